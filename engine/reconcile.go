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

	"github.com/idemflow/idemflow/reconcile"
	"github.com/idemflow/idemflow/store"
)

// Mismatch is a record of a Source that disagrees with the steps, or a
// succeeded step whose record the source lacks (reconcile.MissingRecord), as
// a reconciliation run or CheckRecord found it. It stays until a later run no
// longer finds it, and makes the operation it names need attention. One is
// kept per record and kind: a record may be wrong in two ways at once.
type Mismatch struct {
	Source string
	Kind   reconcile.Kind
	// The record: its key, reference, amount, status, when it was made, and
	// its Data as JSON. For reconcile.MissingRecord, which has no record,
	// they are the step's: its derived key, the reference the books hold
	// (empty when they hold none), when it succeeded, and an empty status,
	// amount and data.
	Key             string
	Reference       string
	Amount          int64
	RecordStatus    reconcile.Status
	RecordCreatedAt time.Time
	Data            json.RawMessage
	// OperationID is the operation whose step Step holds the key; uuid.Nil
	// for reconcile.UnknownKey. Operation, Scope and OperationStatus are that
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
	// be found from the key; Expired those under keys of operations that no
	// longer exist and may have been deleted by the retention job (see
	// Engine.Reconcile); Pages the pages it read.
	Checked      int64
	NotYet       int64
	Unverifiable int64
	Expired      int64
	Pages        int
	// StepsChecked counts the books' succeeded steps that the run checked for
	// a record (see ExternalStepDef.Records).
	StepsChecked int64
	// Mismatches are the source's mismatches now: those of the last run and
	// any that CheckRecord found since, oldest first; at most the first
	// 1,000 (Engine.MismatchList pages through all of them).
	Mismatches []Mismatch
	// Total counts the source's mismatches now; Truncated is true when
	// Mismatches lists fewer.
	Total     int64
	Truncated bool
}

// reconcileReportMax bounds the mismatches that a report, and a page of
// MismatchList, lists.
const reconcileReportMax = 1000

func validateReconcile(c *reconcile.Config, retention time.Duration) error {
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

func (e *Engine) source(name string) (*reconcile.Source, error) {
	for i := range e.cfg.Reconcile.Sources {
		if s := &e.cfg.Reconcile.Sources[i]; s.Name == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("engine: %w: %q", ErrUnknownSource, name)
}

// Reconcile runs one reconciliation of the source named source now and returns
// its report: it reads the source's records made within the window
// (reconcile.Config.Window), page by page, and matches each, by its key, with
// the step whose derived key it is. A record is judged once it is final
// (not reconcile.Pending) and the operation holding its key has finished:
//   - a record that moved money under no key of ours: reconcile.UnknownKey;
//   - one that moved money while its step did not succeed: reconcile.NotSucceeded
//     (a step compensated since undid it, and is in order);
//   - one that failed while its step succeeded: reconcile.RecordFailed;
//   - one whose reference is not the one the books hold for its succeeded
//     step, whoever recorded it (the call, the lookup, an event, an
//     operator): reconcile.ReferenceDiffers;
//   - else what the step's reconcile function (ExternalStepDef.Compare) says.
//
// Then the other way: the succeeded steps whose records the source lists
// (ExternalStepDef.Records), of the finished operations created within the
// window and whose success is at least their outcome window old, are checked
// against the keys the run listed: a step whose key was not listed is
// reconcile.MissingRecord. Operations created in the window's first minute
// (a quarter of it, when shorter) are left to the runs before: a record made
// just after them may be dated before the window by the source's clock.
//
// A record under a key of ours whose operation no longer exists, made longer
// ago than the shortest retention (a key of scheme 3 tells when), is counted
// as expired, not as an unknown key: the retention job may have deleted its
// operation, and the books hold nothing to judge it against.
//
// What it finds is kept (store table idemflow_mismatch) with its last sighting;
// the mismatches of the source that it did not see again are deleted as it
// ends. Records under keys of the schemes before "idf3_" are counted as
// unverifiable, never as mismatches. Memory is bounded by a page and 8 bytes
// per record listed (the keys seen, hashed), whatever the window holds. Runs
// of one source may overlap (the periodic one and one on request): each only
// deletes what was last seen before it started.
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
	seen := newKeySet()
	req := reconcile.ListRequest{Since: run.WindowStart, Limit: limit}
	for {
		recs, next, err := src.List(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("engine: reconcile %s: list page %d: %w", source, run.Pages+1, err)
		}
		run.Pages++
		run.Checked += int64(len(recs))
		for i := range recs {
			seen.add(recs[i].Key)
		}
		j, err := e.judge(ctx, e.pool, source, recs, started)
		if err != nil {
			return nil, fmt.Errorf("engine: reconcile %s: page %d: %w", source, run.Pages, err)
		}
		run.NotYet += int64(len(j.notYet))
		run.Unverifiable += j.unverifiable
		run.Expired += j.expired
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
	if run.StepsChecked, err = e.checkBooks(ctx, source, &run, seen); err != nil {
		return nil, fmt.Errorf("engine: reconcile %s: the books: %w", source, err)
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
		slog.Int64("steps_checked", run.StepsChecked), slog.Int64("mismatches", report.Total), slog.Int64("cleared", cleared),
		slog.Int("pages", run.Pages))
	return report, nil
}

// reconcileWindow is how far back a run reads the source: Config.Reconcile's
// Window, else the shortest retention, else (retention off) the default
// retention's day, which the runs before it read already.
func (e *Engine) reconcileWindow() time.Duration {
	if w := e.cfg.Reconcile.Window; w > 0 {
		return w
	}
	if r := e.shortestRetention(); r != forever {
		return r
	}
	return defaultRetention
}
