package refund_test

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/workflows/refund"
)

// The order that every matrix refunds from: paid 5,000 by cus_1.
const (
	matrixOrderAmount = 5000
	matrixCustomer    = "cus_1"
)

// matrixConfig is the refund's configuration in the matrices: version 2,
// retries 100ms apart, and provider calls that time out after two seconds
// with a outcome window of four, so that the kit's timeout (held until the
// call gives up) and late landing (just inside the window) take seconds, not
// the defaults' minutes. The timeout leaves room for a loaded machine: a call
// that timed out for no fault of the kit's may be asked again, and a second
// request breaks the books' "asked by one request".
func matrixConfig() *refund.Config {
	return &refund.Config{
		RefundVersions:  []int{refund.RefundV2},
		Retry:           engine.RetryPolicy{Base: 100 * time.Millisecond},
		ProviderTimeout: 2 * time.Second,
		ProviderSettle:  4 * time.Second,
	}
}

// refundMatrix is the crash and fault matrix of a refund of version 2 of
// amount from an order of 5,000 (declined by the provider when orderID
// starts with declinePrefix). The provider (providerAPI) is served by the
// test process, so it outlives a killed child; the
// kit's proxy stands in front of it (Run.Services, providerWords), so that
// the refund's own client, classifyRefund, decodeRefund and lookup read
// every fault, a decline and a pending refund included, as the provider
// words them.
func refundMatrix(orderID string, amount int64) idemflowtest.Matrix[refund.RefundInput, refund.RefundState, refund.Refund] {
	declines := strings.HasPrefix(orderID, declinePrefix)
	return idemflowtest.Matrix[refund.RefundInput, refund.RefundState, refund.Refund]{
		Setup: func(t *testing.T, pool *pgxpool.Pool) *idemflowtest.Run {
			ctx := t.Context()
			require.NoError(t, refund.Migrate(ctx, pool))
			provider, providerURL := serveProvider(t)

			wf, err := refund.New(&refund.ProviderClient{BaseURL: providerURL}, nil)
			require.NoError(t, err)
			e := idemflowtest.Engine(t, pool, nil, wf.Order)
			s, err := engine.Start(ctx, e, wf.Order, "c", "order", refund.OrderInput{Client: "c", OrderID: orderID, CustomerID: matrixCustomer, Amount: matrixOrderAmount}, nil)
			require.NoError(t, err)
			require.Equal(t, engine.StatusSucceeded, idemflowtest.Wait(t, e, s).Status)

			return &idemflowtest.Run{
				Env:      map[string]string{"provider": providerURL},
				Services: map[string]idemflowtest.Service{"provider": providerWords(ctx, providerURL, orderID, amount, declines)},
				Check: func(ctx context.Context, info *engine.Info) error {
					return refundBooks(ctx, pool, provider, info, orderID, amount, declines)
				},
			}
		},
		Operation: func(_ *pgxpool.Pool, env map[string]string) (*engine.Operation[refund.RefundInput, refund.RefundState, refund.Refund], error) {
			wf, err := refund.New(&refund.ProviderClient{BaseURL: env["provider"]}, matrixConfig())
			if err != nil {
				return nil, err
			}
			return wf.Refund, nil
		},
		Input: refund.RefundInput{Client: "c", OrderID: orderID, Amount: amount},
	}
}

// providerWords is how the provider (providerAPI, as the demo's) words a
// decline and a pending refund, for the kit's proxy to answer in its name to
// the refund of amount from orderID: a decline is 402 {"error": {"code":
// "declined"}}; a pending refund is a refund POST answered 200 {"id":
// "pr_...", "status": "pending", "orderId", "amount"}, whose lookup by key
// answers the refund with the status "pending", then "failed" for one that
// failed (pending then succeeded: the provider's own answer). A pending
// refund has the id of the refund that the provider made under the key, read
// from the provider at base past the proxy, or one of its own when the
// provider made none (one that fails). The provider declines every refund of
// an order that it declines, so it never answers one pending: with declines,
// the Service has no Pending words.
func providerWords(ctx context.Context, base, orderID string, amount int64, declines bool) idemflowtest.Service {
	direct := &refund.ProviderClient{BaseURL: base}
	// id is the provider's id of the refund under key.
	id := func(key string) string {
		if ref, found, err := direct.ByKey(ctx, key); err == nil && found {
			return ref.ID
		}
		sum := sha256.Sum256([]byte(key))
		return providerIDPrefix + base32.StdEncoding.EncodeToString(sum[:])[:26]
	}
	answer := func(status int, v any) idemflowtest.Answer {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		return idemflowtest.Answer{Status: status, Body: string(b)}
	}
	// record is the refund under key as the lookup shows it.
	record := func(key, status string) idemflowtest.Answer {
		return answer(http.StatusOK, map[string]any{
			"id": id(key), "idempotencyKey": key, "orderId": orderID, "amount": amount,
			"status": status, "requests": 1, "createdAt": time.Now().UTC(),
		})
	}
	svc := idemflowtest.Service{
		Declined: func(string) idemflowtest.Answer {
			return answer(http.StatusPaymentRequired, map[string]any{"error": map[string]string{
				"code": "declined", "message": fmt.Sprintf("the refund of order %s was declined", orderID),
			}})
		},
	}
	if declines {
		return svc
	}
	svc.Pending = func(key string) idemflowtest.Answer {
		return answer(http.StatusOK, map[string]any{"id": id(key), "status": providerPending, "orderId": orderID, "amount": amount})
	}
	svc.LookupPending = func(key string) idemflowtest.Answer { return record(key, providerPending) }
	svc.LookupFailed = func(key string) idemflowtest.Answer { return record(key, providerFailed) }
	return svc
}

// refundBooks checks the books once the refund has ended, whichever way the
// crash or fault led it. A refund that succeeded was made once at the
// provider, asked by one request, succeeded there under the id that the books
// hold; the order's refund succeeded with a receipt, and the ledger moved the
// amount to the customer once. One that failed did so on the provider's word
// (its decline, or a pending refund that failed: never a server fault, and
// only the decline for an order that the provider declines); no refund at the
// provider paid or may still pay; the order's refund failed, and its ledger
// move was reversed. A refund of an order that the provider declines fails;
// any other end (in progress, parked) breaks the books.
func refundBooks(ctx context.Context, pool *pgxpool.Pool, api *providerAPI, info *engine.Info, orderID string, amount int64, declines bool) error {
	provider := api.list()
	order, err := refund.GetOrder(ctx, pool, "c", orderID)
	if err != nil {
		return err
	}
	accounts, err := refund.ListAccounts(ctx, pool, "c")
	if err != nil {
		return err
	}
	balances := map[string]int64{}
	for _, a := range accounts {
		balances[a.Account] = a.Balance
	}

	var errs []error
	brokenf := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	// refunded is what the ledger must have moved to the customer.
	var refunded int64
	switch {
	case info.Status == engine.StatusSucceeded && !declines:
		refunded = amount
		if len(provider) != 1 || provider[0].Status != providerSucceeded || provider[0].Requests != 1 {
			brokenf("the provider has refunds %+v, want one succeeded, asked by one request", provider)
		}
		if len(order.Refunds) != 1 || order.Refunds[0].Status != refund.StatusSucceeded {
			brokenf("the order's refunds are %+v, want one succeeded", order.Refunds)
			break
		}
		if got := order.Refunds[0].ProviderRefundID; len(provider) == 1 && (got == nil || *got != provider[0].ID) {
			brokenf("the refund's provider refund id is %v, the provider's refund is %s", got, provider[0].ID)
		}
		if r, err := refund.GetRefund(ctx, pool, "c", order.Refunds[0].RefundID); err != nil || r.Receipt == nil {
			brokenf("the refund has no receipt (%v)", err)
		}
	case info.Status == engine.StatusFailed:
		switch {
		case info.Error == nil:
			brokenf("the refund failed without an error")
		case declines && info.Error.Code != refund.CodeProviderDeclined,
			info.Error.Code != refund.CodeProviderDeclined && info.Error.Code != refund.CodeProviderRefundFailed:
			brokenf("the refund failed with %s (%s), not on the provider's word", info.Error.Code, info.Error.Message)
		}
		for _, r := range provider {
			if r.Status != providerFailed {
				brokenf("the refund failed, and the provider has its refund %s %s", r.ID, r.Status)
			}
		}
		if len(order.Refunds) != 1 || order.Refunds[0].Status != refund.StatusFailed {
			brokenf("the order's refunds are %+v, want one failed", order.Refunds)
		}
	default:
		want := engine.StatusSucceeded
		if declines {
			want = engine.StatusFailed
		}
		brokenf("the refund is %s (parked %t, attention %+v, error %+v), want %s", info.Status, info.Parked, info.Attention, info.Error, want)
	}
	if order.Refunded != refunded {
		brokenf("the order refunded %d, want %d", order.Refunded, refunded)
	}
	customer, merchant := balances[refund.CustomerAccount(matrixCustomer)], balances[refund.MerchantAccount]
	if customer != -matrixOrderAmount+refunded || merchant != matrixOrderAmount-refunded {
		brokenf("the ledger has the customer at %d and the merchant at %d, want %d and %d (the refund moved once, or was reversed)",
			customer, merchant, -matrixOrderAmount+refunded, matrixOrderAmount-refunded)
	}
	return errors.Join(errs...)
}

// TestRefundCrashMatrix kills the process at every point of a refund that
// succeeds, and after the provider's call was answered declined and pending.
func TestRefundCrashMatrix(t *testing.T) {
	t.Parallel()
	refundMatrix("A-1", 1499).Crashes(t)
}

// TestDeclinedRefundCrashMatrix reaches the ledger's compensation.
func TestDeclinedRefundCrashMatrix(t *testing.T) {
	t.Parallel()
	refundMatrix(declinePrefix+"1", 1499).Crashes(t)
}

// TestRefundFaultMatrix injects every fault at the provider's transport: a
// dropped call, a lost answer, a timeout, a late landing, a decline, and a
// pending refund that then succeeds or fails.
func TestRefundFaultMatrix(t *testing.T) {
	t.Parallel()
	refundMatrix("A-1", 1499).Faults(t)
}
