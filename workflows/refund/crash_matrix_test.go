package refund_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/fakeprovider"
	"github.com/idemflow/idemflow/workflows/refund"
)

// refundMatrix is the crash and fault matrix of a refund of version 2 of
// amount from an order of 5,000 (declined by the provider when orderID
// starts with fakeprovider.DeclinePrefix). The provider is served by the
// test process, on the run's database, so it outlives a killed child.
func refundMatrix(orderID string, amount int64) idemflowtest.Matrix[refund.RefundInput, refund.RefundState, refund.Refund] {
	declined := len(orderID) > len(fakeprovider.DeclinePrefix) && orderID[:len(fakeprovider.DeclinePrefix)] == fakeprovider.DeclinePrefix
	return idemflowtest.Matrix[refund.RefundInput, refund.RefundState, refund.Refund]{
		Setup: func(t *testing.T, pool *pgxpool.Pool) *idemflowtest.Run {
			ctx := t.Context()
			require.NoError(t, refund.Migrate(ctx, pool))
			require.NoError(t, fakeprovider.Migrate(ctx, pool))
			srv, err := fakeprovider.New(pool, nil)
			require.NoError(t, err)
			ts := httptest.NewServer(srv.Handler())
			t.Cleanup(ts.Close)

			wf, err := refund.New(&refund.ProviderClient{BaseURL: ts.URL}, nil)
			require.NoError(t, err)
			e := idemflowtest.Engine(t, pool, nil, wf.Order)
			s, err := engine.Start(ctx, e, wf.Order, "c", "order", refund.OrderInput{Client: "c", OrderID: orderID, CustomerID: "cus_1", Amount: 5000}, nil)
			require.NoError(t, err)
			require.Equal(t, engine.StatusSucceeded, idemflowtest.Wait(t, e, s).Status)

			return &idemflowtest.Run{
				Env: map[string]string{"provider": ts.URL},
				Check: func(ctx context.Context, info *engine.Info) error {
					return refundBooks(ctx, pool, info, orderID, amount, declined)
				},
			}
		},
		Operation: func(_ *pgxpool.Pool, env map[string]string) (*engine.Operation[refund.RefundInput, refund.RefundState, refund.Refund], error) {
			wf, err := refund.New(&refund.ProviderClient{BaseURL: env["provider"]}, &refund.Config{RefundVersions: []int{refund.RefundV2}})
			if err != nil {
				return nil, err
			}
			return wf.Refund, nil
		},
		Input: refund.RefundInput{Client: "c", OrderID: orderID, Amount: amount},
	}
}

// refundBooks checks the refund's invariants: at most one refund asked of the
// provider, by one request; the order's refunded amount and the ledger in step
// with it; the operation's outcome.
func refundBooks(ctx context.Context, pool *pgxpool.Pool, info *engine.Info, orderID string, amount int64, declined bool) error {
	var errs []error
	var refunds, requests int
	if err := pool.QueryRow(ctx, "SELECT count(*), coalesce(sum(requests), 0) FROM provider.refund").Scan(&refunds, &requests); err != nil {
		return err
	}
	order, err := refund.GetOrder(ctx, pool, "c", orderID)
	if err != nil {
		return err
	}
	accounts, err := refund.ListAccounts(ctx, pool, "c")
	if err != nil {
		return err
	}
	var customer int64
	for _, a := range accounts {
		if a.Account == refund.CustomerAccount("cus_1") {
			customer = a.Balance
		}
	}
	want := struct {
		status            engine.Status
		refunds, requests int
		refunded          int64
	}{engine.StatusSucceeded, 1, 1, amount}
	if declined {
		want.status, want.refunds, want.requests, want.refunded = engine.StatusFailed, 0, 0, 0
	}
	if info.Status != want.status {
		errs = append(errs, fmt.Errorf("the refund %s, want %s", info.Status, want.status))
	}
	if refunds != want.refunds || requests > want.requests {
		errs = append(errs, fmt.Errorf("%d refunds at the provider by %d requests, want %d by at most %d", refunds, requests, want.refunds, want.requests))
	}
	if order.Refunded != want.refunded {
		errs = append(errs, fmt.Errorf("order refunded %d, want %d", order.Refunded, want.refunded))
	}
	if customer != -5000+want.refunded {
		errs = append(errs, fmt.Errorf("customer balance %d, want %d (the ledger moved once, or was reversed)", customer, -5000+want.refunded))
	}
	if !declined && info.Status == engine.StatusSucceeded {
		if len(order.Refunds) != 1 {
			errs = append(errs, fmt.Errorf("%d refunds recorded on the order, want 1", len(order.Refunds)))
		} else if r, err := refund.GetRefund(ctx, pool, "c", order.Refunds[0].RefundID); err != nil || r.Receipt == nil {
			errs = append(errs, fmt.Errorf("the refund has no receipt (%v)", err))
		}
	}
	return errors.Join(errs...)
}

func TestRefundCrashMatrix(t *testing.T) {
	t.Parallel()
	refundMatrix("A-1", 1499).Crashes(t)
}

// TestDeclinedRefundCrashMatrix reaches the ledger's compensation.
func TestDeclinedRefundCrashMatrix(t *testing.T) {
	t.Parallel()
	refundMatrix(fakeprovider.DeclinePrefix+"1", 1499).Crashes(t)
}

func TestRefundFaultMatrix(t *testing.T) {
	t.Parallel()
	refundMatrix("A-1", 1499).Faults(t)
}
