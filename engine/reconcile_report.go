package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/reconcile"
	"github.com/idemflow/idemflow/store"
)

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
// kind of reconcile.Kinds included: what a gauge shows.
func (e *Engine) MismatchCounts(ctx context.Context) (map[reconcile.Kind]int64, error) {
	counts, err := e.store.MismatchCounts(ctx, e.pool)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	out := make(map[reconcile.Kind]int64, len(reconcile.Kinds)+len(counts))
	for _, k := range reconcile.Kinds {
		out[k] = 0
	}
	for k, n := range counts {
		out[reconcile.Kind(k)] = n
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
			Source: r.Source, Kind: reconcile.Kind(r.Kind), Key: r.RecordKey, Reference: r.Reference, Amount: r.Amount,
			RecordStatus: reconcile.Status(r.RecordStatus), RecordCreatedAt: r.RecordCreatedAt, Data: r.Data,
			OperationID: r.OperationID, Step: r.Step, Operation: r.OperationName, Scope: r.OperationScope,
			OperationStatus: Status(r.OperationState), Detail: r.Detail, FirstSeen: r.FirstSeen, LastSeen: r.LastSeen,
		}
	}
	return out, nil
}
