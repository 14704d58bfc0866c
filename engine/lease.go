package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// keepLease renews the run's lease every third of it while the run works, and
// stops the run when another run has taken the operation over, or when it
// could not renew the lease and the one it holds is about to run out (a run
// that went on past it could meet the run that takes the operation over). It
// arms a timer rather than start a goroutine: most runs end long before the
// first renewal.
func (r *run) keepLease(ctx context.Context) (stop func()) {
	lease := r.e.cfg.Lease
	every, margin := lease/3, lease/10
	r.mu.Lock()
	held := r.leaseFrom.Add(lease) // the lease runs out by then at the latest
	r.mu.Unlock()
	wasReserved := r.isReserved()
	var (
		mu      sync.Mutex
		stopped bool
		timer   *time.Timer
	)
	renew := func() {
		if ctx.Err() != nil {
			return
		}
		next := every
		if !wasReserved && r.isReserved() {
			// The reservation committed: its lease counts from when it was sent,
			// later than the run began.
			wasReserved = true
			r.mu.Lock()
			held = r.leaseFrom.Add(lease)
			r.mu.Unlock()
		}
		if !r.isReserved() && time.Until(held) <= margin {
			// The reservation has not committed in a lease (the database does
			// not answer): stop, so that nothing waits on it for ever. Should it
			// commit after all, its lease has expired, and a sweep resumes it.
			r.logger().ErrorContext(ctx, "the reservation did not commit within the lease; stopping the run")
			r.cancelRun(errLeaseExpiring)
			return
		}
		if !r.isReserved() {
			next = min(every, max(time.Until(held)-margin, time.Millisecond))
		} else {
			sent := time.Now()
			rctx, cancel := context.WithTimeout(ctx, min(every, time.Until(held)-margin))
			ok, err := r.e.store.OperationRenewLease(rctx, r.e.control, r.id, r.runID, lease)
			cancel()
			switch {
			case err != nil && ctx.Err() != nil:
				return // the run ended while renewing
			case err != nil:
				left := time.Until(held)
				if left <= margin {
					r.logger().ErrorContext(ctx, "could not renew the lease; stopping the run before it runs out", slog.Any("error", err))
					r.cancelRun(errLeaseExpiring)
					return
				}
				r.logger().WarnContext(ctx, "could not renew the lease; trying again", slog.Any("error", err), slog.Duration("left", left))
				next = min(every/4, left-margin)
			case !ok:
				r.cancelRun(errLost)
				return
			default:
				held = sent.Add(lease)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			timer.Reset(next)
		}
	}
	mu.Lock()
	// The first renewal comes a third of the lease from now, or sooner when
	// the claim was sent a while ago.
	timer = time.AfterFunc(min(every, max(time.Until(held)-margin-every, time.Millisecond)), renew)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		timer.Stop()
	}
}
