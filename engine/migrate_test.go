package engine_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/store"
)

// TestMigrate: StartWorkers refuses a database that lacks the migrations,
// saying what to call; Migrate applies them, twice as well as once.
func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	// The test database comes migrated: take idemflow's latest migration back.
	_, err := pool.Exec(ctx, `UPDATE idemflow_schema_version SET version = version - 1`)
	require.NoError(t, err)

	e, err := engine.New(pool, nil)
	require.NoError(t, err)
	err = e.StartWorkers(ctx)
	require.ErrorIs(t, err, store.ErrNotMigrated)
	require.ErrorContains(t, err, "call engine.Migrate(ctx, pool) before StartWorkers")

	// The migration's statements are idempotent only in its own transaction, so
	// give the schema back as it was before it, then migrate.
	_, err = pool.Exec(ctx, `ALTER TABLE idemflow_step DROP COLUMN compensations, DROP COLUMN resolved_by, DROP COLUMN last_cause;
		ALTER TABLE idemflow_operation DROP COLUMN parked, DROP COLUMN attention, DROP COLUMN attention_code, DROP COLUMN key_secret;
		CREATE INDEX idemflow_operation_lease ON idemflow_operation (locked_until) WHERE state = 'in_progress'`)
	require.NoError(t, err)
	require.NoError(t, engine.Migrate(ctx, pool, nil))
	require.NoError(t, engine.Migrate(ctx, pool, nil))
	require.NoError(t, store.CheckSchema(ctx, pool))
	require.NoError(t, e.StartWorkers(ctx))
	require.NoError(t, e.Stop(ctx))
}
