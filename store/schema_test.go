package store_test

import (
	"context"
	"errors"
	"io/fs"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/store"
)

// TestSchemaVersions: the database's version against the build's, ahead once
// another build records a newer one, and ErrNotMigrated without a version.
func TestSchemaVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)

	database, build, err := store.SchemaVersions(ctx, pool)
	require.NoError(t, err)
	files, err := fs.Glob(store.Migrations(), "*.sql")
	require.NoError(t, err)
	require.Len(t, files, build, "the build's latest migration")
	require.Equal(t, build, database)

	_, err = pool.Exec(ctx, `UPDATE idemflow_schema_version SET version = version + 2`)
	require.NoError(t, err)
	database, _, err = store.SchemaVersions(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, build+2, database, "a newer build's")

	_, err = pool.Exec(ctx, `DROP TABLE idemflow_schema_version`)
	require.NoError(t, err)
	_, _, err = store.SchemaVersions(ctx, pool)
	require.ErrorIs(t, err, store.ErrNotMigrated)
}

// TestCheckStatements: every statement of the build fits the schema it
// migrates to, and a rename that a migration that is not rolling would make
// (as 00015 renamed key_secret) is found, naming a query that uses the
// column, with nothing run.
func TestCheckStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	require.NoError(t, store.CheckStatements(ctx, pool))

	t.Run("RenamedColumn", func(t *testing.T) {
		t.Parallel()
		pool := testdb.Pool(t)
		_, err := pool.Exec(ctx, `ALTER TABLE idemflow_operation RENAME COLUMN key_seed TO key_seed_v2`)
		require.NoError(t, err)
		err = store.CheckStatements(ctx, pool)
		require.Error(t, err)
		require.True(t, store.IsSchemaError(err), "%v", err)
		require.Regexp(t, `store: Operation\w+ does not fit the schema: .*key_seed`, err.Error())
	})

	t.Run("DroppedFunction", func(t *testing.T) {
		t.Parallel()
		pool := testdb.Pool(t)
		_, err := pool.Exec(ctx, `DROP FUNCTION idemflow_live_keys(bigint)`)
		require.NoError(t, err)
		err = store.CheckStatements(ctx, pool)
		require.True(t, store.IsSchemaError(err), "%v", err)
		require.ErrorContains(t, err, "idemflow_live_keys")
	})

	t.Run("Additions", func(t *testing.T) {
		t.Parallel()
		pool := testdb.Pool(t)
		// What a rolling migration does: the build's statements still fit.
		_, err := pool.Exec(ctx, `ALTER TABLE idemflow_operation ADD COLUMN priority int NOT NULL DEFAULT 0;
			CREATE TABLE idemflow_newer (id bigint PRIMARY KEY)`)
		require.NoError(t, err)
		require.NoError(t, store.CheckStatements(ctx, pool))
	})
}

func TestIsSchemaError(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{
		"42703": true,  // undefined_column
		"42P01": true,  // undefined_table
		"42883": true,  // undefined_function
		"42501": false, // insufficient_privilege
		"23505": false, // unique_violation
		"08006": false, // connection_failure
	} {
		require.Equal(t, want, store.IsSchemaError(&pgconn.PgError{Code: code}), code)
	}
	require.False(t, store.IsSchemaError(errors.New("42703")))
	require.False(t, store.IsSchemaError(nil))
}
