package engine_test

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

func TestStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RunsEveryStepOnce", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		started, err := engine.Start(ctx, e, op, "client-a", "key-1", transferIn{From: "a", To: "b", Amount: 100}, nil)
		require.NoError(t, err)
		require.True(t, started.Created)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		out, err := op.Result(info)
		require.NoError(t, err)
		require.NotZero(t, out.LedgerID)
		require.Contains(t, out.PayoutID, "po_")
		require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, b.pool))

		got, err := e.Get(ctx, started.ID)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, got.Status)
		require.Equal(t, 1, got.Runs)
		require.JSONEq(t, string(info.Result), string(got.Result))
		require.Len(t, got.Steps, 3)
		for i, name := range []string{"ledger", "payout", "finalize"} {
			require.Equal(t, name, got.Steps[i].Name)
			require.Equal(t, engine.StepStatusSucceeded, got.Steps[i].Status)
			require.Equal(t, 1, got.Steps[i].Attempts)
		}
		require.Regexp(t, `^idf3_[A-Za-z0-9_-]{48}$`, got.Steps[1].DerivedKey)
		require.Empty(t, got.Steps[0].DerivedKey)
	})

	t.Run("SameKeyReplaysWithoutRunning", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		first, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 5}, nil)
		require.NoError(t, err)
		info := waitDone(t, e, first)

		again, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 5}, nil)
		require.NoError(t, err)
		require.False(t, again.Created)
		require.Equal(t, first.ID, again.ID)
		require.Equal(t, engine.StatusSucceeded, again.Existing.Status)
		require.Equal(t, string(info.Result), string(again.Existing.Result))
		require.ElementsMatch(t, []string{"from", "to", "amount"}, slices.Collect(maps.Keys(again.Existing.Fingerprint.Fields)))
		require.Equal(t, int32(1), b.calls.Load())
	})

	t.Run("ConcurrentSameKeyOneOperation", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		const n = 20
		var wg sync.WaitGroup
		results := make([]*engine.Started, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = engine.Start(ctx, e, op, "c", "same", transferIn{From: "a", To: "b", Amount: 7}, nil)
			}()
		}
		wg.Wait()
		created := 0
		for i := range n {
			require.NoError(t, errs[i])
			if results[i].Created {
				created++
				waitDone(t, e, results[i])
			}
			require.Equal(t, results[0].ID, results[i].ID)
		}
		require.Equal(t, 1, created)
		require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, b.pool))
	})

	t.Run("SameKeyTwoScopesTwoOperations", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		s1, err := engine.Start(ctx, e, op, "client-a", "shared", transferIn{From: "a", To: "b", Amount: 1}, nil)
		require.NoError(t, err)
		s2, err := engine.Start(ctx, e, op, "client-b", "shared", transferIn{From: "a", To: "b", Amount: 1}, nil)
		require.NoError(t, err)
		require.True(t, s1.Created)
		require.True(t, s2.Created)
		require.NotEqual(t, s1.ID, s2.ID)
		waitDone(t, e, s1)
		waitDone(t, e, s2)
		require.Equal(t, books{ledgerRows: 4, payouts: 2, payoutCalls: 2, finals: 2}, readBooks(t, b.pool))
	})

	t.Run("EmptyKeyRejected", func(t *testing.T) {
		t.Parallel()
		e, op, _ := setup(t, setupOpts{})
		_, err := engine.Start(ctx, e, op, "c", "", transferIn{Amount: 1}, nil)
		require.ErrorIs(t, err, engine.ErrInvalidKey)
	})

	t.Run("UnregisteredOperation", func(t *testing.T) {
		t.Parallel()
		e, _, b := setup(t, setupOpts{})
		other := b.transferOp(t, engine.RetryPolicy{})
		_, err := engine.Start(ctx, e, other, "c", "k", transferIn{Amount: 1}, nil)
		require.ErrorContains(t, err, "operation type not registered")
	})
}

type fsOrder struct {
	Amount   int64          `json:"amount"`
	Currency string         `json:"currency"`
	Order    string         `json:"order"`
	Note     string         `json:"note"`
	Meta     map[string]int `json:"meta"`
	Ref      string         `json:"ref,omitempty"`
}

// TestKeyReuse: a start under a held key with another input is refused with
// a *ReusedError that names exactly the top-level fields that differ, but
// the unfingerprinted ones; the same input (up to those) gets the existing
// operation. Start and StartTx alike.
func TestKeyReuse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	define := func(name string) *engine.Operation[fsOrder, int, int] {
		op, err := engine.NewOperation(name, []engine.Step[fsOrder, int]{
			engine.TxStep("noop", func(context.Context, engine.Tx, engine.Attempt, fsOrder, *int) error { return nil }),
		}, func(in fsOrder, _ *int) (int, error) { return int(in.Amount), nil }, &engine.OperationOpts{Unfingerprinted: []string{"note"}})
		require.NoError(t, err)
		return op
	}
	op, other := define("order"), define("other_order")
	e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op, other)
	first := fsOrder{Amount: 100, Currency: "EUR", Order: "o-1", Note: "first", Meta: map[string]int{"a": 1, "b": 2}}
	held, err := engine.Start(ctx, e, op, "c", "k", first, nil)
	require.NoError(t, err)
	require.True(t, held.Created)
	done := fsWaitStarted(t, held)
	require.Equal(t, engine.StatusSucceeded, done.Status)

	// A second operation holds a key reserved with StartTx, not run yet.
	var heldTx *engine.Started
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		heldTx, err = engine.StartTx(ctx, tx, e, op, "c", "k-tx", first, nil)
		return err
	}))
	require.True(t, heldTx.Created)

	refused := func(t *testing.T, err error, id uuid.UUID, fields ...string) {
		t.Helper()
		require.ErrorAs(t, err, new(*engine.ReusedError))
		var kre *engine.ReusedError
		require.ErrorAs(t, err, &kre)
		require.Equal(t, id, kre.Operation)
		require.Equal(t, fields, kre.Fields)
	}
	with := func(change func(*fsOrder)) fsOrder {
		in := first
		in.Meta = map[string]int{"a": 1, "b": 2}
		change(&in)
		return in
	}

	for _, tc := range []struct {
		name   string
		in     fsOrder
		fields []string // nil: the same start
	}{
		{"FieldsThatDiffer", with(func(in *fsOrder) { in.Amount, in.Order, in.Note = 101, "o-2", "second" }), []string{"amount", "order"}},
		{"NestedValueAndAddedField", with(func(in *fsOrder) { in.Meta["b"], in.Ref = 3, "r-1" }), []string{"meta", "ref"}},
		{"UnfingerprintedOnly", with(func(in *fsOrder) { in.Note = "changed" }), nil},
		{"SameInput", with(func(*fsOrder) {}), nil},
	} {
		t.Run("Start/"+tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := engine.Start(ctx, e, op, "c", "k", tc.in, nil)
			if tc.fields != nil {
				refused(t, err, held.ID, tc.fields...)
				return
			}
			require.NoError(t, err)
			require.False(t, s.Created)
			require.Equal(t, held.ID, s.ID)
			require.Equal(t, held.ID, s.Existing.ID)
			require.Equal(t, engine.StatusSucceeded, s.Existing.Status)
			require.JSONEq(t, string(done.Result), string(s.Existing.Result))
		})
		t.Run("StartTx/"+tc.name, func(t *testing.T) {
			t.Parallel()
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { require.NoError(t, tx.Rollback(ctx)) }()
			s, err := engine.StartTx(ctx, tx, e, op, "c", "k", tc.in, nil)
			if tc.fields != nil {
				refused(t, err, held.ID, tc.fields...)
				return
			}
			require.NoError(t, err)
			require.False(t, s.Created)
			require.Equal(t, held.ID, s.Existing.ID)
			require.Equal(t, engine.StatusSucceeded, s.Existing.Status)
		})
		t.Run("StartOnStartTxKey/"+tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := engine.Start(ctx, e, op, "c", "k-tx", tc.in, nil)
			if tc.fields != nil {
				refused(t, err, heldTx.ID, tc.fields...)
				return
			}
			require.NoError(t, err)
			require.False(t, s.Created)
			require.Equal(t, heldTx.ID, s.Existing.ID)
			require.Equal(t, engine.StatusInProgress, s.Existing.Status)
		})
	}

	t.Run("OtherOperationType", func(t *testing.T) {
		t.Parallel()
		_, err := engine.Start(ctx, e, other, "c", "k", first, nil)
		refused(t, err, held.ID, "operation")
	})
}

// fsWaitStarted waits for a started operation to finish.
func fsWaitStarted(t *testing.T, s *engine.Started) *engine.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), fsTimeout)
	defer cancel()
	info, err := s.Wait(ctx)
	require.NoError(t, err)
	return info
}

// TestFingerprintOfAnEarlierVersion: an operation stored with a version 2
// fingerprint (whole SHA-256 hashes in hex) is recognised by a start of the
// same input after the deploy that shortened the hashes, and one of another
// input is still refused, naming the field.
func TestFingerprintOfAnEarlierVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, op, b := setup(t, setupOpts{})
	in := transferIn{From: "a", To: "b", Amount: 1}
	s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
	require.NoError(t, err)
	waitDone(t, e, s)
	// As a version 2 process stored it: {"v": 2, "fields": {name: hex SHA-256}}.
	_, err = b.pool.Exec(ctx, `UPDATE idemflow_operation
		SET fingerprint = jsonb_build_object('v', 2, 'fields', (
			SELECT jsonb_object_agg(f.key, encode(sha256(convert_to(f.value, 'UTF8')), 'hex'))
			FROM json_each_text(json_build_object('from', '"a"', 'to', '"b"', 'amount', '1')) AS f))
		WHERE id = $1`, s.ID)
	require.NoError(t, err)

	again, err := engine.Start(ctx, e, op, "c", "k", in, nil)
	require.NoError(t, err, "a retry refused after the deploy")
	require.False(t, again.Created)
	require.Equal(t, s.ID, again.ID)

	_, err = engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 2}, nil)
	var reused *engine.ReusedError
	require.ErrorAs(t, err, &reused)
	require.Equal(t, []string{"amount"}, reused.Fields)
}

// TestStoredWithoutFingerprint: an operation that an earlier release started
// with no fingerprint (NULL) is compared by its stored input: the same input is
// the same start, another is a reused key.
func TestStoredWithoutFingerprint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	f := &fsFlow{pool: pool, lookup: true}
	op := f.op(t, "review_fp")
	e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
	in := fsIn{Account: "acct", Amount: 100}
	s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
	require.NoError(t, err)
	fsWait(t, e, s.ID)
	_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET fingerprint = NULL WHERE id = $1`, s.ID)
	require.NoError(t, err)

	again, err := engine.Start(ctx, e, op, "c", "k", in, nil)
	require.NoError(t, err)
	require.False(t, again.Created)
	require.Equal(t, s.ID, again.ID)
	_, err = engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 101}, nil)
	var reused *engine.ReusedError
	require.ErrorAs(t, err, &reused)
	require.Equal(t, []string{"amount"}, reused.Fields)
}

func TestStartTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CommitsWithCallerAndRunsOnWorker", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{workers: true})
		var started *engine.Started
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO test_ledger (account, amount, note) VALUES ('caller', 0, 'caller')`); err != nil {
				return err
			}
			var err error
			started, err = engine.StartTx(ctx, tx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 9}, nil)
			return err
		}))
		require.True(t, started.Created)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		require.Equal(t, 1, info.Runs, "the job's run is the first")
		require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, b.pool))
	})

	t.Run("RollbackLeavesNothing", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{workers: true})
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		started, err := engine.StartTx(ctx, tx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 9}, nil)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		_, err = e.Get(ctx, started.ID)
		require.ErrorIs(t, err, engine.ErrNotFound)

		// The key was never consumed.
		again, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 9}, nil)
		require.NoError(t, err)
		require.True(t, again.Created)
		waitDone(t, e, again)
	})
}
