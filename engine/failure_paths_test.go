package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/testdb"
)

// TestFirstStatementRefusedByPgx: a tx step whose first statement pgx refuses
// before sending the batch that begins the transaction (an argument it cannot
// encode, SQL the server cannot parse) fails the step, like a statement that
// fails when it runs; it is not taken for a failure of the engine's own
// statements, which would stop the run and resume it every lease, forever.
func TestFirstStatementRefusedByPgx(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sql  string
		arg  any
	}{
		{"encode", `INSERT INTO refused_t (n) VALUES ($1)`, int64(1) << 40},          // int4 overflow: pgx "build" error
		{"parse", `INSERT INTO refused_t (no_such_column) VALUES ($1)`, 1},           // 42703 at Parse
		{"control: execute-time error", `INSERT INTO refused_t (n) VALUES ($1)`, -1}, // CHECK violation at Execute
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			_, err := pool.Exec(ctx, `CREATE TABLE refused_t (n int CHECK (n > 0))`)
			require.NoError(t, err)
			op, err := engine.NewOperation("refused", []engine.Step[int, int]{
				// Undoable, so that the operation can fail after it.
				engine.ExternalStep("call", func(context.Context, engine.Attempt, int, *int) error { return nil }).Compensate(noCompensation),
				engine.TxStep("bad", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
					_, err := tx.Exec(ctx, tc.sql, tc.arg)
					return err
				}),
			}, func(in int, s *int) (int, error) { return *s, nil },
				&engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Millisecond, MaxAttempts: 2}})
			require.NoError(t, err)
			e := idemflowtest.Engine(t, pool, nil, op) // Lease 1s, sweep 50ms, workers started
			started, err := engine.Start(ctx, e, op, "c", "k", 0, nil)
			require.NoError(t, err)
			wctx, cancel := context.WithTimeout(ctx, 6*time.Second)
			defer cancel()
			info, werr := started.Wait(wctx)
			var runs int
			var state string
			require.NoError(t, pool.QueryRow(ctx, `SELECT runs, state FROM idemflow_operation`).Scan(&runs, &state))
			var badRows int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_step_recorded WHERE name = 'bad'`).Scan(&badRows))
			t.Logf("wait err=%v state=%s runs=%d rows for step bad=%d", werr, state, runs, badRows)
			require.NoError(t, werr, "operation never finished: state=%s runs=%d, rows recorded for step bad=%d", state, runs, badRows)
			require.Equal(t, engine.StatusFailed, info.Status)
		})
	}
}

// readyForQueryIdle is PostgreSQL's ReadyForQuery message outside a
// transaction: what it sends once a batch and its commit are done.
var readyForQueryIdle = []byte("Z\x00\x00\x00\x05I")

// lossyProxy forwards TCP to PostgreSQL. The first client write that contains
// marker is forwarded, but no answer goes back: the connection is cut once the
// server has answered it, so ran and committed the batch. With down, the
// database then goes away for that long, as in a failover: every connection
// is cut, and new ones are refused until back.
type lossyProxy struct {
	ln      net.Listener
	target  string
	network string
	marker  []byte
	down    time.Duration
	fired   atomic.Bool

	mu    sync.Mutex
	conns []net.Conn
	back  time.Time // while in the future, connections are refused
}

// goAway cuts every connection and refuses new ones for p.down.
func (p *lossyProxy) goAway() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.back = time.Now().Add(p.down)
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// backAt is when the database answers again after it went away.
func (p *lossyProxy) backAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.back
}

func (p *lossyProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if time.Now().Before(p.backAt()) {
			c.Close()
			continue
		}
		s, err := net.Dial(p.network, p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		var drop atomic.Bool
		// committed is closed once the server has answered the dropped batch
		// with ReadyForQuery, idle: it ran, and its transaction (an implicit
		// one, or with COMMIT) committed.
		committed := make(chan struct{})
		go func() { // server -> client
			buf := make([]byte, 64<<10)
			var dropped []byte
			seen := false
			for {
				n, err := s.Read(buf)
				if n > 0 && !drop.Load() {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				} else if n > 0 && !seen {
					if dropped = append(dropped, buf[:n]...); bytes.Contains(dropped, readyForQueryIdle) {
						close(committed)
						seen = true
					}
				}
				if err != nil {
					c.Close()
					return
				}
			}
		}()
		go func() { // client -> server
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if bytes.Contains(buf[:n], p.marker) && p.fired.CompareAndSwap(false, true) {
						drop.Store(true)
						s.Write(buf[:n])
						select { // the server runs the batch and commits
						case <-committed:
						case <-time.After(30 * time.Second):
						}
						if p.down > 0 {
							p.goAway()
						}
						c.Close()
						s.Close()
						return
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					s.Close()
					return
				}
			}
		}()
	}
}

// lossyPool is a pool on a database of its own, through a lossyProxy that
// loses the answer to the first batch that carries marker, and then keeps
// the database away for down.
func lossyPool(t *testing.T, marker string, down time.Duration) (*pgxpool.Pool, *lossyProxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	p := &lossyProxy{marker: []byte(marker), down: down}
	if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		p.network, p.target = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	} else {
		p.network, p.target = "tcp", fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	}
	p.ln, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.ln.Close() })
	go p.serve()
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = uint16(p.ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.TLSConfig = nil
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, p
}

// TestLostReservationAnswer: when the answer to a first attempt's
// reservation is lost after it committed (the connection broke during
// COMMIT, as in a failover), the starter is told it started, never that the
// database was unavailable while its key is taken; the operation resumes at
// once in a River job and finishes once, and a retry of the key finds it.
func TestLostReservationAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, p := lossyPool(t, "LOSE-THE-RESERVATION", 0)
	_, err := pool.Exec(ctx, `CREATE TABLE lost_reservation (note text NOT NULL)`)
	require.NoError(t, err)
	op, err := engine.NewOperation("lost_reservation", []engine.Step[string, int]{
		engine.TxStep("write", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in string, _ *int) error {
			_, err := engine.AtCommit(tx).Exec(ctx, `INSERT INTO lost_reservation VALUES ($1)`, in)
			return err
		}),
		engine.TxStep("done", func(context.Context, engine.Tx, engine.Attempt, string, *int) error { return nil }),
	}, func(string, *int) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	e := idemflowtest.Engine(t, pool, nil, op)

	started, err := engine.Start(ctx, e, op, "c", "k", "LOSE-THE-RESERVATION", nil)
	require.NoError(t, err, "told unavailable while the key is taken")
	require.True(t, p.fired.Load(), "the proxy never saw the marker")
	require.True(t, started.Created)
	info := waitDone(t, e, started)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM lost_reservation`).Scan(&n))
	require.Equal(t, 1, n, "the first step's write committed once")
	again, err := engine.Start(ctx, e, op, "c", "k", "LOSE-THE-RESERVATION", nil)
	require.NoError(t, err)
	require.False(t, again.Created)
}

// TestLostReservationAnswerDatabaseAway: when the answer to a first
// attempt's reservation is lost after it committed and the database then
// stays away for longer than the engine looks for the reservation (a
// failover that takes a while), the starter is told the database was
// unavailable; the operation, which did commit, resumes as soon as the
// database answers again, not when its 15 s lease ends, and the starter's
// retry of the key finds it.
func TestLostReservationAnswerDatabaseAway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, p := lossyPool(t, "LOSE-THE-RESERVATION", 6*time.Second)
	op, err := engine.NewOperation("lost_reservation", []engine.Step[string, int]{
		engine.TxStep("write", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in string, _ *int) error {
			_, err := engine.AtCommit(tx).Exec(ctx, `SELECT $1::text`, in)
			return err
		}),
		engine.TxStep("done", func(context.Context, engine.Tx, engine.Attempt, string, *int) error { return nil }),
	}, func(string, *int) (int, error) { return 1, nil }, nil)
	require.NoError(t, err)
	// No takeover: its own process resumes it, whichever comes first of its
	// liveness lock, back under the same key, and another's look for dead
	// processes' operations.
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: 15 * time.Second, Takeover: engine.TakeoverConfig{Interval: -1}}, op)

	_, err = engine.Start(ctx, e, op, "c", "k", "LOSE-THE-RESERVATION", nil)
	require.True(t, p.fired.Load(), "the proxy never saw the marker")
	require.True(t, engine.IsUnavailable(err), "the reservation was confirmed with the database away: %v", err)
	// The starter retries its key until the database answers.
	var started *engine.Started
	require.Eventually(t, func() bool {
		started, err = engine.Start(ctx, e, op, "c", "k", "LOSE-THE-RESERVATION", nil)
		return !engine.IsUnavailable(err)
	}, 30*time.Second, 100*time.Millisecond)
	require.NoError(t, err)
	require.False(t, started.Created, "the key's first reservation had committed")
	info := waitDone(t, e, started)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	took := time.Since(p.backAt())
	t.Logf("finished %s after the database answered again (lease 15 s)", took.Round(time.Millisecond))
	require.Less(t, took, 5*time.Second, "the operation waited out its lease")
}

// TestLostCommitAnswerIsNotAStepFailure: when the answer to a batch that
// carried COMMIT (here an implicit one) is lost, the step's AtCommit statement
// may have committed; that is not a failure of the step. Taken for one, on the
// step's last attempt, the operation would fail and compensate its earlier
// steps around a write that did commit: money moved once too often.
func TestLostCommitAnswerIsNotAStepFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, p := lossyPool(t, "bob-LOSE-MARKER", 0)
	_, err := pool.Exec(ctx, `CREATE TABLE lost_ledger (account text NOT NULL, amount bigint NOT NULL)`)
	require.NoError(t, err)

	op, err := engine.NewOperation("lost_answer", []engine.Step[int, int]{
		engine.TxStep("debit", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
			_, err := tx.Exec(ctx, `INSERT INTO lost_ledger VALUES ('alice', -100)`)
			return err
		}).Compensate(func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
			_, err := tx.Exec(ctx, `INSERT INTO lost_ledger VALUES ('alice', 100)`)
			return err
		}),
		engine.TxStep("credit", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
			_, err := engine.AtCommit(tx).Exec(ctx, `INSERT INTO lost_ledger VALUES ($1, 100)`, "bob-LOSE-MARKER")
			return err
		}).Retries(engine.RetryPolicy{MaxAttempts: 1}),
		engine.TxStep("done", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, s *int) (int, error) { return *s, nil }, nil)
	require.NoError(t, err)
	e := idemflowtest.Engine(t, pool, nil, op)
	started, err := engine.Start(ctx, e, op, "c", "k", 0, nil)
	require.NoError(t, err)
	info := waitDone(t, e, started)
	require.True(t, p.fired.Load(), "the proxy never saw the marker")

	rows, err := pool.Query(ctx, `SELECT account, sum(amount)::bigint FROM lost_ledger GROUP BY 1 ORDER BY 1`)
	require.NoError(t, err)
	balances := map[string]int64{}
	var total int64
	for rows.Next() {
		var a string
		var n int64
		require.NoError(t, rows.Scan(&a, &n))
		balances[a] = n
		total += n
	}
	require.NoError(t, rows.Err())
	var creditState string
	require.NoError(t, pool.QueryRow(ctx, `SELECT state FROM idemflow_step_recorded WHERE name = 'credit'`).Scan(&creditState))
	t.Logf("status=%s error=%+v balances=%v credit step row=%s", info.Status, info.Error, balances, creditState)
	require.Zero(t, total, "the ledger must balance: status=%s balances=%v credit row=%s", info.Status, balances, creditState)
}

// TestFirstQueryRowsStillOpen: a statement sent while the rows of the step's
// first query (sent with BEGIN in the engine's batch) are still open fails, as
// with a pgx.Tx ("conn busy"), instead of cutting the rows short silently.
func TestFirstQueryRowsStillOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE open_settle (n int)`)
	require.NoError(t, err)
	settle := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
		rows, err := tx.Query(ctx, `SELECT g FROM generate_series(1, 3) AS g`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var n int
			if err := rows.Scan(&n); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO open_settle VALUES ($1)`, n); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	op, err := engine.NewOperation("open_rows", []engine.Step[int, int]{
		engine.TxStep("settle", settle),
	}, func(in int, s *int) (int, error) { return *s, nil }, &engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Millisecond, MaxAttempts: 1}})
	require.NoError(t, err)
	e := idemflowtest.Engine(t, pool, nil, op)
	started, err := engine.Start(ctx, e, op, "c", "k", 0, nil)
	require.NoError(t, err)
	info := waitDone(t, e, started)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM open_settle`).Scan(&n))
	t.Logf("status=%s rows settled=%d of 3", info.Status, n)
	require.False(t, info.Status == engine.StatusSucceeded && n != 3, "step succeeded having settled %d of 3 rows", n)
}

// TestResultErrorAfterCompensableLastStep: when the result function fails
// after a last tx step that has a compensation, the step's transaction rolls
// back with the result, so the step did not happen and is not compensated; the
// operation ends failed (it had stayed in progress, every run failing to mark
// the step compensated).
func TestResultErrorAfterCompensableLastStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	op, err := engine.NewOperation("result_error", []engine.Step[int, int]{
		engine.ExternalStep("call", func(context.Context, engine.Attempt, int, *int) error { return nil }).Compensate(noCompensation),
		engine.TxStep("debit", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		}).Compensate(func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error { return nil }),
	}, func(in int, s *int) (int, error) { return 0, fmt.Errorf("no result") }, nil)
	require.NoError(t, err)
	e := idemflowtest.Engine(t, pool, nil, op)
	started, err := engine.Start(ctx, e, op, "c", "k", 0, nil)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, werr := started.Wait(wctx)
	var runs int
	var state string
	require.NoError(t, pool.QueryRow(ctx, `SELECT runs, state FROM idemflow_operation`).Scan(&runs, &state))
	t.Logf("wait err=%v state=%s runs=%d", werr, state, runs)
	require.NoError(t, werr)
	require.Equal(t, "failed", state)
	require.Equal(t, 1, runs)
}

// TestCompensateExternalStep: when a tx step fails for good after an external
// step whose checkpoint is still pending (it rides with the next transaction),
// the external step is compensated too, once, last first.
func TestCompensateExternalStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	var mu sync.Mutex
	var order []string
	compensate := func(name string) func(context.Context, engine.Tx, engine.Attempt, int, *int) error {
		return func(context.Context, engine.Tx, engine.Attempt, int, *int) error {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, name)
			return nil
		}
	}
	op, err := engine.NewOperation("compensate_external", []engine.Step[int, int]{
		engine.TxStep("a", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }).Compensate(compensate("a")),
		engine.ExternalStep("b", func(context.Context, engine.Attempt, int, *int) error { return nil }).Compensate(compensate("b")),
		engine.TxStep("c", func(context.Context, engine.Tx, engine.Attempt, int, *int) error {
			return engine.Fail("nope", "c refuses")
		}),
	}, func(in int, s *int) (int, error) { return 0, nil }, nil)
	require.NoError(t, err)
	e := idemflowtest.Engine(t, pool, nil, op)
	started, err := engine.Start(ctx, e, op, "c", "k", 0, nil)
	require.NoError(t, err)
	info := waitDone(t, e, started)
	require.Equal(t, engine.StatusFailed, info.Status)
	require.EqualValues(t, "nope", info.Error.Code)
	require.Equal(t, []string{"b", "a"}, order)
	got, err := e.Get(ctx, started.ID)
	require.NoError(t, err)
	var statuses []engine.StepStatus
	for _, s := range got.Steps {
		statuses = append(statuses, s.Status)
	}
	require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusCompensated, engine.StepStatusFailed}, statuses)
}

// TestDeferredConstraintAtCommit: a deferred constraint that a step's writes
// break fails at COMMIT; that is the step's failure (retried, then failed for
// good), not the run's, which would leave the operation to be resumed forever.
func TestDeferredConstraintAtCommit(t *testing.T) {
	t.Parallel()
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprint("begun=", plain), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			_, err := pool.Exec(ctx, `CREATE TABLE deferred_t (n int, CONSTRAINT deferred_t_n UNIQUE (n) DEFERRABLE INITIALLY DEFERRED)`)
			require.NoError(t, err)
			op, err := engine.NewOperation("deferred", []engine.Step[int, int]{
				engine.TxStep("dup", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
					if plain {
						// Sent at once: the transaction has begun, and COMMIT is explicit.
						if _, err := tx.Exec(ctx, `INSERT INTO deferred_t VALUES (1)`); err != nil {
							return err
						}
					} else if _, err := engine.AtCommit(tx).Exec(ctx, `INSERT INTO deferred_t VALUES (1)`); err != nil {
						return err
					}
					_, err := engine.AtCommit(tx).Exec(ctx, `INSERT INTO deferred_t VALUES (1)`)
					return err
				}),
			}, func(in int, s *int) (int, error) { return 0, nil },
				&engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Millisecond, MaxAttempts: 2}})
			require.NoError(t, err)
			e := idemflowtest.Engine(t, pool, nil, op)
			started, err := engine.Start(ctx, e, op, "c", "k", 0, nil)
			require.NoError(t, err)
			info := waitDone(t, e, started)
			require.Equal(t, engine.StatusFailed, info.Status)
			require.EqualValues(t, engine.CodeAttemptsExhausted, info.Error.Code)
			require.Contains(t, info.Error.Cause, "deferred_t_n")
			require.NotContains(t, info.Error.Message, "deferred_t_n")
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM deferred_t`).Scan(&n))
			require.Zero(t, n)
		})
	}
}

// noCompensation makes an external step undoable, so that it is no pivot.
func noCompensation(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }
