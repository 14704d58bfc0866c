package engine

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemflow/idemflow/store"
)

// StartOpts are the optional parts of a Start.
type StartOpts struct {
	// Fingerprint is stored with the operation and handed back, in Started.Existing,
	// to a later Start with the same key: what the caller needs to tell a retry of
	// the same request from a different request. The engine does not read it.
	Fingerprint json.RawMessage
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

	e     *Engine
	local *localRun
}

// Wait waits until the operation finishes and returns it (see Engine.Wait). For a
// first attempt running in this process it returns the moment the attempt ends,
// without reading the database.
func (s *Started) Wait(ctx context.Context) (*Info, error) {
	if s.local != nil {
		select {
		case <-s.local.done:
			if s.local.info != nil {
				return s.local.info, nil
			}
			// The first attempt handed the operation to a River job, or stopped.
		case <-ctx.Done():
			return nil, ctx.Err()
		}
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
}

type reservation struct {
	created  bool
	existing *Info
	err      error
}

// Start starts an operation of type op under the client's idempotency key, within
// scope (the client: keys of different scopes never meet). It reserves the key
// atomically and returns once the reservation has committed, or found the key
// taken (Created false, with the operation that holds it in Existing). The first
// attempt runs at once in this process, and goes on after ctx ends; retries and
// resumes are River jobs. Use Started.Wait for the result.
func Start[In, S, Out any](ctx context.Context, e *Engine, op *Operation[In, S, Out], scope, key string, in In, opts *StartOpts) (*Started, error) {
	def, raw, err := e.prepare(op, key, in)
	if err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &StartOpts{}
	}
	if !e.addRun() {
		return nil, ErrStopped
	}
	r := &run{
		e:      e,
		def:    def,
		id:     uuid.Must(uuid.NewV7()),
		runID:  uuid.New(),
		scope:  scope,
		key:    key,
		steps:  def.steps,
		in:     in,
		runs:   1,
		status: make(map[string]store.StepState, len(def.steps)),
		tries:  make(map[string]int, len(def.steps)),
		local: &localRun{
			reserved: make(chan reservation, 1),
			done:     make(chan struct{}),
		},
		insert: &store.OperationInsertParams{
			Name:        def.name,
			Scope:       scope,
			Key:         key,
			Steps:       def.stepNames(),
			Input:       raw,
			Fingerprint: opts.Fingerprint,
			Lease:       e.cfg.Lease,
		},
	}
	r.insert.ID = r.id
	r.insert.LockedBy = &r.runID
	state, err := def.decodeState(nil)
	if err != nil {
		e.runs.Done()
		return nil, fmt.Errorf("engine: %w", err)
	}
	r.state = state
	go func() {
		defer e.runs.Done()
		r.execute(e.baseCtx)
	}()

	select {
	case res := <-r.local.reserved:
		if res.err != nil {
			return nil, res.err
		}
		if !res.created {
			return &Started{ID: res.existing.ID, Existing: res.existing, e: e}, nil
		}
		return &Started{ID: r.id, Created: true, e: e, local: r.local}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// StartTx is Start inside the caller's transaction: the key's reservation, the
// caller's own writes in tx and the River job that runs the operation commit
// together or not at all. The operation runs on a River worker once tx commits.
func StartTx[In, S, Out any](ctx context.Context, tx pgx.Tx, e *Engine, op *Operation[In, S, Out], scope, key string, in In, opts *StartOpts) (*Started, error) {
	def, raw, err := e.prepare(op, key, in)
	if err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &StartOpts{}
	}
	id := uuid.Must(uuid.NewV7())
	created, err := e.store.OperationInsert(ctx, tx, store.OperationInsertParams{
		ID:          id,
		Name:        def.name,
		Scope:       scope,
		Key:         key,
		Steps:       def.stepNames(),
		Input:       raw,
		Fingerprint: opts.Fingerprint,
		Lease:       e.cfg.Lease,
	})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if !created {
		rec, err := e.store.OperationGetByKey(ctx, tx, scope, key)
		if err != nil {
			return nil, mapNotFound(err)
		}
		return &Started{ID: rec.ID, Existing: infoFromRecord(rec), e: e}, nil
	}
	if _, err := e.river.InsertTx(ctx, tx, resumeArgs{OperationID: id, Operation: def.name}, &river.InsertOpts{Queue: e.cfg.Queue}); err != nil {
		return nil, fmt.Errorf("engine: enqueue operation: %w", err)
	}
	return &Started{ID: id, Created: true, e: e}, nil
}

func (e *Engine) prepare(op Definition, key string, in any) (*opDef, []byte, error) {
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
	return def, raw, nil
}
