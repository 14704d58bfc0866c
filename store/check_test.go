package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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
			require.EqualValues(t, "IF002", pgErr.Code)
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

	t.Run("InlinedAndLazy", func(t *testing.T) {
		t.Parallel()
		// A SQL function of one CASE (store migration 00011): the plan holds
		// the CASE, not a call, and a passing check never builds its message
		// (random() keeps the planner from folding the division ahead of time).
		var plan []string
		rows, err := pool.Query(ctx, `EXPLAIN (VERBOSE, COSTS OFF) SELECT idemflow_check(g > 0, 'c', 'm') FROM generate_series(1, 2) AS g`)
		require.NoError(t, err)
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan = append(plan, line)
		}
		require.NoError(t, rows.Err())
		require.Contains(t, strings.Join(plan, "\n"), "CASE WHEN")
		require.NotContains(t, strings.Join(plan, "\n"), "idemflow_check(")

		var got bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT idemflow_check(true, 'c', format('%s', (random() / 0)::text))`).Scan(&got))
		require.True(t, got)
		err = pool.QueryRow(ctx, `SELECT idemflow_check(false, 'c', format('%s', (random() / 0)::text))`).Scan(&got)
		require.Equal(t, "22012", pgError(t, err).Code, "a failing check builds its message")
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

// TestFence: idemflow_fence passes true and NULL (the engine never sends a
// NULL; a NULL passed before migration 00011 made it a SQL function, and
// still does), and raises SQLSTATE IF001 on false.
func TestFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	for _, held := range []string{"true", "NULL"} {
		var got bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT idemflow_fence(`+held+`::boolean)`).Scan(&got), held)
		require.True(t, got, held)
	}
	var got bool
	err := pool.QueryRow(ctx, `SELECT idemflow_fence($1)`, false).Scan(&got)
	require.Equal(t, "IF001", pgError(t, err).Code)
	require.ErrorIs(t, store.Err(err), store.ErrFenced)
}

// TestCheckMigrationDown: migration 5 undoes cleanly (idemflow_check gone, the
// comments cleared), with any later one, and applies again.
func TestCheckMigrationDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	m := migrator(t, pool)

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

// TestCheaperWritesMigrationDown: migrations 11 to 13 undo cleanly (the two
// indexes of unfinished operations back, the two checks of state and
// finished_at, the guards PL/pgSQL again, with their comments), and applies
// again; rows are refused and taken alike by its checks and the ones before.
func TestCheaperWritesMigrationDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	m := migrator(t, pool)

	state := func() (indexes []string, languages map[string]string) {
		t.Helper()
		rows, err := pool.Query(ctx, `
			SELECT indexname FROM pg_indexes
			WHERE tablename = 'idemflow_operation' AND indexname IN
			      ('idemflow_operation_unfinished', 'idemflow_operation_lease', 'idemflow_operation_in_progress')
			ORDER BY indexname`)
		require.NoError(t, err)
		indexes, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		languages = map[string]string{}
		rows, err = pool.Query(ctx, `
			SELECT p.proname, l.lanname FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang
			WHERE p.proname IN ('idemflow_check', 'idemflow_fence', 'idemflow_fence_lost')`)
		require.NoError(t, err)
		var name, lang string
		_, err = pgx.ForEachRow(rows, []any{&name, &lang}, func() error {
			languages[name] = lang
			return nil
		})
		require.NoError(t, err)
		return indexes, languages
	}

	// What a row may hold: a state of three, finished_at set when it is
	// finished and only then.
	insert := func(state string, finished bool) error {
		_, err := pool.Exec(ctx, `
			INSERT INTO idemflow_operation (id, name, scope, key, steps, input, locked_until, format, state, finished_at)
			VALUES (gen_random_uuid(), 'op', 's', gen_random_uuid()::text, '{a}', '{}', now(), 2, $1,
			        CASE WHEN $2 THEN now() END)`, state, finished)
		return err
	}
	refused := func(state string, finished bool) {
		t.Helper()
		pgErr := pgError(t, insert(state, finished))
		require.EqualValues(t, "23514", pgErr.Code, "%s, finished %v", state, finished)
	}
	checkRows := func() {
		t.Helper()
		require.NoError(t, insert("in_progress", false))
		require.NoError(t, insert("succeeded", true))
		require.NoError(t, insert("failed", true))
		refused("in_progress", true)
		refused("succeeded", false)
		refused("failed", false)
		refused("cancelled", true)
		refused("cancelled", false)
	}
	checkRows()
	require.Equal(t, "idemflow_operation_state", pgError(t, insert("succeeded", false)).ConstraintName)
	var validated bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT convalidated FROM pg_constraint WHERE conname = 'idemflow_operation_state'`).Scan(&validated))
	require.True(t, validated, "migration 12 validated the check that 11 added NOT VALID")

	indexes, languages := state()
	require.Equal(t, []string{"idemflow_operation_unfinished"}, indexes)
	require.Equal(t, map[string]string{"idemflow_check": "sql", "idemflow_fence": "sql", "idemflow_fence_lost": "plpgsql"}, languages)

	require.NoError(t, m.MigrateTo(ctx, 10))
	indexes, languages = state()
	require.Equal(t, []string{"idemflow_operation_in_progress", "idemflow_operation_lease"}, indexes)
	require.Equal(t, map[string]string{"idemflow_check": "plpgsql", "idemflow_fence": "plpgsql"}, languages)
	requireCheck(t, pool, true)
	checkRows()
	require.Equal(t, "idemflow_operation_finished", pgError(t, insert("succeeded", false)).ConstraintName)

	require.NoError(t, m.Migrate(ctx))
	indexes, _ = state()
	require.Equal(t, []string{"idemflow_operation_unfinished"}, indexes)
	requireCheck(t, pool, true)
	checkRows()
}

// TestCheaperWritesMigrationUnderTraffic: migrations 11 to 13 apply while
// transactions of a running process read an operation FOR SHARE and then
// update it, as OperationFence and the statements after it do. A migration that
// took a weak lock on idemflow_operation and then asked for a stronger one
// (CREATE INDEX, then DROP INDEX, in one transaction) deadlocked with them.
func TestCheaperWritesMigrationUnderTraffic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	m := migrator(t, pool)
	require.NoError(t, m.MigrateTo(ctx, 10))

	_, err := pool.Exec(ctx, `
		INSERT INTO idemflow_operation (id, name, scope, key, steps, input, locked_until, format)
		SELECT gen_random_uuid(), 'op', 's', 'k' || i, '{a}', '{}', now(), 2 FROM generate_series(1, 2000) AS i`)
	require.NoError(t, err)

	stop := make(chan struct{})
	errs := make(chan error, 4)
	for w := range 4 {
		go func() {
			var err error
			for i := 0; err == nil; i++ {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					key := fmt.Sprintf("k%d", 1+w*500+i%500) // each worker its own rows
					if _, err := tx.Exec(ctx, `SELECT 1 FROM idemflow_operation WHERE scope = 's' AND key = $1 FOR SHARE`, key); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.01)`); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `UPDATE idemflow_operation SET locked_until = now() WHERE scope = 's' AND key = $1`, key)
					return err
				})
			}
			errs <- err
		}()
	}
	time.Sleep(100 * time.Millisecond) // the traffic under way
	migrateErr := m.MigrateTo(ctx, 13)
	close(stop)
	for range 4 {
		require.NoError(t, <-errs, "a transaction of the running process")
	}
	require.NoError(t, migrateErr)
	var valid bool
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT indisvalid FROM pg_index WHERE indexrelid = 'idemflow_operation_unfinished'::regclass`).Scan(&valid))
	require.True(t, valid)
	require.NoError(t, m.Migrate(ctx))
}
