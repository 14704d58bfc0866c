package engine

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
		rep.Expired, rep.StepsChecked = run.Expired, run.StepsChecked
	}
	err = e.snapshot(ctx, func(db store.DBTX) error {
		var err error
		if rep.Mismatches, err = e.mismatches(ctx, db, store.MismatchListParams{Source: source, Max: reconcileReportMax}); err != nil {
			return err
		}
		if rep.Total, err = e.store.MismatchCount(ctx, db, source, nil); err != nil {
			return fmt.Errorf("engine: reconciliation %s: %w", source, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rep.Truncated = rep.Total > int64(len(rep.Mismatches))
	return rep, nil
}

// Mismatches lists the mismatches of every source, oldest first: at most the
// first 1,000 (MismatchList pages through all of them).
func (e *Engine) Mismatches(ctx context.Context) ([]Mismatch, error) {
	return e.mismatches(ctx, e.pool, store.MismatchListParams{Max: reconcileReportMax})
}

// MismatchListOpts are options for MismatchList.
type MismatchListOpts struct {
	// Source: only its mismatches. Empty: every source's.
	Source string
	// Limit bounds the page. Defaults to 100; at most 1,000.
	Limit int
	// After is the Next of the previous page; empty for the first.
	After string
}

// MismatchListResult is a page of mismatches.
type MismatchListResult struct {
	// Mismatches are the page's, oldest first.
	Mismatches []Mismatch
	// Total counts the mismatches there are now (of the source, when one was
	// asked for), on every page.
	Total int64
	// Next is the After of the next page; empty after the last.
	Next string
}

// mismatchListDefault and the bound reconcileReportMax are the page sizes of
// MismatchList.
const mismatchListDefault = 100

// MismatchList lists a page of the mismatches, oldest first, and how many
// there are: opts (nil for the defaults) chooses the source and the page.
// An After that is not a Next it gave returns ErrInvalidCursor; a Limit out
// of range returns an error.
func (e *Engine) MismatchList(ctx context.Context, opts *MismatchListOpts) (*MismatchListResult, error) {
	if opts == nil {
		opts = &MismatchListOpts{}
	}
	limit := opts.Limit
	switch {
	case limit == 0:
		limit = mismatchListDefault
	case limit < 0 || limit > reconcileReportMax:
		return nil, fmt.Errorf("engine: mismatch list: the limit must be from 1 to %d, not %d", reconcileReportMax, limit)
	}
	p := store.MismatchListParams{Source: opts.Source, Max: limit + 1}
	if opts.After != "" {
		after, err := decodeMismatchCursor(opts.After)
		if err != nil {
			return nil, fmt.Errorf("engine: mismatch list: %w", err)
		}
		p.After = after
	}
	res := &MismatchListResult{}
	err := e.snapshot(ctx, func(db store.DBTX) error {
		list, err := e.mismatches(ctx, db, p)
		if err != nil {
			return err
		}
		res.Mismatches = list
		if len(list) > limit {
			res.Mismatches = list[:limit]
			res.Next = encodeMismatchCursor(&res.Mismatches[limit-1])
		}
		if res.Total, err = e.store.MismatchCount(ctx, db, opts.Source, nil); err != nil {
			return fmt.Errorf("engine: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// mismatchCursor is where a page of MismatchList ended: its last mismatch's
// place in the list's order.
type mismatchCursor struct {
	FirstSeen time.Time `json:"t"`
	Source    string    `json:"s"`
	Key       string    `json:"k"`
	Reference string    `json:"r"`
	Kind      string    `json:"n"`
}

func encodeMismatchCursor(m *Mismatch) string {
	b, _ := json.Marshal(mismatchCursor{FirstSeen: m.FirstSeen, Source: m.Source, Key: m.Key, Reference: m.Reference, Kind: string(m.Kind)})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeMismatchCursor(s string) (*store.Mismatch, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, ErrInvalidCursor
	}
	var c mismatchCursor
	if err := json.Unmarshal(b, &c); err != nil || c.FirstSeen.IsZero() || c.Kind == "" {
		return nil, ErrInvalidCursor
	}
	return &store.Mismatch{FirstSeen: c.FirstSeen, Source: c.Source, RecordKey: c.Key, Reference: c.Reference, Kind: c.Kind}, nil
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

func (e *Engine) mismatches(ctx context.Context, db store.DBTX, p store.MismatchListParams) ([]Mismatch, error) {
	rows, err := e.store.MismatchList(ctx, db, p)
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

// snapshot runs read in one read-only transaction that sees one snapshot of
// the database, so that a list and its total agree.
func (e *Engine) snapshot(ctx context.Context, read func(db store.DBTX) error) error {
	return pgx.BeginTxFunc(ctx, e.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error { return read(tx) })
}
