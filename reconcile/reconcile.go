// Package reconcile holds what an outside service tells idemflow about its
// records (a payment provider's refunds, say), so that the engine can check
// them against the steps that called it: a Source lists Records in pages, and
// a mismatch has a Kind.
//
//	src := reconcile.Source{
//		Name: "provider",
//		List: func(ctx context.Context, req reconcile.ListRequest) ([]reconcile.Record, string, error) {
//			page, err := client.ListRefunds(ctx, req.Since, req.Cursor, req.Limit)
//			if err != nil {
//				return nil, "", err
//			}
//			recs := make([]reconcile.Record, len(page.Refunds))
//			for i, r := range page.Refunds {
//				recs[i] = reconcile.Record{Key: r.IdempotencyKey, Reference: r.ID, Amount: r.Amount, CreatedAt: r.Created}
//			}
//			return recs, page.Next, nil
//		},
//	}
//	cfg := &engine.Config{Reconcile: reconcile.Config{Sources: []reconcile.Source{src}}}
//
// The package imports nothing of the engine: a provider's adapter implements a
// Source with it alone. The engine's side (runs, reports, the mismatches it
// keeps, ExternalStepDef.Compare) is in package engine.
package reconcile

import (
	"context"
	"time"
)

// Record is one of an outside service's records (a provider's refund), as a
// Source lists it.
type Record struct {
	// Key is the idempotency key the record was made under: an external
	// step's derived key, when one of our steps made it.
	Key string
	// Reference is the service's id of the record.
	Reference string
	// Amount is what it moved, in minor units.
	Amount int64
	// Status is how it ended; empty means Succeeded.
	Status Status
	// CreatedAt is when the service made it.
	CreatedAt time.Time
	// Data is what else the step's reconcile function compares (an order id,
	// a currency), kept as JSON with a mismatch for its report. May be nil.
	Data any
}

// Status is the status of a Record.
type Status string

// The statuses of a Record.
const (
	// Succeeded: the service carried it out (money moved).
	Succeeded Status = "succeeded"
	// Pending: accepted, not final yet; never judged until it is.
	Pending Status = "pending"
	// Failed: final, and it moved nothing.
	Failed Status = "failed"
)

// OrDefault is s, or Succeeded when s is empty.
func (s Status) OrDefault() Status {
	if s == "" {
		return Succeeded
	}
	return s
}

// Kind says how a record and the steps disagree.
type Kind string

// The kinds of mismatch that the engine tells itself; a step's reconcile
// function may return AmountDiffers or a kind of the application's.
const (
	// UnknownKey: a record that moved money under a key no operation of ours
	// holds (made outside the engine, or an operation the database lost).
	UnknownKey Kind = "unknown_key"
	// NotSucceeded: the service carried out the record, but the step that
	// holds its key did not succeed, and its operation finished.
	NotSucceeded Kind = "not_succeeded"
	// RecordFailed: the step succeeded, but the service's record says it
	// failed and moved nothing.
	RecordFailed Kind = "record_failed"
	// AmountDiffers: the record is not for what the operation asked (its
	// amount, or what the reconcile function compares with it).
	AmountDiffers Kind = "amount_differs"
	// ReferenceDiffers: the step succeeded under one reference in the books
	// (whoever recorded it: its call, its lookup, an event or an operator),
	// and the service's record under its key has another.
	ReferenceDiffers Kind = "reference_differs"
	// MissingRecord: the step succeeded in the books, but the service lists
	// no record under its key (only for steps whose records a source lists,
	// once their success is older than their settle window).
	MissingRecord Kind = "missing_record"
)

// Kinds are the kinds the engine knows, for a gauge's labels.
var Kinds = []Kind{UnknownKey, NotSucceeded, RecordFailed, AmountDiffers, ReferenceDiffers, MissingRecord}

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

// Config configures reconciliation (the engine's Config.Reconcile).
type Config struct {
	// Sources are the outside services to check; none, no reconciliation.
	Sources []Source
	// Interval is how often River's leader runs every source. Defaults to
	// DefaultInterval; negative: only on request (Engine.Reconcile).
	Interval time.Duration
	// Window is how far back a run reads records. Defaults to, and may not
	// exceed, the shortest retention of the engine's operation types that
	// call out: an operation deleted by the retention job would leave its
	// records looking unknown. With retention off (engine.Off), it defaults
	// to a day, which the runs before read already.
	Window time.Duration
}

// DefaultInterval is how often reconciliation runs by default.
const DefaultInterval = time.Minute
