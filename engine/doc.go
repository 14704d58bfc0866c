// Package engine runs multi-step operations that move money safely under retries
// and crashes: each step is checkpointed in PostgreSQL, a retry of the client's
// key gets the stored answer, and River resumes what a crash interrupted.
//
// How it works inside, and what each operation costs the database (commits,
// round trips, statements), is told in the repository's docs/architecture.md;
// the states are drawn in docs/state-machine.md.
//
// # Operations and steps
//
//	op, err := engine.NewOperation("payout", []engine.Step[In, State]{
//		engine.TxStep("debit", debit).Compensate(credit),
//		engine.ExternalStep("pay", pay).Lookup(findPayment).Retries(engine.RetryPolicy{MaxAttempts: 5}),
//	}, func(in In, s *State) (Out, error) { return Out{PaymentID: s.PaymentID}, nil }, nil)
//
// An operation type is a name, an ordered list of uniquely named steps over an
// input In and a state S, and a function that builds the result Out. A TxStep
// writes through a Tx that the engine commits with the step's checkpoint: its
// writes happen exactly once. An ExternalStep calls out with Attempt.Key, a
// derived idempotency key that is the same on every attempt (see "Derived
// keys"). Methods add a compensation, a lookup (external steps) and a retry
// policy. In, S and Out must survive encoding/json, since the input and the
// state after each step are stored and read back; NewOperation refuses types
// that would not, and a first attempt runs on them as they decode.
//
// A write whose result the step does not read can go with the step's COMMIT:
//
//	_, err := engine.AtCommit(tx).Exec(ctx, `INSERT INTO ledger (operation_id, amount) VALUES ($1, $2)`, at.OperationID, in.Amount)
//
// Such a statement must fail on its own when the step must not succeed (a
// unique key, or SELECT idemflow_fail(code, message), which fails it for good);
// a step whose writes all go this way costs no round trip of its own.
//
// # Starting and waiting
//
//	started, err := engine.Start(ctx, e, op, "client-1", idempotencyKey, in, nil)
//	info, err := started.Wait(ctx) // started.Created is false for a retry
//	out, err := op.Result(info)
//
// Start takes the scope (the client the key belongs to: keys of different
// clients never meet) before the client's key, as every function of the
// package that takes both does. It reserves (scope, key) atomically and runs
// the first attempt at once in this process, which hands its result to
// Started.Wait without a poll; StartTx reserves in the caller's transaction
// and leaves the run to a River worker. A second Start with the key runs
// nothing: with the same input it returns the existing operation
// (Started.Existing) and, once finished, its stored answer; with another input
// it returns a *ReusedError naming the top-level fields that differ (a
// Fingerprint, one hash per field, is stored; OperationOpts.Unfingerprinted
// leaves fields out). Engine.Wait waits by id.
//
// # Failure
//
//	func debit(ctx context.Context, tx engine.Tx, at engine.Attempt, in In, s *State) error {
//		tag, err := tx.Exec(ctx, `UPDATE wallet SET balance = balance - $2 WHERE id = $1 AND balance >= $2`, in.Wallet, in.Amount)
//		switch {
//		case err != nil:
//			return err // transient: tried again after a backoff
//		case tag.RowsAffected() == 0:
//			return engine.Fail("insufficient_funds", "the wallet has less than that") // the answer
//		}
//		return nil
//	}
//
// The engine follows Garcia-Molina and Salem's sagas. A step is compensatable
// (a TxStep, or an ExternalStep with a Compensate), a pivot (an ExternalStep
// without one: a call that cannot be undone), or retriable (any step after a
// pivot). Before the pivot, a step that returns a *PermanentError (Fail,
// Permanent) or runs out of attempts ends the operation failed: the steps that
// succeeded are compensated, last first, and the error is stored as the
// answer. Once a pivot has succeeded the operation only goes forward: a later
// step is retried past its MaxAttempts every RetryPolicy.Cap, never given up,
// and the operation needs attention meanwhile (Info.Attention); a permanent
// failure there, or of the result function, parks it; nothing is compensated,
// and Engine.Cancel refuses it (ErrPastPivot).
//
// A transient failure is retried after its backoff (RetryPolicy: by default
// from defaultRetryBase, doubling, up to defaultRetryCap, for
// defaultRetryMaxAttempts attempts): waited out in the run when short, else
// by a River job scheduled in the transaction that records the failure. A
// panic in a step, lookup, compensation or result function is one failed
// attempt, never the process's end. An attempt of a transactional step that
// failed because the database did not answer (IsUnavailable: a lock or
// statement timeout, a lost connection) does not count against MaxAttempts.
//
// Some operations can go neither forward nor back without a person, and are
// parked (in progress, needing attention, left alone by every run): a step
// returned Halt (a provider's answer that does not match the request), a
// permanent failure past the pivot, an outcome nobody can tell (an external
// step without a lookup), an input or state that no longer decodes, a
// compensation that failed for good (half undone: a Retry goes on
// compensating). A client retrying its key meanwhile is
// told the operation is in progress.
//
// # Late and unknown outcomes
//
//	engine.ExternalStep("pay", pay).Lookup(findPayment).Window(2 * time.Minute)
//
//	// in a webhook handler's transaction, whenever the event arrives:
//	added, err := e.RecordOutcome(ctx, tx, engine.Outcome{EventID: event.ID, Record: reconcile.Record{
//		Key: event.IdempotencyKey, Reference: event.PaymentID, Amount: event.Amount, Status: reconcile.Succeeded}})
//
// A call to the outside world is known (done: the step returns nil; refused:
// Fail), unknown (a timeout, a lost connection, a 5xx, a crash mid-call: the
// request may still land up to the step's outcome window after it was sent,
// defaultWindow unless Settle says otherwise) or pending (the service accepted
// it and tells later: the step returns Pending). Silence is never "not made".
//
// The window is fixed when the request is sent: the step's settle_by, the
// database's clock then plus the step's window, is stored with it (and shown
// as StepInfo.SettleBy), and every decision that a call was not made (its
// lookup finding nothing, Cancel, Resolve, in any process) compares it with
// the database's clock, never with the deciding process's settings or clock.
//
// An external step out of attempts with its outcome unknown (or failed with a
// server fault) sends nothing more and waits (StepStatusWaiting), with no run,
// lease or busy River job on it, while its lookup is asked at the step's
// backoff (at most ten times its Base) and once more just after the window.
// Found: the operation goes forward. Nothing found once the window has
// passed: the call was not made, and the operation fails and compensates. A
// pending call (Accepted, with the service's reference when it gave one) waits
// until its lookup finds it final (found; or Fail: it ended without effect,
// and the operation compensates with that answer), or the outside service's
// word arrives by another door, or an operator decides. A lookup answers
// "still processing" with Accepted. A step that waits past its window needs
// attention (CodeOutcomeOverdue) and goes on waiting; one without a lookup
// whose outcome is unknown is parked.
//
// # The provider's word, whenever it arrives
//
// Engine.RecordOutcome keeps what an outside service says of a call (a
// webhook's event), by the derived key it names, in the engine's inbox: in
// the caller's transaction, once per event id, whatever the step's state then
// (not begun, calling, waiting, finished). A waiting step reads the inbox
// before its lookup. A success for what was asked (the step's reconcile
// function) goes forward (ResolvedByEvent), even while the lookup finds
// nothing, and while the inbox holds one no "not made" is concluded, by any
// path: the transaction that would record it checks the inbox once more,
// serialised with its writers. A failure counts only when the lookup, asked
// then, does not contradict it: pending or found there, the step waits on; a
// lookup that cannot answer, the failure is weighed again at the next one. An
// outcome that names another reference than the one the service gave for the
// pending call is not the step's.
//
// # Waits
//
//	engine.ApprovalStep("approval", func(in In, s *State) engine.ApprovalPolicy {
//		return engine.ApprovalPolicy{Need: 2, Expires: engine.Deadline{After: 72 * time.Hour}}
//	}),
//	engine.SignalStep("confirm", "customer.confirmed", confirm).
//		Deadline(func(In, *State) engine.Deadline { return engine.Deadline{After: 48 * time.Hour} }, nil),
//	engine.TimerStep("release", func(in In, s *State) engine.Deadline { return engine.Deadline{At: in.ReleaseAt} }),
//
//	// elsewhere, in the sender's transaction, and by an operator:
//	added, err := e.Signal(ctx, tx, engine.SignalTo{Scope: "client-1", Key: key},
//		engine.Signal{ID: msg.ID, Name: "customer.confirmed", Payload: msg.Body})
//	info, err := e.Approve(engine.WithActor(ctx, "ann"), id, "checked the order")
//
// An operation may wait for a word of the application's own (SignalStep,
// sent with Engine.Signal), for a moment (TimerStep), or for operators
// (ApprovalStep: Engine.Approve and Engine.Reject decide it, Engine.Approvals
// lists what waits; an Admin has the same). While it waits it is in progress,
// needs no attention, and nothing is busy on it: no goroutine, lease or River
// job. StepInfo.Wait says what it waits for, and until when.
//
// The wait (a Deadline, the approvals needed) is fixed and stored when the
// step is reached, by the database's clock. A signal is kept once per id,
// and one sent before its step is reached waits for it there. What comes
// first wins, once, by a commit: a signal after its step's deadline has
// passed is refused with ErrWaitOver, as is an approval after its expiry. A
// rejection (CodeRejected), an expiry (CodeApprovalExpired) and a deadline
// with no timeout function (CodeSignalTimeout) are business failures, which
// compensate the steps before. Each process with started workers keeps the
// moments with a timer loop: one passes within about a second, in whichever
// process is up then, or the first to start after it.
//
// # Operators
//
//	ctx = engine.WithActor(ctx, "ann")
//	info, err := e.Retry(ctx, id, nil)               // a parked operation runs again
//	info, err = e.Cancel(ctx, id, "duplicate order") // compensates, ends failed
//	info, err = e.Resolve(ctx, id, engine.Resolution{Made: true, Reference: "pr_123", Reason: "the dashboard lists it"})
//
// Retry, Cancel and Resolve are what an operator asks of an operation (and
// Approve and Reject of one that waits for approval, see "Waits"); an Admin
// (NewAdmin) asks the live processes the same from a command or page that
// has none of the definitions, and gets the same answers: the operation, or
// the same refusal. Both are an Operator, which opsweb serves. Each request, done or refused, is kept
// with the operation (Info.Audit): the action, who asked, why, and what became
// of it. Refusals are errors to branch on (ErrFinal, ErrOutcomeUnknown,
// ErrPastPivot, ErrNotResolvable, ErrResolutionContradicts, ErrRunning...),
// never a failure of the operation.
//
// Who may decide an outcome: the step's answer, its lookup, the application's
// delivered outcome, and an operator (Resolve, refused while the lookup says
// otherwise; a made call's reference goes to ExternalStepDef.FromReference); never
// the engine on a guess. Cancel refuses an operation whose call may still land
// or is pending (*RefusedError, with when it will be known). Told
// answers are final: Retry refuses (ErrFinal) an operation that ended with a
// business answer or a cancel, and reopens one that failed with a server fault
// only with RetryOpts.Force, its old answer kept as Info.PriorError until it
// finishes again.
//
// An operation needs attention (Info.NeedsAttention, ListOpts.NeedsAttention)
// when it is in progress and waits for a person (Info.Attention: parked,
// retrying past the pivot, an overdue outcome), when it is in progress on a
// version no live process runs (CodeVersionNotRun), or, finished or not, when
// a reconciliation mismatch names it (CodeReconciliationMismatch).
//
// # Reconciliation
//
//	engine.ExternalStep("pay", pay).Lookup(findPayment).
//		Reconcile(func(in In, rec reconcile.Record) reconcile.Kind {
//			if rec.Amount != in.Amount {
//				return reconcile.AmountDiffers
//			}
//			return ""
//		}).
//		Records("bank", func(s *S) string { return s.BankID })
//	e, err := engine.New(pool, &engine.Config{Operations: ops,
//		Reconcile: reconcile.Config{Sources: []reconcile.Source{{Name: "bank", List: listPayouts}}}})
//
// Given a reconcile.Source, the engine checks its books against an outside
// service's: a periodic River job on the leader (reconcile.Config.Interval),
// or Engine.Reconcile on request, reads the service's records page by page
// and finds each record's step by its derived key. A record is judged once it
// is final and its operation has finished: money moved under no key of ours
// (reconcile.UnknownKey), while the step did not succeed
// (reconcile.NotSucceeded), not moved while it did (reconcile.RecordFailed),
// under another reference than the books hold, whoever recorded it
// (reconcile.ReferenceDiffers), or not what was asked (the step's function,
// such as reconcile.AmountDiffers). Then the other way, for the steps
// declared with ExternalStepDef.Records: a succeeded step whose key the run
// did not list is reconcile.MissingRecord. Mismatches are kept, one per
// record and kind, until a run no longer finds them, name their operation as
// needing attention, and are listed by Engine.Reconciliation (the first
// 1,000, with their total) and Engine.MismatchList (in pages).
// Engine.CheckRecord judges one record at once, in a webhook handler's
// transaction. The window read is at most the shortest retention of the
// operations that call out; a record under a key of an operation that is
// gone and older than that retention is counted as expired, not as an
// unknown key.
//
// # Errors
//
//	var pe *engine.PermanentError
//	if errors.As(err, &pe) && pe.ServerFault() {
//		// 500: pe.Message for the client, pe.Cause for operators
//	}
//
// Every failure has a text for the client and one for operators:
// PermanentError's Message and Cause, StepInfo's LastError and LastCause. The
// client's names nothing internal (no SQL, URL, Go error text or stack).
// ServerFault tells a server fault (a step out of attempts, a failed
// compensation or result function, Permanent) from a business answer (Fail):
// what an HTTP layer answers 500 for. Errors that callers branch on are
// sentinels matched with errors.Is (ErrOverloaded, ErrScopeBusy...); an
// operator's request refused returns a *RefusedError whose typed Refusal
// (ErrNotFound, ErrFinal, ErrPastPivot...) errors.Is matches and a switch
// reads; an id used again with other content, a *ReusedError naming the
// fields that differ. IsUnavailable tells an error of the database's
// absence, which a retry may cure.
//
// # Crashes
//
//	err := e.StartWorkers(ctx) // retries, resumes, the sweeper, takeovers
//	// ... serve; at shutdown:
//	err = e.Stop(stopCtx) // running steps finish; the rest is handed back
//
// A run holds its operation through a lease on the operation's row, renewed
// while it works; a run that cannot renew stops before its lease runs out.
// Every transaction of a run is fenced by the run that holds the lease, so a
// run that lost it cannot commit a step or the step's writes, and a
// checkpoint is keyed by (operation, step). Every process with started workers
// sweeps for operations whose lease expired and hands them to River workers,
// which resume each at its first unfinished step. A process with workers also
// holds a session advisory lock while it lives (TakeoverConfig): PostgreSQL
// releases it when the session ends, so the others take a dead process's
// operations over within a fraction of a second, not at the end of the lease.
// A process that is alive but slow keeps its lock and its operations; the
// lease stays the bound when no lock is held (no workers, or the liveness
// connection through a pooler: Config.Pooler). Leases, retry times and the
// retention horizon use the database's clock.
//
// # Derived keys
//
//	req.Header.Set("Idempotency-Key", at.Key) // in an ExternalStep's function
//
// An external step's Attempt.Key is derived from the operation's id, a random
// secret chosen at its reservation and the step's name: the same on every
// attempt, unknown to anyone without the database, new for a new operation
// under a client key used before (after retention deleted the old one), so it
// never meets the old operation's records at a provider, and a way back from
// a provider's record to its operation for reconciliation.
//
// # Versions
//
//	v2, err := engine.NewOperation("refund", stepsV2, result, &engine.OperationOpts{Version: 2})
//	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{v1, v2}})
//	unrunnable, err := next.Check(ctx) // next: an engine of the new binary's definitions
//
// An operation type has a version (OperationOpts.Version, 1 by default); a
// process registers any number of versions of a name, Start starts on the
// version of the *Operation it is given, and an operation always runs on the
// version it started on. A process without that version leaves it alone
// (never claims, fails, compensates or runs it), logs it once, and Get shows
// it needing attention (CodeVersionNotRun) until a process with the version
// finishes it.
//
// Within a version a step's body may change (its name and the shape of the
// state kept: the state decodes strictly), steps may be appended, and a step
// may be removed once every unfinished operation has finished it. Anything
// else (a step renamed, reordered or removed while operations need it, a state
// that no longer decodes) needs a new version. New refuses a version
// registered twice and two versions with the same steps. A process whose
// definition lacks a step an operation still needs leaves the operation in
// progress, needing attention (CodeDefinitionChanged).
//
// Before a deploy, Engine.Check on an engine made with the new binary's
// definitions lists the unfinished operations it could not run. To retire a
// version: deploy with both, wait until Check with the new one alone returns
// nothing, then deploy without the old one.
//
// idemflow's own schema has versions too (Migrate). A process left running
// after a newer build migrated the database with a migration that its
// statements do not fit (one that is not rolling) cannot work there: Health,
// for a service's health check, returns ErrIncompatibleSchema, and its starts
// are refused with it, reserving nothing, until it is replaced.
package engine
