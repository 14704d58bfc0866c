package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/store/internal/dbsqlc"
)

// The migration runner: files in tern's SQL format, a version table of one
// row per set as tern keeps it (<set>_schema_version, version int4), and one
// transaction per migration that first takes a transaction-scoped advisory
// lock and reads the version again under it. It needs no session (nothing
// outlives a transaction), so it runs through a pooler in transaction mode,
// and several processes may run it at once: they take turns, migration by
// migration. It replaced tern, whose lock is held by a session, and whose
// Go templates brought sprig and its dependencies into a user's module graph.

// migrationSeparator parts a file: the SQL that applies the migration above
// it, the SQL that undoes it below (tern's format, which sqlc reads too).
const migrationSeparator = "---- create above / drop below ----"

// migrationFile matches a migration's file name: <version>_<name>.sql.
var migrationFile = regexp.MustCompile(`\A(\d+)_.+\.sql\z`)

// migration is one file of a set.
type migration struct {
	version int32
	name    string // the file's
	// up applies it; down undoes it, empty when it cannot be undone.
	up, down string
}

// loadMigrations reads the migrations in fsys's root, numbered from 1 without
// a gap. Subdirectories are not read.
func loadMigrations(fsys fs.FS) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	byVersion := map[int64]migration{}
	for _, ent := range entries {
		m := migrationFile.FindStringSubmatch(ent.Name())
		if ent.IsDir() || m == nil {
			continue
		}
		v, err := strconv.ParseInt(m[1], 10, 32)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%s: the version must be a number from 1", ent.Name())
		}
		if other, dup := byVersion[v]; dup {
			return nil, fmt.Errorf("%s and %s have the same version", other.name, ent.Name())
		}
		body, err := fs.ReadFile(fsys, ent.Name())
		if err != nil {
			return nil, err
		}
		text := string(body)
		switch {
		case strings.Contains(text, "---- tern: disable-tx ----"):
			return nil, fmt.Errorf("%s: every migration runs in a transaction of its own; tern's disable-tx is not supported", ent.Name())
		case strings.Contains(text, "{{"):
			return nil, fmt.Errorf("%s: migrations are not Go templates (as tern's were)", ent.Name())
		}
		up, down, _ := strings.Cut(text, migrationSeparator)
		up, down = strings.TrimSpace(up), strings.TrimSpace(down)
		if !hasSQL(up) {
			return nil, fmt.Errorf("%s: no SQL above %q", ent.Name(), migrationSeparator)
		}
		byVersion[v] = migration{version: int32(v), name: ent.Name(), up: up, down: down}
	}
	if len(byVersion) == 0 {
		return nil, errors.New("no migration files (<version>_<name>.sql)")
	}
	out := slices.SortedFunc(maps.Values(byVersion), func(a, b migration) int { return cmp.Compare(a.version, b.version) })
	for i, m := range out {
		if m.version != int32(i+1) {
			return nil, fmt.Errorf("%s: no migration %d before it", m.name, i+1)
		}
	}
	return out, nil
}

// hasSQL reports whether sql has a line that is neither empty nor a comment.
func hasSQL(sql string) bool {
	for line := range strings.Lines(sql) {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "--") {
			return true
		}
	}
	return false
}

// versionTable is the version table of a set of migrations.
func versionTable(set string) string { return set + "_schema_version" }

// migrateSet moves set's schema to version target, up or down, one migration
// per transaction under the advisory lock schemaMigrateLock; a database
// already past target when it moves up (a newer build migrated it) is left
// as it is. Each migration is logged to logger.
func migrateSet(ctx context.Context, pool *pgxpool.Pool, set string, ms []migration, target int32, up bool, logger *slog.Logger) error {
	q := dbsqlc.New()
	table := pgx.Identifier{versionTable(set)}.Sanitize()
	for {
		done := false
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := q.SetLocalUnbounded(ctx, tx); err != nil {
				return err
			}
			if err := q.AdvisoryXactLock(ctx, tx, schemaMigrateLock); err != nil {
				return fmt.Errorf("lock: %w", err)
			}
			if err := ensureVersionTable(ctx, tx, set); err != nil {
				return err
			}
			var current int32
			if err := tx.QueryRow(ctx, "SELECT version FROM "+table).Scan(&current); err != nil {
				return fmt.Errorf("read the version: %w", err)
			}
			var m migration
			var sql, direction string
			switch {
			case current == target, up && current > target:
				done = true
				return nil
			case current > int32(len(ms)):
				return fmt.Errorf("the database is at version %d, past this build's %d migrations", current, len(ms))
			case current < target:
				m, sql, direction = ms[current], ms[current].up, "up"
			default:
				m, sql, direction = ms[current-1], ms[current-1].down, "down"
				if sql == "" {
					return fmt.Errorf("%s cannot be undone: it has no SQL below %q", m.name, migrationSeparator)
				}
			}
			logger.InfoContext(ctx, "applying migration", slog.String("migration", m.name),
				slog.String("set", set), slog.Int("version", int(m.version)), slog.String("direction", direction))
			if _, err := tx.Exec(ctx, sql); err != nil {
				return fmt.Errorf("%s (%s): %w", m.name, direction, err)
			}
			// What a migration SET for the session ends here, not on a
			// connection that the pool, or a pooler, hands to others.
			if _, err := tx.Exec(ctx, "RESET ALL"); err != nil {
				return err
			}
			next := m.version
			if direction == "down" {
				next--
			}
			if _, err := tx.Exec(ctx, "UPDATE "+table+" SET version = $1", next); err != nil {
				return fmt.Errorf("record version %d: %w", next, err)
			}
			return nil
		})
		if err != nil || done {
			return err
		}
	}
}

// ensureVersionTable creates set's version table at version 0 when it is
// missing, or at the version goose last applied when goose migrated the set
// (<set>_goose_version), as this package did before tern. It runs under the
// migration lock.
func ensureVersionTable(ctx context.Context, tx pgx.Tx, set string) error {
	table, gooseTable := versionTable(set), set+"_goose_version"
	var exists, gooseExists bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL",
		table, gooseTable).Scan(&exists, &gooseExists); err != nil {
		return fmt.Errorf("look for version tables: %w", err)
	}
	t := pgx.Identifier{table}.Sanitize()
	if !exists {
		if _, err := tx.Exec(ctx, "CREATE TABLE "+t+" (version int4 NOT NULL)"); err != nil {
			return fmt.Errorf("create the version table: %w", err)
		}
	}
	var current int32
	err := tx.QueryRow(ctx, "SELECT version FROM "+t).Scan(&current)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("read the version: %w", err)
	case current > 0 || !gooseExists:
		return nil
	}
	var version int32
	if gooseExists {
		if err := tx.QueryRow(ctx, "SELECT coalesce(max(version_id), 0)::int4 FROM "+pgx.Identifier{gooseTable}.Sanitize()+
			" WHERE is_applied").Scan(&version); err != nil {
			return fmt.Errorf("read goose's version: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, "DELETE FROM "+t); err != nil {
		return fmt.Errorf("set the version: %w", err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+t+" (version) VALUES ($1)", version); err != nil {
		return fmt.Errorf("set the version: %w", err)
	}
	return nil
}
