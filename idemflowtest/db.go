package idemflowtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// DatabaseURL returns the URL of a new database for tb, with idemflow's tables
// and River's and nothing in them. It is dropped when tb ends, or kept (its URL
// logged) when tb failed. See the package documentation for the server it is
// made on.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	return testdb.URL(tb)
}

// Pool returns a pool on a new database for tb (see DatabaseURL), closed when tb
// ends. setup, when not nil, runs on it first: the service's own migrations or
// rows.
func Pool(tb testing.TB, setup func(ctx context.Context, pool *pgxpool.Pool) error) *pgxpool.Pool {
	tb.Helper()
	return openPool(tb, DatabaseURL(tb), setup)
}

func openPool(tb testing.TB, url string, setup func(ctx context.Context, pool *pgxpool.Pool) error) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(tb.Context(), url)
	require.NoError(tb, err, "idemflowtest: open pool")
	tb.Cleanup(pool.Close)
	if setup != nil {
		require.NoError(tb, setup(tb.Context(), pool), "idemflowtest: set up the database")
	}
	return pool
}

// ExamplePool returns a pool on a new database for an example function, which
// has no testing.TB, named after name, and the function that closes the pool
// and drops the database. It panics when the database cannot be made: an
// example cannot fail otherwise.
func ExamplePool(name string) (*pgxpool.Pool, func()) {
	return testdb.ExamplePool(name)
}
