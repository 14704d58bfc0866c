package engine

import (
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolOpts are the bounds that BoundPool sets on a pool's connections. Zero
// fields take their defaults, which follow the lease: short next to it, so that
// a statement that waits on a lock or a database that does not answer fails an
// attempt (which is retried) long before another process could take the
// operation over.
type PoolOpts struct {
	// Lease is the engine's Config.Lease. Defaults to defaultLease.
	Lease time.Duration
	// StatementTimeout is PostgreSQL's statement_timeout. Defaults to the
	// smaller of 5 seconds and half the lease.
	StatementTimeout time.Duration
	// LockTimeout is PostgreSQL's lock_timeout. Defaults to the smaller of 2
	// seconds and a quarter of the lease.
	LockTimeout time.Duration
	// IdleInTransactionTimeout is PostgreSQL's
	// idle_in_transaction_session_timeout. Defaults to the larger of the lease
	// and StatementTimeout.
	IdleInTransactionTimeout time.Duration
	// ConnectTimeout bounds making a connection (a frozen server accepts the
	// TCP connection and answers nothing). Defaults to 5 seconds.
	ConnectTimeout time.Duration
	// Pooler says that the pool reaches PostgreSQL through a connection
	// pooler in transaction mode (PgBouncer's pool_mode=transaction), which
	// hands each transaction to any of its server connections. BoundPool then
	// sends none of the three timeouts above as a startup parameter
	// (PgBouncer refuses those it does not know), and has pgx keep no
	// prepared statement on the server (pgx.QueryExecModeCacheDescribe: it
	// caches a statement's description and sends it unnamed). The bounds must
	// then come from the role or the database (ALTER ROLE ... SET
	// statement_timeout = '5s', and the same for lock_timeout and
	// idle_in_transaction_session_timeout), or from the pooler (PgBouncer's
	// query_timeout and idle_transaction_timeout); a step's context still
	// bounds each of its statements from the client's side. Set
	// Config.Pooler too. A pooler in session mode needs neither.
	Pooler bool
}

// BoundPool sets the bounds of opts (nil: the defaults) on the connections of
// c, the configuration of the pool given to New, or of Config.ControlPool. The
// server then ends a statement, a lock wait or an idle transaction that
// outlasts them. A step that needs longer sets its own with SET LOCAL. With
// opts.Pooler, it sets only the connect timeout and pgx's statement mode (see
// PoolOpts.Pooler).
func BoundPool(c *pgxpool.Config, opts *PoolOpts) {
	o := PoolOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Lease <= 0 {
		o.Lease = defaultLease
	}
	if o.StatementTimeout <= 0 {
		o.StatementTimeout = min(5*time.Second, o.Lease/2)
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = min(2*time.Second, o.Lease/4)
	}
	if o.IdleInTransactionTimeout <= 0 {
		o.IdleInTransactionTimeout = max(o.Lease, o.StatementTimeout)
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	c.ConnConfig.ConnectTimeout = o.ConnectTimeout
	params := c.ConnConfig.RuntimeParams
	if o.Pooler {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		for _, p := range []string{"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"} {
			delete(params, p)
		}
		return
	}
	ms := func(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }
	params["statement_timeout"] = ms(o.StatementTimeout)
	params["lock_timeout"] = ms(o.LockTimeout)
	params["idle_in_transaction_session_timeout"] = ms(o.IdleInTransactionTimeout)
}

// checkPooler returns an error when c.Pooler is set and one of pools keeps
// prepared statements on the server (pgx's default), which a pooler in
// transaction mode would leave on a server connection that the next
// transaction may not get.
func (c Config) checkPooler(pools ...*pgxpool.Pool) error {
	if !c.Pooler {
		return nil
	}
	for _, p := range pools {
		if m := p.Config().ConnConfig.DefaultQueryExecMode; m == 0 || m == pgx.QueryExecModeCacheStatement {
			return errors.New("with Pooler, a pool must keep no prepared statement on the server " +
				"(pgx's QueryExecModeCacheStatement, its default): make it with BoundPool and PoolOpts.Pooler")
		}
	}
	return nil
}
