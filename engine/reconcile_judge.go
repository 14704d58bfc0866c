package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemflow/idemflow/reconcile"
	"github.com/idemflow/idemflow/store"
)

// judgement is what judge made of a page of records.
type judgement struct {
	found        []store.Mismatch
	notYet       []string
	inOrder      []string
	unverifiable int64
	// expired counts the records under keys of operations that no longer
	// exist and may have been deleted by the retention job.
	expired int64
}

// judge matches a page of records with the steps, in three reads whatever its
// size: the operations their keys name, those operations' steps, and (only
// for steps an operator resolved) the operators' references. now is the
// time to judge at: a key of ours whose operation is gone, and was made
// longer ago than the shortest retention, is expired, not unknown.
func (e *Engine) judge(ctx context.Context, db store.DBTX, source string, recs []reconcile.Record, now time.Time) (*judgement, error) {
	j := &judgement{}
	ids := make([]uuid.UUID, 0, len(recs))
	for _, r := range recs {
		if id, ok := operationOfKey(r.Key); ok {
			ids = append(ids, id)
		}
	}
	ops := map[uuid.UUID]*store.ReconcileOperation{}
	if len(ids) > 0 {
		rows, err := e.store.ReconcileOperations(ctx, db, ids)
		if err != nil {
			return nil, err
		}
		for i := range rows {
			ops[rows[i].ID] = &rows[i]
		}
	}

	// Each record's step, when its key is one: found by deriving the key again.
	type match struct {
		rec  *reconcile.Record
		op   *store.ReconcileOperation
		step string
	}
	var matched []match
	var judgedIDs []uuid.UUID
	var names []string
	for i := range recs {
		r := &recs[i]
		status := r.Status.OrDefault()
		id, ok := operationOfKey(r.Key)
		if !ok && olderKeyScheme(r.Key) {
			j.unverifiable++
			continue
		}
		var op *store.ReconcileOperation
		step := ""
		if ok {
			if op = ops[id]; op != nil {
				for _, name := range op.Steps {
					if derivedKey(op.ID, op.KeySecret, op.Name, op.Scope, op.Key, name) == r.Key {
						step = name
						break
					}
				}
			}
		}
		switch {
		case status == reconcile.Pending:
			j.notYet = append(j.notYet, r.Key)
		case ok && op == nil && e.mayHaveExpired(id, now):
			// The books hold nothing to judge it against: its operation
			// may have finished and been deleted as its retention allowed.
			j.expired++
		case step == "":
			if status == reconcile.Succeeded {
				j.found = append(j.found, mismatchOf(r, reconcile.UnknownKey, uuid.Nil, "",
					"the record moved money under a key that no operation holds"))
			} else {
				j.inOrder = append(j.inOrder, r.Key)
			}
		case op.State == store.OperationInProgress:
			j.notYet = append(j.notYet, r.Key)
		default:
			matched = append(matched, match{rec: r, op: op, step: step})
			judgedIDs = append(judgedIDs, op.ID)
			if !slices.Contains(names, step) {
				names = append(names, step)
			}
		}
	}
	if len(matched) == 0 {
		j.found = lastOfEach(j.found)
		return j, nil
	}

	steps, err := e.store.ReconcileSteps(ctx, db, judgedIDs, names)
	if err != nil {
		return nil, err
	}
	byKey := stepRowsOf(steps)
	var resolvedIDs []uuid.UUID
	for _, s := range steps {
		if ResolvedBy(s.ResolvedBy) == ResolvedByOperator {
			resolvedIDs = append(resolvedIDs, s.OperationID)
		}
	}
	refs := map[uuid.UUID]string{}
	if len(resolvedIDs) > 0 {
		if refs, err = e.store.ReconcileOperatorReferences(ctx, db, resolvedIDs); err != nil {
			return nil, err
		}
	}

	for _, m := range matched {
		r, op := m.rec, m.op
		st, recorded := byKey.bookStep(op, m.step)
		succeeded := recorded && st.state == store.StepSucceeded
		undone := recorded && st.state == store.StepCompensated
		status := r.Status.OrDefault()
		var found []difference
		switch {
		case status == reconcile.Succeeded && !succeeded && !undone:
			found = []difference{{reconcile.NotSucceeded, fmt.Sprintf("the record moved money; the operation %s and its step %s did not succeed", op.State, m.step)}}
		case status == reconcile.Failed && succeeded:
			found = []difference{{reconcile.RecordFailed, fmt.Sprintf("the step %s succeeded; the record failed and moved nothing", m.step)}}
		case status == reconcile.Succeeded && succeeded:
			found = e.compare(op, m.step, st, refs[op.ID], r)
		}
		if len(found) == 0 {
			j.inOrder = append(j.inOrder, r.Key)
			continue
		}
		for _, d := range found {
			j.found = append(j.found, mismatchOf(r, d.kind, op.ID, m.step, d.detail))
		}
	}
	j.found = lastOfEach(j.found)
	return j, nil
}

// lastOfEach keeps one mismatch per (record key, reference, kind), the last:
// a page that lists a record twice is upserted once.
func lastOfEach(ms []store.Mismatch) []store.Mismatch {
	type id struct{ key, ref, kind string }
	seen := make(map[id]int, len(ms))
	out := ms[:0]
	for _, m := range ms {
		k := id{m.RecordKey, m.Reference, m.Kind}
		if i, ok := seen[k]; ok {
			out[i] = m
			continue
		}
		seen[k] = len(out)
		out = append(out, m)
	}
	return out
}

// mayHaveExpired reports whether the operation id, which no longer exists,
// may have been deleted by the retention job: it was made (its UUIDv7 tells
// when, on its process's clock) longer ago than the shortest retention of
// the types that call out, so it may have finished and expired since. A key
// of an operation made later names one the database lost, or never had.
func (e *Engine) mayHaveExpired(id uuid.UUID, now time.Time) bool {
	made, ok := createdAt(id)
	return ok && made.Before(now.Add(-e.shortestRetention()))
}

// difference is one way a record and the books disagree.
type difference struct {
	kind   reconcile.Kind
	detail string
}

// compare compares a succeeded step's record with what the books hold: the
// reference the step recorded, whoever recorded it (its call, its lookup, an
// event or an operator), and its operation's input (the step's reconcile
// function). A record may be wrong both ways: each is a mismatch of its own.
func (e *Engine) compare(op *store.ReconcileOperation, step string, st bookStep, operatorRef string, r *reconcile.Record) []difference {
	var found []difference
	def := e.def(op.Name, op.Version)
	if booked := e.bookedReference(def, step, st, operatorRef); booked != "" && r.Reference != "" && booked != r.Reference {
		found = append(found, difference{reconcile.ReferenceDiffers, fmt.Sprintf("the books hold the step %s as made under %q (resolved by %s); the record is %q",
			step, booked, resolvedByText(st.resolvedBy), r.Reference)})
	}
	if def == nil {
		return found // another process's version: no input to compare with here
	}
	i, ok := def.index[step]
	if !ok || def.steps[i].reconcile == nil {
		return found
	}
	in, err := def.reloadInput(op.Input)
	if err != nil {
		e.logger.Warn("reconcile: the operation's input does not decode; its record is not compared",
			slog.String("operation_id", op.ID.String()), slog.Any("error", err))
		return found
	}
	if kind := def.steps[i].reconcile(in, *r); kind != "" {
		found = append(found, difference{kind, fmt.Sprintf("the record (amount %d, reference %q) is not what the operation asked for", r.Amount, r.Reference)})
	}
	return found
}

func mismatchOf(r *reconcile.Record, kind reconcile.Kind, op uuid.UUID, step, detail string) store.Mismatch {
	var data json.RawMessage
	if r.Data != nil {
		if b, err := json.Marshal(r.Data); err == nil {
			data = b
		}
	}
	created := r.CreatedAt
	if created.IsZero() {
		created = time.Now() // an event's record, which tells no time
	}
	return store.Mismatch{
		RecordKey: r.Key, Kind: string(kind), Reference: r.Reference, Amount: r.Amount,
		RecordStatus: string(r.Status.OrDefault()), RecordCreatedAt: created, Data: data,
		OperationID: op, Step: step, Detail: detail,
	}
}

// reconcileArgs is the periodic job that reconciles every source.
type reconcileArgs struct{}

// Kind implements river.JobArgs.
func (reconcileArgs) Kind() string { return "idemflow_reconcile" }

type reconcileWorker struct {
	river.WorkerDefaults[reconcileArgs]
	e *Engine
}

// Work reconciles every source; a source that fails does not keep the others
// from running.
func (w *reconcileWorker) Work(ctx context.Context, _ *river.Job[reconcileArgs]) error {
	var errs []error
	for _, s := range w.e.cfg.Reconcile.Sources {
		if _, err := w.e.Reconcile(ctx, s.Name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// reconcileUniqueStates keeps one periodic run at a time: the next is not
// inserted while one waits or runs.
var reconcileUniqueStates = []rivertype.JobState{
	rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning, rivertype.JobStateScheduled,
}

// observeReconciled tells the observer that a run of source ended, with the
// mismatches' counts, containing its panic.
func (e *Engine) observeReconciled(ctx context.Context, source string) {
	obs := e.cfg.Observer
	if obs == nil || obs.Reconciled == nil {
		return
	}
	counts, err := e.MismatchCounts(ctx)
	if err != nil {
		e.logger.WarnContext(ctx, "could not count the mismatches for the observer", slog.Any("error", err))
		return
	}
	defer func() {
		if v := recover(); v != nil {
			e.logger.ErrorContext(ctx, "observer panicked; ignored", slog.String("call", "Reconciled"), slog.Any("panic", v))
		}
	}()
	obs.Reconciled(ctx, source, counts)
}

// CheckRecord judges one record of source at once, as a run would, for an
// event the application received (a provider's webhook): a mismatch is kept
// and returned (a later run clears it if it no longer finds it); a record in
// order clears its mismatch, if it had one; one that cannot be judged yet
// (pending, its operation in progress, a key of an older scheme) changes
// nothing, and both return nil. tx, when not nil, is the application's
// transaction to do it in (the event's, so that it is checked exactly
// once with it); else the engine's pool.
func (e *Engine) CheckRecord(ctx context.Context, tx pgx.Tx, source string, rec reconcile.Record) (*Mismatch, error) {
	if _, err := e.source(source); err != nil {
		return nil, err
	}
	var db store.DBTX = e.pool
	if tx != nil {
		db = tx
	}
	j, err := e.judge(ctx, db, source, []reconcile.Record{rec}, time.Now())
	if err != nil {
		return nil, fmt.Errorf("engine: check record %s: %w", rec.Key, err)
	}
	if len(j.found) == 0 {
		if len(j.inOrder) > 0 {
			if err := e.store.MismatchDelete(ctx, db, source, j.inOrder); err != nil {
				return nil, fmt.Errorf("engine: check record %s: %w", rec.Key, err)
			}
		}
		return nil, nil
	}
	if err := e.store.MismatchUpsert(ctx, db, source, j.found); err != nil {
		return nil, fmt.Errorf("engine: check record %s: %w", rec.Key, err)
	}
	m := j.found[0]
	return &Mismatch{Source: source, Kind: reconcile.Kind(m.Kind), Key: m.RecordKey, Reference: m.Reference, Amount: m.Amount,
		RecordStatus: reconcile.Status(m.RecordStatus), RecordCreatedAt: m.RecordCreatedAt, Data: m.Data,
		OperationID: m.OperationID, Step: m.Step, Detail: m.Detail}, nil
}
