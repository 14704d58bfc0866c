package fakeprovider

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/idemflow/idemflow/cmd/internal/fakeprovider/internal/providerdb"
)

const (
	// settlePoll bounds how long a settler waits before it looks again for
	// pending refunds: another process on the database may have made one.
	settlePoll = time.Second
	// settleMinWait is the least a settler waits between two looks, so that a
	// refund that is due but being settled by another statement does not
	// make it spin.
	settleMinWait = 20 * time.Millisecond
	// settleBatch bounds the refunds that one statement settles.
	settleBatch = 100
)

// Run does the provider's background work until ctx ends, then returns ctx's
// error: it settles every pending refund when its time comes (see the package
// documentation, "Faults"), and, with a Config.WebhookURL, sends the webhook
// events (see RunWebhooks). Both live in the database, so a refund that was
// pending, or an event that was undelivered, when a process died is settled,
// or sent, by the next process that runs Run on the database. Any number of
// processes may run it on one database at once.
func (s *Server) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { s.runSettler(ctx) })
	if s.webhooksOn() {
		wg.Go(func() { s.runSender(ctx) })
	}
	wg.Wait()
	return ctx.Err()
}

// wakeSettler tells this process's settler that a refund was made pending.
func (s *Server) wakeSettler() {
	select {
	case s.settleKick <- struct{}{}:
	default:
	}
}

// runSettler settles the pending refunds as they come due, until ctx ends.
func (s *Server) runSettler(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-s.settleKick:
		}
		if _, err := s.settleDue(ctx); err != nil {
			if ctx.Err() == nil {
				s.logger.WarnContext(ctx, "could not settle the pending refunds that are due", slog.String("error", err.Error()))
			}
			timer.Reset(settlePoll)
			continue
		}
		wait, err := s.q.RefundNextSettle(ctx, s.pool, settlePoll.Milliseconds())
		if err != nil {
			wait = settlePoll.Milliseconds()
		}
		timer.Reset(min(max(time.Duration(wait)*time.Millisecond, settleMinWait), settlePoll))
	}
}

// settleDue settles every pending refund whose time has come and that no
// other statement is settling, and returns how many it settled.
func (s *Server) settleDue(ctx context.Context) (int, error) {
	n := 0
	for {
		rows, err := s.q.RefundSettleDue(ctx, s.pool, settleBatch)
		if err != nil {
			return n, err
		}
		n += len(rows)
		for _, row := range rows {
			s.settled(ctx, row.ID, row.IdempotencyKey, row.Status, row.EventMade)
		}
		if len(rows) < settleBatch {
			return n, nil
		}
	}
}

// refundByKey returns the refund made under key as it is now: a pending one
// whose time has come is settled first (when another statement is settling
// it, once that one has).
func (s *Server) refundByKey(ctx context.Context, key string) (*providerdb.ProviderRefund, error) {
	ref, err := s.q.RefundGetByKey(ctx, s.pool, key)
	if err != nil || ref.Status != StatusPending {
		return ref, err
	}
	rows, err := s.q.RefundSettleKey(ctx, s.pool, key)
	if err != nil {
		return nil, err
	}
	for _, row := range rows {
		s.settled(ctx, row.ID, row.IdempotencyKey, row.Status, row.EventMade)
	}
	return s.q.RefundGetByKey(ctx, s.pool, key)
}

// settled logs that a pending refund became status, and wakes the sender
// when it made an event.
func (s *Server) settled(ctx context.Context, id, key, status string, eventMade bool) {
	if eventMade {
		s.wake()
	}
	s.logger.InfoContext(ctx, "pending refund settled", slog.String("provider_refund_id", id),
		slog.String("key", key), slog.String("status", status))
}
