package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/testdb"
)

// TestAdmin: an operator's handle with no definitions lists, reads and checks
// operations, and its retry and cancel requests are carried out by a live
// process that runs the operation's definition.
func TestAdmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	v := &versioned{runs: map[uuid.UUID][]string{}}
	v1, v2 := v.op(t, 1, "a", "b"), v.op(t, 2, "a", "b", "c")

	admin, err := engine.NewAdmin(ctx, pool)
	require.NoError(t, err)
	waitingV1 := startAndAbandon(t, pool, v1, "one", "b")
	waitingV2 := startAndAbandon(t, pool, v2, "two", "b")

	// No process: nothing can run either.
	found, err := admin.Check(ctx)
	require.NoError(t, err)
	require.Len(t, found, 2)

	live := idemflowtest.Engine(t, pool, versionConfig, v1) // runs version 1 only
	procs, err := admin.Processes(ctx)
	require.NoError(t, err)
	require.Len(t, procs, 1)
	require.Equal(t, []engine.DefinitionName{{Name: "ver", Version: 1}}, procs[0].Definitions)
	found, err = admin.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, []engine.Unrunnable{{Name: "ver", Version: 2, IDs: []uuid.UUID{waitingV2}}}, found)

	// The v1 operation resumes and finishes on the live process.
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = live.Wait(waitCtx, waitingV1)
	require.NoError(t, err)
	list, err := admin.List(ctx, &engine.ListOpts{Status: engine.StatusSucceeded})
	require.NoError(t, err)
	require.Len(t, list, 1)
	got, err := admin.Get(ctx, waitingV1)
	require.NoError(t, err)
	require.Len(t, got.Steps, 2)
	require.NotEmpty(t, got.Steps[1].DerivedKey, "an admin gets every step's key")

	// A retry of a succeeded operation is refused by the process; a cancel of
	// the v2 operation waits for a process that runs version 2.
	_, err = admin.Retry(waitCtx, waitingV1, nil)
	require.ErrorIs(t, err, engine.ErrNotFailed, "the process's refusal, as its own call returns it")
	require.Contains(t, err.Error(), "not failed")

	shortCtx, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	_, err = admin.Cancel(shortCtx, waitingV2, "operator says no")
	require.ErrorIs(t, err, engine.ErrNotCarriedOut)

	// A process with version 2 arrives: it finishes the operation (the sweeper
	// is faster than the pending request), then refuses the stale cancel.
	both := idemflowtest.Engine(t, pool, versionConfig, v1, v2)
	_, err = both.Wait(waitCtx, waitingV2)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		procs, err := admin.Processes(ctx)
		return err == nil && len(procs) == 2
	}, 10*time.Second, 50*time.Millisecond)

	_, err = admin.Retry(ctx, uuid.New(), nil)
	require.ErrorIs(t, err, engine.ErrNotFound)
}

// TestAdminCancel: a cancel request is carried out: the operation is
// compensated and fails, and the request says so.
func TestAdminCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, op, b := setup(t, setupOpts{workers: true, retry: engine.RetryPolicy{MaxAttempts: 1000, Base: time.Hour, Cap: time.Hour}})
	b.failPayout.Store(1000)
	s, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 5}, nil)
	require.NoError(t, err)
	// The payout fails once, and its retry is an hour away: nobody holds it.
	require.Eventually(t, func() bool {
		info, err := e.Get(ctx, s.ID)
		return err == nil && info.Steps[1].Attempts == 1
	}, 10*time.Second, 20*time.Millisecond)

	admin, err := engine.NewAdmin(ctx, b.pool)
	require.NoError(t, err)
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err := admin.Cancel(waitCtx, s.ID, "customer withdrew")
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, info.Status)
	require.EqualValues(t, engine.CodeCancelled, info.Error.Code)
}
