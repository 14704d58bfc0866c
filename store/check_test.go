package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/store"
)

// pgError returns err's *pgconn.PgError, failing t when it has none.
func pgError(t *testing.T, err error) *pgconn.PgError {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "not a PostgreSQL error: %v", err)
	return pgErr
}

// TestCheck: idemflow_check answers true when ok is true, and raises what
// idemflow_fail raises (SQLSTATE IF002, the code as DETAIL) when ok is false
// or NULL.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)

	t.Run("True", func(t *testing.T) {
		t.Parallel()
		var got bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT idemflow_check(true, 'c', 'm')`).Scan(&got))
		require.True(t, got)
		// Code and message are not read then.
		require.NoError(t, pool.QueryRow(ctx, `SELECT idemflow_check(true, NULL, NULL)`).Scan(&got))
		require.True(t, got)
	})

	for _, ok := range []string{"false", "NULL"} {
		t.Run("Fails/ok="+ok, func(t *testing.T) {
			t.Parallel()
			var got bool
			err := pool.QueryRow(ctx, `SELECT idemflow_check(`+ok+`::boolean, 'too_big', '11 is more than 10')`).Scan(&got)
			pgErr := pgError(t, err)
			require.Equal(t, "IF002", pgErr.Code)
			require.Equal(t, "too_big", pgErr.Detail)
			require.Equal(t, "11 is more than 10", pgErr.Message)

			// The error idemflow_fail raises, field for field.
			fail := pgError(t, pool.QueryRow(ctx, `SELECT idemflow_fail('too_big', '11 is more than 10')`).Scan(&got))
			require.Equal(t, [3]string{fail.Code, fail.Detail, fail.Message}, [3]string{pgErr.Code, pgErr.Detail, pgErr.Message})
		})
	}

	t.Run("NullParameter", func(t *testing.T) {
		t.Parallel()
		// The way a guard sees a missing row: its comparison is NULL.
		var got bool
		err := pool.QueryRow(ctx, `SELECT idemflow_check((SELECT n > 0 FROM (VALUES (1)) AS v (n) WHERE false), 'none', 'no row')`).Scan(&got)
		require.Equal(t, "IF002", pgError(t, err).Code)
		err = pool.QueryRow(ctx, `SELECT idemflow_check($1, 'none', 'unset')`, (*bool)(nil)).Scan(&got)
		require.Equal(t, "IF002", pgError(t, err).Code)
	})

	t.Run("NullCodeOrMessage", func(t *testing.T) {
		t.Parallel()
		// The caller's mistake: the statement still fails, with PostgreSQL's
		// "RAISE statement option cannot be null", which is no IF002.
		for _, args := range []string{`NULL, 'm'`, `'c', NULL`} {
			var got bool
			err := pool.QueryRow(ctx, `SELECT idemflow_check(false, `+args+`)`).Scan(&got)
			require.Equal(t, "22004", pgError(t, err).Code, args)
		}
	})

	t.Run("InCTE", func(t *testing.T) {
		t.Parallel()
		// The shape of a guarded AtCommit statement: a write, and a SELECT of
		// one row that fails when the write matched nothing, undoing it.
		_, err := pool.Exec(ctx, `CREATE TABLE test_check (id int PRIMARY KEY, state text NOT NULL)`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO test_check VALUES (1, 'pending'), (2, 'done')`)
		require.NoError(t, err)
		const mark = `
			WITH marked AS (
				UPDATE test_check SET state = 'done' WHERE id = $1 AND state = 'pending' RETURNING id
			)
			SELECT idemflow_check(EXISTS (SELECT 1 FROM marked), 'not_pending', format('%s is not pending', $1::int))`
		_, err = pool.Exec(ctx, mark, 1)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, mark, 2)
		pgErr := pgError(t, err)
		require.Equal(t, "not_pending", pgErr.Detail)
		require.Equal(t, "2 is not pending", pgErr.Message)
		_, err = pool.Exec(ctx, mark, 3)
		require.Equal(t, "3 is not pending", pgError(t, err).Message)
	})

	t.Run("Comments", func(t *testing.T) {
		t.Parallel()
		// What \df+ shows: which of idemflow's functions are the application's.
		comments := map[string]string{}
		rows, err := pool.Query(ctx, `
			SELECT p.proname, coalesce(obj_description(p.oid, 'pg_proc'), '')
			FROM pg_proc AS p
			WHERE p.proname IN ('idemflow_fail', 'idemflow_check', 'idemflow_fence')`)
		require.NoError(t, err)
		for rows.Next() {
			var name, comment string
			require.NoError(t, rows.Scan(&name, &comment))
			comments[name] = comment
		}
		require.NoError(t, rows.Err())
		require.Len(t, comments, 3)
		require.Contains(t, comments["idemflow_fail"], "for application SQL")
		require.Contains(t, comments["idemflow_check"], "for application SQL")
		require.Contains(t, comments["idemflow_fence"], "not for application SQL")
	})
}

// TestCheckMigrationDown: migration 5 undoes cleanly (idemflow_check gone, the
// comments cleared), with any later one, and applies again.
func TestCheckMigrationDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	m, err := migrate.NewMigrator(ctx, conn.Conn(), "idemflow_schema_version")
	require.NoError(t, err)
	require.NoError(t, m.LoadMigrations(store.Migrations()))

	require.NoError(t, m.MigrateTo(ctx, 4))
	requireCheck(t, pool, false)
	require.NoError(t, m.Migrate(ctx))
	requireCheck(t, pool, true)
}

// requireCheck asserts whether idemflow_check exists, and idemflow_fence's
// comment with it.
func requireCheck(t *testing.T, pool *pgxpool.Pool, want bool) {
	t.Helper()
	var exists, commented bool
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT to_regprocedure('idemflow_check(boolean, text, text)') IS NOT NULL,
		       obj_description('idemflow_fence(boolean)'::regprocedure, 'pg_proc') IS NOT NULL`).Scan(&exists, &commented))
	require.Equal(t, want, exists, "idemflow_check exists")
	require.Equal(t, want, commented, "idemflow_fence has its comment")
}
