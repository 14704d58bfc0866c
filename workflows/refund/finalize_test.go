package refund

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// TestFinalize runs the finalize step on a pgx.Tx, where its AtCommit write runs
// at once: it marks a pending refund succeeded, and fails on any other.
func TestFinalize(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.Pool(t)
	require.NoError(t, Migrate(ctx, pool))
	_, err := pool.Exec(ctx, `
		INSERT INTO demo_order (client, order_id, customer_id, amount, refunded) VALUES ('a', 'O-1', 'cus_1', 1000, 300);
		INSERT INTO demo_refund (id, client, order_id, amount, status, provider_refund_id) VALUES
			('re_pending', 'a', 'O-1', 100, 'pending', NULL),
			('re_failed', 'a', 'O-1', 200, 'failed', NULL),
			('re_done', 'a', 'O-1', 200, 'succeeded', 'pr_0');`)
	require.NoError(t, err)
	w := &Workflows{q: refunddb.New()}

	tests := []struct {
		id, wantErr, wantStatus string
	}{
		{"re_pending", "", "succeeded"},
		{"re_failed", "refund re_failed is not pending", "failed"},
		{"re_done", "refund re_done is not pending", "succeeded"},
		{"re_missing", "refund re_missing is not pending", ""},
	}
	for _, tc := range tests {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return w.finalize(ctx, tx, engine.Attempt{}, RefundInput{}, &RefundState{RefundID: tc.id, ProviderRefundID: "pr_1"})
		})
		if tc.wantErr == "" {
			require.NoError(t, err, tc.id)
		} else {
			require.ErrorContains(t, err, tc.wantErr, tc.id)
		}
		var status string
		err = pool.QueryRow(ctx, `SELECT status FROM demo_refund WHERE id = $1`, tc.id).Scan(&status)
		if tc.wantStatus == "" {
			require.ErrorIs(t, err, pgx.ErrNoRows)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.wantStatus, status, tc.id)
	}
}
