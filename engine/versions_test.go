package engine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/internal/testdb"
)

// versioned builds versions of the operation "ver": version 1 runs a and b,
// version 2 a, b and c. Every step's run is counted per operation.
type versioned struct {
	mu   sync.Mutex
	runs map[uuid.UUID][]string
}

func (v *versioned) step(name string) engine.TxStepDef[int, int] {
	return engine.TxStep(name, func(_ context.Context, _ engine.Tx, at engine.Attempt, _ int, _ *int) error {
		v.mu.Lock()
		defer v.mu.Unlock()
		v.runs[at.OperationID] = append(v.runs[at.OperationID], name)
		return nil
	})
}

func (v *versioned) ran(id uuid.UUID) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.runs[id]...)
}

func (v *versioned) op(t *testing.T, version int, steps ...string) *engine.Operation[int, int, int] {
	t.Helper()
	var list []engine.Step[int, int]
	for _, s := range steps {
		list = append(list, v.step(s))
	}
	op, err := engine.NewOperation("ver", list, func(in int, _ *int) (int, error) { return in, nil },
		&engine.OperationOpts{Version: version})
	require.NoError(t, err)
	return op
}

// startAndAbandon starts op in an engine of its own that stops while the
// operation waits at step's start, as a process that dies there: the
// operation is left in progress, for the sweeper of another process.
func startAndAbandon(t *testing.T, pool *pgxpool.Pool, op *engine.Operation[int, int, int], key, step string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	reached := make(chan struct{})
	var once sync.Once
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Lease: time.Second,
		Faults: engine.Faults{Hook: func(ctx context.Context, ev faults.Event) error {
			if ev.Step == step && ev.Point == faults.PointBefore && !ev.Resumed {
				once.Do(func() { close(reached) })
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}}})
	require.NoError(t, err)
	s, err := engine.Start(ctx, e, op, "c", key, 1, nil)
	require.NoError(t, err)
	<-reached
	// Stop waits for the run until stopCtx ends, then cancels it, which ends
	// the hook's wait and hands the operation back.
	stopCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, e.Stop(stopCtx), context.DeadlineExceeded)
	return s.ID
}

// versionConfig is the configuration of the engines of the version tests:
// idemflowtest's, with sweeps every 20ms.
var versionConfig = &engine.Config{SweepInterval: 20 * time.Millisecond}

// TestVersionLeftAlone: a version-2 operation abandoned mid-way is left exactly
// as it is by a process that runs version 1 only, however many sweeps pass, and
// finished, on version 2, by a process that runs both.
func TestVersionLeftAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	v := &versioned{runs: map[uuid.UUID][]string{}}
	v1, v2 := v.op(t, 1, "a", "b"), v.op(t, 2, "a", "b", "c")
	require.Equal(t, 2, v2.Version())

	id := startAndAbandon(t, pool, v2, "k2", "b")
	require.Equal(t, []string{"a"}, v.ran(id))
	before, err := idemflowtest.Engine(t, pool, versionConfig, v1).Get(ctx, id) // a v1-only process
	require.NoError(t, err)

	old := idemflowtest.Engine(t, pool, versionConfig, v1)
	// Sweeps with its lease expired, and a resume job: the v1 process neither
	// claims, fails, compensates nor runs any of it.
	fsNoMoreRuns(t, old, pool, id)
	after, err := old.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInProgress, after.Status)
	require.Equal(t, 2, after.Version)
	require.Equal(t, before.Runs, after.Runs, "a v1 process claimed a v2 operation")
	require.Equal(t, []string{"a"}, v.ran(id))
	require.NotNil(t, after.Attention)
	require.EqualValues(t, engine.CodeVersionNotRun, after.Attention.Code)
	require.Contains(t, after.Attention.Reason, "version 2")
	stats, err := old.InProgress(ctx)
	require.NoError(t, err)
	require.Len(t, stats, 1)
	require.Equal(t, "ver", stats[0].Name)
	require.Equal(t, 2, stats[0].Version)
	require.False(t, stats[0].Runnable, "a v1 process does not run it")
	require.Equal(t, int64(1), stats[0].Count)
	require.Positive(t, stats[0].Oldest, "the age of the oldest")
	_, err = old.Cancel(ctx, id, "not here")
	require.ErrorContains(t, err, "operation type not registered", "a v1 process cancels a v2 operation")
	require.Equal(t, []string{"a"}, v.ran(id))

	both := idemflowtest.Engine(t, pool, versionConfig, v1, v2)
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err := both.Wait(waitCtx, id)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.Equal(t, []string{"a", "b", "c"}, v.ran(id), "finished on version 2")
}

// TestVersionKept: a version-1 operation resumed by a process that runs
// versions 1 and 2 runs version 1's steps, never version 2's; new operations
// start on the version they are started with.
func TestVersionKept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	v := &versioned{runs: map[uuid.UUID][]string{}}
	v1, v2 := v.op(t, 1, "a", "b"), v.op(t, 2, "a", "b", "c")

	id := startAndAbandon(t, pool, v1, "k1", "b")
	both := idemflowtest.Engine(t, pool, versionConfig, v2, v1)
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err := both.Wait(waitCtx, id)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.Equal(t, 1, info.Version)
	require.Equal(t, []string{"a", "b"}, v.ran(id))

	s, err := engine.Start(ctx, both, v2, "c", "new", 1, nil)
	require.NoError(t, err)
	done, err := s.Wait(waitCtx)
	require.NoError(t, err)
	require.Equal(t, 2, done.Version)
	require.Equal(t, []string{"a", "b", "c"}, v.ran(s.ID))
}

// TestCheck: the pre-deploy check names exactly the unfinished operations that
// a set of definitions could not run.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	v := &versioned{runs: map[uuid.UUID][]string{}}
	v1, v2 := v.op(t, 1, "a", "b"), v.op(t, 2, "a", "b", "c")
	// Version 1 with b renamed: operations that still need b cannot run on it.
	renamed := v.op(t, 1, "a", "b2")
	other, err := engine.NewOperation("other", []engine.Step[int, int]{v.step("x")},
		func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)

	firstV1 := startAndAbandon(t, pool, v1, "one", "b")
	secondV1 := startAndAbandon(t, pool, v1, "two", "b")
	onV2 := startAndAbandon(t, pool, v2, "three", "c")
	// A finished operation needs nothing.
	e := idemflowtest.Engine(t, pool, versionConfig, other)
	s, err := engine.Start(ctx, e, other, "c", "done", 1, nil)
	require.NoError(t, err)
	_, err = s.Wait(ctx)
	require.NoError(t, err)

	tests := []struct {
		name string
		defs []engine.Definition
		want []engine.Unrunnable
	}{
		{"Both", []engine.Definition{v1, v2}, nil},
		{"NewOnly", []engine.Definition{v2}, []engine.Unrunnable{{Name: "ver", Version: 1, IDs: []uuid.UUID{firstV1, secondV1}}}},
		{"OldOnly", []engine.Definition{v1, other}, []engine.Unrunnable{{Name: "ver", Version: 2, IDs: []uuid.UUID{onV2}}}},
		{"Renamed", []engine.Definition{renamed, v2}, []engine.Unrunnable{{Name: "ver", Version: 1, Missing: []string{"b"}, IDs: []uuid.UUID{firstV1, secondV1}}}},
		{"None", nil, []engine.Unrunnable{
			{Name: "ver", Version: 1, IDs: []uuid.UUID{firstV1, secondV1}},
			{Name: "ver", Version: 2, IDs: []uuid.UUID{onV2}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := engine.New(pool, &engine.Config{Operations: tt.defs})
			require.NoError(t, err)
			t.Cleanup(func() { _ = e.Stop(context.Background()) })
			got, err := e.Check(ctx)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
	here, err := idemflowtest.Engine(t, pool, versionConfig, v2).Check(ctx)
	require.NoError(t, err)
	require.Len(t, here, 1)
	require.Equal(t, "no definition of ver version 1", here[0].Reason())
}

// TestVersionRegistration: what New refuses.
func TestVersionRegistration(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	v := &versioned{runs: map[uuid.UUID][]string{}}
	v1, v2 := v.op(t, 1, "a", "b"), v.op(t, 2, "a", "b", "c")
	_, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{v1, v.op(t, 1, "a", "c")}})
	require.ErrorContains(t, err, "duplicate operation name")
	require.ErrorContains(t, err, `"ver" version 1`)
	_, err = engine.New(pool, &engine.Config{Operations: []engine.Definition{v1, v.op(t, 3, "a", "b")}})
	require.ErrorContains(t, err, "duplicate operation name")
	require.ErrorContains(t, err, "have the same steps")
	_, err = engine.NewOperation("ver", []engine.Step[int, int]{v.step("a")}, func(in int, _ *int) (int, error) { return in, nil },
		&engine.OperationOpts{Version: -1})
	require.ErrorContains(t, err, "version must be at least 1")

	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{v1}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	_, err = engine.Start(context.Background(), e, v2, "c", "k", 1, nil)
	require.ErrorContains(t, err, "operation type not registered")
	require.ErrorContains(t, err, "version 2")
}

// TestListFilters: List's filters and paging.
func TestListFilters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	v := &versioned{runs: map[uuid.UUID][]string{}}
	v1 := v.op(t, 1, "a", "b")
	other, err := engine.NewOperation("other", []engine.Step[int, int]{v.step("x")},
		func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	waiting := startAndAbandon(t, pool, v1, "waiting", "b")
	e := idemflowtest.Engine(t, pool, versionConfig, other)
	var done []uuid.UUID
	for i := range 3 {
		s, err := engine.Start(ctx, e, other, fmt.Sprint("client-", i%2), fmt.Sprint("k", i), i, nil)
		require.NoError(t, err)
		_, err = s.Wait(ctx)
		require.NoError(t, err)
		done = append(done, s.ID)
	}
	ids := func(list []*engine.Info) []uuid.UUID {
		var out []uuid.UUID
		for _, i := range list {
			out = append(out, i.ID)
		}
		return out
	}
	list := func(o *engine.ListOpts) []uuid.UUID {
		got, err := e.List(ctx, o)
		require.NoError(t, err)
		return ids(got)
	}
	require.Equal(t, []uuid.UUID{done[2], done[1], done[0], waiting}, list(nil), "newest first")
	require.Equal(t, []uuid.UUID{waiting}, list(&engine.ListOpts{Status: engine.StatusInProgress}))
	require.Equal(t, []uuid.UUID{waiting}, list(&engine.ListOpts{Name: "ver"}))
	require.Equal(t, []uuid.UUID{done[2], done[0]}, list(&engine.ListOpts{Scope: "client-0"}))
	require.Equal(t, []uuid.UUID{done[2], done[1]}, list(&engine.ListOpts{Max: 2}))
	page, err := e.List(ctx, &engine.ListOpts{Max: 2})
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{done[0], waiting}, list(&engine.ListOpts{Max: 2, After: page[1]}))
	require.Empty(t, list(&engine.ListOpts{OlderThan: time.Hour}))
	require.Empty(t, list(&engine.ListOpts{NeedsAttention: true}), "an operation whose run died waits for a sweeper, not an operator")
}

func TestVersioning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setupPool(t)
	b := &bundle{pool: pool}

	// A process with the old definition starts the operation, to run on a worker...
	v1 := b.transferOp(t, engine.RetryPolicy{})
	old, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{v1}})
	require.NoError(t, err)
	var started *engine.Started
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		started, err = engine.StartTx(ctx, tx, old, v1, "c", "k", transferIn{From: "a", To: "b", Amount: 1}, nil)
		return err
	}))

	// ...and a process whose definition dropped the payout step picks it up.
	v2, err := engine.NewOperation("transfer", []engine.Step[transferIn, transferState]{
		engine.TxStep("ledger", ledger),
		engine.TxStep("finalize", finalize),
	}, func(in transferIn, s *transferState) (transferOut, error) { return transferOut(*s), nil }, nil)
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{v2}, SweepInterval: 50 * time.Millisecond, Lease: time.Second})
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(ctx))
	// It never fails or compensates the operation, nor runs any of its steps:
	// it leaves it in progress, needing attention, for a process that can.
	var info *engine.Info
	require.Eventually(t, func() bool {
		info, err = e.Get(ctx, started.ID)
		require.NoError(t, err)
		return info.Attention != nil
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, engine.StatusInProgress, info.Status)
	require.True(t, info.NeedsAttention())
	require.EqualValues(t, engine.CodeDefinitionChanged, info.Attention.Code)
	require.Contains(t, info.Attention.Reason, `missing ["payout"]`)
	require.Equal(t, books{}, readBooks(t, pool), "nothing ran")

	// A process with the old definition finishes it, once its turn comes.
	require.NoError(t, e.Stop(ctx))
	_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET locked_until = now() WHERE id = $1`, started.ID)
	require.NoError(t, err)
	back := idemflowtest.Engine(t, pool, nil, b.transferOp(t, engine.RetryPolicy{}))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err = back.Wait(wctx, started.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.Nil(t, info.Attention)
}
