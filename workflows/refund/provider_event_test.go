package refund

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// TestRecordProviderEvent runs the webhook's record of a provider event and
// the refund's finalize step on pgx transactions, in every order, and at once
// with each waiting for the other's commit: the refund is confirmed once, when
// both have committed, whichever came first.
func TestRecordProviderEvent(t *testing.T) {
	t.Parallel()

	type bundle struct {
		pool *pgxpool.Pool
		w    *Workflows
	}
	setup := func(t *testing.T, refunds int) *bundle {
		t.Helper()
		ctx := t.Context()
		pool := testdb.Pool(t)
		require.NoError(t, Migrate(ctx, pool))
		_, err := pool.Exec(ctx, `INSERT INTO demo_order (client, order_id, customer_id, amount, refunded) VALUES ('a', 'O-1', 'cus_1', 1000000, $1::int)`, refunds)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO demo_refund (id, client, order_id, amount) SELECT 're_' || i, 'a', 'O-1', 1 FROM generate_series(1, $1::int) AS i`, refunds)
		require.NoError(t, err)
		return &bundle{pool: pool, w: &Workflows{q: refunddb.New()}}
	}
	// record is the webhook's transaction: the event as its body says.
	record := func(b *bundle, ctx context.Context, tx pgx.Tx, in ProviderEventInput) error {
		body, err := json.Marshal(in)
		if err != nil {
			return err
		}
		fields, err := EventBodyFields(body)
		if err != nil {
			return err
		}
		return b.w.RecordProviderEvent(ctx, tx, ProviderEvent{Input: in, BodyFields: fields}, true)
	}
	// The two halves, for refund re_<i> and provider refund pr_<i>.
	confirm := func(b *bundle, ctx context.Context, tx pgx.Tx, i int) error {
		return record(b, ctx, tx, ProviderEventInput{ID: fmt.Sprintf("evt_%d", i), Type: EventRefundSucceeded, Data: ProviderEventData{RefundID: fmt.Sprintf("pr_%d", i), OrderID: "O-1", Amount: 1}})
	}
	// oldConfirm is the confirm step of a provider_event operation started
	// before the endpoint recorded events itself, which still finishes.
	oldConfirm := func(b *bundle, ctx context.Context, tx pgx.Tx, i int) error {
		return b.w.confirm(ctx, tx, engine.Attempt{OperationKey: fmt.Sprintf("evt_%d", i), OperationID: uuid.New()},
			ProviderEventInput{ID: fmt.Sprintf("evt_%d", i), Type: EventRefundSucceeded, Data: ProviderEventData{RefundID: fmt.Sprintf("pr_%d", i), OrderID: "O-1", Amount: 1}}, nil)
	}
	finalize := func(b *bundle, ctx context.Context, tx pgx.Tx, i int) error {
		return b.w.finalize(ctx, tx, engine.Attempt{}, RefundInput{}, &RefundState{RefundID: fmt.Sprintf("re_%d", i), ProviderRefundID: fmt.Sprintf("pr_%d", i)})
	}
	confirmed := func(t *testing.T, b *bundle, i int) bool {
		t.Helper()
		ok, err := refunddb.New().RefundConfirmed(t.Context(), b.pool, fmt.Sprintf("re_%d", i))
		require.NoError(t, err)
		return ok
	}
	type half func(b *bundle, ctx context.Context, tx pgx.Tx, i int) error

	t.Run("OneAfterTheOther", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 4)
		ctx := t.Context()
		for i, order := range [][2]half{{confirm, finalize}, {finalize, confirm}, {oldConfirm, finalize}, {finalize, oldConfirm}} {
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return order[0](b, ctx, tx, i+1) }))
			require.False(t, confirmed(t, b, i+1), "one half alone confirms nothing")
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return order[1](b, ctx, tx, i+1) }))
			require.True(t, confirmed(t, b, i+1), "order %d", i)
		}
	})

	// The second half's statement starts before the first half commits, so
	// that its snapshot does not see it: it must wait, then see it anyway.
	t.Run("SecondWaitsForTheFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 2)
		ctx := t.Context()
		for i, order := range [][2]half{{confirm, finalize}, {finalize, confirm}} {
			n := i + 1
			first, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, order[0](b, ctx, first, n))
			done := make(chan error, 1)
			go func() {
				done <- pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return order[1](b, ctx, tx, n) })
			}()
			select {
			case err := <-done:
				t.Fatalf("the second half did not wait for the first: %v", err)
			case <-time.After(200 * time.Millisecond):
			}
			require.NoError(t, first.Commit(ctx))
			require.NoError(t, <-done)
			require.True(t, confirmed(t, b, n), "order %d", i)
		}
	})

	t.Run("ManyAtOnce", func(t *testing.T) {
		t.Parallel()
		const n = 50
		b := setup(t, n)
		ctx := t.Context()
		var wg sync.WaitGroup
		errs := make([]error, 2*n)
		for i := range n {
			for j, h := range []half{confirm, finalize} {
				wg.Go(func() {
					errs[2*i+j] = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return h(b, ctx, tx, i+1) })
				})
			}
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		for i := range n {
			require.True(t, confirmed(t, b, i+1), "refund %d", i+1)
		}
	})

	// An event that names the refund's provider id with another order or
	// amount is kept, and confirms nothing, whichever half comes first.
	t.Run("AnotherOrderOrAmountDoesNotConfirm", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 4)
		ctx := t.Context()
		wrong := func(data ProviderEventData) half {
			return func(b *bundle, ctx context.Context, tx pgx.Tx, i int) error {
				data.RefundID = fmt.Sprintf("pr_%d", i)
				return record(b, ctx, tx, ProviderEventInput{ID: fmt.Sprintf("evt_%d", i), Type: EventRefundSucceeded, Data: data})
			}
		}
		cases := [][2]half{
			{wrong(ProviderEventData{OrderID: "O-1", Amount: 2}), finalize},
			{finalize, wrong(ProviderEventData{OrderID: "O-1", Amount: 2})},
			{wrong(ProviderEventData{OrderID: "O-2", Amount: 1}), finalize},
			{finalize, wrong(ProviderEventData{OrderID: "O-2", Amount: 1})},
		}
		for i, order := range cases {
			for _, h := range order {
				require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return h(b, ctx, tx, i+1) }))
			}
			require.False(t, confirmed(t, b, i+1), "case %d", i)
		}
	})

	// A wrong event first does not keep a right one from confirming, whichever
	// half comes last.
	t.Run("ARightEventAfterAWrongOneConfirms", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 2)
		ctx := t.Context()
		event := func(id string, amount int64) half {
			return func(b *bundle, ctx context.Context, tx pgx.Tx, i int) error {
				return record(b, ctx, tx, ProviderEventInput{ID: fmt.Sprintf("%s_%d", id, i), Type: EventRefundSucceeded,
					Data: ProviderEventData{RefundID: fmt.Sprintf("pr_%d", i), OrderID: "O-1", Amount: amount}})
			}
		}
		for i, order := range [][]half{
			{event("wrong", 2), event("right", 1), finalize},
			{finalize, event("wrong", 2), event("right", 1)},
		} {
			for k, h := range order {
				require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return h(b, ctx, tx, i+1) }))
				if k < len(order)-1 {
					require.False(t, confirmed(t, b, i+1), "case %d, after half %d", i, k)
				}
			}
			require.True(t, confirmed(t, b, i+1), "case %d", i)
		}
	})

	t.Run("EventTwiceAppliesOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 1)
		ctx := t.Context()
		for range 2 {
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return confirm(b, ctx, tx, 1) }))
		}
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return finalize(b, ctx, tx, 1) }))
		require.True(t, confirmed(t, b, 1))
		var events int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM demo_provider_event`).Scan(&events))
		require.Equal(t, 1, events)
	})

	// The same event id with another body is refused with the top-level
	// fields that differ, whatever key it names, and whichever of the two
	// deliveries waited for the other: the caller rolls it back.
	t.Run("AnotherBodyUnderTheSameID", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 1)
		ctx := t.Context()
		first := ProviderEventInput{ID: "evt_1", Type: EventRefundSucceeded, Data: ProviderEventData{RefundID: "pr_1", IdempotencyKey: "key-1", OrderID: "O-1", Amount: 1}}
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return record(b, ctx, tx, first) }))
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return record(b, ctx, tx, first) }), "the same body again")

		otherKey, otherType := first, first
		otherKey.Data.IdempotencyKey = "key-2"
		otherType.Type = EventRefundFailed
		for in, fields := range map[*ProviderEventInput][]string{&otherKey: {"data"}, &otherType: {"type"}} {
			err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return record(b, ctx, tx, *in) })
			var reused *engine.ReusedError
			require.ErrorAs(t, err, &reused)
			require.Equal(t, fields, reused.Fields)
		}
		var typ, amount string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT type, amount::text FROM demo_provider_event WHERE event_id = 'evt_1'`).Scan(&typ, &amount))
		require.Equal(t, []string{EventRefundSucceeded, "1"}, []string{typ, amount})
	})
}
