package refund

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

// Provider is the payment provider that the refund operation's provider step
// calls. ProviderClient is one.
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
}

// ErrProviderDeclined is matched by the error of a refund that the provider
// declined (see ProviderError).
var ErrProviderDeclined = errors.New("refund: the provider declined the refund")

// ProviderError is an error answer of the provider's HTTP API.
type ProviderError struct {
	// StatusCode is the answer's HTTP status.
	StatusCode int
	// Code and Message are from the answer's {"error": {"code", "message"}} body,
	// when it has one; else Code is empty and Message holds the start of the body.
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

// DefaultProviderTimeout bounds each request of a ProviderClient whose HTTP is nil.
const DefaultProviderTimeout = 10 * time.Second

// maxAnswer bounds how much of an answer ProviderClient reads.
const maxAnswer = 1 << 20

// notFoundCode is the error code of the provider's 404 for a key under which it
// made no refund.
const notFoundCode = "refund_not_found"

// ProviderClient is a Provider over HTTP, for a provider that speaks the API of
// the demo's fake provider: POST {BaseURL}/refunds with an Idempotency-Key header,
// 402 for a decline, and GET {BaseURL}/refunds/by-key/{key}, whose 404 with the
// error code refund_not_found, and nothing else, means that no refund was made
// under the key.
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
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("refund: encode provider request: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url("/refunds"), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("refund: provider request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Idempotency-Key", key)
	ref, found, err := c.do(hreq)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, &ProviderError{StatusCode: http.StatusNotFound, Message: "the provider has no refunds endpoint"}
	}
	return ref, nil
}

// ByKey implements Provider.
func (c *ProviderClient) ByKey(ctx context.Context, key string) (*ProviderRefund, bool, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url("/refunds/by-key/"+url.PathEscape(key)), nil)
	if err != nil {
		return nil, false, fmt.Errorf("refund: provider request: %w", err)
	}
	return c.do(hreq)
}

// do sends req and decodes a refund from a 2xx answer. A 404 answer gives false
// and no error.
func (c *ProviderClient) do(req *http.Request) (*ProviderRefund, bool, error) {
	req.Header.Set("Accept", "application/json")
	client := c.HTTP
	if client == nil {
		client = DefaultProviderHTTP
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, false, fmt.Errorf("refund: provider: %w", err)
	}
	defer func() {
		// Drained so that the connection can serve the next request.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswer))
		_ = resp.Body.Close()
	}()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return nil, false, fmt.Errorf("refund: read provider answer: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && providerError(resp.StatusCode, raw).Code == notFoundCode:
		return nil, false, nil
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		// A 404 that is not the provider's "no refund under this key" (a wrong
		// URL, a proxy's page) says nothing about the refund: it is an error,
		// never "not made", or a lookup would let a refund be undone on it.
		return nil, false, providerError(resp.StatusCode, raw)
	}
	var ref ProviderRefund
	if err := json.Unmarshal(raw, &ref); err != nil {
		return nil, false, fmt.Errorf("refund: decode provider answer: %w", err)
	}
	if ref.ID == "" {
		return nil, false, fmt.Errorf("refund: the provider answered %d without a refund id", resp.StatusCode)
	}
	return &ref, true, nil
}

func (c *ProviderClient) url(path string) string {
	return strings.TrimRight(c.BaseURL, "/") + path
}

func providerError(status int, raw []byte) *ProviderError {
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &body); err == nil && body.Error.Code != "" {
		return &ProviderError{StatusCode: status, Code: body.Error.Code, Message: body.Error.Message}
	}
	msg := strings.TrimSpace(string(raw))
	if len(msg) > 200 {
		cut := 200
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut-- // never half a character: the text is stored as the step's cause
		}
		msg = msg[:cut] + "..."
	}
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	return &ProviderError{StatusCode: status, Message: msg}
}
