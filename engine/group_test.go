package engine

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/store"
)

// groupSeen records the groups a grouper sent.
type groupSeen struct {
	mu     sync.Mutex
	groups []groupSent
}

type groupSent struct {
	size  int
	split bool
}

func (s *groupSeen) observe(size int, split bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groups = append(s.groups, groupSent{size, split})
}

func (s *groupSeen) sent() []groupSent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]groupSent(nil), s.groups...)
}

// groupMember is one transaction to commit in a group: what it queues before
// its commit, and what its commit must return.
type groupMember struct {
	// queue queues the member's statements on tx (nothing is sent) and
	// returns the batch the commit sends last, if any.
	queue func(t *testing.T, tx *txn) *pgx.Batch
	// wantErr, when not nil, is what the member's commit must fail with;
	// nil: it commits.
	wantErr func(t *testing.T, err error)
	// row is the txn_test row that the member writes.
	row int
}

func insertAtCommit(n int) func(t *testing.T, tx *txn) *pgx.Batch {
	return func(t *testing.T, tx *txn) *pgx.Batch {
		_, err := AtCommit(tx).Exec(context.Background(), `INSERT INTO txn_test (n) VALUES ($1)`, n)
		require.NoError(t, err)
		return nil
	}
}

// holdLock takes advisory lock key on a connection of its own, and returns
// the function that lets it go.
func holdLock(t *testing.T, pool *pgxpool.Pool, key int) func() {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	_, err = conn.Exec(context.Background(), `SELECT pg_advisory_lock($1)`, key)
	require.NoError(t, err)
	var once sync.Once
	release := func() {
		once.Do(func() {
			_, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, key)
			conn.Release()
		})
	}
	t.Cleanup(release)
	return release
}

// commitGroup commits members as one group: a first transaction, alone on the
// grouper's only sender, waits on a lock until the members are queued behind
// it. It returns each member's commit error, and when each ended.
func commitGroup(t *testing.T, pool *pgxpool.Pool, g *grouper, members []groupMember) []error {
	t.Helper()
	ctx := context.Background()
	release := busySender(t, pool, g)

	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		tx := newTxn(pool, 0, g)
		last := m.queue(t, tx)
		wg.Add(1)
		go func() {
			defer func() {
				// A member whose argument panics panics alone, in its own
				// run, as it would without a group.
				if p := recover(); p != nil {
					errs[i] = fmt.Errorf("panic: %v", p)
				}
				wg.Done()
			}()
			errs[i] = tx.commit(ctx, last)
		}()
		require.Eventually(t, func() bool {
			g.mu.Lock()
			defer g.mu.Unlock()
			return len(g.queue) == i+1
		}, 5*time.Second, time.Millisecond, "member %d queued, in order", i)
	}
	release()
	wg.Wait()
	return errs
}

// busySender takes g's only sender with a transaction that waits on a lock
// until the function it returns lets the lock go; that function then waits
// for the transaction to commit.
func busySender(t *testing.T, pool *pgxpool.Pool, g *grouper) func() {
	t.Helper()
	ctx := context.Background()
	release := holdLock(t, pool, 1)
	first := newTxn(pool, 0, g)
	_, err := AtCommit(first).Exec(ctx, `SELECT pg_advisory_xact_lock(1)`)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- first.commit(ctx, nil) }()
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.sending == 1
	}, 5*time.Second, time.Millisecond, "the first transaction holds the sender")
	return func() {
		release()
		require.NoError(t, <-done, "the transaction that held the sender")
	}
}

// TestGroupCommit: transactions queued behind a busy sender commit as one
// group, and a member that fails (a constraint, a lost fence, a key taken, a
// lock it would wait on) fails alone: the others commit all the same, with
// the answers they would have had alone.
func TestGroupCommit(t *testing.T) {
	t.Parallel()
	st := store.New()
	failsWith := func(target error) func(t *testing.T, err error) {
		return func(t *testing.T, err error) { require.ErrorIs(t, err, target) }
	}
	stepFails := func(t *testing.T, err error) {
		var se *stepError
		require.ErrorAs(t, err, &se, "the member's own statement failed: the step's error")
	}
	tests := []struct {
		name string
		// prepare writes what the members meet, and returns the member that
		// fails, if any (nil: all commit).
		prepare func(t *testing.T, pool *pgxpool.Pool) *groupMember
		split   bool
	}{
		{"all commit", func(*testing.T, *pgxpool.Pool) *groupMember { return nil }, false},
		{"a member's constraint fails", func(t *testing.T, pool *pgxpool.Pool) *groupMember {
			_, err := pool.Exec(context.Background(), `INSERT INTO txn_test (n) VALUES (100)`)
			require.NoError(t, err)
			return &groupMember{queue: insertAtCommit(100), wantErr: stepFails}
		}, true},
		{"a member's lease is lost", func(t *testing.T, pool *pgxpool.Pool) *groupMember {
			p := reserve(t, pool, "lost")
			return &groupMember{
				queue: func(t *testing.T, tx *txn) *pgx.Batch {
					insertAtCommit(200)(t, tx)
					last := &pgx.Batch{}
					// Another run holds the operation now.
					require.NoError(t, st.StepCheckpointMany(context.Background(), store.Queue{Batch: last}, store.StepCheckpointManyParams{
						OperationID: p.ID, Run: uuid.New(), Finish: true, State: store.OperationSucceeded, Result: json.RawMessage(`{}`),
						Steps: []store.StepCheckpointParams{{Name: "a", Attempts: 1, Output: json.RawMessage(`{}`), StartedAt: time.Now()}},
					}))
					return last
				},
				wantErr: failsWith(store.ErrFenced),
			}
		}, true},
		{"a member's argument cannot be rewritten", func(*testing.T, *pgxpool.Pool) *groupMember {
			// pgx fails the whole batch before sending it: nothing ran.
			return &groupMember{
				queue: func(t *testing.T, tx *txn) *pgx.Batch {
					_, err := AtCommit(tx).Exec(context.Background(), `INSERT INTO txn_test (n) VALUES (@n)`, pgx.StrictNamedArgs{})
					require.NoError(t, err)
					return nil
				},
				wantErr: func(t *testing.T, err error) { require.ErrorContains(t, err, "rewrite query failed") },
			}
		}, true},
		{"a member's argument panics", func(*testing.T, *pgxpool.Pool) *groupMember {
			return &groupMember{
				queue: func(t *testing.T, tx *txn) *pgx.Batch {
					_, err := AtCommit(tx).Exec(context.Background(), `INSERT INTO txn_test (n) VALUES ($1)`, panicValue{})
					require.NoError(t, err)
					return nil
				},
				wantErr: func(t *testing.T, err error) { require.ErrorContains(t, err, "panic: encoding panicked") },
			}
		}, true},
		{"a member's key is taken", func(t *testing.T, pool *pgxpool.Pool) *groupMember {
			p := reserve(t, pool, "taken")
			return &groupMember{
				queue: func(t *testing.T, tx *txn) *pgx.Batch {
					p.ID = uuid.Must(uuid.NewV7())
					require.NoError(t, st.OperationReserve(context.Background(), tx.queue(), p))
					insertAtCommit(300)(t, tx)
					return nil
				},
				wantErr: failsWith(store.ErrKeyTaken),
			}
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := txnPool(t)
			seen := &groupSeen{}
			g := newGrouper(pool, 0, 8, 1, seen.observe, nil)
			members := []groupMember{{queue: insertAtCommit(1), row: 1}, {queue: insertAtCommit(2), row: 2}}
			if bad := tc.prepare(t, pool); bad != nil {
				members = append(members, *bad)
			}
			members = append(members, groupMember{queue: insertAtCommit(3), row: 3})
			before := txnRows(t, pool)

			errs := commitGroup(t, pool, g, members)
			want := before
			for i, m := range members {
				if m.wantErr != nil {
					m.wantErr(t, errs[i])
					continue
				}
				require.NoError(t, errs[i], "member %d", i)
				want = append(want, m.row)
			}
			require.ElementsMatch(t, want, txnRows(t, pool))
			require.Equal(t, []groupSent{{len(members), tc.split}}, seen.sent())
			require.Zero(t, pool.Stat().AcquiredConns(), "every connection went back to the pool")
		})
	}
}

// panicValue panics when pgx encodes it.
type panicValue struct{}

func (panicValue) Value() (driver.Value, error) { panic("encoding panicked") }

// TestGroupCommitSettings: a transaction that changes its settings (SET,
// set_config) does not join a group, where the change would reach the other
// members' statements: it is sent at once, alone, even with every sender busy.
func TestGroupCommitSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := txnPool(t)
	seen := &groupSeen{}
	g := newGrouper(pool, 0, 8, 1, seen.observe, nil)
	release := busySender(t, pool, g)

	for n, sql := range []string{`SELECT set_config('app.tenant', 'a', true)`, `SET LOCAL work_mem = '8MB'`} {
		tx := newTxn(pool, 0, g)
		_, err := AtCommit(tx).Exec(ctx, sql)
		require.NoError(t, err)
		insertAtCommit(n)(t, tx)
		require.NoError(t, tx.commit(ctx, nil), sql)
	}
	require.Equal(t, []int{0, 1}, txnRows(t, pool), "committed while the sender was busy")
	release()
	require.Empty(t, seen.sent())
}

// TestGroupCommitSlowMember: a member that waits on a lock makes its group
// fail after groupLockTimeout rather than keep the others waiting; they
// commit alone, and it commits once the lock is let go.
func TestGroupCommitSlowMember(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := txnPool(t)
	seen := &groupSeen{}
	g := newGrouper(pool, 0, 8, 1, seen.observe, nil)
	releaseSlow := holdLock(t, pool, 2)

	slow := groupMember{queue: func(t *testing.T, tx *txn) *pgx.Batch {
		_, err := AtCommit(tx).Exec(ctx, `SELECT pg_advisory_xact_lock(2)`)
		require.NoError(t, err)
		insertAtCommit(2)(t, tx)
		return nil
	}}
	// The others must commit while the slow member still waits on its lock:
	// the lock is let go only once they have, or after 5 seconds.
	fastFirst := make(chan bool, 1)
	fast := []groupMember{{queue: insertAtCommit(1)}, {queue: insertAtCommit(3)}}
	go func() {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) && len(txnRows(t, pool)) < 2 {
			time.Sleep(10 * time.Millisecond)
		}
		fastFirst <- len(txnRows(t, pool)) == 2
		releaseSlow()
	}()
	errs := commitGroup(t, pool, g, []groupMember{fast[0], slow, fast[1]})
	require.True(t, <-fastFirst, "the others committed while the slow member waited")
	for i, err := range errs {
		require.NoError(t, err, "member %d", i)
	}
	require.Equal(t, []int{1, 2, 3}, txnRows(t, pool))
	require.Equal(t, []groupSent{{3, true}}, seen.sent())
}

// TestGroupCommitCancelled: a transaction whose context ends while it is
// queued leaves the queue, commits nothing, and leaves the sender free once
// the transaction ahead of it is done.
func TestGroupCommitCancelled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := txnPool(t)
	seen := &groupSeen{}
	g := newGrouper(pool, 0, 8, 1, seen.observe, nil)
	release := busySender(t, pool, g)

	cctx, cancel := context.WithCancel(ctx)
	gone := newTxn(pool, 0, g)
	insertAtCommit(1)(t, gone)
	goneDone := make(chan error, 1)
	go func() { goneDone <- gone.commit(cctx, nil) }()
	require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.queue) == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-goneDone, context.Canceled)
	g.mu.Lock()
	require.Empty(t, g.queue)
	g.mu.Unlock()

	release()
	require.Empty(t, txnRows(t, pool), "the cancelled transaction committed nothing")
	require.Empty(t, seen.sent())
	g.mu.Lock()
	require.Zero(t, g.sending, "the sender is free")
	g.mu.Unlock()
}

// TestGroupCommitAlone: a transaction that finds a sender free is sent at
// once, alone: nothing waits for a group to fill.
func TestGroupCommitAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := txnPool(t)
	seen := &groupSeen{}
	g := newGrouper(pool, 0, 8, 1, seen.observe, nil)
	for n := range 3 {
		tx := newTxn(pool, 0, g)
		insertAtCommit(n)(t, tx)
		require.NoError(t, tx.commit(ctx, nil))
	}
	require.Equal(t, []int{0, 1, 2}, txnRows(t, pool))
	require.Empty(t, seen.sent(), "no group was sent")
}

// TestGroupCommitOperations runs operations through the engine whose first
// commits are held in one queue behind a busy sender, so that they commit in
// groups: every operation ends as it would alone (a step whose write breaks
// a constraint fails its own operation, after its own attempts), each write
// is there once, and the groups were sent.
func TestGroupCommitOperations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE grp_debit (key text PRIMARY KEY, amount int NOT NULL CHECK (amount > 0));
		CREATE TABLE grp_credit (key text PRIMARY KEY, amount int NOT NULL)`)
	require.NoError(t, err)
	write := func(table string) func(context.Context, Tx, Attempt, int, *int) error {
		return func(ctx context.Context, tx Tx, at Attempt, in int, _ *int) error {
			_, err := AtCommit(tx).Exec(ctx, `INSERT INTO `+table+` (key, amount) VALUES ($1, $2)`, at.Key, in)
			return err
		}
	}
	hold := func(ctx context.Context, tx Tx, _ Attempt, _ int, _ *int) error {
		_, err := AtCommit(tx).Exec(ctx, `SELECT pg_advisory_xact_lock(1)`)
		return err
	}
	op, err := NewOperation("grouped", []Step[int, int]{
		TxStep("debit", write("grp_debit")),
		TxStep("credit", write("grp_credit")),
	}, func(in int, _ *int) (int, error) { return in, nil }, &OperationOpts{Retry: RetryPolicy{Base: time.Millisecond, MaxAttempts: 2}})
	require.NoError(t, err)
	blocker, err := NewOperation("blocker", []Step[int, int]{TxStep("hold", hold)},
		func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	e, err := New(pool, &Config{Operations: []Definition{op, blocker}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.WithoutCancel(ctx)) })
	seen := &groupSeen{}
	e.group = newGrouper(pool, 0, 16, 1, seen.observe, nil)

	release := holdLock(t, pool, 1)
	held := make(chan error, 1)
	go func() {
		_, err := Start(ctx, e, blocker, "c", "blocker", 1, nil)
		held <- err
	}()
	require.Eventually(t, func() bool { e.group.mu.Lock(); defer e.group.mu.Unlock(); return e.group.sending == 1 }, 5*time.Second, time.Millisecond)

	const n = 16 // as many as may queue behind one sender (groupSenders × GroupCommit)
	started := make([]*Started, n)
	var wg sync.WaitGroup
	for i := range n {
		amount := 10 + i
		if i%10 == 3 {
			amount = -1 // breaks grp_debit's CHECK
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := Start(ctx, e, op, "c", fmt.Sprint("k", i), amount, nil)
			assert.NoError(t, err)
			started[i] = s
		}()
	}
	require.Eventually(t, func() bool { e.group.mu.Lock(); defer e.group.mu.Unlock(); return len(e.group.queue) == n }, 10*time.Second, time.Millisecond,
		"every first commit queued behind the blocker")
	release()
	require.NoError(t, <-held)
	wg.Wait()

	for i, s := range started {
		require.NotNil(t, s, "operation %d started", i)
		info, err := s.Wait(ctx)
		require.NoError(t, err)
		if i%10 == 3 {
			require.Equal(t, StatusFailed, info.Status, "operation %d: its own constraint fails it", i)
			continue
		}
		require.Equal(t, StatusSucceeded, info.Status, "operation %d", i)
		require.JSONEq(t, fmt.Sprint(10+i), string(info.Result))
	}
	var debits, credits, amounts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM grp_debit), (SELECT count(*) FROM grp_credit),
		(SELECT coalesce(sum(amount), 0) FROM grp_credit)`).Scan(&debits, &credits, &amounts))
	want := 0
	for i := range n {
		if i%10 != 3 {
			want += 10 + i
		}
	}
	require.Equal(t, n-2, debits)
	require.Equal(t, n-2, credits)
	require.Equal(t, want, amounts, "each credit once")

	// The 16 queued first commits went in one group, which the two failing
	// members split.
	groups := seen.sent()
	require.NotEmpty(t, groups)
	require.Equal(t, groupSent{n, true}, groups[0])
}

// TestJoinable: which statements keep a transaction out of a group.
func TestJoinable(t *testing.T) {
	t.Parallel()
	for sql, want := range map[string]bool{
		`INSERT INTO t (n) VALUES ($1)`:                  true,
		`-- name: OperationReserve :exec\nINSERT INTO x`: true,
		`UPDATE t SET n = 1`:                             true,
		`SELECT set_config('app.tenant', $1, true)`:      false,
		`select SET_CONFIG('a', 'b', true)`:              false,
		`SET LOCAL lock_timeout = '1s'`:                  false,
		"  \n(set statement_timeout = 0)":                false,
		`set search_path = x`:                            false,
		`SETTLE`:                                         true,
	} {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO t (n) VALUES (1)`)
		b.Queue(sql)
		require.Equal(t, want, joinable(b), sql)
	}
}

// BenchmarkJoinable: the check runs on every statement of a transaction that
// would queue; the engine's own statements are long (sqlc's, with comments).
func BenchmarkJoinable(b *testing.B) {
	batch := &pgx.Batch{}
	for range 4 {
		batch.Queue("-- name: StepCheckpointMany :exec\n" + strings.Repeat("UPDATE idemflow_operation SET checkpoints = checkpoints || $2::jsonb, locked_until = now() WHERE id = $1 AND locked_by = $3;\n", 20))
	}
	for b.Loop() {
		if !joinable(batch) {
			b.Fatal("not joinable")
		}
	}
}

// TestGroupCommitConnectionLost: when the group's connection dies before the
// server answers, its commit is unknown to every member, as a lone
// transaction's is: none is sent again alone (which could apply a committed
// write twice); each gets its run's commit error to settle as it would alone.
// Here the server had not committed, and nothing is written.
func TestGroupCommitConnectionLost(t *testing.T) {
	t.Parallel()
	pool := txnPool(t)
	seen := &groupSeen{}
	g := newGrouper(pool, 0, 8, 1, seen.observe, nil)
	kill := groupMember{queue: func(t *testing.T, tx *txn) *pgx.Batch {
		_, err := AtCommit(tx).Exec(context.Background(), `SELECT pg_terminate_backend(pg_backend_pid())`)
		require.NoError(t, err)
		return nil
	}}
	errs := commitGroup(t, pool, g, []groupMember{{queue: insertAtCommit(1)}, kill, {queue: insertAtCommit(3)}})
	for i, err := range errs {
		require.ErrorContains(t, err, "engine: commit:", "member %d", i)
		var se *stepError
		require.NotErrorAs(t, err, &se, "member %d: not the step's own failure", i)
	}
	require.Empty(t, txnRows(t, pool), "nothing was sent again alone")
	require.Equal(t, []groupSent{{3, false}}, seen.sent())
}
