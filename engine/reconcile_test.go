package engine_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/reconcile"
)

// ledgerOf is an outside service's book of records, listed in pages as a
// reconciliation source.
type ledgerOf struct {
	mu      sync.Mutex
	records []reconcile.Record
	// asked are the requests List got.
	asked []reconcile.ListRequest
}

func (l *ledgerOf) add(r reconcile.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.CreatedAt.IsZero() {
		r.CreatedAt = time.Now()
	}
	if r.Reference == "" {
		r.Reference = "ref_" + strconv.Itoa(len(l.records)+1)
	}
	l.records = append(l.records, r)
}

// set changes the record under key.
func (l *ledgerOf) set(key string, fn func(r *reconcile.Record)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.records {
		if l.records[i].Key == key {
			fn(&l.records[i])
		}
	}
}

func (l *ledgerOf) list(_ context.Context, req reconcile.ListRequest) ([]reconcile.Record, string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked = append(l.asked, req)
	from := 0
	if req.Cursor != "" {
		n, err := strconv.Atoi(req.Cursor)
		if err != nil {
			return nil, "", err
		}
		from = n
	}
	var page []reconcile.Record
	i := from
	for ; i < len(l.records) && len(page) < req.Limit; i++ {
		if l.records[i].CreatedAt.After(req.Since) {
			page = append(page, l.records[i])
		}
	}
	if i >= len(l.records) {
		return page, "", nil
	}
	return page, strconv.Itoa(i), nil
}

type payIn struct {
	Amount int64 `json:"amount"`
	// Decline makes the call fail for good (the service says no), though a
	// test may put a record under its key anyway: one that landed late.
	Decline bool `json:"decline"`
}

type payState struct {
	Ref string `json:"ref"`
}

// reconcileEngine returns an engine that runs the "pay" operation, whose one
// step records a payment in book, with book as the source "bank" (runs on
// request only, pages of 2).
func reconcileEngine(t *testing.T, book *ledgerOf) (*engine.Engine, *engine.Operation[payIn, payState, payState], *pgxpool.Pool) {
	t.Helper()
	pay := engine.ExternalStep("pay", func(_ context.Context, at engine.Attempt, in payIn, s *payState) error {
		if in.Decline {
			return engine.Fail("declined", "the bank declined")
		}
		book.add(reconcile.Record{Key: at.Key, Amount: in.Amount})
		s.Ref = at.Key
		return nil
	}).Compare(func(in payIn, rec reconcile.Record) reconcile.Kind {
		if rec.Amount != in.Amount {
			return reconcile.AmountDiffers
		}
		return ""
	})
	op, err := engine.NewOperation("pay", []engine.Step[payIn, payState]{pay},
		func(_ payIn, s *payState) (payState, error) { return *s, nil }, nil)
	require.NoError(t, err)
	pool := testdb.Pool(t)
	e := idemflowtest.NewEngine(t, pool, &engine.Config{
		Reconcile: reconcile.Config{Sources: []reconcile.Source{{Name: "bank", List: book.list, PageSize: 2}}, Interval: -1},
	}, op)
	return e, op, pool
}

// pay runs a payment to its end and returns it with its steps.
func pay(t *testing.T, e *engine.Engine, op *engine.Operation[payIn, payState, payState], key string, in payIn) *engine.Info {
	t.Helper()
	ctx := context.Background()
	s, err := engine.Start(ctx, e, op, "shop", key, in, nil)
	require.NoError(t, err)
	_, err = s.Wait(ctx)
	require.NoError(t, err)
	info, err := e.Get(ctx, s.ID)
	require.NoError(t, err)
	return info
}

func TestReconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	book := &ledgerOf{}
	e, op, _ := reconcileEngine(t, book)

	fine := pay(t, e, op, "fine", payIn{Amount: 100})
	require.Equal(t, engine.StatusSucceeded, fine.Status)
	require.Regexp(t, `^idf3_[A-Za-z0-9_-]{48}$`, fine.Steps[0].DerivedKey)
	changed := pay(t, e, op, "changed", payIn{Amount: 200})
	book.set(changed.Steps[0].DerivedKey, func(r *reconcile.Record) { r.Amount = 250 })
	// Declined, then carried out after all: money moved under a failed operation.
	late := pay(t, e, op, "late", payIn{Amount: 300, Decline: true})
	require.Equal(t, engine.StatusFailed, late.Status)
	book.add(reconcile.Record{Key: late.Steps[0].DerivedKey, Amount: 300})
	// Failed at the bank after our step succeeded.
	reversed := pay(t, e, op, "reversed", payIn{Amount: 400})
	book.set(reversed.Steps[0].DerivedKey, func(r *reconcile.Record) { r.Status = reconcile.Failed })
	// Made outside; a key of an older scheme; a pending record; a forged key
	// naming a real operation; a failed record under an unknown key (it moved
	// nothing).
	book.add(reconcile.Record{Key: "manual-refund-7", Amount: 700})
	book.add(reconcile.Record{Key: "idf2_ZZGPyTIDrLHK-dgrZMoLAXWEtJnl-hWdC4rGrempfW4", Amount: 1})
	book.add(reconcile.Record{Key: "pending-1", Amount: 5, Status: reconcile.Pending})
	forged := forgeKey(t, fine.ID)
	book.add(reconcile.Record{Key: forged, Amount: 100})
	book.add(reconcile.Record{Key: "declined-elsewhere", Amount: 9, Status: reconcile.Failed})

	rep, err := e.Reconcile(ctx, "bank")
	require.NoError(t, err)
	require.NotNil(t, rep.CheckedAt)
	require.Equal(t, int64(len(book.records)), rep.Checked)
	require.Equal(t, int64(1), rep.NotYet)
	require.Equal(t, int64(1), rep.Unverifiable)
	require.Equal(t, (len(book.records)+1)/2, rep.Pages, "pages of 2")
	for _, a := range book.asked {
		require.Equal(t, 2, a.Limit)
		require.WithinDuration(t, time.Now().Add(-defaultRetention), a.Since, time.Minute, "the window is the retention")
	}
	kinds := map[string]reconcile.Kind{}
	for _, m := range rep.Mismatches {
		kinds[m.Key] = m.Kind
	}
	require.Equal(t, map[string]reconcile.Kind{
		changed.Steps[0].DerivedKey:  reconcile.AmountDiffers,
		late.Steps[0].DerivedKey:     reconcile.NotSucceeded,
		reversed.Steps[0].DerivedKey: reconcile.RecordFailed,
		"manual-refund-7":            reconcile.UnknownKey,
		forged:                       reconcile.UnknownKey,
	}, kinds)
	for _, m := range rep.Mismatches {
		if m.Key == late.Steps[0].DerivedKey {
			require.Equal(t, late.ID, m.OperationID)
			require.Equal(t, "pay", m.Step)
			require.Equal(t, "shop", m.Scope)
			require.Equal(t, engine.StatusFailed, m.OperationStatus)
			require.NotEmpty(t, m.Detail)
		}
		if m.Kind == reconcile.UnknownKey {
			require.Equal(t, uuid.Nil, m.OperationID)
		}
	}
	counts, err := e.MismatchCounts(ctx)
	require.NoError(t, err)
	require.Equal(t, map[reconcile.Kind]int64{
		reconcile.UnknownKey: 2, reconcile.NotSucceeded: 1, reconcile.RecordFailed: 1,
		reconcile.AmountDiffers: 1, reconcile.ReferenceDiffers: 0, reconcile.MissingRecord: 0,
	}, counts)

	t.Run("NamedOperationsNeedAttention", func(t *testing.T) {
		got, err := e.Get(ctx, late.ID)
		require.NoError(t, err)
		require.True(t, got.NeedsAttention(), "a finished operation named by a mismatch")
		require.EqualValues(t, engine.CodeReconciliationMismatch, got.Attention.Code)
		require.Len(t, got.Mismatches, 1)
		got, err = e.Get(ctx, fine.ID)
		require.NoError(t, err)
		require.False(t, got.NeedsAttention())
		list, err := e.List(ctx, &engine.ListOpts{NeedsAttention: true})
		require.NoError(t, err)
		var ids []uuid.UUID
		for _, i := range list {
			require.True(t, i.NeedsAttention())
			ids = append(ids, i.ID)
		}
		require.ElementsMatch(t, []uuid.UUID{changed.ID, late.ID, reversed.ID}, ids)
	})

	t.Run("ClearedWhenNoLongerFound", func(t *testing.T) {
		book.set(changed.Steps[0].DerivedKey, func(r *reconcile.Record) { r.Amount = 200 })
		rep, err := e.Reconcile(ctx, "bank")
		require.NoError(t, err)
		for _, m := range rep.Mismatches {
			require.NotEqual(t, changed.Steps[0].DerivedKey, m.Key)
		}
		require.Len(t, rep.Mismatches, 4)
		got, err := e.Get(ctx, changed.ID)
		require.NoError(t, err)
		require.False(t, got.NeedsAttention())
		require.Empty(t, got.Mismatches)
	})

	t.Run("UnknownSource", func(t *testing.T) {
		_, err := e.Reconcile(ctx, "nope")
		require.ErrorIs(t, err, engine.ErrUnknownSource)
	})
}

// forgeKey returns a key of scheme 3 that names operation id with a digest
// that is not its.
func forgeKey(t *testing.T, id uuid.UUID) string {
	t.Helper()
	raw := make([]byte, 36)
	copy(raw, id[:])
	return "idf3_" + base64.RawURLEncoding.EncodeToString(raw)
}

// TestReconcileInProgress: a record whose operation is still in progress is
// not judged, however it looks.
func TestReconcileInProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	book := &ledgerOf{}
	e, op, pool := reconcileEngine(t, book)
	// Reserved in a transaction of the caller's, run by a River job: without
	// workers here, it stays in progress.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	s, err := engine.StartTx(ctx, tx, e, op, "shop", "queued", payIn{Amount: 5}, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	info, err := e.Get(ctx, s.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInProgress, info.Status)
	book.add(reconcile.Record{Key: info.Steps[0].DerivedKey, Amount: 6})

	rep, err := e.Reconcile(ctx, "bank")
	require.NoError(t, err)
	require.Empty(t, rep.Mismatches)
	require.Equal(t, int64(1), rep.NotYet)
}

// TestCheckRecord: an event's record is judged at once, in the caller's
// transaction, and a run that no longer finds it clears it.
func TestCheckRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	book := &ledgerOf{}
	e, op, pool := reconcileEngine(t, book)
	late := pay(t, e, op, "late", payIn{Amount: 300, Decline: true})
	rec := reconcile.Record{Key: late.Steps[0].DerivedKey, Reference: "ref_late", Amount: 300, Data: map[string]string{"note": "webhook"}}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	m, err := e.CheckRecord(ctx, tx, "bank", rec)
	require.NoError(t, err)
	require.NotNil(t, m)
	require.Equal(t, reconcile.NotSucceeded, m.Kind)
	require.NoError(t, tx.Rollback(ctx))
	rep, err := e.Reconciliation(ctx, "bank")
	require.NoError(t, err)
	require.Nil(t, rep.CheckedAt, "no run yet")
	require.Empty(t, rep.Mismatches, "rolled back with the caller's transaction")

	m, err = e.CheckRecord(ctx, nil, "bank", rec)
	require.NoError(t, err)
	require.NotNil(t, m)
	rep, err = e.Reconciliation(ctx, "bank")
	require.NoError(t, err)
	require.Len(t, rep.Mismatches, 1)
	var data map[string]string
	require.NoError(t, json.Unmarshal(rep.Mismatches[0].Data, &data))
	require.Equal(t, "webhook", data["note"])

	// The bank never listed it (the event was wrong): the next run clears it.
	rep, err = e.Reconcile(ctx, "bank")
	require.NoError(t, err)
	require.Empty(t, rep.Mismatches)

	// A record in order changes nothing; pending is not judged.
	fine := pay(t, e, op, "fine", payIn{Amount: 1})
	for _, r := range []reconcile.Record{
		{Key: fine.Steps[0].DerivedKey, Amount: 1},
		{Key: "x", Amount: 1, Status: reconcile.Pending},
	} {
		m, err := e.CheckRecord(ctx, nil, "bank", r)
		require.NoError(t, err)
		require.Nil(t, m)
	}
}

// TestReconcileConfig: a window past the retention, and sources without a
// name or a list, are refused.
func TestReconcileConfig(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	list := func(context.Context, reconcile.ListRequest) ([]reconcile.Record, string, error) { return nil, "", nil }
	for name, rc := range map[string]reconcile.Config{
		"window":    {Sources: []reconcile.Source{{Name: "a", List: list}}, Window: 48 * time.Hour},
		"no name":   {Sources: []reconcile.Source{{List: list}}},
		"no list":   {Sources: []reconcile.Source{{Name: "a"}}},
		"duplicate": {Sources: []reconcile.Source{{Name: "a", List: list}, {Name: "a", List: list}}},
	} {
		_, err := engine.New(pool, &engine.Config{Reconcile: rc})
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "reconcile", name)
	}
	_, err := engine.New(pool, &engine.Config{Reconcile: reconcile.Config{Sources: []reconcile.Source{{Name: "a", List: list}}, Window: time.Hour}})
	require.NoError(t, err)
}

// TestReconcileBoundedPages: a run reads a window of many records a page at a
// time, and a source that answers the cursor it was asked with is an error,
// not an endless run.
func TestReconcileBoundedPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	book := &ledgerOf{}
	for i := range 25 {
		book.add(reconcile.Record{Key: fmt.Sprintf("outside-%d", i), Amount: 1})
	}
	e, _, pool := reconcileEngine(t, book)
	rep, err := e.Reconcile(ctx, "bank")
	require.NoError(t, err)
	require.Equal(t, 13, rep.Pages)
	require.Len(t, rep.Mismatches, 25)
	for _, a := range book.asked {
		require.Equal(t, 2, a.Limit)
	}
	require.True(t, slices.IsSortedFunc(rep.Mismatches, func(a, b engine.Mismatch) int { return a.FirstSeen.Compare(b.FirstSeen) }))

	stuck, err := engine.New(pool, &engine.Config{Reconcile: reconcile.Config{Sources: []reconcile.Source{{Name: "s",
		List: func(_ context.Context, req reconcile.ListRequest) ([]reconcile.Record, string, error) {
			return []reconcile.Record{{Key: "k"}}, "same", nil
		}}}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = stuck.Stop(context.Background()) })
	_, err = stuck.Reconcile(ctx, "s")
	require.ErrorContains(t, err, "cursor")
}

// TestReconcileOddPages: records without a key (made by hand), a record
// listed twice in a page, several records under one key, and an empty page
// that is not the last are all read and kept apart.
func TestReconcileOddPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now()
	pages := map[string]struct {
		recs []reconcile.Record
		next string
	}{
		"": {[]reconcile.Record{
			{Reference: "by-hand-1", Amount: 5, CreatedAt: now},
			{Reference: "by-hand-2", Amount: 7, CreatedAt: now},
		}, "2"},
		"2": {nil, "3"},
		"3": {[]reconcile.Record{
			{Key: "twice", Reference: "r-1", Amount: 1, CreatedAt: now},
			{Key: "twice", Reference: "r-1", Amount: 1, CreatedAt: now},
			{Key: "twice", Reference: "r-2", Amount: 2, CreatedAt: now},
		}, ""},
	}
	pool := testdb.Pool(t)
	e, err := engine.New(pool, &engine.Config{Reconcile: reconcile.Config{Interval: -1, Sources: []reconcile.Source{{Name: "bank",
		List: func(_ context.Context, req reconcile.ListRequest) ([]reconcile.Record, string, error) {
			p := pages[req.Cursor]
			return p.recs, p.next, nil
		}}}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	rep, err := e.Reconcile(ctx, "bank")
	require.NoError(t, err)
	require.Equal(t, 3, rep.Pages, "the empty page is not the end")
	require.Equal(t, int64(5), rep.Checked)
	got := map[string]int64{}
	for _, m := range rep.Mismatches {
		require.Equal(t, reconcile.UnknownKey, m.Kind)
		got[m.Key+"/"+m.Reference] = m.Amount
	}
	require.Equal(t, map[string]int64{"/by-hand-1": 5, "/by-hand-2": 7, "twice/r-1": 1, "twice/r-2": 2}, got)
}

// TestReconcileWrongBothWays: a record wrong both in its reference and in
// what it moved is two mismatches, one of each kind.
func TestReconcileWrongBothWays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	book := &ledgerOf{}
	step := engine.ExternalStep("pay", func(_ context.Context, at engine.Attempt, in payIn, s *payState) error {
		book.add(reconcile.Record{Key: at.Key, Reference: "ch_1", Amount: in.Amount})
		s.Ref = "ch_1"
		return nil
	}).Compare(func(in payIn, rec reconcile.Record) reconcile.Kind {
		if rec.Amount != in.Amount {
			return reconcile.AmountDiffers
		}
		return ""
	}).Records("bank", func(s *payState) string { return s.Ref })
	op, err := engine.NewOperation("pay", []engine.Step[payIn, payState]{step},
		func(_ payIn, s *payState) (payState, error) { return *s, nil }, nil)
	require.NoError(t, err)
	e := idemflowtest.NewEngine(t, testdb.Pool(t), &engine.Config{
		Reconcile: reconcile.Config{Sources: []reconcile.Source{{Name: "bank", List: book.list}}, Interval: -1},
	}, op)
	paid := pay(t, e, op, "k", payIn{Amount: 100})
	_, err = e.CheckRecord(ctx, nil, "bank", reconcile.Record{Key: paid.Steps[0].DerivedKey, Reference: "ch_2", Amount: 101})
	require.NoError(t, err)
	got, err := e.Get(ctx, paid.ID)
	require.NoError(t, err)
	var kinds []reconcile.Kind
	for _, m := range got.Mismatches {
		kinds = append(kinds, m.Kind)
	}
	require.ElementsMatch(t, []reconcile.Kind{reconcile.ReferenceDiffers, reconcile.AmountDiffers}, kinds)
}
