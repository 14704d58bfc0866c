package engine_test

import (
	"context"
	"io/fs"
	"log/slog"
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
	// The test database comes migrated: take idemflow's latest migration back,
	// by its own down section.
	files, err := fs.Glob(store.Migrations(), "*.sql")
	require.NoError(t, err)
	set := store.MigrationSet{Name: "idemflow", FS: store.Migrations()}
	require.NoError(t, set.MigrateTo(ctx, pool, len(files)-1, slog.New(slog.DiscardHandler)))

	e, err := engine.New(pool, nil)
	require.NoError(t, err)
	err = e.StartWorkers(ctx)
	require.ErrorIs(t, err, store.ErrNotMigrated)
	require.ErrorContains(t, err, "call engine.Migrate(ctx, pool) before StartWorkers")
	_, err = engine.NewAdmin(ctx, pool)
	require.ErrorIs(t, err, engine.ErrNotMigrated, "an operator's handle creates nothing")

	require.NoError(t, engine.Migrate(ctx, pool, nil))
	require.NoError(t, engine.Migrate(ctx, pool, nil))
	require.NoError(t, store.CheckSchema(ctx, pool, nil))
	require.NoError(t, e.StartWorkers(ctx))
	require.NoError(t, e.Stop(ctx))
}
