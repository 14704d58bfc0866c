package refund

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/steps/httpstep"
)

// Provider is the payment provider that the refund operation's provider step
// calls. ProviderClient is one, over HTTP; the step makes its calls as an
// idempotent HTTP call (steps/httpstep), and calls any other Provider (a test's
// fake) through these methods, with the same rules.
type Provider interface {
	// Refund asks the provider to make the refund req under the idempotency key
	// key, and returns the refund made. A provider that has made a refund under key
	// already must answer that one, without refunding again. An error that
	// errors.Is matches to ErrProviderDeclined is a decline, which ends the
	// operation; any other error is taken as transient, and the step is tried
	// again later with the same key.
	Refund(ctx context.Context, key string, req ProviderRequest) (*ProviderRefund, error)
	// ByKey returns the refund that the provider made under the idempotency key
	// key, or false (and a nil error) when it made none.
	ByKey(ctx context.Context, key string) (*ProviderRefund, bool, error)
}

// ProviderRequest is a refund asked of the provider.
type ProviderRequest struct {
	// OrderID is the client's id of the order to refund.
	OrderID string `json:"orderId"`
	// Amount is how much to refund, in minor units.
	Amount int64 `json:"amount"`
	// Reference is our id of the refund, for the provider's records.
	Reference string `json:"reference"`
}

// ProviderRefund is a refund that the provider made.
type ProviderRefund struct {
	// ID is the provider's id of the refund.
	ID string `json:"id"`
	// OrderID and Amount are what the refund was made for, when the provider's
	// answer tells (a lookup by key does); else empty and zero.
	OrderID string `json:"orderId"`
	Amount  int64  `json:"amount"`
	// Reference is the reference the refund was asked with, when the answer
	// tells (a lookup by key does).
	Reference string `json:"reference,omitempty"`
	// Status is the refund's status: ProviderStatusSucceeded (or empty, for a
	// provider that tells none), ProviderStatusPending (accepted, settled
	// later) or ProviderStatusFailed (it paid nothing).
	Status string `json:"status,omitempty"`
}

// The statuses of a provider's refund.
const (
	ProviderStatusPending   = "pending"
	ProviderStatusSucceeded = "succeeded"
	ProviderStatusFailed    = "failed"
)

// ErrProviderDeclined is matched by the error of a refund that the provider
// declined (see ProviderError).
var ErrProviderDeclined = errors.New("refund: the provider declined the refund")

// ProviderError is an error answer of the provider's HTTP API.
type ProviderError struct {
	// StatusCode is the answer's HTTP status.
	StatusCode int
	// Code and Message are from the answer's {"error": {"code", "message"}} body
	// (or {"code", "message"}), when it has one; else Code is empty and Message
	// holds the start of the body.
	Code    string
	Message string
}

// Error implements error.
func (e *ProviderError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("provider answered %d: %s", e.StatusCode, e.Message)
	}
	return fmt.Sprintf("provider answered %d %s: %s", e.StatusCode, e.Code, e.Message)
}

// Is reports whether e is a decline (status 402) when target is
// ErrProviderDeclined.
func (e *ProviderError) Is(target error) bool {
	return target == ErrProviderDeclined && e.StatusCode == http.StatusPaymentRequired
}

// newProviderError returns an error answer of the provider as a ProviderError.
func newProviderError(a httpstep.Answer) *ProviderError {
	se := httpstep.NewStatusError(a)
	return &ProviderError{StatusCode: se.StatusCode, Code: se.Code, Message: se.Message}
}

// DefaultProviderTimeout bounds each request of a ProviderClient whose HTTP is nil.
const DefaultProviderTimeout = 10 * time.Second

// notFoundCode is the error code of the provider's 404 for a key under which it
// made no refund.
const notFoundCode = "refund_not_found"

// ProviderClient is a Provider over HTTP, for a provider that speaks the API of
// the demo's fake provider: POST {BaseURL}/refunds with an Idempotency-Key header,
// 402 for a decline, and GET {BaseURL}/refunds/by-key/{key}, whose 404 with the
// error code refund_not_found, and nothing else, means that no refund was made
// under the key. Its requests, the provider step's included, are httpstep
// calls: bounded answers (1 MiB), the key on every request, the step's context
// on the request.
type ProviderClient struct {
	// BaseURL is the provider's base URL, such as "http://127.0.0.1:8080/provider".
	BaseURL string
	// HTTP sends the requests. Defaults to DefaultProviderHTTP.
	HTTP *http.Client
}

// DefaultProviderHTTP is the client of a ProviderClient whose HTTP is nil: one
// for the process, so that its connections are kept and reused (a client per
// call left a socket in TIME_WAIT per refund). Its transport keeps up to 256
// idle connections to the provider, dials within 5 seconds, waits 10 seconds
// at most for an answer's headers, and every request times out after
// DefaultProviderTimeout.
var DefaultProviderHTTP = &http.Client{
	Timeout: DefaultProviderTimeout,
	Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: DefaultProviderTimeout,
		ExpectContinueTimeout: time.Second,
	},
}

var _ Provider = (*ProviderClient)(nil)

// Refund implements Provider. Errors other than a decline are a *ProviderError
// for an error answer, or the transport's error (a timeout, a refused connection).
func (c *ProviderClient) Refund(ctx context.Context, key string, req ProviderRequest) (*ProviderRefund, error) {
	var ref ProviderRefund
	if err := c.api().Run(ctx, engine.Attempt{Key: key}, req, &ref); err != nil {
		return nil, err
	}
	return &ref, nil
}

// ByKey implements Provider. A 404 that is not the provider's refund_not_found
// (a wrong URL, a proxy's page) is a *ProviderError, never "none made".
func (c *ProviderClient) ByKey(ctx context.Context, key string) (*ProviderRefund, bool, error) {
	var ref ProviderRefund
	found, err := c.api().Find(ctx, engine.Attempt{Key: key}, ProviderRequest{}, &ref)
	if se := (*httpstep.StatusError)(nil); errors.As(err, &se) {
		return nil, false, &ProviderError{StatusCode: se.StatusCode, Code: se.Code, Message: se.Message}
	}
	if err != nil || !found {
		return nil, false, err
	}
	return &ref, true, nil
}

// api is the provider's API as an httpstep call of the refund asked, whose
// state is the refund made: what Refund and ByKey run.
func (c *ProviderClient) api() httpstep.Call[ProviderRequest, ProviderRefund] {
	return httpstep.Call[ProviderRequest, ProviderRefund]{
		Client: c.client(),
		RequestFunc: func(_ context.Context, _ engine.Attempt, req ProviderRequest, _ *ProviderRefund) (httpstep.Request, error) {
			return c.refundRequest(req), nil
		},
		ClassifyFunc: func(a httpstep.Answer) error {
			if a.Success() {
				return nil
			}
			return newProviderError(a)
		},
		DecodeFunc: func(_ engine.Attempt, _ ProviderRequest, ref *ProviderRefund, a httpstep.Answer) error {
			got, err := decodeProviderRefund(a)
			if err != nil {
				return err
			}
			*ref = *got
			return nil
		},
		Lookup: byKeyLookup[ProviderRequest, ProviderRefund](c),
	}
}

func (c *ProviderClient) client() *http.Client {
	if c.HTTP == nil {
		return DefaultProviderHTTP
	}
	return c.HTTP
}

// refundRequest is the request that asks the provider for the refund req.
func (c *ProviderClient) refundRequest(req ProviderRequest) httpstep.Request {
	return httpstep.Request{Method: http.MethodPost, URL: c.url("/refunds"), Body: req}
}

// byKeyLookup is the lookup of a refund by the key it was asked under: GET
// /refunds/by-key/{key}, whose 404 means "none made" only with the code
// refund_not_found.
func byKeyLookup[In, S any](c *ProviderClient) *httpstep.Lookup[In, S] {
	return &httpstep.Lookup[In, S]{
		URLFunc: func(at engine.Attempt, _ In, _ *S) string {
			return c.url("/refunds/by-key/" + url.PathEscape(at.Key))
		},
		NotFoundFunc: httpstep.HasCode(notFoundCode),
	}
}

func (c *ProviderClient) url(path string) string {
	return strings.TrimRight(c.BaseURL, "/") + path
}

// decodeProviderRefund reads the refund of a 2xx answer of the provider, a
// refund POST's or a lookup's.
func decodeProviderRefund(a httpstep.Answer) (*ProviderRefund, error) {
	var ref ProviderRefund
	if err := json.Unmarshal(a.Body, &ref); err != nil {
		return nil, fmt.Errorf("refund: decode provider answer: %w", err)
	}
	if ref.ID == "" {
		return nil, fmt.Errorf("refund: the provider answered %d without a refund id", a.StatusCode)
	}
	return &ref, nil
}
