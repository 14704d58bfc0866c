package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/reconcile"
)

// reconcileBenchSizesEnv overrides the sizes (records, comma separated) that
// BenchmarkReconcile runs at.
const reconcileBenchSizesEnv = "IDEMFLOW_BENCH_RECONCILE_SIZES"

// reconcileBenchExecModeEnv, when set, is the pool's default_query_exec_mode
// (pgx's connection setting: "cache_describe", say, whose unnamed statements
// PostgreSQL plans anew with their values every time, as behind a pooler in
// transaction mode); else pgx's default, which prepares each query once per
// connection and lets PostgreSQL's plan cache choose a generic plan.
const reconcileBenchExecModeEnv = "IDEMFLOW_BENCH_RECONCILE_EXEC_MODE"

// BenchmarkReconcile measures one reconciliation run of a source whose window
// holds n records against n finished operations (each a step "pay" that
// succeeded, every 10th at its second attempt, with a step row), at n =
// 100,000 and 1,000,000 by default (IDEMFLOW_BENCH_RECONCILE_SIZES overrides,
// as "10000,100000"). The operations are copied into the tables as the engine
// writes finished ones, outside the timer (setup-s); the source makes its
// records from their index, so that the test holds none of them. Every
// 10,000th record has another amount, and after every 20,000th comes one under
// a key no operation holds: the run must find exactly those. It reports
// records/s, the heap in use at its peak over what it was before (sampled
// every 50 ms), what the run allocated (the source's pages included, which
// source-alloc-MiB and source-s measure alone), the engine's queries per page
// and the share of the run spent in them (db-%, until their rows are read),
// and on Linux with a local server the CPU time of this process and of the
// database's backends; with -v, the time of each query and the plans (EXPLAIN
// ANALYZE) of the last full page's two reads. IDEMFLOW_BENCH_RECONCILE_EXEC_MODE
// sets the pool's query exec mode. docs/benchmarks.md has its figures.
//
//	go test ./engine -run '^$' -bench Reconcile -benchtime 1x -timeout 60m -v
func BenchmarkReconcile(b *testing.B) {
	sizes := []int{100_000, 1_000_000}
	if v := os.Getenv(reconcileBenchSizesEnv); v != "" {
		sizes = nil
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			require.NoError(b, err, "%s", reconcileBenchSizesEnv)
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			sc := newReconcileScenario(n, 10_000, 20_000, 0)
			ctx := context.Background()
			setup := time.Now()
			e, queries := sc.engine(b)
			setupTime := time.Since(setup)

			side := untraced(ctx, b, e.pool)
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			goCPU, goCPUOK := procCPU("self")
			pgCPU, pgCPUOK := backendsCPU(ctx, b, side)
			peak := sampleHeapInuse(50 * time.Millisecond)
			var rep *ReconcileReport
			for b.Loop() {
				var err error
				rep, err = e.Reconcile(ctx, "bank")
				require.NoError(b, err)
			}
			b.StopTimer()
			heapPeak := peak()
			goCPUAfter, _ := procCPU("self")
			pgCPUAfter, _ := backendsCPU(ctx, b, side)
			runtime.ReadMemStats(&after)
			sc.check(b, rep)

			runs := float64(b.N)
			pages := float64(rep.Pages)
			n, wall := queries.total()
			b.ReportMetric(float64(rep.Checked)*runs/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(pages, "pages")
			b.ReportMetric(float64(n)/runs/pages, "queries/page")
			b.ReportMetric(100*wall.Seconds()/b.Elapsed().Seconds(), "db-%")
			b.ReportMetric(float64(int64(heapPeak)-int64(before.HeapInuse))/(1<<20), "peak-heap-MiB")
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/runs/(1<<20), "alloc-MiB")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/runs/float64(rep.Checked), "allocs/record")
			if goCPUOK && pgCPUOK { // Linux, the server on this machine
				b.ReportMetric((goCPUAfter-goCPU).Seconds()/runs, "go-cpu-s")
				b.ReportMetric((pgCPUAfter-pgCPU).Seconds()/runs, "pg-cpu-s")
			}
			// After the loop: b.Loop drops the metrics reported before it.
			b.ReportMetric(setupTime.Seconds(), "setup-s")
			sourceAlloc, sourceTime := sc.sourceCost(b)
			b.ReportMetric(sourceAlloc, "source-alloc-MiB")
			b.ReportMetric(sourceTime.Seconds(), "source-s")
			if testing.Verbose() {
				queries.log(b, runs*pages)
				queries.explain(ctx, b, side)
			}
		})
	}
}

// TestReconcileBenchScenario runs BenchmarkReconcile's scenario small, so that
// the operations it writes without the engine keep the shape the engine
// reads: a change of schema breaks this test, not only the benchmark.
func TestReconcileBenchScenario(t *testing.T) {
	t.Parallel()
	sc := newReconcileScenario(4_000, 1_000, 2_000, 500)
	e, queries := sc.engine(t)
	rep, err := e.Reconcile(context.Background(), "bank")
	require.NoError(t, err)
	sc.check(t, rep)
	// A read of the operations and one of their steps on every page, an
	// upsert on the six pages that have a mismatch; then the books the
	// other way, a page of 1,000 operations and their step rows at a time
	// (the fifth page is empty), no upsert (nothing missing). The report's
	// list and total are read in one read-only transaction ("other": its
	// BEGIN and COMMIT), so that they agree.
	require.Equal(t, 9, rep.Pages)
	require.Equal(t, map[string]int{
		"ReconcileOperations": 9, "ReconcileSteps": 9 + 4, "MismatchUpsert": 6, "ReconcileBooks": 5,
		"ReconcileNow": 1, "MismatchClear": 1, "ReconciliationRunRecord": 1, "ReconciliationRunGet": 1, "MismatchList": 1,
		"MismatchCount": 1, "other": 2,
	}, queries.calls())
}

// reconcileScenario is n finished operations, each with one record under its
// step's derived key, and every unknownEvery records one more under a key that
// no operation holds; the record of every mismatchEvery-th operation has
// another amount. Everything is computed from the index, so that nothing of
// size n is held.
type reconcileScenario struct {
	n, mismatchEvery, unknownEvery int
	// rowEvery: the step of every rowEvery-th operation succeeded at its
	// second attempt, and has a row in idemflow_step_row rather than a
	// checkpoint in the operation's row.
	rowEvery int
	// pageSize is the source's page size.
	pageSize int
	// base is when operation 0 was made; they are 20 ms apart.
	base time.Time
}

const reconcileBenchGap = 20 * time.Millisecond

// newReconcileScenario returns a scenario of n operations, read in pages of
// pageSize (0 for the default, 1000).
func newReconcileScenario(n, mismatchEvery, unknownEvery, pageSize int) *reconcileScenario {
	if n%unknownEvery != 0 || n%mismatchEvery != 0 {
		panic("reconcile scenario: n must be a multiple of both strides")
	}
	// Within the default window (24 hours) at a million operations.
	base := time.Now().Add(-time.Duration(n) * reconcileBenchGap).Add(-time.Minute).Truncate(time.Millisecond)
	if pageSize == 0 {
		pageSize = 1000
	}
	return &reconcileScenario{n: n, mismatchEvery: mismatchEvery, unknownEvery: unknownEvery, rowEvery: 10, pageSize: pageSize, base: base}
}

// records is how many records the source lists.
func (s *reconcileScenario) records() int { return s.n + s.n/s.unknownEvery }

// created is when operation i was made.
func (s *reconcileScenario) created(i int) time.Time {
	return s.base.Add(time.Duration(i) * reconcileBenchGap)
}

// digest is a deterministic 32 bytes for (what, i).
func (s *reconcileScenario) digest(what string, i int) [32]byte {
	var b [16]byte
	copy(b[:8], what)
	binary.BigEndian.PutUint64(b[8:], uint64(i))
	return sha256.Sum256(b[:])
}

// id is operation i's id: a UUIDv7 of its creation, as the engine makes them,
// so that the operations of a page lie together in the table as they would.
func (s *reconcileScenario) id(what string, i int) uuid.UUID {
	d := s.digest(what, i)
	var u uuid.UUID
	ms := uint64(s.created(i).UnixMilli())
	binary.BigEndian.PutUint16(u[0:2], uint16(ms>>32))
	binary.BigEndian.PutUint32(u[2:6], uint32(ms))
	copy(u[6:], d[:10])
	u[6] = 0x70 | u[6]&0x0f
	u[8] = 0x80 | u[8]&0x3f
	return u
}

// secret is operation i's key secret, of scheme 3 as newKeySecret makes them.
func (s *reconcileScenario) secret(what string, i int) []byte {
	d := s.digest(what+"-s", i)
	b := make([]byte, keySecretSize)
	b[0] = keyScheme3
	copy(b[1:], d[:keySecretRandom])
	return b
}

func (s *reconcileScenario) amount(i int) int64 { return 100 + int64(i%9_000) }

// stepRow reports whether operation i's step has a row rather than a
// checkpoint.
func (s *reconcileScenario) stepRow(i int) bool { return i%s.rowEvery == s.rowEvery-1 }

// mismatchedOp is the operation of the k-th record with another amount: one
// in every mismatchEvery, every other one an operation with a step row.
func (s *reconcileScenario) mismatchedOp(k int) int {
	return k*s.mismatchEvery + s.mismatchEvery/2 - k%2
}

// mismatched reports whether operation i's record has another amount.
func (s *reconcileScenario) mismatched(i int) bool { return i == s.mismatchedOp(i/s.mismatchEvery) }

func (s *reconcileScenario) clientKey(i int) string { return "order-" + strconv.Itoa(i) }

// unknownKey is the key of the q-th record that no operation holds: a key of
// scheme 3 whose operation does not exist, or (every other one) a key the
// engine never makes.
func (s *reconcileScenario) unknownKey(q int) string {
	if q%2 == 1 {
		return "manual-" + strconv.Itoa(q)
	}
	return derivedKey(s.id("unknown", q), s.secret("unknown", q), "pay", "shop", "none", "pay")
}

// record is the j-th record the source lists, oldest first: those of
// operations, and one that no operation holds after every unknownEvery.
func (s *reconcileScenario) record(j int) reconcile.Record {
	q, r := j/(s.unknownEvery+1), j%(s.unknownEvery+1)
	if r == s.unknownEvery {
		i := (q+1)*s.unknownEvery - 1
		return reconcile.Record{Key: s.unknownKey(q), Reference: "re_x" + strconv.Itoa(q), Amount: 1,
			Status: reconcile.Succeeded, CreatedAt: s.created(i).Add(2 * time.Millisecond)}
	}
	i := q*s.unknownEvery + r
	amount := s.amount(i)
	if s.mismatched(i) {
		amount++
	}
	return reconcile.Record{Key: derivedKey(s.id("op", i), s.secret("op", i), "pay", "shop", s.clientKey(i), "pay"),
		Reference: "re_" + strconv.Itoa(i), Amount: amount, Status: reconcile.Succeeded, CreatedAt: s.created(i).Add(time.Millisecond)}
}

// list is the source's ListFunc: the cursor is the index of the next record.
func (s *reconcileScenario) list(_ context.Context, req reconcile.ListRequest) ([]reconcile.Record, string, error) {
	from := 0
	if req.Cursor != "" {
		n, err := strconv.Atoi(req.Cursor)
		if err != nil {
			return nil, "", err
		}
		from = n
	}
	total := s.records()
	page := make([]reconcile.Record, 0, min(req.Limit, total-from))
	j := from
	for ; j < total && len(page) < req.Limit; j++ {
		if r := s.record(j); r.CreatedAt.After(req.Since) {
			page = append(page, r)
		}
	}
	if j >= total {
		return page, "", nil
	}
	return page, strconv.Itoa(j), nil
}

type reconcileBenchIn struct {
	Amount int64 `json:"amount"`
}

type reconcileBenchState struct {
	Ref string `json:"ref"`
}

// engine writes the scenario's operations into a new database and returns an
// engine that reconciles them with the source "bank", on a pool whose queries
// are counted.
func (s *reconcileScenario) engine(tb testing.TB) (*Engine, *queryCounter) {
	tb.Helper()
	ctx := context.Background()
	dbURL, err := url.Parse(testdb.URL(tb))
	require.NoError(tb, err)
	if mode := os.Getenv(reconcileBenchExecModeEnv); mode != "" {
		q := dbURL.Query()
		q.Set("default_query_exec_mode", mode)
		dbURL.RawQuery = q.Encode()
	}
	cfg, err := pgxpool.ParseConfig(dbURL.String())
	require.NoError(tb, err)
	queries := &queryCounter{}
	cfg.ConnConfig.Tracer = queries
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close) // before testdb drops the database

	s.copyOperations(tb, pool)
	for _, sql := range []string{"VACUUM ANALYZE idemflow_operation", "VACUUM ANALYZE idemflow_step_row", "CHECKPOINT"} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(tb, err)
	}

	pay := ExternalStep("pay", func(context.Context, Attempt, reconcileBenchIn, *reconcileBenchState) error {
		return nil
	}).Compare(func(in reconcileBenchIn, rec reconcile.Record) reconcile.Kind {
		if rec.Amount != in.Amount {
			return reconcile.AmountDiffers
		}
		return ""
	}).Window(0).Records("bank", func(st *reconcileBenchState) string { return st.Ref })
	op, err := NewOperation("pay", []Step[reconcileBenchIn, reconcileBenchState]{pay},
		func(_ reconcileBenchIn, st *reconcileBenchState) (reconcileBenchState, error) { return *st, nil }, nil)
	require.NoError(tb, err)
	e, err := New(pool, &Config{
		Operations: []Definition{op},
		Reconcile:  reconcile.Config{Sources: []reconcile.Source{{Name: "bank", List: s.list, PageSize: s.pageSize}}, Interval: -1},
	})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = e.Stop(context.Background()) })
	queries.reset() // the setup's
	return e, queries
}

// copyOperations writes the n operations with COPY, as the engine leaves a
// succeeded one whose step "pay" succeeded at its first attempt: its
// checkpoint in the row (store migration 00010), no step row; or, every
// rowEvery-th, at its second: a step row, no checkpoint.
func (s *reconcileScenario) copyOperations(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	ctx := context.Background()
	expires := time.Now().Add(defaultRetention)
	cols := []string{"id", "name", "version", "scope", "key", "state", "steps", "input", "result",
		"locked_until", "created_at", "finished_at", "expires_at", "checkpoints", "format", "key_seed"}
	steps := []string{"pay"}
	i := 0
	n, err := pool.CopyFrom(ctx, pgx.Identifier{"idemflow_operation"}, cols, pgx.CopyFromFunc(func() ([]any, error) {
		if i == s.n {
			return nil, nil
		}
		created := s.created(i)
		started := created.Add(100 * time.Microsecond)
		finished := created.Add(time.Millisecond)
		input := []byte(`{"amount":` + strconv.FormatInt(s.amount(i), 10) + `}`)
		result := []byte(`{"ref":"re_` + strconv.Itoa(i) + `"}`)
		var checkpoints []byte
		if !s.stepRow(i) {
			checkpoints = []byte(`{"pay":{"p":0,"a":1,"r":"call","s":` + strconv.FormatInt(started.UnixMicro(), 10) +
				`,"d":` + strconv.FormatInt(finished.Sub(started).Microseconds(), 10) + `}}`)
		}
		row := []any{s.id("op", i), "pay", int32(1), "shop", s.clientKey(i), "succeeded", steps, input, result,
			finished, created, finished, expires, checkpoints, int16(2), s.secret("op", i)}
		i++
		return row, nil
	}))
	require.NoError(tb, err)
	require.Equal(tb, int64(s.n), n)

	cols = []string{"operation_id", "name", "position", "state", "attempts", "output", "last_error",
		"started_at", "finished_at", "resolved_by", "sent_at"}
	i = s.rowEvery - 1
	n, err = pool.CopyFrom(ctx, pgx.Identifier{"idemflow_step_row"}, cols, pgx.CopyFromFunc(func() ([]any, error) {
		if i >= s.n {
			return nil, nil
		}
		created := s.created(i)
		row := []any{s.id("op", i), "pay", int32(0), "succeeded", int32(2), []byte(`{"ref":"re_` + strconv.Itoa(i) + `"}`),
			"the bank did not answer", created.Add(100 * time.Microsecond), created.Add(time.Millisecond), "call", created.Add(900 * time.Microsecond)}
		i += s.rowEvery
		return row, nil
	}))
	require.NoError(tb, err)
	require.Equal(tb, int64(s.n/s.rowEvery), n)
}

// check asserts that rep found exactly the scenario's mismatches.
func (s *reconcileScenario) check(tb testing.TB, rep *ReconcileReport) {
	tb.Helper()
	total := s.records()
	require.Equal(tb, int64(total), rep.Checked)
	require.Zero(tb, rep.NotYet)
	require.Zero(tb, rep.Unverifiable)
	require.Equal(tb, (total+s.pageSize-1)/s.pageSize, rep.Pages)
	require.Equal(tb, int64(s.n), rep.StepsChecked, "every step checked the other way, none missing its record")

	want := map[string]Mismatch{}
	for k := range s.n / s.mismatchEvery {
		i := s.mismatchedOp(k)
		key := derivedKey(s.id("op", i), s.secret("op", i), "pay", "shop", s.clientKey(i), "pay")
		want[key] = Mismatch{Kind: reconcile.AmountDiffers, OperationID: s.id("op", i), Step: "pay", Amount: s.amount(i) + 1}
	}
	for q := range s.n / s.unknownEvery {
		want[s.unknownKey(q)] = Mismatch{Kind: reconcile.UnknownKey, Amount: 1}
	}
	require.Len(tb, rep.Mismatches, len(want))
	for _, m := range rep.Mismatches {
		w, ok := want[m.Key]
		require.True(tb, ok, "unexpected mismatch %+v", m)
		require.Equal(tb, w.Kind, m.Kind, m.Key)
		require.Equal(tb, w.OperationID, m.OperationID, m.Key)
		require.Equal(tb, w.Step, m.Step, m.Key)
		require.Equal(tb, w.Amount, m.Amount, m.Key)
		delete(want, m.Key)
	}
	require.Empty(tb, want)
}

// sourceCost lists every page as a run does, without the engine, and returns
// what that allocated and how long it took: the source's share of a run.
func (s *reconcileScenario) sourceCost(tb testing.TB) (allocMiB float64, took time.Duration) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	req := reconcile.ListRequest{Since: s.base.Add(-time.Hour), Limit: s.pageSize}
	for {
		recs, next, err := s.list(context.Background(), req)
		require.NoError(tb, err)
		if next == "" || len(recs) == 0 {
			break
		}
		req.Cursor = next
	}
	took = time.Since(start)
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / (1 << 20), took
}

// sampleHeapInuse samples the heap in use every interval until the function
// it returns is called, which returns the highest sample.
func sampleHeapInuse(interval time.Duration) func() uint64 {
	done := make(chan struct{})
	result := make(chan uint64)
	go func() {
		var peak uint64
		var ms runtime.MemStats
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-done:
				result <- peak
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		return <-result
	}
}

// queryCounter is a pgx.QueryTracer that counts the queries, and adds up
// their time (until their rows are read and closed), by sqlc's name ("--
// name: X" starts every query of the store); it keeps the text and arguments
// of the last call of each whose first argument is as long as any before (a
// full page's ids, the newest), for EXPLAIN.
type queryCounter struct {
	mu    sync.Mutex
	stats map[string]*queryStat
}

type queryStat struct {
	calls int
	wall  time.Duration
	sql   string
	args  []any
	// argLen is the length of args[0] when it is a slice.
	argLen int
}

type queryStartKey struct{}

type queryStart struct {
	name string
	at   time.Time
	sql  string
	args []any
}

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	name := "other"
	if rest, ok := strings.CutPrefix(d.SQL, "-- name: "); ok {
		name, _, _ = strings.Cut(rest, " ")
	}
	return context.WithValue(ctx, queryStartKey{}, queryStart{name: name, at: time.Now(), sql: d.SQL, args: d.Args})
}

func (c *queryCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	st, ok := ctx.Value(queryStartKey{}).(queryStart)
	if !ok {
		return
	}
	wall := time.Since(st.at)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stats == nil {
		c.stats = map[string]*queryStat{}
	}
	q := c.stats[st.name]
	if q == nil {
		q = &queryStat{}
		c.stats[st.name] = q
	}
	q.calls++
	q.wall += wall
	if len(st.args) > 0 {
		if v := reflect.ValueOf(st.args[0]); v.Kind() == reflect.Slice && v.Len() >= q.argLen {
			q.sql, q.args, q.argLen = st.sql, st.args, v.Len()
		}
	}
}

func (c *queryCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats = nil
}

// calls returns how many times each query ran.
func (c *queryCounter) calls() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.stats))
	for name, q := range c.stats {
		out[name] = q.calls
	}
	return out
}

// total returns how many queries ran, and how long they took.
func (c *queryCounter) total() (int, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int
	var wall time.Duration
	for _, q := range c.stats {
		n += q.calls
		wall += q.wall
	}
	return n, wall
}

// log logs each query's calls and time, per page of pages.
func (c *queryCounter) log(tb testing.TB, pages float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := make([]string, 0, len(c.stats))
	for name := range c.stats {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		q := c.stats[name]
		tb.Logf("%-30s %8d calls %10.3f ms/page %8.3f ms/call", name, q.calls,
			float64(q.wall.Microseconds())/1000/pages, float64(q.wall.Microseconds())/1000/float64(q.calls))
	}
}

// explain logs the plans, run, of a page's reads of the operations and of
// their steps, with the arguments of their last full page: as a custom plan (for
// those values), as a generic one, and as PostgreSQL's plan cache chooses
// after six runs (what the run's connections, which prepare every statement,
// use from the sixth page on). conn is not pool's, nor traced.
func (c *queryCounter) explain(ctx context.Context, tb testing.TB, conn *pgx.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range []string{"ReconcileOperations", "ReconcileSteps"} {
		q := c.stats[name]
		if q == nil || q.sql == "" {
			continue
		}
		stmt := "explain_" + strings.ToLower(name)
		sd, err := conn.Prepare(ctx, stmt, q.sql)
		require.NoError(tb, err)
		params := make([]string, len(sd.ParamOIDs))
		for i, oid := range sd.ParamOIDs {
			var typ string
			require.NoError(tb, conn.QueryRow(ctx, "SELECT format_type($1, NULL)", oid).Scan(&typ))
			params[i] = "$" + strconv.Itoa(i+1) + "::" + typ
		}
		execute := "EXECUTE " + stmt + "(" + strings.Join(params, ", ") + ")"
		// EXECUTE takes no parameters of its own: pgx puts the values in,
		// as text (the casts above make them what they were).
		args := []any{pgx.QueryExecModeSimpleProtocol}
		for _, a := range q.args {
			args = append(args, textArg(a))
		}
		for _, mode := range []string{"force_custom_plan", "force_generic_plan", "auto"} {
			_, err := conn.Exec(ctx, "SELECT set_config('plan_cache_mode', $1, false)", mode)
			require.NoError(tb, err)
			if mode == "auto" {
				for range 6 {
					_, err := conn.Exec(ctx, execute, args...)
					require.NoError(tb, err)
				}
			}
			rows, err := conn.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+execute, args...)
			require.NoError(tb, err)
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(tb, err)
			tb.Logf("%s, plan_cache_mode %s:\n%s", name, mode, strings.Join(lines, "\n"))
		}
	}
}

// textArg returns a, or the texts of its elements when it is a slice of
// fmt.Stringer (the store's UUIDs, which pgx encodes in binary only).
func textArg(a any) any {
	v := reflect.ValueOf(a)
	if v.Kind() != reflect.Slice || !v.Type().Elem().Implements(reflect.TypeFor[fmt.Stringer]()) {
		return a
	}
	out := make([]string, v.Len())
	for i := range out {
		out[i] = v.Index(i).Interface().(fmt.Stringer).String()
	}
	return out
}

// untraced returns a connection of its own to pool's database, whose queries
// the pool's tracer does not count, closed at cleanup.
func untraced(ctx context.Context, tb testing.TB, pool *pgxpool.Pool) *pgx.Conn {
	cfg := pool.Config().ConnConfig.Copy()
	cfg.Tracer = nil
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	return conn
}

// procCPU returns the CPU time that process pid ("self": this one) has used,
// from /proc; false where there is none (not Linux).
func procCPU(pid string) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, false
	}
	// The fields after the command's closing parenthesis start at the third;
	// utime and stime are the 14th and 15th, in ticks of 1/100 s (USER_HZ).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * (time.Second / 100), true
}

// backendsCPU returns the CPU time used by the server processes that serve
// conn's database, conn's own left out; false when the server is not a
// process of this machine.
func backendsCPU(ctx context.Context, tb testing.TB, conn *pgx.Conn) (time.Duration, bool) {
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`)
	require.NoError(tb, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(tb, err)
	var sum time.Duration
	for _, pid := range pids {
		p := strconv.Itoa(int(pid))
		if comm, err := os.ReadFile("/proc/" + p + "/comm"); err != nil || !bytes.HasPrefix(comm, []byte("postgres")) {
			return 0, false
		}
		d, ok := procCPU(p)
		if !ok {
			return 0, false
		}
		sum += d
	}
	return sum, true
}
