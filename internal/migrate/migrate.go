// Package migrate applies a set of SQL migrations of the repository's own
// (the demo's ledger, the fake provider, the examples' tables) beside
// idemflow's, each set with a version table of its own. A service keeps its
// own tables with the migration tool it already has; what engine.Migrate
// applies is also printed by `idemflow migrate-get` for one that applies
// idemflow's SQL itself.
package migrate

import (
	"context"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/store"
)

// Apply applies the set named name: the files of fsys's directory dir (its
// root when empty), named <version>_<name>.sql and numbered from 1, in
// tern's SQL format (what undoes a migration below a "---- create above /
// drop below ----" line), with a version table of their own
// (<name>_schema_version). Each migration runs in a transaction of its own
// under a transaction-scoped advisory lock, without pool's statement and lock
// timeouts: it is safe to call from several processes at once, and through
// a pooler in transaction mode. logger may be nil.
func Apply(ctx context.Context, pool *pgxpool.Pool, name string, fsys fs.FS, dir string, logger *slog.Logger) error {
	return store.MigrationSet{Name: name, FS: fsys, Dir: dir}.Apply(ctx, pool, logger)
}
