package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/store"
)

// TestCheckpoints: steps checkpointed in the operation's row (by the
// reservation, by OperationCheckpoint and by the statement that finishes the
// operation) read back as the rows they replace, a row of its own wins over
// a checkpoint, and a step recorded twice is refused.
func TestCheckpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	st := store.New()
	run := uuid.New()
	id := uuid.Must(uuid.NewV7())
	started := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	step := func(name string, pos int, resolvedBy string, out string) store.StepCheckpointParams {
		return store.StepCheckpointParams{Name: name, Position: pos, Attempts: 1, Output: json.RawMessage(out), StartedAt: started, ResolvedBy: resolvedBy}
	}

	require.NoError(t, st.OperationReserve(ctx, pool, store.OperationInsertParams{
		ID: id, Name: "op", Version: 1, Scope: "s", Key: "k", Steps: []string{"a", "b", "c", "d"},
		Input: json.RawMessage(`{}`), KeySecret: make([]byte, 16), LockedBy: &run, Lease: time.Minute,
		Checkpoints: []store.StepCheckpointParams{step("a", 0, "", `{"n":1,"name":"quote \" and \\ é, \u0000","b":0}`)},
	}))
	require.NoError(t, st.StepCheckpointMany(ctx, pool, store.StepCheckpointManyParams{
		OperationID: id, Run: run, Steps: []store.StepCheckpointParams{step("b", 1, "lookup", `{"n": 2}`)},
	}))
	// b again: another run recorded it first.
	err := st.StepCheckpointMany(ctx, pool, store.StepCheckpointManyParams{
		OperationID: id, Run: run, Steps: []store.StepCheckpointParams{step("b", 1, "lookup", `{"n": 2}`)},
	})
	require.ErrorIs(t, err, store.ErrFenced)

	steps, err := st.StepListByOperation(ctx, pool, id)
	require.NoError(t, err)
	require.Len(t, steps, 2)
	for i, want := range []struct {
		name, resolvedBy, output string
	}{{"a", "", `{"n":1,"name":"quote \" and \\ é, \u0000","b":0}`}, {"b", "lookup", `{"n": 2}`}} {
		got := steps[i]
		require.Equal(t, want.name, got.Name)
		require.Equal(t, i, got.Position)
		require.Equal(t, store.StepSucceeded, got.State)
		require.Equal(t, 1, got.Attempts)
		require.Equal(t, want.resolvedBy, got.ResolvedBy)
		require.Equal(t, want.output, string(got.Output), "the state's exact bytes")
		require.True(t, started.Equal(got.StartedAt), "started %s, read %s", started, got.StartedAt)
		require.NotNil(t, got.FinishedAt)
		require.WithinDuration(t, time.Now(), *got.FinishedAt, 10*time.Second)
		require.False(t, got.FinishedAt.Before(got.StartedAt))
	}

	// A compensation gives the step a row, which wins.
	ok, err := st.StepCompensated(ctx, pool, id, "b")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = st.StepCompensated(ctx, pool, id, "b")
	require.NoError(t, err)
	require.False(t, ok, "compensated twice")
	// A failure of a checkpointed step is never recorded over it.
	require.NoError(t, st.StepRecordFailure(ctx, pool, store.StepRecordFailureParams{
		OperationID: id, Name: "a", Position: 0, State: store.StepRetrying, Attempts: 2, LastError: "x", StartedAt: time.Now(),
	}))
	steps, err = st.StepListByOperation(ctx, pool, id)
	require.NoError(t, err)
	require.Equal(t, []store.StepState{store.StepSucceeded, store.StepCompensated}, []store.StepState{steps[0].State, steps[1].State})
	require.Equal(t, 1, steps[0].Attempts)
	require.JSONEq(t, `{"n": 2}`, string(steps[1].Output), "the row keeps the checkpoint's output")

	// The end carries the last checkpoints.
	finished := &store.Finished{}
	require.NoError(t, st.StepCheckpointMany(ctx, pool, store.StepCheckpointManyParams{
		OperationID: id, Run: run, Steps: []store.StepCheckpointParams{step("c", 2, "call", `{"n": 3}`)},
		Finish: true, State: store.OperationFailed, Error: json.RawMessage(`{"code": "x"}`), Retention: time.Hour, Finished: finished,
	}))
	steps, err = st.StepListByOperation(ctx, pool, id)
	require.NoError(t, err)
	require.Len(t, steps, 3)
	require.Equal(t, "c", steps[2].Name)
	require.Equal(t, "call", steps[2].ResolvedBy)

	// A reopen forgets the compensated step, row and checkpoint; the others stay.
	ok, err = st.OperationReopen(ctx, pool, id, time.Minute, false, false)
	require.NoError(t, err)
	require.True(t, ok)
	steps, err = st.StepListByOperation(ctx, pool, id)
	require.NoError(t, err)
	names := []string{}
	for _, s := range steps {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"a", "c"}, names)
}

// TestOlderBinariesRefused: a binary from before store migration 00010 can
// neither reserve an operation (it does not set the row's format) nor read or
// write steps (it names idemflow_step): it would read an operation's steps
// without their checkpoints and run them again, or undo some of them only.
func TestOlderBinariesRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	id := uuid.New()
	_, err := pool.Exec(ctx, `INSERT INTO idemflow_operation (id, name, version, scope, key, steps, input, locked_by, locked_until)
		VALUES ($1, 'op', 1, 's', 'k', '{a}', '{}', gen_random_uuid(), now())`, id)
	require.Equal(t, "23502", pgError(t, err).Code, "not null violation")
	// As version 0.1.0's StepListByOperation, StepCompensated and StepDeleteUnsucceeded name the table.
	for _, sql := range []string{
		`SELECT operation_id, name, position, state, attempts, output FROM idemflow_step WHERE operation_id = $1`,
		`UPDATE idemflow_step SET state = 'compensated' WHERE operation_id = $1 AND name = 'a' AND state = 'succeeded'`,
		`DELETE FROM idemflow_step WHERE operation_id = $1 AND state <> 'succeeded'`,
	} {
		_, err = pool.Exec(ctx, sql, id)
		require.Equal(t, "42P01", pgError(t, err).Code, "undefined table: %s", sql)
	}
}

// TestCheckpointsDownMigration: undoing store migration 00010 turns the
// checkpoints back into step rows, for the binaries before it.
func TestCheckpointsDownMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	st := store.New()
	run, id := uuid.New(), uuid.Must(uuid.NewV7())
	started := time.Now().Truncate(time.Microsecond)
	require.NoError(t, st.OperationReserve(ctx, pool, store.OperationInsertParams{
		ID: id, Name: "op", Version: 1, Scope: "s", Key: "k", Steps: []string{"a", "b"},
		Input: json.RawMessage(`{}`), KeySecret: make([]byte, 16), LockedBy: &run, Lease: time.Minute,
		Checkpoints: []store.StepCheckpointParams{{Name: "a", Position: 0, Attempts: 1, Output: json.RawMessage(`{"n":1}`), StartedAt: started}},
	}))
	require.NoError(t, st.StepRecordFailure(ctx, pool, store.StepRecordFailureParams{
		OperationID: id, Name: "b", Position: 1, State: store.StepRetrying, Attempts: 1, LastError: "x", StartedAt: started,
	}))

	migrateTo(t, pool, 9)
	type row struct {
		name, state string
		output      string
	}
	var got []row
	rows, err := pool.Query(ctx, `SELECT name, state, coalesce(output::text, '') FROM idemflow_step WHERE operation_id = $1 ORDER BY position`, id)
	require.NoError(t, err)
	for rows.Next() {
		var r row
		require.NoError(t, rows.Scan(&r.name, &r.state, &r.output))
		got = append(got, r)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []row{{"a", "succeeded", `{"n":1}`}, {"b", "retrying", ""}}, got)
}
