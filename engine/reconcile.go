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

	"github.com/idemflow/idemflow/store"
)

// Record is one of an outside service's records (a provider's refund), as a
// Source lists it for reconciliation.
type Record struct {
	// Key is the idempotency key the record was made under: an external
	// step's derived key, when one of our steps made it.
	Key string
	// Reference is the service's id of the record.
	Reference string
	// Amount is what it moved, in minor units.
	Amount int64
	// Status is how it ended; empty means RecordSucceeded.
	Status RecordStatus
	// CreatedAt is when the service made it.
	CreatedAt time.Time
	// Data is what else the step's ReconcileFunc compares (an order id, a
	// currency), kept as JSON with a mismatch for its report. May be nil.
	Data any
}

// RecordStatus is the status of a Record.
type RecordStatus string

// The statuses of a Record.
const (
	// RecordSucceeded: the service carried it out (money moved).
	RecordSucceeded RecordStatus = "succeeded"
	// RecordPending: accepted, not final yet; never judged until it is.
	RecordPending RecordStatus = "pending"
	// RecordFailed: final, and it moved nothing.
	RecordFailed RecordStatus = "failed"
)

func (s RecordStatus) orDefault() RecordStatus {
	if s == "" {
		return RecordSucceeded
	}
	return s
}

// MismatchKind says how a record and the steps disagree.
type MismatchKind string

// The kinds of mismatch that the engine tells itself; a ReconcileFunc may
// return MismatchAmountDiffers, MismatchReferenceDiffers or a kind of the
// application's.
const (
	// MismatchUnknownKey: a record that moved money under a key no operation
	// of ours holds (made outside the engine, or an operation the database
	// lost).
	MismatchUnknownKey MismatchKind = "unknown_key"
	// MismatchNotSucceeded: the service carried out the record, but the step
	// that holds its key did not succeed, and its operation finished.
	MismatchNotSucceeded MismatchKind = "not_succeeded"
	// MismatchRecordFailed: the step succeeded, but the service's record
	// says it failed and moved nothing.
	MismatchRecordFailed MismatchKind = "record_failed"
	// MismatchAmountDiffers: the record is not for what the operation asked
	// (its amount, or what the ReconcileFunc compares with it).
	MismatchAmountDiffers MismatchKind = "amount_differs"
	// MismatchReferenceDiffers: an operator resolved the step as made under
	// one reference, and the service's record under its key has another.
	MismatchReferenceDiffers MismatchKind = "reference_differs"
)

// MismatchKinds are the kinds the engine knows, for a gauge's labels.
var MismatchKinds = []MismatchKind{MismatchUnknownKey, MismatchNotSucceeded, MismatchRecordFailed, MismatchAmountDiffers, MismatchReferenceDiffers}

// ReconcileFunc compares rec, the service's record under the step's derived
// key, with the input of the operation whose step succeeded, and returns the
// kind of mismatch, or "" when they agree.
type ReconcileFunc[In any] func(in In, rec Record) MismatchKind

// ListRequest asks a Source for one page of its records.
type ListRequest struct {
	// Since: only records made after it, oldest first.
	Since time.Time
	// Cursor is where the previous page ended (its next); empty for the first.
	Cursor string
	// Limit bounds the page (Source.PageSize).
	Limit int
}

// ListFunc lists one page of a service's records. It returns the cursor of
// the next page, or "" after the last one.
type ListFunc func(ctx context.Context, req ListRequest) (records []Record, next string, err error)

// Source is an outside service whose records reconciliation checks against
// the steps that call it.
type Source struct {
	// Name names the source in mismatches and reports ("provider").
	Name string
	// List lists its records, in pages.
	List ListFunc
	// PageSize is the Limit of every page. Defaults to 1000.
	PageSize int
}

// ReconcileConfig configures reconciliation (Config.Reconcile).
type ReconcileConfig struct {
	// Sources are the outside services to check; none, no reconciliation.
	Sources []Source
	// Interval is how often River's leader runs every source. Defaults to
	// DefaultReconcileInterval; negative: only on request (Engine.Reconcile).
	Interval time.Duration
	// Window is how far back a run reads records. Defaults to, and may not
	// exceed, the shortest retention of the engine's operation types that
	// call out: an operation deleted by the retention job would leave its
	// records looking unknown.
	Window time.Duration
}

// DefaultReconcileInterval is how often reconciliation runs by default.
const DefaultReconcileInterval = time.Minute

// Mismatch is a record of a Source that disagrees with the steps, as a
// reconciliation run or CheckRecord found it. It stays until a later run no
// longer finds it, and makes the operation it names need attention.
type Mismatch struct {
	Source string
	Kind   MismatchKind
	// The record: its key, reference, amount, status, when it was made, and
	// its Data as JSON.
	Key             string
	Reference       string
	Amount          int64
	RecordStatus    RecordStatus
	RecordCreatedAt time.Time
	Data            json.RawMessage
	// OperationID is the operation whose step Step holds the key; uuid.Nil
	// for MismatchUnknownKey. Operation, Scope and OperationStatus are that
	// operation's as they are now (empty once it was deleted).
	OperationID     uuid.UUID
	Step            string
	Operation       string
	Scope           string
	OperationStatus Status
	// Detail says what differs, for operators.
	Detail string
	// FirstSeen and LastSeen are when a run (or CheckRecord) found it first
	// and last.
	FirstSeen time.Time
	LastSeen  time.Time
}

// ReconcileReport is what a source's last reconciliation run found.
type ReconcileReport struct {
	Source string
	// CheckedAt is when the last run ended; nil before the first.
	CheckedAt *time.Time
	// WindowStart: the run read the records made after it.
	WindowStart time.Time
	// Checked counts the records it read; NotYet those it could not judge
	// yet (pending, or their operation in progress); Unverifiable those
	// under derived keys of schemes before "idf3_", whose operation cannot
	// be found from the key; Pages the pages it read.
	Checked      int64
	NotYet       int64
	Unverifiable int64
	Pages        int
	// Mismatches are the source's mismatches now: those of the last run and
	// any that CheckRecord found since, oldest first.
	Mismatches []Mismatch
}

// ErrUnknownSource is returned for a source name that Config.Reconcile does
// not have.
var ErrUnknownSource = errors.New("no such reconciliation source")

// reconcileReportMax bounds the mismatches that a report lists.
const reconcileReportMax = 1000

func (c *ReconcileConfig) validate(retention time.Duration) error {
	seen := map[string]bool{}
	for _, s := range c.Sources {
		switch {
		case s.Name == "":
			return errors.New("reconcile: a source has no name")
		case seen[s.Name]:
			return fmt.Errorf("reconcile: source %q given twice", s.Name)
		case s.List == nil:
			return fmt.Errorf("reconcile: source %q has no List", s.Name)
		case s.PageSize < 0:
			return fmt.Errorf("reconcile: source %q: page size must not be negative", s.Name)
		}
		seen[s.Name] = true
	}
	if c.Window < 0 {
		return errors.New("reconcile: window must not be negative")
	}
	if c.Window > retention {
		return fmt.Errorf("reconcile: window %s exceeds the shortest retention, %s: records of deleted operations would look unknown", c.Window, retention)
	}
	return nil
}

// shortestRetention is the shortest retention of the engine's operation
// types that call out (whose steps a record may name).
func (e *Engine) shortestRetention() time.Duration {
	r := e.cfg.Retention
	for _, d := range e.defs {
		if d.retention > 0 && slices.ContainsFunc(d.steps, func(s *stepDef) bool { return s.kind == StepKindExternal }) {
			r = min(r, d.retention)
		}
	}
	return r
}

func (e *Engine) source(name string) (*Source, error) {
	for i := range e.cfg.Reconcile.Sources {
		if s := &e.cfg.Reconcile.Sources[i]; s.Name == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("engine: %w: %q", ErrUnknownSource, name)
}

// Reconcile runs one reconciliation of the source named source now and returns
// its report: it reads the source's records made within the window
// (ReconcileConfig.Window), page by page, and matches each, by its key, with
// the step whose derived key it is. A record is judged once it is final
// (not RecordPending) and the operation holding its key has finished:
//   - a record that moved money under no key of ours: MismatchUnknownKey;
//   - one that moved money while its step did not succeed: MismatchNotSucceeded
//     (a step compensated since undid it, and is in order);
//   - one that failed while its step succeeded: MismatchRecordFailed;
//   - one whose step an operator resolved under another reference:
//     MismatchReferenceDiffers;
//   - else what the step's ReconcileFunc says.
//
// What it finds is kept (store table idemflow_mismatch) with its last sighting;
// the mismatches of the source that it did not see again are deleted as it
// ends. Records under keys of the schemes before "idf3_" are counted as
// unverifiable, never as mismatches. Memory is bounded by a page, whatever
// the window holds. Runs of one source may overlap (the periodic one and one
// on request): each only deletes what was last seen before it started.
func (e *Engine) Reconcile(ctx context.Context, source string) (*ReconcileReport, error) {
	src, err := e.source(source)
	if err != nil {
		return nil, err
	}
	started, err := e.store.ReconcileNow(ctx, e.control)
	if err != nil {
		return nil, fmt.Errorf("engine: reconcile %s: %w", source, err)
	}
	run := store.ReconciliationRun{Source: source, StartedAt: started, WindowStart: started.Add(-e.reconcileWindow())}
	limit := src.PageSize
	if limit == 0 {
		limit = 1000
	}
	req := ListRequest{Since: run.WindowStart, Limit: limit}
	for {
		recs, next, err := src.List(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("engine: reconcile %s: list page %d: %w", source, run.Pages+1, err)
		}
		run.Pages++
		run.Checked += int64(len(recs))
		j, err := e.judge(ctx, e.pool, source, recs)
		if err != nil {
			return nil, fmt.Errorf("engine: reconcile %s: page %d: %w", source, run.Pages, err)
		}
		run.NotYet += int64(len(j.notYet))
		run.Unverifiable += j.unverifiable
		if err := e.store.MismatchUpsert(ctx, e.pool, source, j.found); err != nil {
			return nil, fmt.Errorf("engine: reconcile %s: %w", source, err)
		}
		if err := e.store.MismatchTouch(ctx, e.pool, source, j.notYet); err != nil {
			return nil, fmt.Errorf("engine: reconcile %s: %w", source, err)
		}
		if next == "" { // an empty page with a cursor is not the end
			break
		}
		if next == req.Cursor {
			return nil, fmt.Errorf("engine: reconcile %s: the source answered page %d with the cursor it was asked with, %q", source, run.Pages, next)
		}
		req.Cursor = next
	}
	cleared, err := e.store.MismatchClear(ctx, e.pool, source, started)
	if err != nil {
		return nil, fmt.Errorf("engine: reconcile %s: %w", source, err)
	}
	if err := e.store.ReconciliationRunRecord(ctx, e.pool, run); err != nil {
		return nil, fmt.Errorf("engine: reconcile %s: %w", source, err)
	}
	report, err := e.Reconciliation(ctx, source)
	if err != nil {
		return nil, err
	}
	e.observeReconciled(ctx, source)
	e.logger.InfoContext(ctx, "reconciled", slog.String("source", source), slog.Int64("checked", run.Checked),
		slog.Int("mismatches", len(report.Mismatches)), slog.Int64("cleared", cleared), slog.Int("pages", run.Pages))
	return report, nil
}

func (e *Engine) reconcileWindow() time.Duration {
	if w := e.cfg.Reconcile.Window; w > 0 {
		return w
	}
	return e.shortestRetention()
}

// Reconciliation returns the report of source's last run, with the
// mismatches the source has now.
func (e *Engine) Reconciliation(ctx context.Context, source string) (*ReconcileReport, error) {
	if _, err := e.source(source); err != nil {
		return nil, err
	}
	rep := &ReconcileReport{Source: source}
	run, err := e.store.ReconciliationRunGet(ctx, e.pool, source)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return nil, fmt.Errorf("engine: reconciliation %s: %w", source, err)
	default:
		checked := run.CheckedAt
		rep.CheckedAt, rep.WindowStart = &checked, run.WindowStart
		rep.Checked, rep.NotYet, rep.Unverifiable, rep.Pages = run.Checked, run.NotYet, run.Unverifiable, run.Pages
	}
	if rep.Mismatches, err = e.mismatches(ctx, source, nil); err != nil {
		return nil, err
	}
	return rep, nil
}

// Mismatches lists the mismatches of every source, oldest first (at most
// 1,000).
func (e *Engine) Mismatches(ctx context.Context) ([]Mismatch, error) {
	return e.mismatches(ctx, "", nil)
}

// MismatchCounts returns how many mismatches there are of each kind, every
// kind of MismatchKinds included: what a gauge shows.
func (e *Engine) MismatchCounts(ctx context.Context) (map[MismatchKind]int64, error) {
	counts, err := e.store.MismatchCounts(ctx, e.pool)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	out := make(map[MismatchKind]int64, len(MismatchKinds)+len(counts))
	for _, k := range MismatchKinds {
		out[k] = 0
	}
	for k, n := range counts {
		out[MismatchKind(k)] = n
	}
	return out, nil
}

func (e *Engine) mismatches(ctx context.Context, source string, op *uuid.UUID) ([]Mismatch, error) {
	rows, err := e.store.MismatchList(ctx, e.pool, source, op, reconcileReportMax)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	out := make([]Mismatch, len(rows))
	for i, r := range rows {
		out[i] = Mismatch{
			Source: r.Source, Kind: MismatchKind(r.Kind), Key: r.RecordKey, Reference: r.Reference, Amount: r.Amount,
			RecordStatus: RecordStatus(r.RecordStatus), RecordCreatedAt: r.RecordCreatedAt, Data: r.Data,
			OperationID: r.OperationID, Step: r.Step, Operation: r.OperationName, Scope: r.OperationScope,
			OperationStatus: Status(r.OperationState), Detail: r.Detail, FirstSeen: r.FirstSeen, LastSeen: r.LastSeen,
		}
	}
	return out, nil
}

// CheckRecord judges one record of source at once, as a run would, for an
// event the application received (a provider's webhook): a mismatch is kept
// and returned (a later run clears it if it no longer finds it); a record in
// order clears its mismatch, if it had one; one that cannot be judged yet
// (pending, its operation in progress, a key of an older scheme) changes
// nothing, and both return nil. tx, when not nil, is the application's
// transaction to do it in (the event's, so that it is checked exactly
// once with it); else the engine's pool.
func (e *Engine) CheckRecord(ctx context.Context, tx pgx.Tx, source string, rec Record) (*Mismatch, error) {
	if _, err := e.source(source); err != nil {
		return nil, err
	}
	var db store.DBTX = e.pool
	if tx != nil {
		db = tx
	}
	j, err := e.judge(ctx, db, source, []Record{rec})
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
	return &Mismatch{Source: source, Kind: MismatchKind(m.Kind), Key: m.RecordKey, Reference: m.Reference, Amount: m.Amount,
		RecordStatus: RecordStatus(m.RecordStatus), RecordCreatedAt: m.RecordCreatedAt, Data: m.Data,
		OperationID: m.OperationID, Step: m.Step, Detail: m.Detail}, nil
}

// judgement is what judge made of a page of records.
type judgement struct {
	found        []store.Mismatch
	notYet       []string
	inOrder      []string
	unverifiable int64
}

// judge matches a page of records with the steps, in three reads whatever its
// size: the operations their keys name, those operations' steps, and (only
// for steps an operator resolved) the operators' references.
func (e *Engine) judge(ctx context.Context, db store.DBTX, source string, recs []Record) (*judgement, error) {
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
		rec  *Record
		op   *store.ReconcileOperation
		step string
	}
	var matched []match
	var judgedIDs []uuid.UUID
	var names []string
	for i := range recs {
		r := &recs[i]
		status := r.Status.orDefault()
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
		case status == RecordPending:
			j.notYet = append(j.notYet, r.Key)
		case step == "":
			if status == RecordSucceeded {
				j.found = append(j.found, mismatchOf(r, MismatchUnknownKey, uuid.Nil, "",
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
	type stepKey struct {
		id   uuid.UUID
		name string
	}
	byKey := make(map[stepKey]store.ReconcileStep, len(steps))
	var resolvedIDs []uuid.UUID
	for _, m := range matched {
		if slices.Contains(m.op.Checkpointed, m.step) {
			byKey[stepKey{m.op.ID, m.step}] = store.ReconcileStep{OperationID: m.op.ID, Name: m.step, State: store.StepSucceeded}
		}
	}
	for _, s := range steps { // a row wins over a checkpoint
		byKey[stepKey{s.OperationID, s.Name}] = s
		if s.ResolvedBy == ResolvedByOperator {
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
		st, recorded := byKey[stepKey{op.ID, m.step}]
		succeeded := recorded && st.State == store.StepSucceeded
		undone := recorded && st.State == store.StepCompensated
		status := r.Status.orDefault()
		kind, detail := MismatchKind(""), ""
		switch {
		case status == RecordSucceeded && !succeeded && !undone:
			kind, detail = MismatchNotSucceeded, fmt.Sprintf("the record moved money; the operation %s and its step %s did not succeed", op.State, m.step)
		case status == RecordFailed && succeeded:
			kind, detail = MismatchRecordFailed, fmt.Sprintf("the step %s succeeded; the record failed and moved nothing", m.step)
		case status == RecordSucceeded && succeeded:
			kind, detail = e.compare(op, m.step, st, refs[op.ID], r)
		}
		if kind == "" {
			j.inOrder = append(j.inOrder, r.Key)
			continue
		}
		j.found = append(j.found, mismatchOf(r, kind, op.ID, m.step, detail))
	}
	j.found = lastOfEach(j.found)
	return j, nil
}

// lastOfEach keeps one mismatch per (record key, reference), the last: a
// page that lists a record twice is upserted once.
func lastOfEach(ms []store.Mismatch) []store.Mismatch {
	type id struct{ key, ref string }
	seen := make(map[id]int, len(ms))
	out := ms[:0]
	for _, m := range ms {
		k := id{m.RecordKey, m.Reference}
		if i, ok := seen[k]; ok {
			out[i] = m
			continue
		}
		seen[k] = len(out)
		out = append(out, m)
	}
	return out
}

// compare compares a succeeded step's record with what the operator said
// (a step resolved by one) and with its operation's input (the step's
// ReconcileFunc).
func (e *Engine) compare(op *store.ReconcileOperation, step string, st store.ReconcileStep, operatorRef string, r *Record) (MismatchKind, string) {
	if st.ResolvedBy == ResolvedByOperator && operatorRef != "" && r.Reference != "" && operatorRef != r.Reference {
		return MismatchReferenceDiffers, fmt.Sprintf("an operator resolved the step as made under %q; the record is %q", operatorRef, r.Reference)
	}
	def := e.def(op.Name, op.Version)
	if def == nil {
		return "", "" // another process's version: nothing to compare with here
	}
	i, ok := def.index[step]
	if !ok || def.steps[i].reconcile == nil {
		return "", ""
	}
	sd := def.steps[i]
	in, err := def.reloadInput(op.Input)
	if err != nil {
		e.logger.Warn("reconcile: the operation's input does not decode; its record is not compared",
			slog.String("operation_id", op.ID.String()), slog.Any("error", err))
		return "", ""
	}
	kind := sd.reconcile(in, *r)
	if kind == "" {
		return "", ""
	}
	return kind, fmt.Sprintf("the record (amount %d, reference %q) is not what the operation asked for", r.Amount, r.Reference)
}

func mismatchOf(r *Record, kind MismatchKind, op uuid.UUID, step, detail string) store.Mismatch {
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
		RecordStatus: string(r.Status.orDefault()), RecordCreatedAt: created, Data: data,
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
