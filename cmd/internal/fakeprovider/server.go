package fakeprovider

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/cmd/internal/fakeprovider/internal/providerdb"
)

// The modes of an injected fault. See the package documentation. All but
// FaultLookupError act on the refund POSTs; FaultLookupError acts on the
// lookups by key.
const (
	FaultError         = "error"
	FaultLostResponse  = "lost_response"
	FaultSlow          = "slow"
	FaultPending       = "pending"
	FaultLookupError   = "lookup_error"
	FaultLaggingLookup = "lagging_lookup"
)

// The statuses of a refund. A refund made under the fault FaultPending is
// StatusPending until its time comes, then StatusSucceeded or StatusFailed
// (it paid nothing); every other refund is StatusSucceeded at once.
const (
	StatusPending   = "pending"
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
)

// DeclinePrefix starts the order ids whose refunds the provider declines.
const DeclinePrefix = "DECLINE-"

// IDPrefix starts the ids of the provider's refunds.
const IDPrefix = "pr_"

const (
	// maxBody bounds a request body.
	maxBody = 64 << 10
	// maxKeyLen bounds an idempotency key, as Stripe does.
	maxKeyLen = 255
	// defaultSlowDelay is how long a slow fault waits, how long a refund
	// made pending stays so, and how long a lagging lookup does not find its
	// refund, when delayMs is not given.
	defaultSlowDelay = time.Second
	// maxSlowDelay bounds delayMs.
	maxSlowDelay = 10 * time.Minute
	// workTimeout bounds the database work of a refund POST (after the wait
	// of a slow fault): the work goes on when the caller leaves, so the
	// caller's context does not bound it.
	workTimeout = time.Minute
	// maxFaultCount bounds how many requests one POST /faults may affect.
	maxFaultCount = 1_000_000
)

// Config configures a Server. The zero value takes every default.
type Config struct {
	// Logger receives a line per refund request and per change of the faults.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// WebhookURL, when set, is where the provider sends a webhook event for
	// every refund it makes (see the package documentation, "Webhooks"),
	// from Run. Empty: the provider makes no events.
	WebhookURL string
	// WebhookSecret signs the webhooks (entry/webhook's scheme, in the header
	// Provider-Signature). Required with WebhookURL.
	WebhookSecret []byte
	// WebhookRetryBase and WebhookRetryCap bound the backoff between the
	// attempts of an event that got no 2xx: the base, doubled after each
	// failure, at most the cap. Default to DefaultWebhookRetryBase and
	// DefaultWebhookRetryCap.
	WebhookRetryBase time.Duration
	WebhookRetryCap  time.Duration
	// WebhookTimeout bounds one delivery. Defaults to DefaultWebhookTimeout.
	WebhookTimeout time.Duration
}

// Server is the fake payment provider. Make one with New; it is safe for
// concurrent use, and several Servers (in one process or many) may share one
// database.
type Server struct {
	pool   *pgxpool.Pool
	q      *providerdb.Queries
	logger *slog.Logger
	mux    *http.ServeMux

	webhookURL                        string
	webhookSecret                     []byte
	webhookRetryBase, webhookRetryCap time.Duration
	webhookTimeout                    time.Duration
	webhookClient                     *http.Client
	// kick wakes this process's webhook sender when a refund made an event.
	kick chan struct{}
	// settleKick wakes this process's settler when a refund was made
	// pending, so that it knows when the refund is due.
	settleKick chan struct{}
}

// New returns a provider that keeps its state in pool's database, which Migrate
// must have prepared. cfg may be nil.
func New(pool *pgxpool.Pool, cfg *Config) (*Server, error) {
	if pool == nil {
		return nil, errors.New("provider: pool is nil")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	s := &Server{pool: pool, q: providerdb.New(), logger: logger, mux: http.NewServeMux(),
		kick: make(chan struct{}, 1), settleKick: make(chan struct{}, 1)}
	if err := s.configureWebhooks(cfg); err != nil {
		return nil, err
	}
	s.mux.HandleFunc("POST /refunds", s.createRefund)
	s.mux.HandleFunc("GET /refunds", s.listRefunds)
	s.mux.HandleFunc("GET /refunds/by-key/{key...}", s.getRefundByKey)
	s.mux.HandleFunc("POST /faults", s.setFault)
	s.mux.HandleFunc("DELETE /faults", s.clearFaults)
	s.mux.HandleFunc("GET /webhooks", s.listWebhooks)
	s.mux.HandleFunc("POST /webhooks/redeliver", s.redeliver)
	// Every answer is JSON, a wrong method's and an unknown path's too. (A
	// caller must not take this 404 for "no refund under this key": that one
	// has the code refund_not_found.)
	for _, path := range []string{"/refunds", "/refunds/by-key/{key...}", "/faults", "/webhooks", "/webhooks/redeliver"} {
		s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "", r.Method+" is not allowed here")
		})
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "", "no such endpoint")
	})
	return s, nil
}

// Handler returns the provider's HTTP API, with routes relative to its root; mount
// it under a prefix with http.StripPrefix.
func (s *Server) Handler() http.Handler { return s.mux }

// refundRequest is the body of POST /refunds.
type refundRequest struct {
	OrderID   string `json:"orderId"`
	Amount    int64  `json:"amount"`
	Reference string `json:"reference"`
}

// refundAnswer is the answer to a POST /refunds that made a refund or found
// one under its key.
type refundAnswer struct {
	ID string `json:"id"`
	// Status is the refund's status now: a refund made pending is answered
	// pending until its time has come.
	Status string `json:"status"`
	// OrderID and Amount are those of the refund made under the key, so that a
	// caller can check that it is the refund it asked for.
	OrderID string `json:"orderId"`
	Amount  int64  `json:"amount"`
}

// refundRecord is a refund as GET /refunds and GET /refunds/by-key/{key} show it.
type refundRecord struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotencyKey"`
	OrderID        string    `json:"orderId"`
	Amount         int64     `json:"amount"`
	Status         string    `json:"status"`
	Requests       int       `json:"requests"`
	CreatedAt      time.Time `json:"createdAt"`
}

// faultRequest is the body of POST /faults.
type faultRequest struct {
	Mode    string `json:"mode"`
	Count   *int   `json:"count"`
	DelayMs *int   `json:"delayMs"`
	// Outcome is what the refunds made pending become: StatusSucceeded (the
	// default) or StatusFailed. Other modes ignore it.
	Outcome *string `json:"outcome"`
}

func (s *Server) createRefund(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	ctx := r.Context()
	key := r.Header.Get("Idempotency-Key")
	switch {
	case key == "":
		writeError(w, http.StatusBadRequest, "idempotency_key_missing", "", "the Idempotency-Key header is required")
		return
	case !validKey(key):
		writeError(w, http.StatusBadRequest, "idempotency_key_invalid", "",
			fmt.Sprintf("the Idempotency-Key header must be 1 to %d visible ASCII characters", maxKeyLen))
		return
	}
	var req refundRequest
	if !decodeBody(w, r, &req) {
		return
	}
	switch {
	case req.OrderID == "":
		writeError(w, http.StatusBadRequest, "invalid_request", "orderId", "orderId is required")
		return
	case req.Amount <= 0:
		writeError(w, http.StatusBadRequest, "invalid_request", "amount", "amount must be a positive integer")
		return
	case strings.ContainsRune(req.OrderID, 0):
		// PostgreSQL's text cannot hold a NUL byte.
		writeError(w, http.StatusBadRequest, "invalid_request", "orderId", "orderId must not contain NUL characters")
		return
	case strings.ContainsRune(req.Reference, 0):
		writeError(w, http.StatusBadRequest, "invalid_request", "reference", "reference must not contain NUL characters")
		return
	}
	log := s.logger.With(slog.String("key", key), slog.String("order_id", req.OrderID), slog.Int64("amount", req.Amount))

	// From here on the request is the provider's to carry out, whatever
	// happens to its connection: a real provider goes on with a request whose
	// caller gave up waiting, and so does this one. The work runs apart from
	// the handler, on a context that the caller's leaving does not cancel,
	// and the handler answers if the caller is still there when it is done.
	done := make(chan reply, 1)
	go func() { done <- s.carryOut(context.WithoutCancel(ctx), arrived, key, req, log) }()
	select {
	case rep := <-done:
		for k, v := range rep.header {
			w.Header()[k] = v
		}
		writeJSON(w, rep.status, rep.body)
	case <-ctx.Done():
		log.InfoContext(ctx, "the caller gave up on its refund request; the request is carried out all the same")
	}
}

// reply is the answer to a refund POST, made apart from the handler.
type reply struct {
	status int
	header http.Header
	body   any
}

func errorReply(status int, code, message string) reply {
	return reply{status: status, body: errorBody{Error: errorDetail{Code: code, Message: message}}}
}

// unavailable is the answer of the faults that make the provider look down.
var unavailable = errorReply(http.StatusServiceUnavailable, "service_unavailable", "the provider is unavailable (injected fault)")

// carryOut carries out a refund POST that arrived at arrived, and returns its
// answer. base carries the request's values but not its cancellation.
func (s *Server) carryOut(base context.Context, arrived time.Time, key string, req refundRequest, log *slog.Logger) reply {
	ctx, cancel := context.WithTimeout(base, workTimeout)
	defer cancel()
	fault, err := s.takeFault(ctx)
	if err != nil {
		return s.internalErrorReply(ctx, err)
	}
	lost := false
	var pending *providerdb.FaultTakeRow
	// lag, under FaultLaggingLookup, is how long the lookup under the key
	// does not find the refund made here.
	var lag *int64
	if fault != nil {
		log = log.With(slog.String("fault", fault.Mode))
		switch fault.Mode {
		case FaultError:
			log.InfoContext(ctx, "refund request failed by an injected fault; nothing recorded")
			return unavailable
		case FaultSlow:
			delay := time.Duration(fault.DelayMs) * time.Millisecond
			log.InfoContext(ctx, "refund request slowed by an injected fault", slog.Duration("delay", delay))
			// The delay is the fault itself, counted from the request's
			// arrival; the work that follows gets its own bound.
			time.Sleep(time.Until(arrived.Add(delay)))
			cancel()
			ctx, cancel = context.WithTimeout(base, workTimeout)
			defer cancel()
		case FaultLostResponse:
			lost = true
		case FaultLaggingLookup:
			lost = true
			ms := int64(fault.DelayMs)
			lag = &ms
		case FaultPending:
			pending = fault
		}
	}

	if strings.HasPrefix(req.OrderID, DeclinePrefix) {
		if lost {
			log.InfoContext(ctx, "refund declined, and the answer lost by an injected fault")
			return unavailable
		}
		log.InfoContext(ctx, "refund declined")
		return errorReply(http.StatusPaymentRequired, "declined", fmt.Sprintf("the refund of order %s was declined", req.OrderID))
	}

	params := providerdb.RefundUpsertParams{
		ID:             IDPrefix + rand.Text(),
		IdempotencyKey: key,
		OrderID:        req.OrderID,
		Amount:         req.Amount,
		Reference:      req.Reference,
		LookupLagMs:    lag,
	}
	switch {
	case pending != nil:
		// Made pending, with the event it makes once it has become its
		// outcome (see RefundSettleDue): that event names the outcome.
		outcome, settleMs := pending.Outcome, int64(pending.DelayMs)
		params.Outcome, params.SettleMs = &outcome, &settleMs
		if s.webhooksOn() {
			id, body, err := newEvent(params.ID, key, req, outcome)
			if err != nil {
				return s.internalErrorReply(ctx, err)
			}
			params.SettleEventID, params.SettleEventBody = &id, &body
		}
	case s.webhooksOn():
		id, body, err := newEvent(params.ID, key, req, StatusSucceeded)
		if err != nil {
			return s.internalErrorReply(ctx, err)
		}
		params.EventID, params.EventType, params.EventBody = &id, EventRefundSucceeded, body
	}
	ref, err := s.q.RefundUpsert(ctx, s.pool, params)
	if err != nil {
		return s.internalErrorReply(ctx, err)
	}
	if ref.EventMade {
		s.wake()
	}
	status := ref.Status
	log = log.With(slog.String("provider_refund_id", ref.ID), slog.Int("requests", int(ref.Requests)))
	if ref.Requests > 1 && (ref.OrderID != req.OrderID || ref.Amount != req.Amount) {
		log.WarnContext(ctx, "idempotency key reused with a different request; answering the refund made under it",
			slog.String("refund_order_id", ref.OrderID), slog.Int64("refund_amount", ref.Amount))
	}
	switch {
	case ref.Requests == 1 && status == StatusPending:
		s.wakeSettler()
		log.InfoContext(ctx, "refund recorded as pending by an injected fault",
			slog.String("outcome", pending.Outcome), slog.Duration("settles_in", time.Duration(pending.DelayMs)*time.Millisecond))
	case status == StatusPending:
		// A repeat answers the refund as it is now: one whose time has come
		// settles here, if no settler got to it yet.
		now, err := s.refundByKey(ctx, key)
		if err != nil {
			return s.internalErrorReply(ctx, err)
		}
		status = now.Status
	}
	log = log.With(slog.String("status", status))
	if lost {
		if lag != nil && ref.Requests == 1 {
			log.InfoContext(ctx, "refund recorded, its answer lost and its lookup lagging by an injected fault",
				slog.Duration("lookup_lag", time.Duration(*lag)*time.Millisecond))
		} else {
			log.InfoContext(ctx, "refund recorded, and its answer lost by an injected fault")
		}
		return unavailable
	}
	rep := reply{status: http.StatusOK, body: refundAnswer{ID: ref.ID, Status: status, OrderID: ref.OrderID, Amount: ref.Amount}}
	if ref.Requests > 1 {
		log.InfoContext(ctx, "refund request repeated; answering the same refund")
		rep.header = http.Header{"Idempotent-Replayed": {"true"}}
	} else if status != StatusPending {
		log.InfoContext(ctx, "refund made")
	}
	return rep
}

// takeFault takes one injection of the pending fault, or returns nil when there is
// none.
func (s *Server) takeFault(ctx context.Context) (*providerdb.FaultTakeRow, error) {
	f, err := s.q.FaultTake(ctx, s.pool)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("take fault: %w", err)
	}
	return f, nil
}

// getRefundByKey answers the lookup by key: the refund made under the key,
// or 404 refund_not_found. Under the fault FaultLookupError it answers 503
// instead; a refund made under FaultLaggingLookup is not found until its
// lookup_after has come.
func (s *Server) getRefundByKey(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := r.PathValue("key")
	switch _, err := s.q.FaultTakeLookup(ctx, s.pool); {
	case err == nil:
		s.logger.InfoContext(ctx, "lookup failed by an injected fault", slog.String("key", key), slog.String("fault", FaultLookupError))
		writeJSON(w, unavailable.status, unavailable.body)
		return
	case !errors.Is(err, pgx.ErrNoRows):
		s.internalError(ctx, w, fmt.Errorf("take lookup fault: %w", err))
		return
	}
	if !validKey(key) { // no refund is made under a key that POST /refunds refuses
		writeError(w, http.StatusNotFound, "refund_not_found", "", "no refund was made under this idempotency key")
		return
	}
	ref, err := s.refundByKey(ctx, key)
	if err == nil && ref.LookupAfter != nil {
		var lags bool
		if lags, err = s.q.RefundLookupLags(ctx, s.pool, key); err == nil && lags {
			s.logger.InfoContext(ctx, "lookup does not find the refund yet: an injected fault makes it lag",
				slog.String("key", key), slog.String("provider_refund_id", ref.ID), slog.String("fault", FaultLaggingLookup))
			err = pgx.ErrNoRows
		}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		writeError(w, http.StatusNotFound, "refund_not_found", "", "no refund was made under this idempotency key")
		return
	}
	if err != nil {
		s.internalError(ctx, w, err)
		return
	}
	writeJSON(w, http.StatusOK, recordFromRow(ref))
}

// maxPage bounds a page of GET /refunds?limit=.
const maxPage = 1000

// listRefunds answers the refunds, oldest first: every one, or those made
// after ?createdAfter=<RFC 3339>, and after the refund ?after=<id>; with
// ?limit=N (1 to 1,000) at most N of them, and "next", the id to ask after
// for the next page, or null on the last page. Empty createdAfter and after
// are as absent.
func (s *Server) listRefunds(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	q := r.URL.Query()
	var params providerdb.RefundListParams
	limit := 0
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > maxPage {
			writeError(w, http.StatusBadRequest, "invalid_request", "limit", fmt.Sprintf("limit must be an integer from 1 to %d", maxPage))
			return
		}
		// One more than asked for tells whether there is a next page.
		limit = n
		max := int32(n + 1)
		params.Max = &max
	}
	if v := q.Get("createdAfter"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request", "createdAfter", "createdAfter must be a time in RFC 3339 format, such as 2026-12-01T10:00:00Z")
			return
		}
		params.CreatedAfter = &t
	}
	if v := q.Get("after"); v != "" {
		created, err := s.q.RefundCreatedAt(ctx, s.pool, v)
		if errors.Is(err, pgx.ErrNoRows) {
			writeError(w, http.StatusBadRequest, "invalid_request", "after", "after must be the id of a refund, such as a page's next")
			return
		}
		if err != nil {
			s.internalError(ctx, w, err)
			return
		}
		params.AfterID, params.AfterCreatedAt = &v, &created
	}
	// The list shows every refund as it is now.
	if _, err := s.settleDue(ctx); err != nil {
		s.internalError(ctx, w, err)
		return
	}
	rows, err := s.q.RefundList(ctx, s.pool, params)
	if err != nil {
		s.internalError(ctx, w, err)
		return
	}
	page := struct {
		Refunds []refundRecord `json:"refunds"`
		Next    *string        `json:"next"`
	}{}
	if limit > 0 && len(rows) > limit {
		rows = rows[:limit]
		page.Next = &rows[limit-1].ID
	}
	page.Refunds = records(rows)
	writeJSON(w, http.StatusOK, page)
}

func records(rows []*providerdb.ProviderRefund) []refundRecord {
	refunds := make([]refundRecord, 0, len(rows))
	for _, row := range rows {
		refunds = append(refunds, recordFromRow(row))
	}
	return refunds
}

func (s *Server) setFault(w http.ResponseWriter, r *http.Request) {
	var req faultRequest
	if !decodeBody(w, r, &req) {
		return
	}
	switch req.Mode {
	case FaultError, FaultLostResponse, FaultSlow, FaultPending, FaultLookupError, FaultLaggingLookup:
	default:
		writeError(w, http.StatusBadRequest, "invalid_request", "mode",
			fmt.Sprintf("mode must be %q, %q, %q, %q, %q or %q", FaultError, FaultLostResponse, FaultSlow, FaultPending,
				FaultLookupError, FaultLaggingLookup))
		return
	}
	outcome := StatusSucceeded
	if req.Outcome != nil {
		outcome = *req.Outcome
	}
	if outcome != StatusSucceeded && outcome != StatusFailed {
		writeError(w, http.StatusBadRequest, "invalid_request", "outcome",
			fmt.Sprintf("outcome must be %q or %q", StatusSucceeded, StatusFailed))
		return
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 0 || count > maxFaultCount {
		writeError(w, http.StatusBadRequest, "invalid_request", "count",
			fmt.Sprintf("count must be between 0 and %d", maxFaultCount))
		return
	}
	delay := time.Duration(0)
	if req.Mode == FaultSlow || req.Mode == FaultPending || req.Mode == FaultLaggingLookup {
		delay = defaultSlowDelay
	}
	if req.DelayMs != nil {
		// Compared before the conversion, which would overflow for a huge delayMs.
		if *req.DelayMs < 0 || int64(*req.DelayMs) > maxSlowDelay.Milliseconds() {
			writeError(w, http.StatusBadRequest, "invalid_request", "delayMs",
				fmt.Sprintf("delayMs must be between 0 and %d", maxSlowDelay.Milliseconds()))
			return
		}
		delay = time.Duration(*req.DelayMs) * time.Millisecond
	}
	err := s.q.FaultSet(r.Context(), s.pool, providerdb.FaultSetParams{
		Mode:      req.Mode,
		Remaining: int32(count),
		DelayMs:   int32(delay.Milliseconds()),
		Outcome:   outcome,
	})
	if err != nil {
		s.internalError(r.Context(), w, err)
		return
	}
	attrs := []any{slog.String("fault", req.Mode), slog.Int("count", count), slog.Duration("delay", delay)}
	if req.Mode == FaultPending {
		attrs = append(attrs, slog.String("outcome", outcome))
	}
	what := "fault injected into the next refund requests"
	if req.Mode == FaultLookupError {
		what = "fault injected into the next lookups by key"
	}
	s.logger.InfoContext(r.Context(), what, attrs...)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) clearFaults(w http.ResponseWriter, r *http.Request) {
	if err := s.q.FaultClear(r.Context(), s.pool); err != nil {
		s.internalError(r.Context(), w, err)
		return
	}
	s.logger.InfoContext(r.Context(), "faults cleared")
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) internalError(ctx context.Context, w http.ResponseWriter, err error) {
	rep := s.internalErrorReply(ctx, err)
	writeJSON(w, rep.status, rep.body)
}

func (s *Server) internalErrorReply(ctx context.Context, err error) reply {
	s.logger.ErrorContext(ctx, "provider request failed", slog.Any("error", err))
	return errorReply(http.StatusInternalServerError, "internal_error", "the provider failed to answer")
}

func recordFromRow(row *providerdb.ProviderRefund) refundRecord {
	return refundRecord{
		ID:             row.ID,
		IdempotencyKey: row.IdempotencyKey,
		OrderID:        row.OrderID,
		Amount:         row.Amount,
		Status:         row.Status,
		Requests:       int(row.Requests),
		CreatedAt:      row.CreatedAt.UTC(),
	}
}

// validKey reports whether key is 1 to maxKeyLen visible ASCII characters.
func validKey(key string) bool {
	if len(key) == 0 || len(key) > maxKeyLen {
		return false
	}
	for i := range len(key) {
		if key[i] < 0x21 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

// decodeBody decodes r's JSON body into v, which must be the body's only value and
// have every field the body names. On failure it answers 400 (413 for a body too
// large) and returns false.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if dec.Decode(&struct{}{}) != io.EOF {
			err = errors.New("the body holds more than one JSON value")
		}
	}
	if err == nil {
		return true
	}
	var (
		tooLarge *http.MaxBytesError
		typeErr  *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "request_too_large", "",
			fmt.Sprintf("the body must be at most %d bytes", maxBody))
	case errors.As(err, &typeErr):
		writeError(w, http.StatusBadRequest, "invalid_request", typeErr.Field,
			fmt.Sprintf("%s must be a JSON %s", typeErr.Field, typeName(typeErr.Type.Kind().String())))
	default:
		writeError(w, http.StatusBadRequest, "invalid_request", "", "the body must be a JSON object: "+err.Error())
	}
	return false
}

func typeName(kind string) string {
	if strings.HasPrefix(kind, "int") {
		return "integer"
	}
	return kind
}

// errorBody is the body of every error answer.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Param names the body field at fault, if any.
	Param string `json:"param,omitempty"`
}

func writeError(w http.ResponseWriter, status int, code, param, message string) {
	writeJSON(w, status, errorBody{Error: errorDetail{Code: code, Message: message, Param: param}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// A write error means that the caller went away: there is nobody to tell.
	_ = json.NewEncoder(w).Encode(v)
}
