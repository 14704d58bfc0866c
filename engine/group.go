package engine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/store"
)

// grouper shares one commit among the transactions of several runs that are
// ready to commit at the same moment, the way PostgreSQL groups the flushes of
// concurrent commits: one round trip, one implicit transaction, one commit
// record, where each run would have sent its own.
//
// Only a transaction that has sent nothing yet (its statements all queued: a
// reservation, AtCommit writes, checkpoints, a finish) can join a group, so a
// group runs no step code, only statements. It never waits to fill: a
// transaction that finds a sender free goes at once, alone, as without the
// grouper; only when every sender is busy does it queue, and the next sender to
// finish takes what is queued (at most max) as its next group. A group commits
// all of its members or none; when one member's statement fails, nothing of the
// group committed, and each member is sent again alone, so that its answer is
// its own. A group's lock waits are bounded (groupLockTimeout): a member
// waiting on the application's locks makes the group fail and go one by one,
// rather than keep the others waiting.
type grouper struct {
	pool           *pgxpool.Pool
	acquireTimeout time.Duration
	// max is the most members of one group.
	max int
	// senders is how many groups may be in flight at once.
	senders int
	// observe, when not nil, is told of each group of two or more that was
	// sent: its size, and whether it failed and went one by one.
	observe func(size int, split bool)
	// logger is told why a group split, at debug level.
	logger *slog.Logger

	mu sync.Mutex
	// sending counts the groups in flight (a lone transaction is one).
	sending int
	// queue holds the transactions waiting for a sender, oldest first.
	queue []*member
}

// groupLockTimeout bounds a group's waits for a lock: past it the group fails
// (and its members go one by one, each waiting as long as it must).
const groupLockTimeout = "100ms"

// member is one transaction's part of a group.
type member struct {
	t       *txn
	b       *pgx.Batch
	prelude int
	last    *pgx.Batch
	// done gets what became of the member: its verdict, or the group it
	// leads.
	done chan verdict
}

// verdict is what became of a member of a group.
type verdict struct {
	// lead, when not nil, is the group that the member must send: it holds a
	// sender now.
	lead []*member
	// alone: the group committed nothing; send the member alone.
	alone bool
	// err is the member's error: the group's commit may or may not have
	// happened.
	err error
}

func newGrouper(pool *pgxpool.Pool, acquireTimeout time.Duration, max, senders int, observe func(int, bool), logger *slog.Logger) *grouper {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &grouper{pool: pool, acquireTimeout: acquireTimeout, max: max, senders: senders, observe: observe, logger: logger}
}

// commit commits m's transaction, alone or in a group, and returns its
// error as txn.commitImplicit would.
func (g *grouper) commit(ctx context.Context, m *member) error {
	g.mu.Lock()
	if g.sending < g.senders || len(g.queue) >= g.max*g.senders {
		// A sender is free, or enough are queued to keep every sender busy
		// for a round: no waiting.
		g.sending++
		g.mu.Unlock()
		return g.lead(ctx, []*member{m}, m)
	}
	m.done = make(chan verdict, 1)
	g.queue = append(g.queue, m)
	g.mu.Unlock()

	var v verdict
	select {
	case v = <-m.done:
	case <-ctx.Done():
		if g.dequeue(m) {
			return fmt.Errorf("engine: commit: %w", ctx.Err())
		}
		v = <-m.done // a sender took it: its outcome is the group's
	}
	switch {
	case v.lead != nil:
		return g.lead(ctx, v.lead, m)
	case v.alone:
		return m.t.commitAlone(ctx, m.b, m.prelude, m.last)
	}
	return v.err
}

// dequeue takes m out of the queue, and reports whether it was still there.
func (g *grouper) dequeue(m *member) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, q := range g.queue {
		if q == m {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			return true
		}
	}
	return false
}

// lead sends group, of which self is a member, with the sender that the
// caller holds, then hands the sender on to the oldest queued transaction, and
// returns self's error.
func (g *grouper) lead(ctx context.Context, group []*member, self *member) error {
	var err error
	if len(group) == 1 {
		err = self.t.commitAlone(ctx, self.b, self.prelude, self.last)
	} else {
		err = g.send(context.WithoutCancel(ctx), group, self)
	}
	g.handOn()
	return err
}

// handOn gives the caller's sender to the next group, the oldest queued
// transactions, or frees it.
func (g *grouper) handOn() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		g.sending--
		return
	}
	n := min(len(g.queue), g.max)
	next := make([]*member, n)
	copy(next, g.queue)
	g.queue = append(g.queue[:0], g.queue[n:]...)
	next[0].done <- verdict{lead: next}
}

// send sends a group of two or more in one implicit transaction and tells each
// member but self its verdict, returning self's error.
func (g *grouper) send(ctx context.Context, group []*member, self *member) error {
	v := g.run(ctx, group)
	if g.observe != nil {
		g.observe(len(group), v.alone)
	}
	for _, m := range group {
		if m != self {
			m.done <- v
		}
	}
	switch {
	case v.alone:
		return self.t.commitAlone(ctx, self.b, self.prelude, self.last)
	case v.err != nil:
		return v.err
	}
	return nil
}

// run sends the group's statements, behind a bound on its lock waits, in one
// batch, and reads each member's results in order: a statement that fails
// rolls back the whole group, and every member then goes alone.
func (g *grouper) run(ctx context.Context, group []*member) verdict {
	actx := ctx
	if g.acquireTimeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, g.acquireTimeout)
		defer cancel()
	}
	conn, err := g.pool.Acquire(actx)
	if err != nil {
		// Nothing was sent, and a member alone would have waited as long.
		return verdict{err: fmt.Errorf("engine: acquire a connection: %w", err)}
	}
	defer conn.Release()

	b := &pgx.Batch{}
	b.Queue("select set_config('lock_timeout', $1, true)", groupLockTimeout)
	for _, m := range group {
		for _, q := range m.b.QueuedQueries {
			// A copy: pgx keeps in a queued statement what it prepared of it
			// on this connection, which another connection does not have
			// when the member is sent again alone.
			c := *q
			b.QueuedQueries = append(b.QueuedQueries, &c)
		}
	}
	now := time.Now()
	for _, m := range group {
		m.t.firstSent = now
	}
	br := conn.SendBatch(ctx, b)
	err = readGroup(br, group)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case err == nil:
		return verdict{}
	case preprocessed(err) != "" || rejected(err):
		// The server (or pgx, before sending anything) refused a statement:
		// the implicit transaction rolled back, nothing of the group is
		// written.
		g.logger.DebugContext(ctx, "a member of a group commit failed; each goes again alone", slog.Int("size", len(group)), slog.Any("error", err))
		return verdict{alone: true}
	}
	// The connection failed: the commit may or may not have happened, for all
	// of the group alike, as it may for one transaction alone.
	return verdict{err: fmt.Errorf("engine: commit: %w", store.Err(err))}
}

// readGroup reads the results of the group's batch (the lock bound's, then
// each member's) up to the first error, which it returns.
func readGroup(br pgx.BatchResults, group []*member) error {
	if _, err := br.Exec(); err != nil {
		return err
	}
	for _, m := range group {
		n := m.b.Len() - m.last.Len()
		for i := range m.b.Len() {
			var err error
			if j := i - n; j >= 0 && m.last.QueuedQueries[j].Fn != nil {
				err = m.last.QueuedQueries[j].Fn(br)
			} else {
				_, err = br.Exec()
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}
