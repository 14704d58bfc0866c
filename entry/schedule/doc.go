// Package schedule runs scheduled operations: one operation per scope (a
// client) and slot (the start of a period), fired by every process and run
// once, because the slot is the operation's idempotency key.
//
//	r, err := schedule.New(e, statement, &schedule.Config[StatementIn]{
//		Period:     time.Hour,
//		ScopesFunc: listClients, // func(ctx, slot) ([]string, error)
//		InputFunc:  func(client string, slot time.Time) StatementIn { return StatementIn{Slot: slot} },
//	})
//	go r.Run(ctx) // in every process; cancel ctx before Engine.Stop
//
// # Slots and keys
//
//	slot := schedule.Slot(time.Now(), time.Hour) // 10:00:00Z at 10:42 UTC
//	key := schedule.Key(statement.Name(), slot)  // "schedule statement 2026-12-01T10:00:00Z"
//	started, err := schedule.Fire(ctx, e, statement, "client-1", slot, StatementIn{Slot: slot})
//
// Slot(t, period) is the start of the period that holds t, in UTC; every
// process computes the same one for the same instant, and daylight saving time
// plays no part. Key(name, slot) is the slot's idempotency key, such as
// "schedule statement 2026-12-01T10:00:00Z". It names the operation type,
// because the engine's keys are unique per scope and not per type, and it
// holds spaces, which no key sent through idempotency.Handler can (visible
// ASCII only): no client's key meets a slot's. Fire(ctx, e, op, scope, slot,
// in) starts the slot's operation with engine.Start under that key; the first
// firing starts it, every later one returns it (Started.Created false).
// Engine.GetByKey(ctx, scope, Key(op.Name(), slot)) reads it.
//
// A slot's input must be derived from the scope and the slot only, so that
// every process builds the same: a firing with another input is refused with
// the engine's *engine.ReusedError, which names the fields that differ,
// and logged. What changes from firer to firer (a balance, the time of the
// firing) belongs in a step, which reads it once.
//
// # Why not River periodic jobs alone
//
//	go r.Run(ctx) // every process fires every slot; the key makes all but the first no-ops
//
// River's periodic jobs are inserted by the elected leader only, from a
// schedule it keeps in memory: a period's job comes late while no leader is
// elected, and twice around a leader change or a deploy, when the new leader
// does not know what the old one inserted. A job runs at least once in any
// case. Here no process is special: every process fires
// every slot, and the slot's key turns the firings after the first into
// no-ops, so a slot runs as long as one process is up during it, whatever the
// leader does, and runs once however many fire it. Its steps are then an
// operation's: checkpointed, retried, resumed after a crash. (A River periodic
// job whose worker calls Fire is as safe, if it takes the slot from the job's
// scheduled time, not from the time it runs.)
//
// # What a firing costs
//
//	schedule.Config[StatementIn]{Period: time.Hour, Concurrency: 4, Jitter: time.Second, ...}
//
// Run fires each slot at its start (plus Config.Jitter), in each process, for
// every scope: one reservation attempt per scope per period per process. The
// firing that reserves the key runs the operation's first attempt in its
// process, as engine.Start does. Every other firing costs the database one
// aborted transaction (a taken key is a unique violation; it leaves a dead row
// version for autovacuum) and an indexed read of the operation by its key.
// The reservation goes with the first statement of the operation's first
// step, so that step's function runs, up to its first statement, in every
// firing: like any transactional step, it must do nothing outside its
// transaction (a log line, a call) before that. An operation whose first step
// is external reserves alone, before it, and does not run it on a taken key.
//
// With P processes and N scopes, a period costs N operations and (P-1)·N
// refused reservations. Each process fires its scopes in a random order,
// Config.Concurrency at a time, so that processes firing at once mostly take
// different scopes and share the operations' first attempts rather than queue
// behind one another on the same keys. A firing refused for a reason that may
// pass (the database unreachable, engine.ErrOverloaded) is tried again with a
// backoff until the next slot begins.
//
// # Clock skew
//
//	if slot.After(dbNow) {
//		return engine.RetryAfter(errors.New("slot not begun"), slot.Sub(dbNow))
//	}
//
// Processes compute the slot from their own clocks, and all compute the same
// slot for the same period. A process whose clock is late fires each slot
// late, by its skew, and finds it fired: harmless. One whose clock is early
// fires it early, so a slot's operation can start that much before the
// slot's start by the database's clock; a step that must not run before its
// slot has begun can compare the slot with the database's now() and return
// engine.RetryAfter. Skew matters once more for retention (below).
//
// # Retention
//
//	op, err := engine.NewOperation("statement", steps, result,
//		&engine.OperationOpts{Retention: 2 * 24 * time.Hour}) // a daily schedule: at least two periods
//
// A SLOT'S KEY LIVES AS LONG AS ITS OPERATION. The engine's retention job
// deletes a finished operation, and so frees its key, once it finished longer
// ago than its retention (engine.OperationOpts.Retention, else
// engine.Config.Retention; 24 hours by default). A firing of the slot after
// that finds the key free and RUNS THE SLOT AGAIN. Run fires only the slot
// that its clock says is current, so a process with a sound clock never fires
// a slot more than a period after its start; keep the retention of a
// scheduled operation type longer than the period plus the clock skew between
// processes: at least MinRetentionPeriods (2) periods. The engine's default
// of 24 hours is not enough for a daily schedule.
//
// New asks the engine for the operation type's retention (Engine.Retention)
// and refuses a period longer than half of it. Runner.FireSlot refuses a slot
// whose start is a retention ago (less a margin for the clocks' skew) with
// ErrSlotExpired. Fire has no such guard: it fires what it is given. For
// money, give the step's own row a unique
// constraint on (scope, slot) as well: it outlives the operation, and a
// second run of a slot then fails its step instead of moving money again.
//
// # Scopes and periods
//
//	err := r.FireSlot(ctx, schedule.Slot(missed, time.Hour)) // a slot no process was up for
//
// Config.ScopesFunc is asked for the scopes once per slot in each process. A
// scope that appears after every process fired a slot waits for the next
// slot (or FireSlot). A slot during which no process ran Run is not fired by
// Run: FireSlot fires it. Periods are durations (Slot); a calendar month is
// not one: fire such slots with Fire, from slots of your own making
// (time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)).
package schedule
