package main

import (
	"context"
	"maps"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// category is what a statement does, told from its SQL.
type category int

const (
	// catEngine: the engine's own statements (sqlc queries on idemflow_ tables),
	// or in the baseline the statements on its reservation (bench_operation).
	catEngine category = iota
	// catSteps: the steps' own (sqlc queries on the demo's tables).
	catSteps
	// catRiver: River's (sqlc queries on river_ tables, LISTEN and notifications).
	catRiver
	// catProvider: the fake provider's (its schema, provider.).
	catProvider
	// catTxControl: BEGIN, COMMIT and ROLLBACK.
	catTxControl
	// catOther: anything else.
	catOther
	numCategories
)

// counter is a pgx tracer (queries and batches) that counts what one pool sends:
// statements by category and by name, transactions, and round trips. It is safe
// for concurrent use.
type counter struct {
	stmts      [numCategories]atomic.Int64
	commits    atomic.Int64
	rollbacks  atomic.Int64
	roundTrips atomic.Int64
	// groups counts the engine's group commits (engine.Observer's
	// CommitGrouped), grouped the transactions in them, splits those that
	// failed and went one by one.
	groups, grouped, splits atomic.Int64

	// byName counts statements by sqlc query name (or first word), for the
	// breakdown. Its values are *atomic.Int64.
	byName sync.Map
	// kinds caches what each SQL text is: its keys are SQL, its values *kind.
	kinds sync.Map
}

// kind is a statement's category and name, and its counter in byName.
type kind struct {
	cat   category
	name  string
	count *atomic.Int64
	// begin, commit and rollback tell BEGIN, COMMIT and ROLLBACK apart.
	begin, commit, rollback bool
}

var (
	_ pgx.QueryTracer = (*counter)(nil)
	_ pgx.BatchTracer = (*counter)(nil)
)

// counts is a snapshot of a counter.
type counts struct {
	stmts      [numCategories]int64
	commits    int64
	rollbacks  int64
	roundTrips int64
	groups     int64
	grouped    int64
	splits     int64
	byName     map[string]int64
}

// traceState is what TraceQueryStart hands to TraceQueryEnd, and TraceBatchStart
// to TraceBatchEnd.
type traceState struct {
	// implicit: the statement (or batch) ran outside a transaction block, so that
	// the server ran it in a transaction of its own.
	implicit bool
	kind     *kind
}

type traceKey struct{}

func (c *counter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return c.queryStart(ctx, conn.PgConn().TxStatus(), data.SQL)
}

// queryStart is TraceQueryStart on a connection whose transaction status (as
// pgconn.PgConn.TxStatus reports it) is txStatus.
func (c *counter) queryStart(ctx context.Context, txStatus byte, sql string) context.Context {
	c.roundTrips.Add(1)
	k := c.count(sql)
	implicit := k.cat != catTxControl && txStatus == 'I'
	return context.WithValue(ctx, traceKey{}, traceState{implicit: implicit, kind: k})
}

func (c *counter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	st, _ := ctx.Value(traceKey{}).(traceState)
	switch {
	case st.kind == nil:
	case st.implicit:
		c.ended(data.Err == nil)
	default:
		c.txControl(st.kind, data.CommandTag, data.Err)
	}
}

// TraceBatchStart counts a batch as one round trip: pgx sends its statements
// and one Sync together. Outside a transaction block the server runs the batch
// as one implicit transaction, unless the batch begins with BEGIN: then it is
// the start of an explicit one, which a COMMIT or ROLLBACK ends, in this batch or
// a later one.
func (c *counter) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	return c.batchStart(ctx, conn.PgConn().TxStatus(), data.Batch)
}

// batchStart is TraceBatchStart on a connection whose transaction status is
// txStatus.
func (c *counter) batchStart(ctx context.Context, txStatus byte, b *pgx.Batch) context.Context {
	c.roundTrips.Add(1)
	begins := b != nil && len(b.QueuedQueries) > 0 && c.lookup(b.QueuedQueries[0].SQL).begin
	return context.WithValue(ctx, traceKey{}, traceState{implicit: txStatus == 'I' && !begins})
}

// TraceBatchQuery counts a statement of a batch. pgx traces the statements up
// to the first that fails, and none after it: the server skipped them.
func (c *counter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.txControl(c.count(data.SQL), data.CommandTag, data.Err)
}

func (c *counter) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	if st, _ := ctx.Value(traceKey{}).(traceState); st.implicit {
		c.ended(data.Err == nil)
	}
}

// txControl counts the end of a transaction when k, which answered tag and err,
// is COMMIT or ROLLBACK of an explicit transaction.
func (c *counter) txControl(k *kind, tag pgconn.CommandTag, err error) {
	switch {
	case k.commit:
		// COMMIT of a failed transaction answers ROLLBACK; a COMMIT that fails
		// (at a deferred constraint, say) leaves no transaction either.
		c.ended(err == nil && tag.String() == "COMMIT")
	case k.rollback && err == nil:
		c.rollbacks.Add(1)
	}
}

func (c *counter) ended(committed bool) {
	if committed {
		c.commits.Add(1)
	} else {
		c.rollbacks.Add(1)
	}
}

// count counts a statement and returns what it is.
func (c *counter) count(sql string) *kind {
	k := c.lookup(sql)
	c.stmts[k.cat].Add(1)
	k.count.Add(1)
	return k
}

// lookup returns what a statement is, without counting it.
func (c *counter) lookup(sql string) *kind {
	v, ok := c.kinds.Load(sql)
	if !ok {
		cat, name := classify(sql)
		n, _ := c.byName.LoadOrStore(name, new(atomic.Int64))
		tc := cat == catTxControl
		v, _ = c.kinds.LoadOrStore(sql, &kind{
			cat: cat, name: name, count: n.(*atomic.Int64),
			begin: tc && name == "BEGIN", commit: tc && name == "COMMIT", rollback: tc && name == "ROLLBACK",
		})
	}
	return v.(*kind)
}

// classify tells a statement's category and name from its SQL. sqlc's queries
// start with "-- name: <Name>"; the engine's are named Operation... and Step...
// and work on idemflow_ tables (the baseline's, on bench_operation).
func classify(sql string) (category, string) {
	s := strings.TrimSpace(sql)
	// pgx begins with options as "begin isolation level ...".
	if first, _, _ := strings.Cut(s, " "); strings.EqualFold(first, "BEGIN") {
		return catTxControl, "BEGIN"
	}
	for _, tc := range []string{"COMMIT", "ROLLBACK"} {
		if strings.EqualFold(s, tc) {
			return catTxControl, tc
		}
	}
	name := ""
	if rest, ok := strings.CutPrefix(s, "-- name: "); ok {
		name, _, _ = strings.Cut(rest, " ")
	} else {
		name, _, _ = strings.Cut(s, " ")
		name = strings.ToUpper(name)
	}
	switch {
	case (strings.HasPrefix(name, "Operation") || strings.HasPrefix(name, "Step")) &&
		(strings.Contains(s, "idemflow_") || strings.Contains(s, "bench_operation")):
		return catEngine, name
	case strings.Contains(s, "river"):
		return catRiver, name
	case strings.Contains(s, "provider."):
		return catProvider, name
	case strings.Contains(s, "demo_"):
		return catSteps, name
	}
	return catOther, name
}

// commitGrouped counts a group commit of the engine's: its
// engine.Observer.CommitGrouped.
func (c *counter) commitGrouped(_ context.Context, size int, split bool) {
	c.groups.Add(1)
	c.grouped.Add(int64(size))
	if split {
		c.splits.Add(1)
	}
}

func (c *counter) snapshot() counts {
	var s counts
	for i := range s.stmts {
		s.stmts[i] = c.stmts[i].Load()
	}
	s.commits = c.commits.Load()
	s.rollbacks = c.rollbacks.Load()
	s.roundTrips = c.roundTrips.Load()
	s.groups, s.grouped, s.splits = c.groups.Load(), c.grouped.Load(), c.splits.Load()
	s.byName = make(map[string]int64)
	c.byName.Range(func(k, v any) bool {
		s.byName[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return s
}

// since returns what was counted after before.
func (s counts) since(before counts) counts {
	d := counts{
		commits:    s.commits - before.commits,
		rollbacks:  s.rollbacks - before.rollbacks,
		roundTrips: s.roundTrips - before.roundTrips,
		groups:     s.groups - before.groups,
		grouped:    s.grouped - before.grouped,
		splits:     s.splits - before.splits,
		byName:     maps.Clone(s.byName),
	}
	for i := range s.stmts {
		d.stmts[i] = s.stmts[i] - before.stmts[i]
	}
	for k, v := range before.byName {
		d.byName[k] -= v
		if d.byName[k] == 0 {
			delete(d.byName, k)
		}
	}
	return d
}

// statements counts every statement but BEGIN, COMMIT and ROLLBACK.
func (s counts) statements() int64 {
	var n int64
	for cat, v := range s.stmts {
		if category(cat) != catTxControl {
			n += v
		}
	}
	return n
}
