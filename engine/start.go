package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/store"
)

// StartOpts are the optional parts of a Start.
type StartOpts struct {
	// Fingerprint replaces the fingerprint that the engine makes of the input
	// (see Start): for a caller that knows better what tells a retry from a new
	// request, such as an HTTP layer that fingerprints the request body as sent
	// and adds the method and the path as context. Nil: the engine's.
	Fingerprint *Fingerprint
	// Wait, for a starter that waits for the answer (Started.Wait), keeps
	// Start waiting after the reservation has committed, up to Wait, for the
	// first attempt to end: the starter then wakes once, with the answer,
	// rather than once for the reservation and again for the answer, while
	// the attempt runs (12 to 60 µs of CPU less per operation in
	// BenchmarkFirstAttempt; see docs/benchmarks.md). ctx ends the wait too.
	// Zero: Start returns as soon as the reservation has committed. StartTx,
	// whose operation runs on a River worker, has no attempt to wait for.
	Wait time.Duration
}

// Started is what Start returns.
type Started struct {
	// ID is the operation's id: the new one's, or the existing one's when Created is
	// false.
	ID uuid.UUID
	// Created is true when this call reserved the key and started the operation.
	Created bool
	// Existing is the operation that already held the key when Created is false:
	// its state, fingerprint and, once finished, its stored result or error.
	Existing *Info
	// ReservedAt is when this process saw the reservation commit, when Start
	// created the operation (a reservation whose answer was lost: when the
	// engine found it had committed): a wait for the answer that counts from
	// the reservation, as StartOpts.Wait does, counts from it. Zero for
	// StartTx, whose caller's transaction commits it.
	ReservedAt time.Time

	e     *Engine
	local *localRun
}

// Wait waits until the operation finishes or is parked and returns it (see
// Engine.Wait): check Info.Status, and Info.Parked for an operation that waits
// for an operator. For a first attempt that finishes the operation in this
// process it returns the moment the attempt ends, without reading the database,
// and, once it has, whatever ctx.
func (s *Started) Wait(ctx context.Context) (*Info, error) {
	if s.local != nil {
		select {
		case <-s.local.done: // an attempt that has ended is not waited for
		default:
			select {
			case <-s.local.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if s.local.info != nil {
			return s.local.info, nil
		}
		// The first attempt handed the operation to a River job, parked it,
		// or stopped: the row tells which.
	}
	return s.e.Wait(ctx, s.ID)
}

// localRun lets a starter follow a first attempt running in this process.
type localRun struct {
	reserved chan reservation
	done     chan struct{}
	// info is the finished operation, set before done is closed; nil when the
	// attempt ended without finishing the operation.
	info *Info
	// wait is StartOpts.Wait. While quiet, the run does not tell the starter
	// of a reservation that committed: the starter waits for the attempt's
	// end, until wait after the reservation (speaker) or until its ctx ends.
	// The run's mu guards quiet and speaker.
	wait    time.Duration
	quiet   bool
	speaker *time.Timer
}

// tellReserved tells the starter that the reservation committed, at once, or,
// for a quiet starter, once the attempt has run for its wait without ending.
// r.mu is held.
func (r *run) tellReserved() {
	if !r.local.quiet {
		r.local.reserved <- reservation{created: true}
		return
	}
	r.local.speaker = time.AfterFunc(r.local.wait, func() { r.speakUp() })
}

// speakUp ends a quiet wait: the starter is told of a reservation that has
// committed (which it reports), and of one that commits later as it does.
func (r *run) speakUp() (reserved bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.local.quiet {
		r.local.quiet = false
		if r.reserved {
			r.local.reserved <- reservation{created: true}
		}
	}
	return r.reserved
}

// started is the Started of a first attempt whose reservation committed.
func (r *run) started() *Started {
	r.mu.Lock()
	at := r.reservedAt
	r.mu.Unlock()
	return &Started{ID: r.id, Created: true, ReservedAt: at, e: r.e, local: r.local}
}

type reservation struct {
	created  bool
	existing *Info
	err      error
}

// Start starts an operation of type op under the client's idempotency key, within
// scope (the client: keys of different scopes never meet). It reserves the key
// atomically and returns once the reservation has committed (with
// StartOpts.Wait, once the first attempt has ended, up to that long after), or
// found the key taken: by an operation started with the same input, which it returns (Created
// false, with the operation in Existing), or with another input, which it
// refuses with a *ReusedError naming the fields that differ. The input's fingerprint is a hash of each top-level field of
// its JSON, but those in OperationOpts.Unfingerprinted; StartOpts.Fingerprint
// replaces it. The first attempt runs at once in this process, and goes on
// after ctx ends; retries and resumes are River jobs. Use Started.Wait for the
// result.
//
// The first attempt runs on the input as it decodes from its JSON, as a resumed
// run does, so that both see the same values.
func Start[In, S, Out any](ctx context.Context, e *Engine, op *Operation[In, S, Out], scope, key string, in In, opts *StartOpts) (*Started, error) {
	def, p, err := e.prepare(op, scope, key, in, opts)
	if err != nil {
		return nil, err
	}
	if err := e.schemaRefusal(ctx); err != nil {
		return nil, fmt.Errorf("engine: start %q: %w", def.name, err)
	}
	decoded, err := def.reloadInput(p.raw)
	if err != nil {
		return nil, fmt.Errorf("engine: input of %q does not survive encoding/json: %w", def.name, err)
	}
	if max := e.cfg.MaxInFlight; e.inFlight.Add(1) > int64(max) && max > 0 {
		e.inFlight.Add(-1)
		return e.startWithoutRoom(ctx, def, p, fmt.Errorf("%w (%d)", ErrOverloaded, max))
	}
	perScope := e.cfg.MaxInFlightPerScope
	if !e.scopes.enter(scope, perScope) {
		e.inFlight.Add(-1)
		return e.startWithoutRoom(ctx, def, p, fmt.Errorf("%w (%d)", ErrScopeBusy, perScope))
	}
	if !e.addRun() {
		e.inFlight.Add(-1)
		e.scopes.leave(scope, perScope)
		return nil, ErrStopped
	}
	r := e.newRun(def, uuid.Must(uuid.NewV7()), e.newRunID(), scope, key, newKeySecret(), p.fp, def.names)
	r.steps = def.steps
	r.in = decoded
	r.runs = 1
	r.local = &localRun{reserved: make(chan reservation, 1), done: make(chan struct{})}
	if opts != nil && opts.Wait > 0 {
		r.local.quiet, r.local.wait = true, opts.Wait
	}
	r.leaseFrom = time.Now()
	r.insert = p.insert(r.id, r.secret, e.cfg.Lease)
	r.insert.LockedBy = &r.runID
	state, err := def.decodeState(nil)
	if err != nil {
		e.runs.Done()
		e.inFlight.Add(-1)
		e.scopes.leave(scope, perScope)
		return nil, fmt.Errorf("engine: %w", err)
	}
	r.state = state
	// The run keeps the caller's values (a request's span, say), not its
	// cancellation: it goes on when the caller stops waiting, and stops with
	// the engine.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	stopWithEngine := context.AfterFunc(e.baseCtx, cancelRun)
	r.room = &room{leave: func() {
		e.inFlight.Add(-1)
		e.scopes.leave(scope, perScope)
	}}
	e.goRun(func() {
		defer e.runs.Done()
		defer r.room.giveBack() // when the run ended before end
		defer cancelRun()
		defer stopWithEngine()
		r.execute(runCtx)
	})

	select {
	case res := <-r.local.reserved:
		return e.answerStart(ctx, def, r, res)
	case <-r.local.done:
		// A quiet attempt ended. One whose reservation did not commit told
		// the starter so before done.
		select {
		case res := <-r.local.reserved:
			return e.answerStart(ctx, def, r, res)
		default:
			return r.started(), nil
		}
	case <-ctx.Done():
		if r.speakUp() { // committed already: that is the answer
			return r.started(), nil
		}
		return nil, ctx.Err()
	}
}

// answerStart is what Start answers once the run has told it of its
// reservation (res).
func (e *Engine) answerStart(ctx context.Context, def *opDef, r *run, res reservation) (*Started, error) {
	if res.err != nil && errors.Is(res.err, context.Canceled) && e.isStopping() {
		return nil, fmt.Errorf("engine: start %q: %w", def.name, ErrStopped)
	}
	if fault := e.schemaFault(ctx, res.err); fault != nil {
		return nil, fmt.Errorf("engine: start %q: %w", def.name, fault)
	}
	if res.err != nil && errors.Is(res.err, errUnavailable) {
		return nil, fmt.Errorf("engine: start %q: %w", def.name, res.err)
	}
	if res.err != nil && IsUnavailable(res.err) {
		return nil, fmt.Errorf("engine: start %q: %w: %w", def.name, errUnavailable, res.err)
	}
	if res.err != nil {
		return nil, res.err
	}
	if !res.created {
		return &Started{ID: res.existing.ID, Existing: res.existing, e: e}, nil
	}
	return r.started(), nil
}

// startWithoutRoom answers a start that has no room to run (why): a retry
// needs none, so the key is read, and a start that finds it taken is
// answered as a reservation that found it would be; else why.
func (e *Engine) startWithoutRoom(ctx context.Context, def *opDef, p *prepared, why error) (*Started, error) {
	rec, err := e.store.OperationGetByKey(ctx, e.pool, p.scope, p.key)
	switch {
	case err == nil:
		if err := e.sameStart(rec, def, p.fp, p.raw); err != nil {
			return nil, err
		}
		return &Started{ID: rec.ID, Existing: infoFromRecord(rec), e: e}, nil
	case !errors.Is(err, store.ErrNotFound):
		if fault := e.schemaFault(ctx, err); fault != nil {
			return nil, fmt.Errorf("engine: start %q: %w", def.name, fault)
		}
		return nil, fmt.Errorf("engine: start %q: %w: %w", def.name, errUnavailable, err)
	}
	return nil, fmt.Errorf("engine: start %q: %w", def.name, why)
}

// StartTx is Start inside the caller's transaction: the key's reservation, the
// caller's own writes in tx and the River job that runs the operation commit
// together or not at all. The operation runs on a River worker once tx commits,
// in whichever process runs workers; so, unlike Start, StartTx works after Stop,
// which stops only this process's runs.
//
// A key taken by a start with another input is refused as Start refuses it.
func StartTx[In, S, Out any](ctx context.Context, tx pgx.Tx, e *Engine, op *Operation[In, S, Out], scope, key string, in In, opts *StartOpts) (*Started, error) {
	def, p, err := e.prepare(op, scope, key, in, opts)
	if err != nil {
		return nil, err
	}
	if err := e.schemaRefusal(ctx); err != nil {
		return nil, fmt.Errorf("engine: start %q: %w", def.name, err)
	}
	id := uuid.Must(uuid.NewV7())
	created, err := e.store.OperationInsert(ctx, tx, *p.insert(id, newKeySecret(), e.cfg.Lease))
	if err != nil {
		return nil, e.statementErr(ctx, err)
	}
	if !created {
		rec, err := e.store.OperationGetByKey(ctx, tx, scope, key)
		if err != nil {
			return nil, e.statementErr(ctx, err)
		}
		if err := e.sameStart(rec, def, p.fp, p.raw); err != nil {
			return nil, err
		}
		return &Started{ID: rec.ID, Existing: infoFromRecord(rec), e: e}, nil
	}
	if err := e.enqueueResume(ctx, tx, resumeArgs{OperationID: id, Operation: def.name, Scope: scope}, time.Time{}); err != nil {
		return nil, fmt.Errorf("engine: enqueue operation: %w", err)
	}
	e.handedToRiver(ctx)
	return &Started{ID: id, Created: true, e: e}, nil
}

// prepared is a start, checked and encoded.
type prepared struct {
	def   *opDef
	scope string
	key   string
	raw   []byte
	fp    *Fingerprint
}

func (p *prepared) insert(id uuid.UUID, secret []byte, lease time.Duration) *store.OperationInsertParams {
	return &store.OperationInsertParams{
		ID:          id,
		Name:        p.def.name,
		Version:     p.def.version,
		Scope:       p.scope,
		Key:         p.key,
		Steps:       p.def.names,
		Input:       p.raw,
		Fingerprint: p.fp.encode(),
		KeySecret:   secret,
		Lease:       lease,

		SettleWindow: p.def.settleWindow(),
	}
}

func (e *Engine) prepare(op Definition, scope, key string, in any, opts *StartOpts) (*opDef, *prepared, error) {
	def, err := e.registered(op)
	if err != nil {
		return nil, nil, err
	}
	if key == "" {
		return nil, nil, fmt.Errorf("engine: %w: empty", ErrInvalidKey)
	}
	raw, err := json.Marshal(in)
	if err != nil {
		return nil, nil, fmt.Errorf("engine: encode input of %q: %w", def.name, err)
	}
	p := &prepared{def: def, scope: scope, key: key, raw: raw}
	if opts != nil && opts.Fingerprint != nil {
		p.fp = opts.Fingerprint
	} else if p.fp, err = fingerprintOf(raw, def.ignore); err != nil {
		return nil, nil, fmt.Errorf("engine: fingerprint input of %q: %w", def.name, err)
	}
	return def, p, nil
}

// sameStart returns a *ReusedError when the operation rec, which holds a
// key, was started with another input than the start fingerprinted fp, whose
// input encodes as raw. An operation stored without a readable fingerprint
// (started by Start before the engine fingerprinted, or with a caller's own
// format) is compared by the fields of its stored input, as the engine
// fingerprints them.
func (e *Engine) sameStart(rec *store.Operation, def *opDef, fp *Fingerprint, raw []byte) error {
	stored := decodeFingerprint(rec.Fingerprint)
	if len(stored.Fields) == 0 && len(stored.Context) == 0 {
		var err error
		if stored, err = fingerprintOf(rec.Input, def.ignore); err != nil {
			stored = &Fingerprint{}
		}
		if fp, err = fingerprintOf(raw, def.ignore); err != nil {
			fp = &Fingerprint{}
		}
	}
	diff := fp.mismatches(stored, def.ignore)
	if len(diff) == 0 && rec.Name != def.name {
		diff = []string{"operation"}
	}
	if len(diff) > 0 {
		return &ReusedError{What: "key", ID: rec.Key, Operation: rec.ID, Fields: diff}
	}
	return nil
}

// existingReadTimeout bounds the read of the operation that holds a key a
// first attempt could not reserve; Stop waits for it.
const existingReadTimeout = 2 * time.Second

// existing reads the operation that holds the key a first attempt could not
// reserve, and refuses it when its input differs from this start's.
//
// waited, when not nil, is why the reservation failed instead: it waited out
// lock_timeout on the key's row, which a transaction was writing (the run that
// holds the operation records a step, say) or had inserted and not committed
// (another start's reservation). The row as last committed answers as a taken
// key's would; with none, or when it cannot be read, the start is unavailable
// for now (errUnavailable, errKeyRowLocked), and a retry finds how that
// transaction ended.
// Without waited, a row gone since the reservation found the key taken (the
// retention job deleted it) is errUnavailable too: a retry reserves the key.
//
// The read does not end with the run's context, which ends when the
// reservation took too long (errLeaseExpiring): the starter still waits for
// its answer (Start reports a read that fails for want of the database as
// errUnavailable).
func (r *run) existing(ctx context.Context, waited error) reservation {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), existingReadTimeout)
	defer cancel()
	rec, err := r.e.store.OperationGetByKey(rctx, r.e.pool, r.scope, r.key)
	switch {
	case err == nil:
	case waited != nil && errors.Is(err, store.ErrNotFound):
		return reservation{err: fmt.Errorf("%w: %w: %w", errUnavailable, errKeyRowLocked, waited)}
	case waited != nil:
		return reservation{err: fmt.Errorf("%w: %w: %w; reading the key: %w", errUnavailable, errKeyRowLocked, waited, err)}
	case errors.Is(err, store.ErrNotFound):
		// Deleted since (by the retention job): the key is free again.
		return reservation{err: fmt.Errorf("engine: the operation that held the key is gone; a retry reserves it: %w: %w", errUnavailable, err)}
	default:
		return reservation{err: fmt.Errorf("engine: read existing operation: %w", err)}
	}
	if err := r.e.sameStart(rec, r.def, r.fp, r.insert.Input); err != nil {
		return reservation{err: err}
	}
	return reservation{existing: infoFromRecord(rec)}
}
