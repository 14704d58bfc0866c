package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// livenessNamespace is the first key of every liveness lock (PostgreSQL's
// two-key advisory locks): "idf1", so that an application's own advisory
// locks, which use one bigint key or other namespaces, never meet ours.
const livenessNamespace = 0x69646631

// livenessPing is how often a process checks its liveness connection, which
// also keeps it from looking idle to whatever closes idle connections.
const livenessPing = time.Second

// TakeoverConfig configures how a process with workers takes over the
// operations of a process that died (Config.Takeover).
//
// Each process with workers holds a session advisory lock on a connection of
// its own for as long as it lives, and its runs' ids carry the lock's key.
// PostgreSQL releases the lock the moment the session ends: at once for a
// killed process on a live host, after TCP keepalives for a vanished one.
// Every Interval, a process looks for operations held by a run whose key no
// session holds, and takes them over at once, instead of when their lease
// ends. A process that is alive but slow (stopped by SIGSTOP, in a long
// garbage collection) keeps its session, so its lock, and its operations to
// their lease's end. The fence on every commit stays the guarantee: should a
// live process lose its liveness connection, a run taken from it cannot
// commit, and its calls out carry the same derived keys.
type TakeoverConfig struct {
	// Interval is how often to look for a dead process's operations.
	// Defaults to defaultTakeoverInterval; negative: never (leases only, as
	// for a process without workers).
	Interval time.Duration
	// ConnConfig is the liveness connection's: a direct connection to
	// PostgreSQL, which holds a session. Defaults to the control pool's
	// (Config.ControlPool, else the pool's). Through a pooler in transaction
	// mode (PgBouncer; Config.Pooler) a session lock would stay on a server
	// connection of the pooler's: give a direct one here (one connection per
	// process, idle but for a ping a second), or none is taken and a dead
	// process's operations wait for their lease.
	ConnConfig *pgx.ConnConfig
}

// newRunID returns the id of a new run: random, its first four bytes the
// process's liveness key while it holds its lock (zero otherwise, which no
// process takes over before the lease ends).
func (e *Engine) newRunID() uuid.UUID {
	id := uuid.New()
	binary.BigEndian.PutUint32(id[:4], uint32(e.liveKey.Load()))
	return id
}

// holdLiveness takes this process's liveness lock on a connection of its
// own, with a random positive key that no other session holds, and keeps it
// (watchLiveness) until ctx ends. Without the lock the process runs as
// before: its operations are taken over when their lease ends.
func (e *Engine) holdLiveness(ctx context.Context) error {
	if e.cfg.Pooler {
		// Through a pooler in transaction mode, a session lock would stay on
		// whichever server connection took it, after this process is gone.
		if e.cfg.Takeover.ConnConfig == nil {
			e.logger.InfoContext(ctx, "through a pooler, and no direct connection for the liveness lock (Takeover.ConnConfig): "+
				"this process's operations are taken over when their lease ends, not when it dies")
			return nil
		}
		e.logger.InfoContext(ctx, "through a pooler: the liveness lock is held on the direct connection of Takeover.ConnConfig",
			slog.String("host", e.cfg.Takeover.ConnConfig.Host), slog.Int("port", int(e.cfg.Takeover.ConnConfig.Port)))
	}
	conn, key, err := e.lockLiveness(ctx, 0)
	if err != nil {
		return err
	}
	// A lock held in another database is one that no sweeper of this one
	// sees: its runs would all look dead, and be taken from it.
	var here, there string
	err = e.control.QueryRow(ctx, `SELECT current_database() || '/' || (SELECT system_identifier FROM pg_control_system())`).Scan(&here)
	if err == nil {
		err = conn.QueryRow(ctx, `SELECT current_database() || '/' || (SELECT system_identifier FROM pg_control_system())`).Scan(&there)
	}
	if err == nil && here != there {
		err = fmt.Errorf("engine: the liveness connection reaches database %s, the pool %s", there, here)
	}
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return err
	}
	e.liveKey.Store(key)
	e.sweeps.Add(1)
	go func() {
		defer e.sweeps.Done()
		e.watchLiveness(ctx, conn, key)
	}()
	return nil
}

// lockLiveness connects and takes a liveness lock: key again when it is not
// zero (a reconnection keeps its runs' key), else a new random one.
func (e *Engine) lockLiveness(ctx context.Context, key int32) (*pgx.Conn, int32, error) {
	cfg := e.cfg.Takeover.ConnConfig
	if cfg == nil {
		cfg = e.control.Config().ConnConfig
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err != nil {
		return nil, 0, fmt.Errorf("engine: liveness connection: %w", err)
	}
	for range 10 {
		k := key
		if k == 0 {
			k = rand.Int32N(1<<31-1) + 1
		}
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, int32(livenessNamespace), k).Scan(&ok); err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			return nil, 0, fmt.Errorf("engine: liveness lock: %w", err)
		}
		if ok {
			return conn, k, nil
		}
		key = 0 // taken: by a process that chose the same key, or a sweeper's glance at it
	}
	_ = conn.Close(context.WithoutCancel(ctx))
	return nil, 0, fmt.Errorf("engine: liveness lock: no free key in 10 tries")
}

// watchLiveness keeps the liveness connection until ctx ends, then closes it
// (which releases the lock). When the connection fails, the process's runs
// are taken for dead's and may be taken over; it reconnects and locks the
// same key again when it can, so that its runs that go on keep theirs.
func (e *Engine) watchLiveness(ctx context.Context, conn *pgx.Conn, key int32) {
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	t := time.NewTicker(livenessPing)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			e.liveKey.Store(0)
			return
		case <-t.C:
		}
		if conn != nil {
			pingCtx, cancel := context.WithTimeout(ctx, livenessPing)
			err := conn.Ping(pingCtx)
			cancel()
			if err == nil || ctx.Err() != nil {
				continue
			}
			e.logger.WarnContext(ctx, "the liveness connection failed: other processes may take this one's operations over; reconnecting",
				slog.Any("error", err))
			_ = conn.Close(context.Background())
			conn = nil
		}
		c, k, err := e.lockLiveness(ctx, key)
		if err != nil {
			if ctx.Err() == nil {
				e.liveKey.Store(0) // new runs wait for their lease, not for a lock nobody holds
				e.logger.WarnContext(ctx, "could not take the liveness lock again; trying at the next ping", slog.Any("error", err))
			}
			continue
		}
		conn, key = c, k
		e.liveKey.Store(k)
	}
}

// takeOver hands every operation held by a run of a dead process to a resume
// job, in one transaction that takes them from the dead runs (handToWorkers).
func (e *Engine) takeOver(ctx context.Context) error {
	orphans, err := e.store.OperationListOrphaned(ctx, e.control, livenessNamespace, e.definitionNames(), sweepBatch)
	if err != nil {
		return fmt.Errorf("engine: take over: %w", err)
	}
	resumes := make([]handedResume, len(orphans))
	for i, op := range orphans {
		resumes[i] = handedResume{args: resumeArgs{OperationID: op.ID, Operation: op.Name, Recovery: true, Scope: op.Scope},
			take: func(tx pgx.Tx) (bool, error) { return e.store.OperationTakeOver(ctx, tx, op.ID, op.RunID, e.cfg.Lease) }}
	}
	if err := e.handToWorkers(ctx, resumes, "the process that ran the operation is gone; resuming it"); err != nil {
		return fmt.Errorf("engine: take over: %w", err)
	}
	return nil
}

// takeOverLoop looks for a dead process's operations every Takeover.Interval
// until ctx ends.
func (e *Engine) takeOverLoop(ctx context.Context) {
	t := time.NewTicker(e.cfg.Takeover.Interval)
	defer t.Stop()
	for {
		if err := e.takeOver(ctx); err != nil && ctx.Err() == nil {
			e.logger.WarnContext(ctx, "could not look for a dead process's operations; trying again", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
