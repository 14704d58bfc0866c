package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/store/internal/dbsqlc"
)

// ReconcileOperation is an operation as reconciliation matches records against
// it.
type ReconcileOperation struct {
	ID        uuid.UUID
	Name      string
	Version   int
	Scope     string
	Key       string
	State     OperationState
	Steps     []string
	Input     []byte
	KeySecret []byte
	CreatedAt time.Time
	// Checkpointed are the steps checkpointed in the operation's row:
	// succeeded, unless a step row says otherwise.
	Checkpointed []Checkpointed
}

// Checkpointed is what a checkpoint in an operation's row tells
// reconciliation of its step.
type Checkpointed struct {
	// Name is the step's.
	Name string
	// Reference is the outside service's reference that the step recorded
	// (StepCheckpointParams.Reference); empty when none was.
	Reference string
	// ResolvedBy is how an external step's outcome was known ("call",
	// "lookup"); empty for other steps.
	ResolvedBy string
	// SucceededAt is when the step succeeded.
	SucceededAt time.Time
}

// Checkpoint returns the checkpoint of the step name, if the operation's row
// holds one.
func (o *ReconcileOperation) Checkpoint(name string) (Checkpointed, bool) {
	for _, c := range o.Checkpointed {
		if c.Name == name {
			return c, true
		}
	}
	return Checkpointed{}, false
}

func checkpointedOf(names, refs, bys []string, done []int64) []Checkpointed {
	if len(names) == 0 {
		return nil
	}
	out := make([]Checkpointed, len(names))
	for i, n := range names {
		c := Checkpointed{Name: n}
		if i < len(refs) {
			c.Reference = refs[i]
		}
		if i < len(bys) {
			c.ResolvedBy = bys[i]
		}
		if i < len(done) {
			c.SucceededAt = time.UnixMicro(done[i])
		}
		out[i] = c
	}
	return out
}

// ReconcileOperations reads the operations ids (those that exist).
func (s *Store) ReconcileOperations(ctx context.Context, db DBTX, ids []uuid.UUID) ([]ReconcileOperation, error) {
	rows, err := s.q.ReconcileOperations(ctx, db, uuidTexts(ids))
	if err != nil {
		return nil, fmt.Errorf("store: read operations to reconcile: %w", err)
	}
	out := make([]ReconcileOperation, len(rows))
	for i, r := range rows {
		out[i] = ReconcileOperation{ID: uuid.UUID(r.ID), Name: r.Name, Version: int(r.Version), Scope: r.Scope,
			Key: r.Key, State: OperationState(r.State), Steps: r.Steps, Input: r.Input, KeySecret: r.KeySeed,
			CreatedAt: r.CreatedAt, Checkpointed: checkpointedOf(r.Checkpointed, r.CheckpointRefs, r.CheckpointResolvedBy, r.CheckpointDone)}
	}
	return out, nil
}

// ReconcileBooksParams asks for a page of the books that a run checks for
// records.
type ReconcileBooksParams struct {
	// After is the last operation of the previous page (its id); for the
	// first, an id of UUIDv7 no later than CreatedFrom.
	After uuid.UUID
	// CreatedFrom: only operations created from then on (the database's
	// clock).
	CreatedFrom time.Time
	// Names are the operation types to read.
	Names []string
	// Max bounds the page.
	Max int
}

// ReconcileBooks reads a page of the finished operations that p asks for, by
// id; Steps and Input are left empty.
func (s *Store) ReconcileBooks(ctx context.Context, db DBTX, p ReconcileBooksParams) ([]ReconcileOperation, error) {
	rows, err := s.q.ReconcileBooks(ctx, db, dbsqlc.ReconcileBooksParams{
		After: pguuid.UUID(p.After), CreatedFrom: p.CreatedFrom, Names: p.Names, Max: int32(p.Max),
	})
	if err != nil {
		return nil, fmt.Errorf("store: read the books to reconcile: %w", err)
	}
	out := make([]ReconcileOperation, len(rows))
	for i, r := range rows {
		out[i] = ReconcileOperation{ID: uuid.UUID(r.ID), Name: r.Name, Version: int(r.Version), Scope: r.Scope,
			Key: r.Key, State: OperationState(r.State), KeySecret: r.KeySeed, CreatedAt: r.CreatedAt,
			Checkpointed: checkpointedOf(r.Checkpointed, r.CheckpointRefs, r.CheckpointResolvedBy, r.CheckpointDone)}
	}
	return out, nil
}

// ReconcileStep is a step row as reconciliation reads it.
type ReconcileStep struct {
	OperationID uuid.UUID
	Name        string
	State       StepState
	ResolvedBy  string
	// Output is the operation's state after the step, when it succeeded.
	Output json.RawMessage
	// FinishedAt is when the step ended (succeeded); nil while it runs.
	FinishedAt *time.Time
}

// ReconcileSteps reads the step rows named names of the operations ids (their
// checkpoints are in ReconcileOperation.Checkpointed).
func (s *Store) ReconcileSteps(ctx context.Context, db DBTX, ids []uuid.UUID, names []string) ([]ReconcileStep, error) {
	rows, err := s.q.ReconcileSteps(ctx, db, dbsqlc.ReconcileStepsParams{Ids: uuidTexts(ids), Names: names})
	if err != nil {
		return nil, fmt.Errorf("store: read steps to reconcile: %w", err)
	}
	out := make([]ReconcileStep, len(rows))
	for i, r := range rows {
		out[i] = ReconcileStep{OperationID: uuid.UUID(r.OperationID), Name: r.Name, State: StepState(r.State), ResolvedBy: deref(r.ResolvedBy),
			Output: r.Output, FinishedAt: r.FinishedAt}
	}
	return out, nil
}

// ReconcileOperatorReferences returns, by operation, the reference of the
// last done resolve that said "made" of the operations ids.
func (s *Store) ReconcileOperatorReferences(ctx context.Context, db DBTX, ids []uuid.UUID) (map[uuid.UUID]string, error) {
	rows, err := s.q.ReconcileOperatorReferences(ctx, db, uuidTexts(ids))
	if err != nil {
		return nil, fmt.Errorf("store: read operators' references: %w", err)
	}
	out := make(map[uuid.UUID]string, len(rows))
	for _, r := range rows {
		out[uuid.UUID(r.OperationID)] = deref(r.Reference)
	}
	return out, nil
}

// Mismatch is a record of an outside service that does not agree with the
// steps, as a reconciliation found it.
type Mismatch struct {
	Source          string
	RecordKey       string
	Kind            string
	Reference       string
	Amount          int64
	RecordStatus    string
	RecordCreatedAt time.Time
	Data            json.RawMessage
	// OperationID is uuid.Nil for a key no operation holds.
	OperationID uuid.UUID
	Step        string
	Detail      string
	FirstSeen   time.Time
	LastSeen    time.Time
	// The operation's name, scope and state as they are when listed (empty
	// when there is none, or no longer).
	OperationName  string
	OperationScope string
	OperationState OperationState
}

// MismatchUpsert records ms, all of source and at most one per (RecordKey,
// Reference, Kind), or sees them again.
func (s *Store) MismatchUpsert(ctx context.Context, db DBTX, source string, ms []Mismatch) error {
	if len(ms) == 0 {
		return nil
	}
	p := dbsqlc.MismatchUpsertParams{Source: source}
	for _, m := range ms {
		p.RecordKeys = append(p.RecordKeys, Text(m.RecordKey))
		p.Kinds = append(p.Kinds, Text(m.Kind))
		p.Refs = append(p.Refs, Text(m.Reference))
		p.Amounts = append(p.Amounts, m.Amount)
		p.RecordStatuses = append(p.RecordStatuses, Text(m.RecordStatus))
		p.RecordCreatedAts = append(p.RecordCreatedAts, m.RecordCreatedAt)
		p.Data = append(p.Data, nullJSON(m.Data))
		op := ""
		if m.OperationID != uuid.Nil {
			op = m.OperationID.String()
		}
		p.OperationIds = append(p.OperationIds, op)
		p.Steps = append(p.Steps, Text(m.Step))
		p.Details = append(p.Details, Text(m.Detail))
	}
	if err := s.q.MismatchUpsert(ctx, db, p); err != nil {
		return fmt.Errorf("store: record mismatches: %w", err)
	}
	return nil
}

// MismatchTouch keeps the mismatches of source's records keys, which a run saw
// and could not judge yet, from being cleared at its end.
func (s *Store) MismatchTouch(ctx context.Context, db DBTX, source string, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	if err := s.q.MismatchTouch(ctx, db, dbsqlc.MismatchTouchParams{Source: source, RecordKeys: keys}); err != nil {
		return fmt.Errorf("store: keep mismatches: %w", err)
	}
	return nil
}

// MismatchDelete forgets the mismatches of source's records keys, judged in
// order.
func (s *Store) MismatchDelete(ctx context.Context, db DBTX, source string, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	if err := s.q.MismatchDelete(ctx, db, dbsqlc.MismatchDeleteParams{Source: source, RecordKeys: keys}); err != nil {
		return fmt.Errorf("store: forget mismatches: %w", err)
	}
	return nil
}

// MismatchClear deletes the mismatches of source that were last seen before
// startedAt, and returns how many.
func (s *Store) MismatchClear(ctx context.Context, db DBTX, source string, startedAt time.Time) (int64, error) {
	n, err := s.q.MismatchClear(ctx, db, dbsqlc.MismatchClearParams{Source: source, StartedAt: startedAt})
	if err != nil {
		return 0, fmt.Errorf("store: clear mismatches: %w", err)
	}
	return n, nil
}

// MismatchListParams asks MismatchList for a page of mismatches.
type MismatchListParams struct {
	// Source: only its mismatches; every source's when empty.
	Source string
	// Operation, when not nil: only those that name it.
	Operation *uuid.UUID
	// After, when not nil: the page after this mismatch (its FirstSeen,
	// Source, RecordKey, Reference and Kind), in the list's order.
	After *Mismatch
	// Max bounds the page.
	Max int
}

// MismatchList lists a page of mismatches as p asks, oldest first.
func (s *Store) MismatchList(ctx context.Context, db DBTX, p MismatchListParams) ([]Mismatch, error) {
	args := dbsqlc.MismatchListParams{Source: p.Source, Max: int32(p.Max)}
	if p.Operation != nil {
		id := pguuid.UUID(*p.Operation)
		args.OperationID = &id
	}
	if a := p.After; a != nil {
		first := a.FirstSeen
		args.AfterFirstSeen, args.AfterSource, args.AfterRecordKey, args.AfterReference, args.AfterKind =
			&first, a.Source, a.RecordKey, a.Reference, a.Kind
	}
	rows, err := s.q.MismatchList(ctx, db, args)
	if err != nil {
		return nil, fmt.Errorf("store: list mismatches: %w", err)
	}
	out := make([]Mismatch, len(rows))
	for i, r := range rows {
		m := Mismatch{Source: r.Source, RecordKey: r.RecordKey, Kind: r.Kind, Reference: r.Reference, Amount: r.Amount,
			RecordStatus: r.RecordStatus, RecordCreatedAt: r.RecordCreatedAt, Data: r.Data, Step: deref(r.Step),
			Detail: r.Detail, FirstSeen: r.FirstSeen, LastSeen: r.LastSeen, OperationName: deref(r.OperationName),
			OperationScope: deref(r.OperationScope)}
		if r.OperationID != nil {
			m.OperationID = uuid.UUID(*r.OperationID)
		}
		if r.OperationState != nil {
			m.OperationState = OperationState(*r.OperationState)
		}
		out[i] = m
	}
	return out, nil
}

// MismatchCount counts the mismatches of source (every source when empty),
// of the operation op when not nil.
func (s *Store) MismatchCount(ctx context.Context, db DBTX, source string, op *uuid.UUID) (int64, error) {
	args := dbsqlc.MismatchCountParams{Source: source}
	if op != nil {
		id := pguuid.UUID(*op)
		args.OperationID = &id
	}
	n, err := s.q.MismatchCount(ctx, db, args)
	if err != nil {
		return 0, fmt.Errorf("store: count mismatches: %w", err)
	}
	return n, nil
}

// MismatchCounts returns how many mismatches there are of each kind.
func (s *Store) MismatchCounts(ctx context.Context, db DBTX) (map[string]int64, error) {
	rows, err := s.q.MismatchCounts(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("store: count mismatches: %w", err)
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.Kind] = r.Count
	}
	return out, nil
}

// ReconciliationRun is a finished reconciliation run of a source.
type ReconciliationRun struct {
	Source       string
	StartedAt    time.Time
	CheckedAt    time.Time
	WindowStart  time.Time
	Checked      int64
	NotYet       int64
	Unverifiable int64
	Pages        int
	// StepsChecked counts the succeeded steps checked for a record; Expired
	// the records under keys of operations that may have been deleted.
	StepsChecked int64
	Expired      int64
}

// ReconciliationRunRecord records r as its source's last run, unless a run
// that started later is recorded already.
func (s *Store) ReconciliationRunRecord(ctx context.Context, db DBTX, r ReconciliationRun) error {
	err := s.q.ReconciliationRunRecord(ctx, db, dbsqlc.ReconciliationRunRecordParams{
		Source: r.Source, StartedAt: r.StartedAt, WindowStart: r.WindowStart, Checked: r.Checked,
		NotYet: r.NotYet, Unverifiable: r.Unverifiable, Pages: int32(r.Pages), StepsChecked: r.StepsChecked, Expired: r.Expired,
	})
	if err != nil {
		return fmt.Errorf("store: record reconciliation run: %w", err)
	}
	return nil
}

// ReconciliationRunGet reads source's last run; ErrNotFound before its first.
func (s *Store) ReconciliationRunGet(ctx context.Context, db DBTX, source string) (*ReconciliationRun, error) {
	r, err := s.q.ReconciliationRunGet(ctx, db, source)
	if err != nil {
		return nil, mapErr("get reconciliation run", err)
	}
	return &ReconciliationRun{Source: r.Source, StartedAt: r.StartedAt, CheckedAt: r.CheckedAt, WindowStart: r.WindowStart,
		Checked: r.Checked, NotYet: r.NotYet, Unverifiable: r.Unverifiable, Pages: int(r.Pages),
		StepsChecked: r.StepsChecked, Expired: r.Expired}, nil
}

// uuidTexts are ids as text, which every pgx query mode encodes in an array
// (the queries cast them back).
func uuidTexts(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// ReconcileNow reads the database's clock.
func (s *Store) ReconcileNow(ctx context.Context, db DBTX) (time.Time, error) {
	now, err := s.q.ReconcileNow(ctx, db)
	if err != nil {
		return time.Time{}, fmt.Errorf("store: read the clock: %w", err)
	}
	return now, nil
}
