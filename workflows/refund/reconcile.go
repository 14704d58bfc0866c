package refund

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/idemflow/idemflow/reconcile"
	"github.com/idemflow/idemflow/steps/httpstep"
)

// ProviderSource is the name of the provider as a reconciliation source.
const ProviderSource = "provider"

// ProviderLister is a Provider that lists the refunds it made, in pages, for
// reconciliation (ProviderClient is one).
type ProviderLister interface {
	// ListRefunds returns the refunds made after req.Since, oldest first, at
	// most req.Limit of them after the cursor req.Cursor, and the cursor of
	// the next page ("" after the last).
	ListRefunds(ctx context.Context, req reconcile.ListRequest) ([]ListedRefund, string, error)
}

// ListedRefund is a refund as the provider's list tells it.
type ListedRefund struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotencyKey"`
	OrderID        string    `json:"orderId"`
	Amount         int64     `json:"amount"`
	Status         string    `json:"status"`
	CreatedAt      time.Time `json:"createdAt"`
}

// RecordData is what a provider refund's reconciliation record carries beside
// its key, id, amount and status: the order it refunds.
type RecordData struct {
	OrderID string `json:"orderId"`
}

// Source returns the provider as a reconciliation source (reconcile.Source) for
// engine.Config.Reconcile, listing through p.
func Source(p ProviderLister) reconcile.Source {
	return reconcile.Source{
		Name: ProviderSource,
		List: func(ctx context.Context, req reconcile.ListRequest) ([]reconcile.Record, string, error) {
			refunds, next, err := p.ListRefunds(ctx, req)
			if err != nil {
				return nil, "", err
			}
			recs := make([]reconcile.Record, len(refunds))
			for i, r := range refunds {
				recs[i] = reconcile.Record{
					Key: r.IdempotencyKey, Reference: r.ID, Amount: r.Amount, Status: recordStatus(r.Status),
					CreatedAt: r.CreatedAt, Data: RecordData{OrderID: r.OrderID},
				}
			}
			return recs, next, nil
		},
	}
}

// recordStatus maps a provider refund's status to a record's. An empty status
// is a succeeded refund, as in ProviderRefund; one the demo does not know is
// taken as pending, so that it is never judged on a guess.
func recordStatus(s string) reconcile.Status {
	switch s {
	case "", ProviderStatusSucceeded:
		return reconcile.Succeeded
	case ProviderStatusFailed:
		return reconcile.Failed
	default:
		return reconcile.Pending
	}
}

// reconcileProvider is the provider step's reconcile function (ExternalStepDef.Compare): the provider's
// refund under the step's key must be for the order and amount asked.
func reconcileProvider(in RefundInput, rec reconcile.Record) reconcile.Kind {
	d, ok := rec.Data.(RecordData)
	if raw, isJSON := rec.Data.(json.RawMessage); !ok && isJSON {
		// A record read back from the engine's inbox carries its JSON.
		_ = json.Unmarshal(raw, &d)
	}
	if rec.Amount != in.Amount || d.OrderID != in.OrderID {
		return reconcile.AmountDiffers
	}
	return ""
}

// providerReference is the provider step's reference (ExternalStepDef.Records):
// the provider's refund id that the books hold, whoever recorded it (the
// call, the lookup, an event, an operator's resolve).
func providerReference(s *RefundState) string { return s.ProviderRefundID }

var _ ProviderLister = (*ProviderClient)(nil)

// maxListBody bounds a page of the provider's list: 1,000 refunds take about
// 250 KiB.
const maxListBody = 8 << 20

// refundPage is a page of GET {BaseURL}/refunds.
type refundPage struct {
	Refunds []ListedRefund `json:"refunds"`
	Next    *string        `json:"next"`
}

// ListRefunds implements ProviderLister: GET {BaseURL}/refunds with
// createdAfter, limit and after.
func (c *ProviderClient) ListRefunds(ctx context.Context, req reconcile.ListRequest) ([]ListedRefund, string, error) {
	q := url.Values{}
	if !req.Since.IsZero() {
		q.Set("createdAfter", req.Since.UTC().Format(time.RFC3339Nano))
	}
	if req.Limit > 0 {
		q.Set("limit", strconv.Itoa(req.Limit))
	}
	if req.Cursor != "" {
		q.Set("after", req.Cursor)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url("/refunds")+"?"+q.Encode(), nil)
	if err != nil {
		return nil, "", err
	}
	resp, err := c.client().Do(hreq)
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	a := httpstep.Answer{Method: hreq.Method, URL: hreq.URL.Redacted(), StatusCode: resp.StatusCode, Header: resp.Header}
	if a.Body, err = io.ReadAll(io.LimitReader(resp.Body, maxListBody+1)); err != nil {
		return nil, "", fmt.Errorf("refund: read the provider's refunds: %w", err)
	}
	if len(a.Body) > maxListBody {
		return nil, "", fmt.Errorf("refund: the provider's page of refunds is over %d bytes", maxListBody)
	}
	if !a.Success() {
		return nil, "", newProviderError(a)
	}
	var page refundPage
	if err := json.Unmarshal(a.Body, &page); err != nil {
		return nil, "", fmt.Errorf("refund: decode the provider's refunds: %w", err)
	}
	next := ""
	if page.Next != nil {
		if *page.Next == "" {
			return nil, "", errors.New("refund: the provider's page has an empty next")
		}
		next = *page.Next
	}
	return page.Refunds, next, nil
}
