package pgcluster

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestPgBouncer: a PgBouncer in transaction mode with one server connection
// serves two clients, each transaction on that one connection; it refuses a
// startup parameter that it does not know, as engine.BoundPool's timeouts.
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	if _, err := BinDir(); err != nil {
		t.Skip("no PostgreSQL server binaries")
	}
	ctx := t.Context()
	cluster, err := Ensure(ctx, TestClusterConfig())
	require.NoError(t, err)
	b := StartPgBouncerT(t, cluster.URL("postgres"), &PgBouncerConfig{PoolSize: 1})

	connect := func(params map[string]string) (*pgx.Conn, error) {
		c, err := pgx.ParseConfig(b.URL("postgres"))
		require.NoError(t, err)
		c.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		for k, v := range params {
			c.RuntimeParams[k] = v
		}
		return pgx.ConnectConfig(ctx, c)
	}
	pids := map[uint32]bool{}
	for range 2 {
		conn, err := connect(nil)
		require.NoError(t, err)
		defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
		var pid uint32
		require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SELECT pg_backend_pid()::int8").Scan(&pid)
		}))
		pids[pid] = true
	}
	require.Len(t, pids, 1, "both clients' transactions ran on the one server connection")

	_, err = connect(map[string]string{"statement_timeout": "5000"})
	require.ErrorContains(t, err, "unsupported startup parameter")
}
