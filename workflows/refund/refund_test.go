package refund_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/workflows/refund"
)

// bundle is what setup hands a test: an engine running the demo's operations on a
// database of its own, against a provider served over HTTP (providerAPI).
type bundle struct {
	pool        *pgxpool.Pool
	e           *engine.Engine
	wf          *refund.Workflows
	providerURL string
}

// setupOpts are the optional parts of setup.
type setupOpts struct {
	// providerTimeout bounds each request to the provider; zero keeps the default.
	providerTimeout time.Duration
	// config, when not nil, is the workflows' configuration, with the
	// tests' retry policy.
	config *refund.Config
}

// setup migrates a new database for the demo's tables, serves a provider, and
// starts an engine with River workers and a 10ms retry base.
func setup(t *testing.T) *bundle {
	t.Helper()
	return setupWith(t, setupOpts{})
}

func setupWith(t *testing.T, opts setupOpts) *bundle {
	t.Helper()
	ctx := t.Context()
	pool := testdb.Pool(t)
	require.NoError(t, refund.Migrate(ctx, pool))
	_, providerURL := serveProvider(t)

	client := &refund.ProviderClient{BaseURL: providerURL}
	if opts.providerTimeout != 0 {
		client.HTTP = &http.Client{Timeout: opts.providerTimeout}
	}
	cfg := refund.Config{}
	if opts.config != nil {
		cfg = *opts.config
	}
	cfg.Retry = engine.RetryPolicy{Base: 10 * time.Millisecond}
	wf, err := refund.New(client, &cfg)
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{
		Operations:    wf.Operations(),
		SweepInterval: 50 * time.Millisecond,
		PollInterval:  20 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Stop(stopCtx))
	})
	return &bundle{pool: pool, e: e, wf: wf, providerURL: providerURL}
}

func wait(t *testing.T, s *engine.Started) *engine.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	info, err := s.Wait(ctx)
	require.NoError(t, err)
	return info
}

// order runs the order operation and waits for it.
func (b *bundle) order(t *testing.T, client, key, orderID, customerID string, amount int64) *engine.Info {
	t.Helper()
	s, err := engine.Start(t.Context(), b.e, b.wf.Order, client, key,
		refund.OrderInput{Client: client, OrderID: orderID, CustomerID: customerID, Amount: amount}, nil)
	require.NoError(t, err)
	require.True(t, s.Created)
	return wait(t, s)
}

// mustOrder records an order that must succeed.
func (b *bundle) mustOrder(t *testing.T, client, orderID, customerID string, amount int64) {
	t.Helper()
	info := b.order(t, client, "order-"+orderID, orderID, customerID, amount)
	require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
}

// refund runs the refund operation and waits for it.
func (b *bundle) refund(t *testing.T, client, key, orderID string, amount int64) *engine.Info {
	t.Helper()
	s, err := engine.Start(t.Context(), b.e, b.wf.Refund, client, key,
		refund.RefundInput{Client: client, OrderID: orderID, Amount: amount}, nil)
	require.NoError(t, err)
	require.True(t, s.Created)
	return wait(t, s)
}

// requireFailed checks that info failed with code at step.
func requireFailed(t *testing.T, info *engine.Info, code, step string) {
	t.Helper()
	require.Equal(t, engine.StatusFailed, info.Status)
	require.NotNil(t, info.Error)
	require.EqualValues(t, code, info.Error.Code)
	require.Equal(t, step, info.Error.Step)
	require.NotEmpty(t, info.Error.Message)
}

// balances returns the client's accounts by name, and checks that the balances
// sum to zero.
func (b *bundle) balances(t *testing.T, client string) map[string]int64 {
	t.Helper()
	accounts, err := refund.ListAccounts(t.Context(), b.pool, client)
	require.NoError(t, err)
	got := make(map[string]int64, len(accounts))
	sum := int64(0)
	for _, a := range accounts {
		got[a.Account] = a.Balance
		sum += a.Balance
	}
	require.Zero(t, sum, "balances of %s: %v", client, accounts)
	return got
}

func (b *bundle) getOrder(t *testing.T, client, orderID string) *refund.Order {
	t.Helper()
	o, err := refund.GetOrder(t.Context(), b.pool, client, orderID)
	require.NoError(t, err)
	return o
}

// orderRefunded reads the order's refunded column, what its pending and
// succeeded refunds take, and checks that it is their sum.
func (b *bundle) orderRefunded(t *testing.T, client, orderID string) int64 {
	t.Helper()
	var refunded, sum int64
	require.NoError(t, b.pool.QueryRow(t.Context(), `
		SELECT o.refunded, (SELECT coalesce(sum(r.amount), 0) FROM demo_refund AS r
		                    WHERE r.client = o.client AND r.order_id = o.order_id AND r.status IN ('pending', 'succeeded'))
		FROM demo_order AS o WHERE o.client = $1 AND o.order_id = $2`, client, orderID).Scan(&refunded, &sum))
	require.Equal(t, sum, refunded, "refunded of order %s is the sum of its pending and succeeded refunds", orderID)
	return refunded
}

// providerRefund is a refund as the provider lists it.
type providerRefund struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotencyKey"`
	OrderID        string `json:"orderId"`
	Amount         int64  `json:"amount"`
	Requests       int    `json:"requests"`
}

// providerRefunds lists the refunds that the provider made.
func (b *bundle) providerRefunds(t *testing.T) []providerRefund {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.providerURL+"/refunds", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var got struct {
		Refunds []providerRefund `json:"refunds"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	return got.Refunds
}

// fault injects a fault into the provider's next refund requests.
func (b *bundle) fault(t *testing.T, body string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.providerURL+"/faults", strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
}

// concurrentRefunds starts a refund of orderID of merchant-a for each amount at
// once, and waits for them all.
func (b *bundle) concurrentRefunds(t *testing.T, orderID string, amounts []int64) []*engine.Info {
	t.Helper()
	started := make([]*engine.Started, len(amounts))
	errs := make([]error, len(amounts))
	var wg sync.WaitGroup
	for i, amount := range amounts {
		wg.Go(func() {
			started[i], errs[i] = engine.Start(t.Context(), b.e, b.wf.Refund, "merchant-a", fmt.Sprint("key-", i),
				refund.RefundInput{Client: "merchant-a", OrderID: orderID, Amount: amount}, nil)
		})
	}
	wg.Wait()
	infos := make([]*engine.Info, len(amounts))
	for i := range amounts {
		require.NoError(t, errs[i])
		infos[i] = wait(t, started[i])
	}
	return infos
}

// stepsOf returns the operation's steps by name.
func (b *bundle) stepsOf(t *testing.T, info *engine.Info) map[string]engine.StepInfo {
	t.Helper()
	got, err := b.e.Get(t.Context(), info.ID)
	require.NoError(t, err)
	steps := make(map[string]engine.StepInfo, len(got.Steps))
	for _, s := range got.Steps {
		steps[s.Name] = s
	}
	return steps
}

func TestOrder(t *testing.T) {
	t.Parallel()

	t.Run("Records", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		info := b.order(t, "merchant-a", "key-1", "A-1042", "cus_1", 5000)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		require.JSONEq(t, `{"orderId": "A-1042", "customerId": "cus_1", "amount": 5000, "refunded": 0, "refunds": []}`, string(info.Result))
		out, err := b.wf.Order.Result(info)
		require.NoError(t, err)
		require.Equal(t, out, *b.getOrder(t, "merchant-a", "A-1042"))
		require.Equal(t, map[string]int64{"customer:cus_1": -5000, "merchant": 5000}, b.balances(t, "merchant-a"))
	})

	t.Run("ExistingOrderIDFails", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		info := b.order(t, "merchant-a", "other-key", "A-1", "cus_2", 700)
		requireFailed(t, info, refund.CodeOrderExists, refund.StepRecord)
		require.Equal(t, map[string]int64{"customer:cus_1": -5000, "merchant": 5000}, b.balances(t, "merchant-a"))
		require.Equal(t, "cus_1", b.getOrder(t, "merchant-a", "A-1").CustomerID)
	})

	t.Run("OrderIDsArePerClient", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		b.mustOrder(t, "merchant-b", "A-1", "cus_1", 300)
		require.Equal(t, int64(5000), b.getOrder(t, "merchant-a", "A-1").Amount)
		require.Equal(t, int64(300), b.getOrder(t, "merchant-b", "A-1").Amount)
		require.Equal(t, map[string]int64{"customer:cus_1": -300, "merchant": 300}, b.balances(t, "merchant-b"))
		_, err := refund.GetOrder(t.Context(), b.pool, "merchant-c", "A-1")
		require.ErrorIs(t, err, refund.ErrOrderNotFound)
	})

	t.Run("InvalidInputFails", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i, in := range []refund.OrderInput{
			{OrderID: "A-1", CustomerID: "cus_1", Amount: 0},
			{OrderID: "", CustomerID: "cus_1", Amount: 1},
			{OrderID: "A-1", CustomerID: "", Amount: 1},
		} {
			info := b.order(t, "merchant-a", fmt.Sprint("key-", i), in.OrderID, in.CustomerID, in.Amount)
			requireFailed(t, info, refund.CodeInvalidRequest, refund.StepRecord)
		}
		require.Empty(t, b.balances(t, "merchant-a"))
	})
}

func TestRefund(t *testing.T) {
	t.Parallel()

	t.Run("Succeeds", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-a", "A-1042", "cus_1", 5000)
		info := b.refund(t, "merchant-a", "key-1", "A-1042", 1499)
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)

		out, err := b.wf.Refund.Result(info)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(out.RefundID, refund.RefundIDPrefix), out.RefundID)
		require.NotNil(t, out.ProviderRefundID)
		require.True(t, strings.HasPrefix(*out.ProviderRefundID, providerIDPrefix), *out.ProviderRefundID)
		require.JSONEq(t, fmt.Sprintf(`{"refundId": %q, "orderId": "A-1042", "amount": 1499, "status": "succeeded", "providerRefundId": %q}`,
			out.RefundID, *out.ProviderRefundID), string(info.Result))

		got, err := refund.GetRefund(t.Context(), b.pool, "merchant-a", out.RefundID)
		require.NoError(t, err)
		require.NotNil(t, got.ProviderConfirmed, "GetRefund says whether the provider's event was applied")
		require.False(t, *got.ProviderConfirmed, "no webhook here")
		got.ProviderConfirmed = nil
		require.Equal(t, out, *got)
		require.Equal(t, &refund.Order{
			OrderID: "A-1042", CustomerID: "cus_1", Amount: 5000, Refunded: 1499,
			Refunds: []refund.OrderRefund{{RefundID: out.RefundID, Amount: 1499, Status: refund.StatusSucceeded, ProviderRefundID: out.ProviderRefundID}},
		}, b.getOrder(t, "merchant-a", "A-1042"))
		require.Equal(t, int64(1499), b.orderRefunded(t, "merchant-a", "A-1042"))
		// The merchant's balance is its orders less its refunds.
		require.Equal(t, map[string]int64{"customer:cus_1": -3501, "merchant": 5000 - 1499}, b.balances(t, "merchant-a"))

		require.Equal(t, []providerRefund{{
			ID:             *out.ProviderRefundID,
			IdempotencyKey: b.stepsOf(t, info)[refund.StepProvider].DerivedKey,
			OrderID:        "A-1042",
			Amount:         1499,
			Requests:       1,
		}}, b.providerRefunds(t))
		for _, name := range []string{refund.StepLedger, refund.StepProvider, refund.StepFinalize} {
			step := b.stepsOf(t, info)[name]
			require.Equal(t, engine.StepStatusSucceeded, step.Status, name)
			require.Equal(t, 1, step.Attempts, name)
		}
	})

	t.Run("SameKeyDoesNotRunAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		info := b.refund(t, "merchant-a", "key-1", "A-1", 100)
		again, err := engine.Start(t.Context(), b.e, b.wf.Refund, "merchant-a", "key-1",
			refund.RefundInput{Client: "merchant-a", OrderID: "A-1", Amount: 100}, nil)
		require.NoError(t, err)
		require.False(t, again.Created)
		require.Equal(t, string(info.Result), string(again.Existing.Result))
		require.Len(t, b.getOrder(t, "merchant-a", "A-1").Refunds, 1)
		require.Len(t, b.providerRefunds(t), 1)
	})

	t.Run("SeveralRefundsOfOneOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 1000)
		b.mustOrder(t, "merchant-a", "A-2", "cus_2", 2000)
		for i, amount := range []int64{600, 399, 1} {
			info := b.refund(t, "merchant-a", fmt.Sprint("key-", i), "A-1", amount)
			require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
		}
		o := b.getOrder(t, "merchant-a", "A-1")
		require.Equal(t, int64(1000), o.Refunded)
		require.Len(t, o.Refunds, 3)
		for i, amount := range []int64{600, 399, 1} {
			require.Equal(t, amount, o.Refunds[i].Amount, "refunds oldest first")
		}
		require.Equal(t, map[string]int64{"customer:cus_1": 0, "customer:cus_2": -2000, "merchant": 2000}, b.balances(t, "merchant-a"))
		require.Len(t, b.providerRefunds(t), 3)
	})

	t.Run("OrderNotFound", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-b", "A-1", "cus_1", 5000)
		for _, orderID := range []string{"A-404", "A-1"} { // A-1 belongs to another client
			info := b.refund(t, "merchant-a", "key-"+orderID, orderID, 100)
			requireFailed(t, info, refund.CodeOrderNotFound, refund.StepLedger)
		}
		require.Empty(t, b.balances(t, "merchant-a"))
		require.Empty(t, b.getOrder(t, "merchant-b", "A-1").Refunds)
		require.Empty(t, b.providerRefunds(t))
	})

	t.Run("AmountExceedsRefundable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 1000)
		requireFailed(t, b.refund(t, "merchant-a", "key-1", "A-1", 1001), refund.CodeAmountExceedsRefundable, refund.StepLedger)
		require.Equal(t, engine.StatusSucceeded, b.refund(t, "merchant-a", "key-2", "A-1", 600).Status)
		info := b.refund(t, "merchant-a", "key-3", "A-1", 401)
		requireFailed(t, info, refund.CodeAmountExceedsRefundable, refund.StepLedger)
		require.Equal(t, "amount 401 exceeds the 400 left to refund of order A-1", info.Error.Message)

		o := b.getOrder(t, "merchant-a", "A-1")
		require.Len(t, o.Refunds, 1, "a rejected refund records nothing")
		require.Equal(t, int64(600), o.Refunded)
		require.Equal(t, int64(600), b.orderRefunded(t, "merchant-a", "A-1"))
		require.Equal(t, map[string]int64{"customer:cus_1": -400, "merchant": 400}, b.balances(t, "merchant-a"))
		require.Len(t, b.providerRefunds(t), 1)
	})

	t.Run("HugeAmountExceedsRefundable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 1000)
		require.Equal(t, engine.StatusSucceeded, b.refund(t, "merchant-a", "key-1", "A-1", 600).Status)
		// refunded + amount would overflow a bigint.
		requireFailed(t, b.refund(t, "merchant-a", "key-2", "A-1", math.MaxInt64), refund.CodeAmountExceedsRefundable, refund.StepLedger)
		require.Equal(t, int64(600), b.orderRefunded(t, "merchant-a", "A-1"))
	})

	t.Run("NonPositiveAmountFails", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 1000)
		requireFailed(t, b.refund(t, "merchant-a", "key-1", "A-1", 0), refund.CodeInvalidRequest, refund.StepLedger)
		require.Empty(t, b.getOrder(t, "merchant-a", "A-1").Refunds)
	})

	t.Run("DeclineReversesTheLedger", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		orderID := declinePrefix + "1"
		b.mustOrder(t, "merchant-a", orderID, "cus_1", 5000)
		info := b.refund(t, "merchant-a", "key-1", orderID, 1000)
		requireFailed(t, info, refund.CodeProviderDeclined, refund.StepProvider)

		require.Equal(t, map[string]int64{"customer:cus_1": -5000, "merchant": 5000}, b.balances(t, "merchant-a"))
		require.Zero(t, b.orderRefunded(t, "merchant-a", orderID), "the compensation gave the amount back")
		o := b.getOrder(t, "merchant-a", orderID)
		require.Zero(t, o.Refunded)
		require.Len(t, o.Refunds, 1)
		require.Equal(t, refund.StatusFailed, o.Refunds[0].Status)
		require.Nil(t, o.Refunds[0].ProviderRefundID)
		got, err := refund.GetRefund(t.Context(), b.pool, "merchant-a", o.Refunds[0].RefundID)
		require.NoError(t, err)
		require.Equal(t, refund.StatusFailed, got.Status)
		require.Empty(t, b.providerRefunds(t))

		steps := b.stepsOf(t, info)
		require.Equal(t, engine.StepStatusCompensated, steps[refund.StepLedger].Status)
		require.Equal(t, engine.StepStatusFailed, steps[refund.StepProvider].Status)
		require.Equal(t, 1, steps[refund.StepProvider].Attempts)
		require.Equal(t, engine.StepStatusSkipped, steps[refund.StepFinalize].Status)

		// A declined refund no longer counts against what is left to refund.
		requireFailed(t, b.refund(t, "merchant-a", "key-2", orderID, 5000), refund.CodeProviderDeclined, refund.StepProvider)
		require.Zero(t, b.orderRefunded(t, "merchant-a", orderID))
		require.Equal(t, map[string]int64{"customer:cus_1": -5000, "merchant": 5000}, b.balances(t, "merchant-a"))
	})

	t.Run("ProviderErrorIsRetried", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		b.fault(t, `{"mode": "error", "count": 2}`)
		info := b.refund(t, "merchant-a", "key-1", "A-1", 1000)
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
		got := b.providerRefunds(t)
		require.Len(t, got, 1)
		require.Equal(t, 1, got[0].Requests)
		require.Equal(t, 3, b.stepsOf(t, info)[refund.StepProvider].Attempts)
		require.Equal(t, map[string]int64{"customer:cus_1": -4000, "merchant": 4000}, b.balances(t, "merchant-a"))
	})

	t.Run("LostResponseIsFoundByKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		b.fault(t, `{"mode": "lost_response", "count": 1}`)
		info := b.refund(t, "merchant-a", "key-1", "A-1", 1000)
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
		out, err := b.wf.Refund.Result(info)
		require.NoError(t, err)

		got := b.providerRefunds(t)
		require.Len(t, got, 1, "one refund at the provider")
		require.Equal(t, *out.ProviderRefundID, got[0].ID)
		require.Equal(t, 1, got[0].Requests, "the retry found the refund by key and did not ask again")
		require.Equal(t, 2, b.stepsOf(t, info)[refund.StepProvider].Attempts)
		o := b.getOrder(t, "merchant-a", "A-1")
		require.Equal(t, int64(1000), o.Refunded)
		require.Len(t, o.Refunds, 1)
		require.Equal(t, map[string]int64{"customer:cus_1": -4000, "merchant": 4000}, b.balances(t, "merchant-a"))
	})

	t.Run("ProviderTimeoutIsRetried", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupOpts{providerTimeout: 100 * time.Millisecond})
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		b.fault(t, `{"mode": "slow", "count": 1, "delayMs": 300}`)
		info := b.refund(t, "merchant-a", "key-1", "A-1", 1000)
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
		require.Len(t, b.providerRefunds(t), 1)
		require.GreaterOrEqual(t, b.stepsOf(t, info)[refund.StepProvider].Attempts, 2)
		require.Equal(t, map[string]int64{"customer:cus_1": -4000, "merchant": 4000}, b.balances(t, "merchant-a"))
	})

	t.Run("ConcurrentRefundsCannotExceedTheOrder", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name      string
			refunds   int
			amount    int64
			succeeded int
		}{
			{name: "TwoThatTogetherExceed", refunds: 2, amount: 600, succeeded: 1},
			{name: "FiveOfWhichThreeFit", refunds: 5, amount: 300, succeeded: 3},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				b.mustOrder(t, "merchant-a", "A-1", "cus_1", 1000)
				started := make([]*engine.Started, tc.refunds)
				errs := make([]error, tc.refunds)
				var wg sync.WaitGroup
				for i := range tc.refunds {
					wg.Go(func() {
						started[i], errs[i] = engine.Start(t.Context(), b.e, b.wf.Refund, "merchant-a", fmt.Sprint("key-", i),
							refund.RefundInput{Client: "merchant-a", OrderID: "A-1", Amount: tc.amount}, nil)
					})
				}
				wg.Wait()
				succeeded := 0
				for i := range tc.refunds {
					require.NoError(t, errs[i])
					info := wait(t, started[i])
					if info.Status == engine.StatusSucceeded {
						succeeded++
					} else {
						requireFailed(t, info, refund.CodeAmountExceedsRefundable, refund.StepLedger)
					}
				}
				require.Equal(t, tc.succeeded, succeeded)
				refunded := int64(tc.succeeded) * tc.amount
				require.Equal(t, refunded, b.getOrder(t, "merchant-a", "A-1").Refunded)
				require.Equal(t, refunded, b.orderRefunded(t, "merchant-a", "A-1"))
				require.Equal(t, map[string]int64{"customer:cus_1": refunded - 1000, "merchant": 1000 - refunded}, b.balances(t, "merchant-a"))
				require.Len(t, b.providerRefunds(t), tc.succeeded)
			})
		}
	})

	t.Run("ManyConcurrentRefundsOfDifferentAmounts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const orderAmount = 1000
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", orderAmount)
		// 30 refunds of 20 to 167, about 2,800 together.
		amounts := make([]int64, 30)
		for i := range amounts {
			amounts[i] = 20 + int64(i*37%148)
		}
		infos := b.concurrentRefunds(t, "A-1", amounts)

		var refunded int64
		succeeded := 0
		var failed []int64
		for i, info := range infos {
			if info.Status == engine.StatusSucceeded {
				refunded += amounts[i]
				succeeded++
				continue
			}
			requireFailed(t, info, refund.CodeAmountExceedsRefundable, refund.StepLedger)
			failed = append(failed, amounts[i])
		}
		require.LessOrEqual(t, refunded, int64(orderAmount))
		require.NotEmpty(t, failed)
		// What is left only went down, so every refund refused was refused rightly:
		// it did not fit in what is left now.
		for _, amount := range failed {
			require.Greater(t, amount, orderAmount-refunded)
		}
		require.Equal(t, refunded, b.orderRefunded(t, "merchant-a", "A-1"))
		o := b.getOrder(t, "merchant-a", "A-1")
		require.Equal(t, refunded, o.Refunded)
		require.Len(t, o.Refunds, succeeded, "a rejected refund records nothing")
		require.Equal(t, map[string]int64{"customer:cus_1": refunded - orderAmount, "merchant": orderAmount - refunded}, b.balances(t, "merchant-a"))
		require.Len(t, b.providerRefunds(t), succeeded)
	})

	t.Run("ConcurrentDeclinesGiveTheAmountBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		orderID := declinePrefix + "1"
		b.mustOrder(t, "merchant-a", orderID, "cus_1", 1000)
		amounts := []int64{400, 400, 400, 400, 400, 400, 400, 400, 400, 400}
		declined := 0
		for _, info := range b.concurrentRefunds(t, orderID, amounts) {
			require.Equal(t, engine.StatusFailed, info.Status)
			require.Contains(t, []string{refund.CodeProviderDeclined, refund.CodeAmountExceedsRefundable}, string(info.Error.Code))
			if info.Error.Code == refund.CodeProviderDeclined {
				declined++
			}
		}
		require.Positive(t, declined)
		require.Zero(t, b.orderRefunded(t, "merchant-a", orderID), "every compensation gave its amount back")
		o := b.getOrder(t, "merchant-a", orderID)
		require.Len(t, o.Refunds, declined)
		for _, r := range o.Refunds {
			require.Equal(t, refund.StatusFailed, r.Status)
		}
		require.Equal(t, map[string]int64{"customer:cus_1": -1000, "merchant": 1000}, b.balances(t, "merchant-a"))
	})

	t.Run("RefundsArePerClient", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 1000)
		out, err := b.wf.Refund.Result(b.refund(t, "merchant-a", "key-1", "A-1", 100))
		require.NoError(t, err)
		_, err = refund.GetRefund(t.Context(), b.pool, "merchant-b", out.RefundID)
		require.ErrorIs(t, err, refund.ErrRefundNotFound)
		_, err = refund.GetRefund(t.Context(), b.pool, "merchant-a", "re_missing")
		require.ErrorIs(t, err, refund.ErrRefundNotFound)
	})
}

func TestListAccounts(t *testing.T) {
	t.Parallel()

	t.Run("NoneIsAnEmptyList", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		accounts, err := refund.ListAccounts(t.Context(), b.pool, "merchant-a")
		require.NoError(t, err)
		require.NotNil(t, accounts)
		require.Empty(t, accounts)
		raw, err := json.Marshal(accounts)
		require.NoError(t, err)
		require.Equal(t, "[]", string(raw))
	})

	t.Run("SortedInByteOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustOrder(t, "merchant-a", "A-1", "a", 1)
		b.mustOrder(t, "merchant-a", "A-2", "B", 2)
		b.mustOrder(t, "merchant-a", "A-3", "_", 4)
		accounts, err := refund.ListAccounts(t.Context(), b.pool, "merchant-a")
		require.NoError(t, err)
		require.Equal(t, []refund.Account{
			{Account: "customer:B", Balance: -2},
			{Account: "customer:_", Balance: -4},
			{Account: "customer:a", Balance: -1},
			{Account: "merchant", Balance: 7},
		}, accounts)
	})
}

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("ConcurrentAndRepeated", func(t *testing.T) {
		t.Parallel()
		pool := testdb.Pool(t)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() { errs[i] = refund.Migrate(t.Context(), pool) })
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		require.NoError(t, refund.Migrate(t.Context(), pool))
	})
}
