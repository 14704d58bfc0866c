package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/cmd/bench/internal/benchdb"
)

// serverStats are the server's counters that a mode's figures are deltas of.
type serverStats struct {
	commits, rollbacks                        int64
	blocksHit, blocksRead                     int64
	walRecords, walBytes, walWrites, walSyncs int64
}

func (s serverStats) since(before serverStats) serverStats {
	return serverStats{
		commits:    s.commits - before.commits,
		rollbacks:  s.rollbacks - before.rollbacks,
		blocksHit:  s.blocksHit - before.blocksHit,
		blocksRead: s.blocksRead - before.blocksRead,
		walRecords: s.walRecords - before.walRecords,
		walBytes:   s.walBytes - before.walBytes,
		walWrites:  s.walWrites - before.walWrites,
		walSyncs:   s.walSyncs - before.walSyncs,
	}
}

// How the statistics are read. Since PostgreSQL 15 a backend publishes its
// counters (transactions, WAL) to shared memory at most once a second while busy,
// and within 10 seconds once idle, so a plain read right after a run misses the
// last second or more of it. Before a mode runs, every idle connection of its
// pools calls pg_stat_force_next_flush(), which makes the backend publish as
// soon as that statement ends; after it, the pools are closed, and a backend
// that exits publishes everything. Then the counters are read from a session on
// another database, after pg_stat_clear_snapshot(), until they stop moving.
const (
	// settleInterval is how long the counters must stay unchanged.
	settleInterval = 100 * time.Millisecond
	// settleTimeout bounds the wait for the counters to settle, and for the
	// benchmark database's sessions to end.
	settleTimeout = 30 * time.Second
)

// flushIdle makes the backend of every idle connection of pools publish its
// statistics, and returns how many it asked.
func (s *server) flushIdle(ctx context.Context, pools ...*pgxpool.Pool) (int, error) {
	q := benchdb.New()
	n := 0
	for _, pool := range pools {
		for _, conn := range pool.AcquireAllIdle(ctx) {
			err := q.StatForceNextFlush(ctx, conn)
			conn.Release()
			if err != nil {
				return n, fmt.Errorf("pg_stat_force_next_flush: %w", err)
			}
			n++
		}
	}
	return n, nil
}

// readStats reads the counters once they have stopped moving. With
// noSessions it first waits until no session is connected to the benchmark's
// database, so that every backend has exited (and published its counters).
func (s *server) readStats(ctx context.Context, noSessions bool) (serverStats, error) {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	q := benchdb.New()
	read := func() (serverStats, int64, error) {
		if err := q.StatClearSnapshot(ctx, s.admin); err != nil {
			return serverStats{}, 0, fmt.Errorf("pg_stat_clear_snapshot: %w", err)
		}
		db, err := q.StatDatabase(ctx, s.admin, s.dbName)
		if err != nil {
			return serverStats{}, 0, fmt.Errorf("read pg_stat_database: %w", err)
		}
		wal, err := q.StatWAL(ctx, s.admin)
		if err != nil {
			return serverStats{}, 0, fmt.Errorf("read pg_stat_wal: %w", err)
		}
		return serverStats{
			commits: db.Commits, rollbacks: db.Rollbacks, blocksHit: db.BlocksHit, blocksRead: db.BlocksRead,
			walRecords: wal.Records, walBytes: wal.Bytes, walWrites: wal.Writes, walSyncs: wal.Syncs,
		}, db.Backends, nil
	}
	var (
		last         serverStats
		lastBackends int64 = -1
	)
	for {
		st, backends, err := read()
		if err != nil {
			return st, err
		}
		// Two reads in a row with the same counters, and with no session left in
		// either when the sessions must have ended.
		if lastBackends >= 0 && st == last && (!noSessions || backends == 0 && lastBackends == 0) {
			return st, nil
		}
		last, lastBackends = st, backends
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("the server's statistics did not settle within %s (%d sessions left on %s)", settleTimeout, backends, s.dbName)
		case <-time.After(settleInterval):
		}
	}
}
