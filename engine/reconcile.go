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
