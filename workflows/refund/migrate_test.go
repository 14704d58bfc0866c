package refund

import (
	"io/fs"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/store"
)

// TestMigrateOrderRefunded checks that the migration that adds demo_order.refunded
// fills it from the refunds recorded before it.
func TestMigrateOrderRefunded(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.Pool(t)

	first, err := fs.ReadFile(migrations, "migrations/00001_init.sql")
	require.NoError(t, err)
	firstOnly := store.MigrationSet{Name: migrationSetName, FS: fstest.MapFS{"00001_init.sql": {Data: first}}}
	require.NoError(t, firstOnly.Apply(ctx, pool, nil))
	_, err = pool.Exec(ctx, `
		INSERT INTO demo_order (client, order_id, customer_id, amount) VALUES
			('a', 'O-1', 'cus_1', 1000), ('a', 'O-2', 'cus_1', 500), ('b', 'O-1', 'cus_2', 300);
		INSERT INTO demo_refund (id, client, order_id, amount, status, provider_refund_id) VALUES
			('re_1', 'a', 'O-1', 100, 'succeeded', 'pr_1'),
			('re_2', 'a', 'O-1', 200, 'pending', NULL),
			('re_3', 'a', 'O-1', 400, 'failed', NULL),
			('re_4', 'b', 'O-1', 300, 'succeeded', 'pr_4');`)
	require.NoError(t, err)

	require.NoError(t, Migrate(ctx, pool))
	rows, err := pool.Query(ctx, `SELECT client || '/' || order_id, refunded FROM demo_order`)
	require.NoError(t, err)
	got := map[string]int64{}
	for rows.Next() {
		var order string
		var refunded int64
		require.NoError(t, rows.Scan(&order, &refunded))
		got[order] = refunded
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int64{"a/O-1": 300, "a/O-2": 0, "b/O-1": 300}, got)

	// The column stays within the order's amount.
	_, err = pool.Exec(ctx, `UPDATE demo_order SET refunded = 301 WHERE client = 'b'`)
	require.ErrorContains(t, err, "demo_order_refunded")
	_, err = pool.Exec(ctx, `UPDATE demo_order SET refunded = -1 WHERE client = 'b'`)
	require.ErrorContains(t, err, "demo_order_refunded")
}
