package engine

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
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
	// ctx is the member's run's: a group's send ends when one of its
	// members' does.
	ctx     context.Context
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
	m.ctx = ctx
	g.mu.Lock()
	if g.sending < g.senders || len(g.queue) >= g.max*g.senders || !joinable(m.b) {
		// A sender is free, or enough are queued to keep every sender busy
		// for a round, or the transaction must not share its own: no waiting.
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

// joinable reports whether a transaction of b's statements may share its
// commit: not when one of them may change what the transaction's later
// statements see of its settings (SET, set_config), which in a group would
// reach the other members' statements.
func joinable(b *pgx.Batch) bool {
	for _, q := range b.QueuedQueries {
		if start := strings.TrimLeft(q.SQL, " \t\r\n("); len(start) >= 4 && strings.EqualFold(start[:4], "set ") || hasSetConfig(q.SQL) {
			return false
		}
	}
	return true
}

// hasSetConfig reports whether sql calls set_config, in any case. It looks
// only around each underscore (strings.IndexByte is fast): it runs on every
// statement of a transaction that would queue.
func hasSetConfig(sql string) bool {
	const word, at = "set_config", 3 // the underscore is word[at]
	for i := 0; ; {
		j := strings.IndexByte(sql[i:], '_')
		if j < 0 {
			return false
		}
		i += j
		if i >= at && i-at+len(word) <= len(sql) && strings.EqualFold(sql[i-at:i-at+len(word)], word) {
			return true
		}
		i++
	}
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
// caller holds, hands the sender on to the oldest queued transactions, and
// returns self's error. A group that split hands the sender on before its
// members go alone.
func (g *grouper) lead(ctx context.Context, group []*member, self *member) error {
	if len(group) == 1 {
		defer g.handOn()
		return self.t.commitAlone(ctx, self.b, self.prelude, self.last)
	}
	v := g.send(group, self)
	g.handOn()
	if v.alone {
		return self.t.commitAlone(ctx, self.b, self.prelude, self.last)
	}
	return v.err
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

// send sends a group of two or more in one implicit transaction, tells each
// member but self its verdict, and returns the verdict.
func (g *grouper) send(group []*member, self *member) verdict {
	// The send ends when any member's run must stop (its lease runs out, the
	// engine stops), as the member's own commit would: the outcome is then
	// unknown to all, as it is to a lone transaction cut off.
	ctx, cancel := context.WithCancel(context.WithoutCancel(self.ctx))
	defer cancel()
	for _, m := range group {
		stop := context.AfterFunc(m.ctx, cancel)
		defer stop()
	}
	v := g.run(ctx, group)
	if g.observe != nil {
		g.observe(len(group), v.alone)
	}
	for _, m := range group {
		if m != self {
			m.done <- v
		}
	}
	return v
}

// run sends the group's statements, behind a bound on its lock waits, in one
// batch, and reads each member's results in order: a statement that fails
// rolls back the whole group, and every member then goes alone.
func (g *grouper) run(ctx context.Context, group []*member) (v verdict) {
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
	// A connection left in the middle of a batch (a panic) is closed, not
	// reused: the server rolls back what it got of a batch without its end.
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
	sent := false
	defer func() {
		if p := recover(); p != nil {
			// A member's argument panicked as pgx encoded it (before the
			// batch's end went out: nothing commits), or a member's reading of
			// its result did (after: the commit may have happened). The
			// member's own run meets the panic again alone.
			g.logger.DebugContext(ctx, "a group commit panicked", slog.Any("panic", p), slog.Bool("sent", sent))
			if sent {
				v = verdict{err: fmt.Errorf("engine: commit: panic reading a group's results: %v", p)}
				return
			}
			v = verdict{alone: true}
		}
	}()
	br := conn.SendBatch(ctx, b)
	sent = true
	first, err := readGroup(br, group)
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
	case first && !conn.Conn().PgConn().IsClosed():
		// pgx failed the batch before sending it (an argument it could not
		// rewrite or encode): the connection is whole and nothing ran.
		g.logger.DebugContext(ctx, "a group commit was not sent; each goes again alone", slog.Int("size", len(group)), slog.Any("error", err))
		return verdict{alone: true}
	}
	// The connection failed: the commit may or may not have happened, for all
	// of the group alike, as it may for one transaction alone.
	return verdict{err: fmt.Errorf("engine: commit: %w", store.Err(err))}
}

// readGroup reads the results of the group's batch (the lock bound's, then
// each member's) up to the first error, which it returns; first says that the
// error was the first result's, before any member's.
func readGroup(br pgx.BatchResults, group []*member) (first bool, err error) {
	if _, err := br.Exec(); err != nil {
		return true, err
	}
	for _, m := range group {
		n := m.b.Len() - m.last.Len()
		for i := range m.b.Len() {
			if err := readStatement(br, m.last, i-n); err != nil {
				return false, err
			}
		}
	}
	return false, nil
}
