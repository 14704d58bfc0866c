package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/store"
)

// outcomeOp reserves an operation whose step "pay" failed an attempt that
// sent a request with a settle window of window, and returns its id.
func outcomeOp(t *testing.T, pool *pgxpool.Pool, window time.Duration) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	st := store.New()
	id, run := uuid.New(), uuid.New()
	require.NoError(t, st.OperationReserve(ctx, pool, store.OperationInsertParams{
		ID: id, Name: "op", Version: 1, Scope: "s", Key: "k", Steps: []string{"pay"},
		Input: json.RawMessage(`{}`), KeySecret: make([]byte, 16), LockedBy: &run, Lease: time.Minute,
	}))
	sent := time.Now()
	require.NoError(t, st.StepRecordFailure(ctx, pool, store.StepRecordFailureParams{
		OperationID: id, Name: "pay", Position: 0, State: store.StepWaiting, Attempts: 1, StartedAt: sent,
		SentAt: &sent, SettleWindow: &window, DerivedKey: "dk-" + id.String(),
	}))
	return id
}

// TestOutcomeRecord: the inbox keeps an outcome once per (key, event id),
// and answers a repeat with what it kept.
func TestOutcomeRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	st := store.New()
	o := store.Outcome{DerivedKey: "dk", EventID: "evt_1", Status: "succeeded", Reference: "pr_1", Amount: 100, Data: json.RawMessage(`{"orderId":"A"}`)}
	added, kept, err := st.OutcomeRecord(ctx, pool, o)
	require.NoError(t, err)
	require.True(t, added)
	require.Nil(t, kept)

	o.Reference = "pr_2"
	added, kept, err = st.OutcomeRecord(ctx, pool, o)
	require.NoError(t, err)
	require.False(t, added)
	require.Equal(t, "pr_1", kept.Reference, "the first one is kept")

	list, err := st.OutcomeListByKey(ctx, pool, "dk")
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.JSONEq(t, `{"orderId":"A"}`, string(list[0].Data))

	_, _, err = st.OutcomeRecord(ctx, pool, store.Outcome{DerivedKey: "dk", EventID: "evt_2", Status: "maybe"})
	require.Error(t, err, "the status is checked")
}

// TestOutcomeRefuseNotMade: a call may be recorded as not made only while the
// inbox holds no success under its key, and, from silence, once its stored
// settle_by has passed by the database's clock.
func TestOutcomeRefuseNotMade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := store.New()

	t.Run("WindowOpen", func(t *testing.T) {
		t.Parallel()
		pool := testdb.Pool(t)
		id := outcomeOp(t, pool, time.Hour)
		err := st.OutcomeRefuseNotMade(ctx, pool, id, "pay", "dk-"+id.String(), true)
		require.ErrorIs(t, err, store.ErrMayLand)
		var open *store.SettleOpenError
		require.ErrorAs(t, err, &open)
		require.WithinDuration(t, time.Now().Add(time.Hour), open.Until, time.Minute)
		// A failure the service reported is no decision from silence.
		require.NoError(t, st.OutcomeRefuseNotMade(ctx, pool, id, "pay", "dk-"+id.String(), false))

		times, err := st.OperationSettleBy(ctx, pool, id, "pay", time.Second)
		require.NoError(t, err)
		require.Equal(t, open.Until.UTC(), times.Until.UTC())
		require.WithinDuration(t, time.Now(), times.Now, time.Minute)
	})

	t.Run("WindowPassed", func(t *testing.T) {
		t.Parallel()
		pool := testdb.Pool(t)
		id := outcomeOp(t, pool, 0)
		require.NoError(t, st.OutcomeRefuseNotMade(ctx, pool, id, "pay", "dk-"+id.String(), true))
	})

	t.Run("SuccessKept", func(t *testing.T) {
		t.Parallel()
		pool := testdb.Pool(t)
		id := outcomeOp(t, pool, 0)
		_, _, err := st.OutcomeRecord(ctx, pool, store.Outcome{DerivedKey: "dk-" + id.String(), EventID: "e", Status: "succeeded"})
		require.NoError(t, err)
		for _, bySilence := range []bool{true, false} {
			err := st.OutcomeRefuseNotMade(ctx, pool, id, "pay", "dk-"+id.String(), bySilence)
			require.ErrorIs(t, err, store.ErrOutcomeSucceeded)
		}
	})

	t.Run("SerialisedWithTheInbox", func(t *testing.T) {
		t.Parallel()
		pool := testdb.Pool(t)
		id := outcomeOp(t, pool, 0)
		key := "dk-" + id.String()
		decide, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = decide.Rollback(ctx) }()
		require.NoError(t, st.OutcomeRefuseNotMade(ctx, decide, id, "pay", key, true))
		// While the decision's transaction is open, an outcome under its key
		// waits for it: here it gives up at lock_timeout.
		record, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = record.Rollback(ctx) }()
		_, err = record.Exec(ctx, "SET LOCAL lock_timeout = '100ms'")
		require.NoError(t, err)
		_, _, err = st.OutcomeRecord(ctx, record, store.Outcome{DerivedKey: key, EventID: "e", Status: "succeeded"})
		require.Equal(t, "55P03", pgError(t, err).Code, "lock_not_available")
	})
}

// TestInboxMigrationDown: migration 17 undoes cleanly, and applies again.
func TestInboxMigrationDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	m := migrator(t, pool)
	require.NoError(t, m.MigrateTo(ctx, 16))
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('idemflow_outcome') IS NOT NULL`).Scan(&exists))
	require.False(t, exists)
	require.NoError(t, m.Migrate(ctx))
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('idemflow_outcome') IS NOT NULL`).Scan(&exists))
	require.True(t, exists)
}
