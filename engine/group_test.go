package engine

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

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
	release := holdLock(t, pool, 1)
	first := newTxn(pool, 0, g)
	_, err := AtCommit(first).Exec(ctx, `SELECT pg_advisory_xact_lock(1)`)
	require.NoError(t, err)
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.commit(ctx, nil) }()
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.sending == 1
	}, 5*time.Second, time.Millisecond, "the first transaction holds the sender")

	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		tx := newTxn(pool, 0, g)
		last := m.queue(t, tx)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = tx.commit(ctx, last)
		}()
		require.Eventually(t, func() bool {
			g.mu.Lock()
			defer g.mu.Unlock()
			return len(g.queue) == i+1
		}, 5*time.Second, time.Millisecond, "member %d queued, in order", i)
	}
	release()
	require.NoError(t, <-firstDone)
	wg.Wait()
	return errs
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
			g := newGrouper(pool, 0, 8, 1, seen.observe)
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

// TestGroupCommitSlowMember: a member that waits on a lock makes its group
// fail after groupLockTimeout rather than keep the others waiting; they
// commit alone, and it commits once the lock is let go.
func TestGroupCommitSlowMember(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := txnPool(t)
	seen := &groupSeen{}
	g := newGrouper(pool, 0, 8, 1, seen.observe)
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
// queued leaves the queue, commits nothing, and does not hold up the group
// behind it.
func TestGroupCommitCancelled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := txnPool(t)
	seen := &groupSeen{}
	g := newGrouper(pool, 0, 8, 1, seen.observe)
	release := holdLock(t, pool, 1)
	first := newTxn(pool, 0, g)
	_, err := AtCommit(first).Exec(ctx, `SELECT pg_advisory_xact_lock(1)`)
	require.NoError(t, err)
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.commit(ctx, nil) }()
	require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.sending == 1 }, 5*time.Second, time.Millisecond)

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
	require.NoError(t, <-firstDone)
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
	g := newGrouper(pool, 0, 8, 1, seen.observe)
	for n := range 3 {
		tx := newTxn(pool, 0, g)
		insertAtCommit(n)(t, tx)
		require.NoError(t, tx.commit(ctx, nil))
	}
	require.Equal(t, []int{0, 1, 2}, txnRows(t, pool))
	require.Empty(t, seen.sent(), "no group was sent")
}
