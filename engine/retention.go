package engine

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/idemflow/idemflow/store"
)

// Retention bounds: each batch deletes at most retentionBatch operations within
// retentionBatchTimeout, so that the job never holds locks for long.
const (
	retentionBatch        = 1000
	retentionBatchTimeout = 5 * time.Second
)

// retention is how long an operation of def is kept once it finished.
func (e *Engine) retention(def *opDef) time.Duration {
	if def.retention > 0 {
		return def.retention
	}
	return e.cfg.Retention
}

// DeleteFinished deletes the finished operations whose retention has passed
// before now (nil: the database's clock, as the retention job uses), in
// batches, and returns how many it deleted. An operation's retention is the
// one of the process that finished it (its OperationOpts.Retention, else
// Config.Retention), stored with it then: a later deploy that shortens the
// retention, or a process that does not run the type, never frees its key
// early. Operations that finished before store migration 00009 have none
// stored, and go by this process's retention for their type (its
// Config.Retention for a type it does not run). Operations in progress are
// never deleted; rows of the application that name an operation are not
// touched. A key whose operation was deleted is free: a request that uses it
// again starts a new operation. The retention job calls it; tests and
// operators may too.
func (e *Engine) DeleteFinished(ctx context.Context, now *time.Time) (int, error) {
	total, err := e.deleteFinished(ctx, store.OperationDeleteFinishedParams{Now: now, Expired: true})
	if err != nil {
		return total, err
	}
	var own []string
	for name, versions := range e.versions {
		// One retention per name: the longest of its versions', so that no
		// version's operations go before their time.
		var retention time.Duration
		for _, v := range versions {
			retention = max(retention, e.def(name, int(v)).retention)
		}
		if retention == 0 {
			continue
		}
		own = append(own, name)
		if retention == forever {
			continue
		}
		n, err := e.deleteFinished(ctx, store.OperationDeleteFinishedParams{Now: now, Retention: retention, Name: name})
		total += n
		if err != nil {
			return total, err
		}
	}
	if e.cfg.Retention != forever {
		n, err := e.deleteFinished(ctx, store.OperationDeleteFinishedParams{Now: now, Retention: e.cfg.Retention, Exclude: own})
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, e.deleteOutcomes(ctx, now)
}

// deleteOutcomes deletes what the inbox received longer ago than the longest
// retention here, and than Config.Retention, but what a waiting step has yet
// to read: by then the operation it was for has finished and gone, or
// reconciliation judges what arrives.
func (e *Engine) deleteOutcomes(ctx context.Context, now *time.Time) error {
	keep := e.cfg.Retention
	for _, d := range e.defs {
		keep = max(keep, d.retention)
	}
	before := time.Now()
	if now != nil {
		before = *now
	}
	before = before.Add(-keep)
	for {
		n, err := e.store.OutcomeDeleteBefore(ctx, e.control, before, retentionBatch)
		if err != nil {
			return fmt.Errorf("engine: %w", err)
		}
		if n < retentionBatch {
			return nil
		}
	}
}

func (e *Engine) deleteFinished(ctx context.Context, p store.OperationDeleteFinishedParams) (int, error) {
	p.Max, p.Timeout = retentionBatch, retentionBatchTimeout
	total := 0
	for {
		n, err := e.store.OperationDeleteFinished(ctx, e.control, p)
		total += n
		if err != nil {
			return total, fmt.Errorf("engine: %w", err)
		}
		if n < p.Max {
			return total, nil
		}
	}
}

// retentionArgs is the periodic job that deletes expired operations.
type retentionArgs struct{}

// Kind implements river.JobArgs.
func (retentionArgs) Kind() string { return "idemflow_retention" }

type retentionWorker struct {
	river.WorkerDefaults[retentionArgs]
	e *Engine
}

// Work deletes the operations whose retention has passed.
func (w *retentionWorker) Work(ctx context.Context, job *river.Job[retentionArgs]) error {
	n, err := w.e.DeleteFinished(ctx, nil)
	if n > 0 {
		w.e.logger.InfoContext(ctx, "deleted finished operations past their retention", slog.Int("deleted", n))
	}
	return err
}
