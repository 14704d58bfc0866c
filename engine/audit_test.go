package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/testdb"
)

// TestAuditKeptAsLongAsTheOperation: an operator's request, refused here, is
// in the operation's audit trail, and goes when retention deletes the
// operation.
func TestAuditKeptAsLongAsTheOperation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	op, err := engine.NewOperation("audited", []engine.Step[int, struct{}]{
		engine.TxStep("refuse", func(context.Context, engine.Tx, engine.Attempt, int, *struct{}) error {
			return engine.Fail("declined", "declined")
		}),
	}, func(int, *struct{}) (int, error) { return 0, nil }, nil)
	require.NoError(t, err)
	e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
	s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, fsWait(t, e, s.ID).Status)

	require.ErrorIs(t, errOf(e.Retry(engine.WithActor(ctx, "gina"), s.ID, &engine.RetryOpts{Reason: "try again"})), engine.ErrFinal)
	audit := fsGet(t, e, s.ID).Audit
	require.Len(t, audit, 1)
	require.Equal(t, engine.AuditEntry{At: audit[0].At, Action: engine.ActionRetry, Actor: "gina", Reason: "try again",
		Result: "refused", Refusal: engine.ErrFinal, Detail: audit[0].Detail}, audit[0])
	require.Contains(t, audit[0].Detail, "final")

	later := time.Now().Add(defaultRetention + time.Hour)
	n, err := e.DeleteFinished(ctx, &later)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_operator_request`).Scan(&left))
	require.Zero(t, left, "the audit trail goes with its operation")
}
