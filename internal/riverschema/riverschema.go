// Package riverschema migrates and checks River's schema, the queue that
// idemflow's engine runs its resume jobs on, beside idemflow's own (package
// store, which knows nothing of River).
package riverschema

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemflow/idemflow/store"
)

// migrateLock is the advisory lock key that serialises River's migrations
// when several processes start at once (River's migrator takes no lock of
// its own).
const migrateLock = 0x69_64_65_6d_66_6c_77 // "idemflw"

// Migrate applies River's migrations, one per transaction under the advisory
// lock migrateLock and without pool's statement and lock timeouts, as
// River's own Migrate does without the lock: they cannot share one
// transaction, since a later one uses an enum value that an earlier one adds.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	st := store.New()
	for {
		var res *rivermigrate.MigrateResult
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := st.LiftTimeouts(ctx, tx); err != nil {
				return err
			}
			if err := st.AdvisoryXactLock(ctx, tx, migrateLock); err != nil {
				return fmt.Errorf("lock: %w", err)
			}
			var err error
			//lint:ignore SA1019 deprecated for applying several migrations in one transaction; this applies one per transaction, as Migrate does, under a lock that Migrate cannot take.
			res, err = migrator.MigrateTx(ctx, tx, rivermigrate.DirectionUp, &rivermigrate.MigrateOpts{MaxSteps: 1})
			return err
		})
		if err != nil {
			return fmt.Errorf("apply river migrations: %w", err)
		}
		if len(res.Versions) == 0 {
			return nil
		}
		for _, v := range res.Versions {
			logger.InfoContext(ctx, "applied river migration", slog.Int("version", v.Version))
		}
	}
}

// ErrNotMigrated is matched by Check's error for a database that lacks
// River's latest migrations.
var ErrNotMigrated = errors.New("the queue's schema (River's) is not migrated")

// Check returns an error matching ErrNotMigrated, saying what is missing,
// when the database lacks River migrations that this build has. It reads in
// tx, and writes nothing.
func Check(ctx context.Context, tx pgx.Tx) error {
	migrator, err := rivermigrate.New(riverpgxv5.New(nil), &rivermigrate.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	res, err := migrator.ValidateTx(ctx, tx, nil)
	if err != nil {
		return fmt.Errorf("%w: River's schema cannot be read (%w)", ErrNotMigrated, err)
	}
	if !res.OK {
		return fmt.Errorf("%w: %s", ErrNotMigrated, strings.Join(res.Messages, "; "))
	}
	return nil
}
