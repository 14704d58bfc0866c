package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

func TestBoundPool(t *testing.T) {
	t.Parallel()
	base := testdb.Pool(t)
	for _, tt := range []struct {
		name                  string
		opts                  *engine.PoolOpts
		statement, lock, idle string
		connect               time.Duration
	}{
		{"Defaults", nil, "5s", "2s", "15s", 5 * time.Second},
		{"ShortLease", &engine.PoolOpts{Lease: time.Second}, "500ms", "250ms", "1s", 5 * time.Second},
		{"Set", &engine.PoolOpts{StatementTimeout: 7 * time.Second, LockTimeout: time.Second, IdleInTransactionTimeout: time.Minute, ConnectTimeout: time.Second},
			"7s", "1s", "1min", time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := base.Config().Copy()
			engine.BoundPool(c, tt.opts)
			require.Equal(t, tt.connect, c.ConnConfig.ConnectTimeout)
			pool, err := pgxpool.NewWithConfig(ctx, c)
			require.NoError(t, err)
			defer pool.Close()
			for setting, want := range map[string]string{
				"statement_timeout": tt.statement, "lock_timeout": tt.lock, "idle_in_transaction_session_timeout": tt.idle,
			} {
				var got string
				require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got))
				require.Equal(t, want, got, setting)
			}
		})
	}
}
