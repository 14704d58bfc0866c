package opscli

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/reconcile"
	"github.com/idemflow/idemflow/store"
)

type result struct {
	code           int
	stdout, stderr string
}

func idemflow(t *testing.T, dbURL string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Run(t.Context(), append([]string{"-database-url", dbURL, "-wait", "10s"}, args...), func(string) string { return "" }, &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

// TestCommand runs the command, which knows no definition, against a service's
// database while a process of the service runs.
func TestCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := idemflowtest.DatabaseURL(t)
	var fail atomic.Bool
	fail.Store(true)
	op, err := engine.NewOperation("payout", []engine.Step[int, int]{
		engine.TxStep("debit", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }).
			Compensate(func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
		engine.ExternalStep("bank", func(context.Context, engine.Attempt, int, *int) error {
			if fail.Load() {
				return engine.Permanent(errors.New("the bank is down"))
			}
			return nil
		}).Lookup(func(context.Context, engine.Attempt, int, *int) (bool, error) { return false, nil }).
			Window(0), // the bank answers for good or never
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	// The service's process, on the database the command is given.
	e := idemflowtest.Engine(t, openPool(t, dbURL), nil, op)
	s, err := engine.Start(ctx, e, op, "merchant-a", "payout-1", 30, nil)
	require.NoError(t, err)
	info := idemflowtest.Wait(t, e, s)
	require.Equal(t, engine.StatusFailed, info.Status)

	r := idemflow(t, dbURL, "list", "-status", "failed")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, s.ID.String())
	require.Contains(t, r.stdout, engine.CodeAttemptsExhausted)

	r = idemflow(t, dbURL, "show", s.ID.String())
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "bank")
	require.Contains(t, r.stdout, "idf3_")

	r = idemflow(t, dbURL, "processes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "payout@1")

	r = idemflow(t, dbURL, "check")
	require.Equal(t, 0, r.code, r.stdout+r.stderr)

	// A cancel of a finished operation is refused by the live process; a
	// retry reopens it, and it succeeds this time.
	r = idemflow(t, dbURL, "cancel", s.ID.String(), "no")
	require.Equal(t, 1, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, "refused")
	fail.Store(false)
	// Its client was told of a server fault: only a forced retry reopens it.
	r = idemflow(t, dbURL, "retry", s.ID.String())
	require.Equal(t, 1, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, "refused")
	require.Contains(t, r.stderr, "final")
	r = idemflow(t, dbURL, "-actor", "carol", "retry", "-force", s.ID.String())
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, ": done: reopened")
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got, err := e.Wait(waitCtx, s.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, got.Status)
	// The audit trail: the refused cancel and retry, and carol's forced retry.
	r = idemflow(t, dbURL, "show", s.ID.String())
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "audit:")
	require.Regexp(t, `retry\s+carol\s+done`, r.stdout)
	require.Regexp(t, `cancel\s+\S+\s+refused`, r.stdout)

	r = idemflow(t, dbURL, "show", "not-an-id")
	require.Equal(t, 2, r.code)
	r = idemflow(t, dbURL, "bogus")
	require.Equal(t, 2, r.code)
}

// TestCommandCreatesNothing: pointed at a database without idemflow's tables,
// the command says so and creates none.
func TestCommandCreatesNothing(t *testing.T) {
	t.Parallel()
	dbURL := emptyDatabase(t)
	r := idemflow(t, dbURL, "list")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "not migrated")
	conn, err := pgx.Connect(t.Context(), dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var tables int
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&tables))
	require.Zero(t, tables)
}

// TestCommandPending: a request for an operation whose definition no live
// process runs stays recorded, and the command says so (exit 3).
func TestCommandPending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := idemflowtest.DatabaseURL(t)
	p := openPool(t, dbURL)
	op, err := engine.NewOperation("transfer", []engine.Step[int, int]{
		engine.TxStep("move", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return engine.Fail("no", "no") }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	e, err := engine.New(p, &engine.Config{Operations: []engine.Definition{op}}) // no workers: not a live process
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
	require.NoError(t, err)
	_, err = s.Wait(ctx)
	require.NoError(t, err)

	var out, errOut bytes.Buffer
	code := Run(t.Context(), []string{"-database-url", dbURL, "-wait", "300ms", "retry", s.ID.String()}, func(string) string { return "" }, &out, &errOut)
	require.Equal(t, 3, code, out.String()+errOut.String())
	require.Contains(t, errOut.String(), "no live process carried it out")
}

func openPool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// emptyDatabase makes a database with no tables at all on the test server.
func emptyDatabase(t *testing.T) string {
	t.Helper()
	admin := testdb.AdminURL(t)
	conn, err := pgx.Connect(t.Context(), admin)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	name := "idemflow_cmd_empty_" + strings.ToLower(rand.Text())
	_, err = conn.Exec(t.Context(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0")
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), admin)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			_ = c.Close(context.Background())
		}
	})
	u, err := url.Parse(admin)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}

// TestCommandMismatches: the command lists what the service's reconciliation
// found, and shows it with the operation it names.
func TestCommandMismatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := idemflowtest.DatabaseURL(t)
	op, err := engine.NewOperation("payout", []engine.Step[int, int]{
		engine.ExternalStep("bank", func(context.Context, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	var records atomic.Pointer[[]reconcile.Record]
	records.Store(&[]reconcile.Record{})
	bank := reconcile.Source{Name: "bank", List: func(context.Context, reconcile.ListRequest) ([]reconcile.Record, string, error) {
		return *records.Load(), "", nil
	}}
	e := idemflowtest.Engine(t, openPool(t, dbURL), &engine.Config{Reconcile: reconcile.Config{Sources: []reconcile.Source{bank}, Interval: -1}}, op)

	r := idemflow(t, dbURL, "mismatches")
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "no reconciliation mismatches")

	s, err := engine.Start(ctx, e, op, "merchant-a", "payout-1", 30, nil)
	require.NoError(t, err)
	info := idemflowtest.Wait(t, e, s)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	got, err := e.Get(ctx, s.ID)
	require.NoError(t, err)
	// The bank says the payout failed after all, and knows one we never asked.
	records.Store(&[]reconcile.Record{
		{Key: got.Steps[0].DerivedKey, Reference: "po_1", Amount: 30, Status: reconcile.Failed, CreatedAt: time.Now()},
		{Key: "by-hand-1", Reference: "po_2", Amount: 99, CreatedAt: time.Now()},
	})
	rep, err := e.Reconcile(ctx, "bank")
	require.NoError(t, err)
	var report bytes.Buffer
	PrintReport(&report, rep)
	require.Contains(t, report.String(), "source bank: 2 record(s) made since ")
	require.Contains(t, report.String(), "2 mismatch(es):")
	require.Regexp(t, `bank\s+unknown_key\s+by-hand-1`, report.String())

	// A run needs the application's sources: the command says where to run it.
	r = idemflow(t, dbURL, "reconcile", "run")
	require.Equal(t, 2, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, "needs the application's build")
	require.Contains(t, r.stderr, "demo ops reconcile run")

	r = idemflow(t, dbURL, "mismatches")
	require.Equal(t, 1, r.code, r.stdout+r.stderr)
	require.Regexp(t, `bank\s+record_failed\s+`+got.Steps[0].DerivedKey+`\s+po_1\s+30\s+failed\s+`+s.ID.String(), r.stdout)
	require.Regexp(t, `bank\s+unknown_key\s+by-hand-1\s+po_2\s+99\s+succeeded\s+-`, r.stdout)

	require.Contains(t, r.stdout, "runbook for record_failed: "+RunbookURL+"#record_failed\n")
	require.Contains(t, r.stdout, "runbook for unknown_key: "+RunbookURL+"#unknown_key\n")

	r = idemflow(t, dbURL, "show", s.ID.String())
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "needs attention: "+engine.CodeReconciliationMismatch)
	require.Contains(t, r.stdout, "  runbook: "+RunbookURL+"#"+engine.CodeReconciliationMismatch+"\n")
	require.Contains(t, r.stdout, "reconciliation mismatches:")
	require.Contains(t, r.stdout, "po_1")
	r = idemflow(t, dbURL, "list", "-attention")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, s.ID.String(), "a finished operation a mismatch names needs attention")
}

// TestCommandWithholdsAddresses: what a process answered a request, and the
// audit trail, name no URL or address of the outside service, though the
// engine's errors do (a lookup's, wrapped as httpstep wraps it); show names
// the runbook's section on the operation's attention code.
func TestCommandWithholdsAddresses(t *testing.T) {
	t.Parallel()
	dbURL := idemflowtest.DatabaseURL(t)
	mismatched := func(at engine.Attempt) error {
		return fmt.Errorf("httpstep: read the answer of GET http://10.0.0.7:8443/payouts/by-key/%s: %w", at.Key,
			engine.Halt("payout_mismatch", "the bank's payout under the derived key is for another amount"))
	}
	op, err := engine.NewOperation("payout", []engine.Step[int, int]{
		engine.ExternalStep("bank", func(_ context.Context, at engine.Attempt, _ int, _ *int) error { return mismatched(at) }).
			Lookup(func(_ context.Context, at engine.Attempt, _ int, _ *int) (bool, error) { return false, mismatched(at) }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	e := idemflowtest.Engine(t, openPool(t, dbURL), nil, op)
	s, err := engine.Start(t.Context(), e, op, "merchant-a", "payout-1", 30, nil)
	require.NoError(t, err)
	info := idemflowtest.Wait(t, e, s)
	require.True(t, info.Parked)
	require.EqualValues(t, "payout_mismatch", info.Attention.Code)

	r := idemflow(t, dbURL, "cancel", s.ID.String(), "customer withdrew")
	require.Equal(t, 1, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stderr, ": refused (past_point_of_no_return): ")
	require.Contains(t, r.stderr, "payout_mismatch")
	require.Contains(t, r.stderr, "past its point of no return")
	require.NotContains(t, r.stderr, "10.0.0.7")

	r = idemflow(t, dbURL, "show", s.ID.String())
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "  runbook: "+RunbookURL+"#payout_mismatch\n")
	audit := r.stdout[strings.Index(r.stdout, "audit:"):]
	require.Regexp(t, `cancel\s+\S+\s+refused\s+customer withdrew`, audit)
	require.NotContains(t, audit, "10.0.0.7")
}

// TestApprovals: the command lists what waits for approval, and approves or
// rejects it with a reason, as the actor it is given; refusals exit 1.
func TestApprovals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := idemflowtest.DatabaseURL(t)
	op, err := engine.NewOperation("payout", []engine.Step[int, int]{
		engine.TxStep("debit", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
		engine.ApprovalStep("approval", func(int, *int) engine.ApprovalPolicy { return engine.ApprovalPolicy{Need: 1} }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	e := idemflowtest.Engine(t, openPool(t, dbURL), nil, op)
	start := func(key string) string {
		s, err := engine.Start(ctx, e, op, "merchant-a", key, 30, nil)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			r := idemflow(t, dbURL, "approvals")
			return r.code == 0 && strings.Contains(r.stdout, s.ID.String())
		}, 10*time.Second, 20*time.Millisecond)
		return s.ID.String()
	}
	approved, rejected := start("p-1"), start("p-2")

	r := idemflow(t, dbURL, "approve", approved)
	require.Equal(t, 1, r.code, "no reason")
	require.Contains(t, r.stderr, engine.ErrReasonRequired.Error())
	r = idemflow(t, dbURL, "-actor", "ann", "approve", approved, "checked", "it")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "approved by ann")
	r = idemflow(t, dbURL, "-actor", "bob", "reject", rejected, "not", "this", "one")
	require.Equal(t, 0, r.code, r.stderr)
	for id, want := range map[string]engine.Status{approved: engine.StatusSucceeded, rejected: engine.StatusFailed} {
		require.Eventually(t, func() bool {
			r := idemflow(t, dbURL, "show", id)
			return r.code == 0 && strings.Contains(r.stdout, string(want))
		}, 20*time.Second, 50*time.Millisecond)
	}
	r = idemflow(t, dbURL, "approve", rejected, "too", "late")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, engine.ErrFinished.Error())
}

// TestMigrateGet: the SQL that migrate-get prints, applied by hand to an
// empty database, leaves it where engine.Migrate would for idemflow's part.
func TestMigrateGet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var out, errOut bytes.Buffer
	require.Equal(t, 0, Run(ctx, []string{"migrate-get"}, func(string) string { return "" }, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "00019_waits.sql")

	admin, err := pgx.Connect(ctx, testdb.AdminURL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	name := "migrate_get_" + strings.ToLower(rand.Text()[:10])
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)") })
	u, err := url.Parse(testdb.AdminURL(t))
	require.NoError(t, err)
	u.Path = "/" + name
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, out.String())
	require.NoError(t, err, "the printed SQL applies")
	require.NoError(t, store.CheckSchema(ctx, pool, nil), "idemflow's schema is complete")
}
