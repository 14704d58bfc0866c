package fakeprovider

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/idemflow/idemflow/cmd/internal/fakeprovider/internal/providerdb"
	"github.com/idemflow/idemflow/entry/webhook"
)

// The types of the webhook events: EventRefundSucceeded for a refund that
// succeeded, at once or after being pending, EventRefundFailed for a pending
// refund that failed. A refund has one event, made when it has its final
// status; a pending refund has none yet.
const (
	EventRefundSucceeded = "refund.succeeded"
	EventRefundFailed    = "refund.failed"
)

// EventIDPrefix starts the ids of the provider's webhook events.
const EventIDPrefix = "evt_"

// The defaults of the webhook settings of Config.
const (
	DefaultWebhookRetryBase = 250 * time.Millisecond
	DefaultWebhookRetryCap  = 5 * time.Second
	DefaultWebhookTimeout   = 10 * time.Second
)

const (
	// webhookPoll is how often a sender looks for events that are due, besides
	// being woken by the refunds it makes.
	webhookPoll = 250 * time.Millisecond
	// webhookConcurrency bounds the POSTs a sender has in flight, and so the
	// events it claims at once: it sends every event it claimed at once, each
	// within its claim (a timeout and a fifth), so that no claim runs out while
	// its event waits behind others, and another sender sends it again.
	webhookConcurrency = 16
	// maxCopies bounds the copies of POST /webhooks/redeliver.
	maxCopies = 100
	// redeliverConcurrency bounds the POSTs in flight of a redelivery.
	redeliverConcurrency = 64
)

// event is the body of a webhook: a refund the provider made.
type event struct {
	ID   string    `json:"id"`
	Type string    `json:"type"`
	Data eventData `json:"data"`
}

type eventData struct {
	RefundID       string `json:"refundId"`
	IdempotencyKey string `json:"idempotencyKey"`
	OrderID        string `json:"orderId"`
	Amount         int64  `json:"amount"`
	// Status is the refund's final status, StatusSucceeded or StatusFailed.
	Status string `json:"status"`
}

// eventRecord is an event as GET /webhooks lists it.
type eventRecord struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	Deliveries int    `json:"deliveries"`
	Delivered  bool   `json:"delivered"`
}

// newEvent returns the id and body of the event of a refund being made that
// ends with status, StatusSucceeded or StatusFailed.
func newEvent(refundID, key string, req refundRequest, status string) (string, string, error) {
	typ := EventRefundSucceeded
	if status == StatusFailed {
		typ = EventRefundFailed
	}
	id := EventIDPrefix + rand.Text()
	body, err := json.Marshal(event{ID: id, Type: typ, Data: eventData{
		RefundID: refundID, IdempotencyKey: key, OrderID: req.OrderID, Amount: req.Amount, Status: status,
	}})
	if err != nil {
		return "", "", fmt.Errorf("encode the webhook event: %w", err)
	}
	return id, string(body), nil
}

// webhooksOn reports whether the provider sends webhooks.
func (s *Server) webhooksOn() bool { return s.webhookURL != "" }

// wake tells this process's sender that an event is due.
func (s *Server) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// RunWebhooks is Run: the provider's background work, which is no longer the
// webhooks alone, under the name that its callers know. Each webhook event is
// POSTed to Config.WebhookURL, signed, and sent again with a backoff
// (Config.WebhookRetryBase doubling up to Config.WebhookRetryCap) until an
// attempt gets a 2xx. Events live in the database, so one that a process
// could not deliver before it died is sent by the next process that runs Run
// on the database. Without a Config.WebhookURL it sends nothing, but still
// settles the pending refunds until ctx ends.
func (s *Server) RunWebhooks(ctx context.Context) error { return s.Run(ctx) }

// runSender sends the webhook events as they come due, until ctx ends.
func (s *Server) runSender(ctx context.Context) {
	tick := time.NewTicker(webhookPoll)
	defer tick.Stop()
	for {
		s.sendDue(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.kick:
		}
	}
}

// sendDue takes the events that are due, as many at a time as it sends at
// once, and sends each once.
func (s *Server) sendDue(ctx context.Context) {
	for ctx.Err() == nil {
		due, err := s.q.WebhookTakeDue(ctx, s.pool, providerdb.WebhookTakeDueParams{
			ClaimMs: (s.webhookTimeout + s.webhookTimeout/5).Milliseconds(),
			Max:     webhookConcurrency,
		})
		if err != nil {
			if ctx.Err() == nil {
				s.logger.WarnContext(ctx, "could not read the webhook events that are due", slog.String("error", err.Error()))
			}
			return
		}
		if len(due) == 0 {
			return
		}
		var wg sync.WaitGroup
		for _, ev := range due {
			wg.Go(func() { s.deliver(ctx, ev.ID, ev.Body, ev.Failures) })
		}
		wg.Wait()
		if len(due) < webhookConcurrency {
			return
		}
	}
}

// deliver sends an event once and records how it went: failures is how many
// attempts in a row failed before, for the backoff of the next one.
func (s *Server) deliver(ctx context.Context, id, body string, failures int32) {
	err := s.post(ctx, body)
	// Recorded even when ctx ended meanwhile: the POST was sent.
	rec := context.WithoutCancel(ctx)
	if err == nil {
		if err := s.q.WebhookDelivered(rec, s.pool, id); err != nil {
			s.logger.WarnContext(ctx, "could not record a webhook delivery; the event will be sent again",
				slog.String("event_id", id), slog.String("error", err.Error()))
		}
		return
	}
	retry := s.backoff(failures)
	s.logger.InfoContext(ctx, "webhook delivery failed; sending it again later", slog.String("event_id", id),
		slog.Duration("retry_in", retry), slog.String("error", err.Error()))
	if err := s.q.WebhookFailed(rec, s.pool, providerdb.WebhookFailedParams{ID: id, RetryMs: retry.Milliseconds()}); err != nil {
		s.logger.WarnContext(ctx, "could not record a failed webhook delivery", slog.String("event_id", id), slog.String("error", err.Error()))
	}
}

// backoff is the wait before the next attempt after failures failed ones and
// one more: the base doubled each time, at most the cap, with up to a fifth
// of jitter.
func (s *Server) backoff(failures int32) time.Duration {
	d := s.webhookRetryCap
	if failures < 30 {
		d = min(s.webhookRetryBase<<failures, s.webhookRetryCap)
	}
	return d - time.Duration(mrand.Int64N(int64(d/5)+1))
}

// post sends body to the webhook URL, signed now. Any answer but a 2xx is an
// error.
func (s *Server) post(ctx context.Context, body string) error {
	ctx, cancel := context.WithTimeout(ctx, s.webhookTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.webhookURL, bytes.NewReader([]byte(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.DefaultHeader, webhook.Sign(s.webhookSecret, time.Now(), []byte(body)))
	resp, err := s.webhookClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}

// redeliverRequest is the body of POST /webhooks/redeliver.
type redeliverRequest struct {
	Copies int `json:"copies"`
}

// redeliver sends every event made so far copies more times, the copies of an
// event at once, as a provider that delivers twice does, and answers once every
// copy was sent: 200 with how many were sent and how many got a 2xx.
func (s *Server) redeliver(w http.ResponseWriter, r *http.Request) {
	if !s.webhooksOn() {
		writeError(w, http.StatusConflict, "webhooks_disabled", "", "the provider has no webhook URL to send events to")
		return
	}
	var req redeliverRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if req.Copies < 1 || req.Copies > maxCopies {
		writeError(w, http.StatusBadRequest, "invalid_request", "copies", fmt.Sprintf("copies must be an integer from 1 to %d", maxCopies))
		return
	}
	ctx := r.Context()
	events, err := s.q.WebhookList(ctx, s.pool)
	if err != nil {
		s.internalError(ctx, w, err)
		return
	}
	var (
		mu        sync.Mutex
		delivered int
		wg        sync.WaitGroup
	)
	// The copies of one event go out together, so that they meet at the
	// endpoint; redeliverConcurrency bounds the POSTs in flight.
	sem := make(chan struct{}, redeliverConcurrency)
	for _, ev := range events {
		for range req.Copies {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				err := s.q.WebhookCounted(ctx, s.pool, ev.ID)
				if err == nil {
					err = s.post(ctx, ev.Body)
				}
				if err == nil {
					mu.Lock()
					delivered++
					mu.Unlock()
					// A copy that failed changes nothing else: the event's own
					// retries go on as they were.
					err = s.q.WebhookDelivered(context.WithoutCancel(ctx), s.pool, ev.ID)
				}
				if err != nil {
					s.logger.InfoContext(ctx, "a redelivered copy of a webhook event failed", slog.String("event_id", ev.ID), slog.String("error", err.Error()))
				}
			})
		}
	}
	wg.Wait()
	s.logger.InfoContext(ctx, "webhook events redelivered", slog.Int("events", len(events)), slog.Int("copies", req.Copies), slog.Int("delivered", delivered))
	writeJSON(w, http.StatusOK, struct {
		Events    int `json:"events"`
		Sent      int `json:"sent"`
		Delivered int `json:"delivered"`
	}{len(events), len(events) * req.Copies, delivered})
}

// listWebhooks answers every event, oldest first.
func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request) {
	rows, err := s.q.WebhookList(r.Context(), s.pool)
	if err != nil {
		s.internalError(r.Context(), w, err)
		return
	}
	events := make([]eventRecord, 0, len(rows))
	for _, row := range rows {
		events = append(events, eventRecord{ID: row.ID, Type: row.Type, Deliveries: int(row.Deliveries), Delivered: row.DeliveredAt != nil})
	}
	writeJSON(w, http.StatusOK, struct {
		Events []eventRecord `json:"events"`
	}{events})
}

// configureWebhooks takes the webhook settings of cfg.
func (s *Server) configureWebhooks(cfg *Config) error {
	if cfg.WebhookURL == "" {
		return nil
	}
	if len(cfg.WebhookSecret) == 0 {
		return errors.New("provider: a WebhookURL needs a WebhookSecret")
	}
	s.webhookURL = cfg.WebhookURL
	s.webhookSecret = bytes.Clone(cfg.WebhookSecret)
	s.webhookRetryBase = cmp.Or(cfg.WebhookRetryBase, DefaultWebhookRetryBase)
	s.webhookRetryCap = max(cmp.Or(cfg.WebhookRetryCap, DefaultWebhookRetryCap), s.webhookRetryBase)
	s.webhookTimeout = cmp.Or(cfg.WebhookTimeout, DefaultWebhookTimeout)
	if s.webhookRetryBase < 0 || s.webhookTimeout < 0 {
		return errors.New("provider: webhook durations must not be negative")
	}
	s.webhookClient = &http.Client{Transport: &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		MaxIdleConnsPerHost: redeliverConcurrency,
		IdleConnTimeout:     30 * time.Second,
	}}
	return nil
}
