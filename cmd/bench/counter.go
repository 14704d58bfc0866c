package main

import (
	"context"
	"maps"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
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
	// commit and rollback tell COMMIT and ROLLBACK apart from BEGIN.
	commit, rollback bool
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
	c.roundTrips.Add(1)
	k := c.count(data.SQL)
	implicit := k.cat != catTxControl && conn.PgConn().TxStatus() == 'I'
	return context.WithValue(ctx, traceKey{}, traceState{implicit: implicit, kind: k})
}

func (c *counter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	st, _ := ctx.Value(traceKey{}).(traceState)
	switch {
	case st.kind == nil:
	case st.implicit:
		c.ended(data.Err == nil)
	case st.kind.commit:
		// COMMIT of a failed transaction answers ROLLBACK.
		c.ended(data.Err == nil && data.CommandTag.String() == "COMMIT")
	case st.kind.rollback && data.Err == nil:
		c.rollbacks.Add(1)
	}
}

// TraceBatchStart counts a batch as one round trip: pgx sends its statements
// and one Sync together. Outside a transaction block the server runs the batch
// as one implicit transaction.
func (c *counter) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.roundTrips.Add(1)
	return context.WithValue(ctx, traceKey{}, traceState{implicit: conn.PgConn().TxStatus() == 'I'})
}

func (c *counter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.count(data.SQL)
}

func (c *counter) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	if st, _ := ctx.Value(traceKey{}).(traceState); st.implicit {
		c.ended(data.Err == nil)
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
	v, ok := c.kinds.Load(sql)
	if !ok {
		cat, name := classify(sql)
		n, _ := c.byName.LoadOrStore(name, new(atomic.Int64))
		v, _ = c.kinds.LoadOrStore(sql, &kind{
			cat: cat, name: name, count: n.(*atomic.Int64),
			commit: cat == catTxControl && name == "COMMIT", rollback: cat == catTxControl && name == "ROLLBACK",
		})
	}
	k := v.(*kind)
	c.stmts[k.cat].Add(1)
	k.count.Add(1)
	return k
}

// classify tells a statement's category and name from its SQL. sqlc's queries
// start with "-- name: <Name>"; the engine's are named Operation... and Step...
// and work on idemflow_ tables (the baseline's, on bench_operation).
func classify(sql string) (category, string) {
	s := strings.TrimSpace(sql)
	for _, tc := range []string{"BEGIN", "COMMIT", "ROLLBACK"} {
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

func (c *counter) snapshot() counts {
	var s counts
	for i := range s.stmts {
		s.stmts[i] = c.stmts[i].Load()
	}
	s.commits = c.commits.Load()
	s.rollbacks = c.rollbacks.Load()
	s.roundTrips = c.roundTrips.Load()
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
