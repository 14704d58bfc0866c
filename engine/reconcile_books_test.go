package engine_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
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

// remove takes the records under key out of the book: the service lost them,
// or never made them.
func (l *ledgerOf) remove(key string) []reconcile.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var gone []reconcile.Record
	l.records = slices.DeleteFunc(l.records, func(r reconcile.Record) bool {
		if r.Key == key {
			gone = append(gone, r)
			return true
		}
		return false
	})
	return gone
}

type chargeIn struct {
	Amount int64 `json:"amount"`
	// FailFirst fails the first attempt (the step then has a row, and its
	// reference is read from the state in it); Unrecorded makes the call
	// succeed without a record at the service (it lost it).
	FailFirst  bool `json:"failFirst,omitempty"`
	Unrecorded bool `json:"unrecorded,omitempty"`
	Decline    bool `json:"decline,omitempty"`
}

type chargeState struct {
	Ref string `json:"ref"`
}

// booksEngine returns an engine that runs "charge", whose one step records a
// charge in book under a reference of its own and says so with Records, and
// "charge_slow", the same with a outcome window of an hour; book is the
// source "bank" (runs on request only, pages of 2).
func booksEngine(t *testing.T, book *ledgerOf) (*engine.Engine, map[string]*engine.Operation[chargeIn, chargeState, chargeState], *pgxpool.Pool) {
	t.Helper()
	ops := map[string]*engine.Operation[chargeIn, chargeState, chargeState]{}
	for name, settle := range map[string]time.Duration{"charge": 0, "charge_slow": time.Hour} {
		failed := map[string]bool{}
		step := engine.ExternalStep("charge", func(_ context.Context, at engine.Attempt, in chargeIn, s *chargeState) error {
			if in.Decline {
				return engine.Fail("declined", "the bank declined")
			}
			if in.FailFirst && !failed[at.Key] {
				failed[at.Key] = true
				return errors.New("the bank timed out")
			}
			s.Ref = "ch_" + at.Key[len(at.Key)-8:]
			if !in.Unrecorded {
				book.add(reconcile.Record{Key: at.Key, Reference: s.Ref, Amount: in.Amount})
			}
			return nil
		}).Window(settle).Retries(engine.RetryPolicy{Base: time.Millisecond}).
			Records("bank", func(s *chargeState) string { return s.Ref })
		op, err := engine.NewOperation(name, []engine.Step[chargeIn, chargeState]{step},
			func(_ chargeIn, s *chargeState) (chargeState, error) { return *s, nil }, nil)
		require.NoError(t, err)
		ops[name] = op
	}
	pool := testdb.Pool(t)
	e := idemflowtest.NewEngine(t, pool, &engine.Config{
		Reconcile: reconcile.Config{Sources: []reconcile.Source{{Name: "bank", List: book.list, PageSize: 2}}, Interval: -1},
	}, ops["charge"], ops["charge_slow"])
	return e, ops, pool
}

func charge(t *testing.T, e *engine.Engine, op *engine.Operation[chargeIn, chargeState, chargeState], key string, in chargeIn) *engine.Info {
	t.Helper()
	ctx := context.Background()
	s, err := engine.Start(ctx, e, op, "shop", key, in, nil)
	require.NoError(t, err)
	_, _ = s.Wait(ctx)
	info, err := e.Get(ctx, s.ID)
	require.NoError(t, err)
	require.NotEqual(t, engine.StatusInProgress, info.Status)
	return info
}

// byKind returns the mismatches of rep by kind, then key.
func byKind(rep *engine.ReconcileReport) map[reconcile.Kind]map[string]engine.Mismatch {
	out := map[reconcile.Kind]map[string]engine.Mismatch{}
	for _, m := range rep.Mismatches {
		if out[m.Kind] == nil {
			out[m.Kind] = map[string]engine.Mismatch{}
		}
		out[m.Kind][m.Key] = m
	}
	return out
}

// TestReconcileBooks: the books' succeeded steps are checked against the
// records listed, and a record's reference against the one the books hold,
// whoever recorded it.
func TestReconcileBooks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	book := &ledgerOf{}
	e, ops, _ := booksEngine(t, book)

	fine := charge(t, e, ops["charge"], "fine", chargeIn{Amount: 1})
	retried := charge(t, e, ops["charge"], "retried", chargeIn{Amount: 2, FailFirst: true})
	require.Equal(t, 2, retried.Steps[0].Attempts, "a row holds its state")
	lost := charge(t, e, ops["charge"], "lost", chargeIn{Amount: 3, Unrecorded: true})
	lostRetried := charge(t, e, ops["charge"], "lost-retried", chargeIn{Amount: 4, FailFirst: true, Unrecorded: true})
	declined := charge(t, e, ops["charge"], "declined", chargeIn{Amount: 5, Decline: true})
	require.Equal(t, engine.StatusFailed, declined.Status)
	young := charge(t, e, ops["charge_slow"], "young", chargeIn{Amount: 6, Unrecorded: true})
	relabelled := charge(t, e, ops["charge"], "relabelled", chargeIn{Amount: 7})
	relabelledRetried := charge(t, e, ops["charge"], "relabelled-retried", chargeIn{Amount: 8, FailFirst: true})
	for _, i := range []*engine.Info{relabelled, relabelledRetried} {
		book.set(i.Steps[0].DerivedKey, func(r *reconcile.Record) { r.Reference = "ch_elsewhere" })
	}
	keyOf := func(i *engine.Info) string { return i.Steps[0].DerivedKey }

	rep, err := e.Reconcile(ctx, "bank")
	require.NoError(t, err)
	// Every succeeded step but the one inside its outcome window.
	require.Equal(t, int64(6), rep.StepsChecked)
	got := byKind(rep)
	require.Len(t, got, 2, "%+v", rep.Mismatches)
	require.Len(t, got[reconcile.MissingRecord], 2)
	for _, i := range []*engine.Info{lost, lostRetried} {
		m, ok := got[reconcile.MissingRecord][keyOf(i)]
		require.True(t, ok, "a step without a record: %s", i.Key)
		require.Equal(t, "ch_"+keyOf(i)[len(keyOf(i))-8:], m.Reference, "the reference the books hold")
		require.Equal(t, i.ID, m.OperationID)
		require.Equal(t, "charge", m.Step)
		require.Equal(t, engine.StatusSucceeded, m.OperationStatus)
		require.Empty(t, m.RecordStatus)
		require.Contains(t, m.Detail, "lists no record")
	}
	require.NotContains(t, got[reconcile.MissingRecord], keyOf(young), "inside its outcome window")
	require.Len(t, got[reconcile.ReferenceDiffers], 2, "checkpoint and row alike")
	for _, i := range []*engine.Info{relabelled, relabelledRetried} {
		m := got[reconcile.ReferenceDiffers][keyOf(i)]
		require.Equal(t, "ch_elsewhere", m.Reference, "the record's")
		require.Contains(t, m.Detail, "ch_"+keyOf(i)[len(keyOf(i))-8:])
		require.Contains(t, m.Detail, "resolved by call")
	}
	_ = fine

	t.Run("KeptPerKind", func(t *testing.T) {
		// An event says the record failed: a second mismatch beside the
		// run's, not one in its place.
		m, err := e.CheckRecord(ctx, nil, "bank", reconcile.Record{Key: keyOf(relabelled), Reference: "ch_elsewhere", Amount: 7, Status: reconcile.Failed})
		require.NoError(t, err)
		require.Equal(t, reconcile.RecordFailed, m.Kind)
		info, err := e.Get(ctx, relabelled.ID)
		require.NoError(t, err)
		var kinds []reconcile.Kind
		for _, m := range info.Mismatches {
			kinds = append(kinds, m.Kind)
		}
		require.ElementsMatch(t, []reconcile.Kind{reconcile.ReferenceDiffers, reconcile.RecordFailed}, kinds)
	})

	t.Run("ClearedWhenFound", func(t *testing.T) {
		book.add(reconcile.Record{Key: keyOf(lost), Reference: "ch_" + keyOf(lost)[len(keyOf(lost))-8:], Amount: 3})
		for _, i := range []*engine.Info{relabelled, relabelledRetried} {
			book.set(keyOf(i), func(r *reconcile.Record) { r.Reference = "ch_" + keyOf(i)[len(keyOf(i))-8:] })
		}
		rep, err := e.Reconcile(ctx, "bank")
		require.NoError(t, err)
		require.Len(t, rep.Mismatches, 1, "%+v", rep.Mismatches)
		require.Equal(t, reconcile.MissingRecord, rep.Mismatches[0].Kind)
		require.Equal(t, keyOf(lostRetried), rep.Mismatches[0].Key)
		counts, err := e.MismatchCounts(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(1), counts[reconcile.MissingRecord])
	})

	t.Run("NotListedAsFailed", func(t *testing.T) {
		// A record that failed is listed: the step is not missing it, its
		// record failed.
		book.add(reconcile.Record{Key: keyOf(lostRetried), Reference: "ch_" + keyOf(lostRetried)[len(keyOf(lostRetried))-8:], Amount: 4,
			Status: reconcile.Failed})
		rep, err := e.Reconcile(ctx, "bank")
		require.NoError(t, err)
		require.Len(t, rep.Mismatches, 1, "%+v", rep.Mismatches)
		require.Equal(t, reconcile.RecordFailed, rep.Mismatches[0].Kind)
		book.remove(keyOf(lostRetried))
	})
}

// TestReconcileBooksWindowEdge: an operation created at the window's start
// is not checked (its record may be dated before the window by the source's
// clock); one created well inside it is.
func TestReconcileBooksWindowEdge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	book := &ledgerOf{}
	e, ops, pool := booksEngine(t, book)
	edge := charge(t, e, ops["charge"], "edge", chargeIn{Amount: 1, Unrecorded: true})
	inside := charge(t, e, ops["charge"], "inside", chargeIn{Amount: 2, Unrecorded: true})
	// The window is the retention (a day): move "edge" to its first
	// seconds, "inside" an hour in.
	for id, age := range map[uuid.UUID]time.Duration{edge.ID: defaultRetention - 10*time.Second, inside.ID: defaultRetention - time.Hour} {
		_, err := pool.Exec(ctx, `UPDATE idemflow_operation SET created_at = now() - $2::interval WHERE id = $1`, id, fmt.Sprintf("%d seconds", int(age.Seconds())))
		require.NoError(t, err)
	}
	rep, err := e.Reconcile(ctx, "bank")
	require.NoError(t, err)
	require.Equal(t, int64(1), rep.StepsChecked)
	require.Len(t, rep.Mismatches, 1)
	require.Equal(t, inside.ID, rep.Mismatches[0].OperationID)
	require.Equal(t, reconcile.MissingRecord, rep.Mismatches[0].Kind)
}

// v7At returns a UUIDv7 of time t.
func v7At(t *testing.T, at time.Time) uuid.UUID {
	t.Helper()
	id, err := uuid.NewV7()
	require.NoError(t, err)
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(at.UnixMilli()))
	copy(id[:6], b[2:])
	return id
}

// TestReconcileExpired: a record under a key of ours whose operation is gone
// is judged against what the books hold: made longer ago than the retention,
// its operation may have been deleted, and it is counted as expired; made
// since, the operation was lost, and it is an unknown key.
func TestReconcileExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	book := &ledgerOf{}
	e, _, _ := booksEngine(t, book)
	old := forgeKey(t, v7At(t, time.Now().Add(-defaultRetention-time.Hour)))
	recent := forgeKey(t, v7At(t, time.Now().Add(-time.Hour)))
	book.add(reconcile.Record{Key: old, Amount: 1})
	book.add(reconcile.Record{Key: recent, Amount: 2})

	rep, err := e.Reconcile(ctx, "bank")
	require.NoError(t, err)
	require.Equal(t, int64(1), rep.Expired)
	require.Len(t, rep.Mismatches, 1)
	require.Equal(t, reconcile.UnknownKey, rep.Mismatches[0].Kind)
	require.Equal(t, recent, rep.Mismatches[0].Key)

	// An event redelivered after its operation expired: nothing to report.
	m, err := e.CheckRecord(ctx, nil, "bank", reconcile.Record{Key: old, Reference: "evt", Amount: 1})
	require.NoError(t, err)
	require.Nil(t, m)
	m, err = e.CheckRecord(ctx, nil, "bank", reconcile.Record{Key: recent, Reference: "evt", Amount: 2})
	require.NoError(t, err)
	require.Equal(t, reconcile.UnknownKey, m.Kind)
}

// TestMismatchList: a report says how many mismatches there are and whether
// it lists them all; MismatchList pages through them all.
func TestMismatchList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	book := &ledgerOf{}
	for i := range 1001 {
		book.add(reconcile.Record{Key: fmt.Sprintf("outside-%04d", i), Amount: 1})
	}
	pool := testdb.Pool(t)
	e := idemflowtest.NewEngine(t, pool, &engine.Config{
		Reconcile: reconcile.Config{Sources: []reconcile.Source{{Name: "bank", List: book.list}}, Interval: -1},
	})
	rep, err := e.Reconcile(ctx, "bank")
	require.NoError(t, err)
	require.Equal(t, int64(1001), rep.Total)
	require.Len(t, rep.Mismatches, 1000)
	require.True(t, rep.Truncated)

	var all []engine.Mismatch
	after := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 4)
		res, err := e.MismatchList(ctx, &engine.MismatchListOpts{Source: "bank", Limit: 400, After: after})
		require.NoError(t, err)
		require.Equal(t, int64(1001), res.Total)
		all = append(all, res.Mismatches...)
		if res.Next == "" {
			require.Len(t, res.Mismatches, 201)
			break
		}
		require.Len(t, res.Mismatches, 400)
		after = res.Next
	}
	require.Len(t, all, 1001)
	keys := map[string]bool{}
	for _, m := range all {
		keys[m.Key] = true
	}
	require.Len(t, keys, 1001, "each once")
	require.Equal(t, rep.Mismatches, all[:1000], "in the report's order")

	res, err := e.MismatchList(ctx, nil)
	require.NoError(t, err)
	require.Len(t, res.Mismatches, 100, "the default page")
	res, err = e.MismatchList(ctx, &engine.MismatchListOpts{Source: "elsewhere"})
	require.NoError(t, err)
	require.Empty(t, res.Mismatches)
	require.Zero(t, res.Total)

	_, err = e.MismatchList(ctx, &engine.MismatchListOpts{After: "not-a-cursor"})
	require.ErrorIs(t, err, engine.ErrInvalidCursor)
	_, err = e.MismatchList(ctx, &engine.MismatchListOpts{Limit: 1001})
	require.Error(t, err)

	// Put right at the source: the next run lists them all again.
	book.mu.Lock()
	book.records = book.records[:10]
	book.mu.Unlock()
	rep, err = e.Reconcile(ctx, "bank")
	require.NoError(t, err)
	require.Equal(t, int64(10), rep.Total)
	require.False(t, rep.Truncated)
}
