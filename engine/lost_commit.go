package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idemflow/idemflow/store"
)

// reservationConfirmTimeout bounds how long a first attempt whose
// reservation's answer was lost looks for it: long enough for a failover to
// a standby to accept connections, within the HTTP layer's reserve timeout.
const reservationConfirmTimeout = 5 * time.Second

// reservedAfterAll reports whether a first attempt's reservation committed
// although its answer was lost: the connection broke during COMMIT, as in a
// failover, where a synchronous standby may have it. It reads the operation
// by id, on a connection of the pool (the new primary's, after a failover),
// until it finds it, learns that it is not there, or reservationConfirmTimeout
// passes. Found, the operation is handed to a River job at once: this run has
// stopped, and the operation's lease would keep it waiting. Not told in time
// (the failover takes longer), the run is stranded: should the reservation
// have committed, this process hands the operation to a River job as soon as
// the database answers (rescueLoop), rather than leave it to its lease.
func (r *run) reservedAfterAll(ctx context.Context) bool {
	ctx = context.WithoutCancel(ctx)
	deadline := time.Now().Add(reservationConfirmTimeout)
	for {
		rctx, cancel := context.WithTimeout(ctx, existingReadTimeout)
		rec, err := r.e.store.OperationGet(rctx, r.e.pool, r.id)
		cancel()
		switch {
		case err == nil:
			r.logger().WarnContext(ctx, "the reservation's answer was lost, and it had committed; the operation resumes in a River job")
			r.handOverLost(ctx, rec)
			return true
		case errors.Is(err, store.ErrNotFound):
			return false
		case time.Now().After(deadline):
			r.e.strand(r, false)
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// handOverLost gives back the operation that this run reserved and stopped
// holding, with a resume job, in one transaction; should that fail, it
// resumes when its lease ends.
func (r *run) handOverLost(ctx context.Context, rec *store.Operation) {
	err := func() error {
		tx, err := r.e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer rollback(ctx, tx)
		ok, err := r.e.store.OperationGiveBack(ctx, tx, r.id, r.runID, time.Now())
		if err != nil || !ok {
			return err
		}
		if err := r.e.enqueueResume(ctx, tx, resumeArgs{OperationID: r.id, Operation: rec.Name, Scope: rec.Scope}, time.Time{}); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}()
	if err != nil {
		r.logger().WarnContext(ctx, "could not hand the operation to a River job; it resumes once its lease expires", slog.Any("error", err))
	}
}
