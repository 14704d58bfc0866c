package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
)

// The defaults of Config and EndpointOpts.
const (
	DefaultMaxBodyBytes   = 64 << 10
	DefaultWait           = 5 * time.Second
	DefaultRetryAfter     = time.Second
	DefaultSuccessStatus  = http.StatusCreated
	DefaultErrorStatus    = http.StatusUnprocessableEntity
	DefaultReserveTimeout = 8 * time.Second
)

// The headers this package reads and writes.
const (
	HeaderKey         = "Idempotency-Key"
	HeaderReplayed    = "Idempotent-Replayed"
	HeaderOperationID = "Operation-Id"
)

// Config configures the endpoints of a service; several Handlers may share one.
// Handler copies it, so changing it later does not change them.
type Config struct {
	// Engine runs the operations; the endpoints' operation types must be
	// registered with it. Required.
	Engine *engine.Engine
	// ScopeFunc returns the client scope of a request: the authenticated client,
	// whose keys never meet another client's. An error answers 401
	// unauthenticated with the error's text as message. Required.
	ScopeFunc func(*http.Request) (string, error)
	// MaxBodyBytes bounds the request body: a larger one answers 413
	// request_too_large. Defaults to 64 KiB.
	MaxBodyBytes int64
	// Wait is how long a first request waits for its operation to finish before
	// it answers 202 with the operation's id, counted from the moment the key is
	// reserved (the reservation commits with the operation's first database
	// step, which Wait does not bound). Defaults to 5 seconds.
	Wait time.Duration
	// RetryAfter is what the Retry-After header of a 409 request_in_progress,
	// and of a 503, says, rounded up to whole seconds and at least 1. Defaults
	// to 1 second.
	RetryAfter time.Duration
	// ReserveTimeout bounds how long a first request waits for its key's
	// reservation to commit (it goes with the operation's first database
	// step): a database that does not answer gets a 503 service_unavailable
	// with Retry-After by then, rather than a request that hangs. Defaults to 8
	// seconds.
	ReserveTimeout time.Duration
	// OperationPathFunc returns the Location of a 202: where the client reads the
	// operation. Defaults to "/operations/<id>".
	OperationPathFunc func(id uuid.UUID) string
	// Logger receives the server faults the endpoints answer 500 for. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// ObserveFunc, when set, is told how each keyed request was answered, for
	// metrics: operation is the endpoint's operation type. It runs in the
	// request's goroutine: keep it short.
	ObserveFunc func(ctx context.Context, operation string, outcome Outcome)
}

// Outcome is how an endpoint answered a keyed request (Config.ObserveFunc).
type Outcome string

// The outcomes of a keyed request.
const (
	// OutcomeCreated: the request started the operation and got its answer.
	OutcomeCreated Outcome = "created"
	// OutcomeReplayed: the operation had finished; its stored answer again.
	OutcomeReplayed Outcome = "replayed"
	// OutcomeInProgress: 409, the operation runs.
	OutcomeInProgress Outcome = "in_progress"
	// OutcomeAccepted: 202, the operation outlasted the wait.
	OutcomeAccepted Outcome = "accepted"
	// OutcomeMismatch: 422, the key holds another request.
	OutcomeMismatch Outcome = "mismatch"
	// OutcomeRejected: 400 or 413, the key not consumed.
	OutcomeRejected Outcome = "rejected"
)

func (ep *endpoint[In, S, Out]) observe(ctx context.Context, o Outcome) {
	if ep.cfg.ObserveFunc != nil {
		ep.cfg.ObserveFunc(ctx, ep.op.Name(), o)
	}
}

func (c Config) withDefaults() Config {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Wait == 0 {
		c.Wait = DefaultWait
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.ReserveTimeout == 0 {
		c.ReserveTimeout = DefaultReserveTimeout
	}
	if c.OperationPathFunc == nil {
		c.OperationPathFunc = func(id uuid.UUID) string { return "/operations/" + id.String() }
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Engine == nil:
		return errors.New("an engine is required")
	case c.ScopeFunc == nil:
		return errors.New("a scope function is required")
	case c.MaxBodyBytes < 0:
		return errors.New("max body bytes must not be negative")
	case c.Wait < 0:
		return errors.New("wait must not be negative")
	case c.RetryAfter < 0, c.ReserveTimeout < 0:
		return errors.New("retry after and reserve timeout must not be negative")
	}
	return nil
}

// EndpointOpts describe how one endpoint reads its requests and answers.
type EndpointOpts[In any] struct {
	// DecodeFunc checks the top-level fields of the request body and builds the
	// operation's input; r is the request, for what the input takes from
	// elsewhere (the authenticated client, a path parameter). A *FieldError
	// answers 400 invalid_request with error.param; any other error answers 400
	// invalid_request without it. Required.
	DecodeFunc func(r *http.Request, fields Fields) (In, error)
	// Unfingerprinted are top-level fields that are stored with the input but do
	// not take part in the fingerprint: a retry that changes, adds or removes only
	// these fields is the same request (the demo's "metadata"). Name them in the
	// operation's OperationOpts.Unfingerprinted too, so that the engine leaves
	// them out of fingerprints stored before they were listed.
	Unfingerprinted []string
	// SuccessStatus is the status of a succeeded operation's answer. Defaults to
	// 201.
	SuccessStatus int
	// ErrorStatusFunc returns the status of the answer of an operation that failed
	// with the business error code (see engine.Fail), or 0 for the default, 422.
	// It is not asked about server faults (engine.PermanentError.ServerFault: a
	// step out of attempts, a failed compensation or result function), which
	// answer 500 operation_failed with a fixed message.
	ErrorStatusFunc func(code string) int
}

// Handler returns an http.Handler that runs an operation of type op for each new
// request, under the request's Idempotency-Key, and answers retries from the
// stored operation. See the package documentation for what it answers when.
// The handler serves whatever method and path it is mounted on; both are part of
// the fingerprint.
func Handler[In, S, Out any](cfg *Config, op *engine.Operation[In, S, Out], opts *EndpointOpts[In]) (http.Handler, error) {
	if cfg == nil {
		return nil, errors.New("idempotency: a config is required")
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("idempotency: invalid config: %w", err)
	}
	if op == nil {
		return nil, errors.New("idempotency: an operation type is required")
	}
	if opts == nil || opts.DecodeFunc == nil {
		return nil, fmt.Errorf("idempotency: endpoint of %q: a decode function is required", op.Name())
	}
	o := *opts
	o.Unfingerprinted = slices.Clone(o.Unfingerprinted)
	if o.SuccessStatus == 0 {
		o.SuccessStatus = DefaultSuccessStatus
	}
	if o.SuccessStatus < 200 || o.SuccessStatus > 299 {
		return nil, fmt.Errorf("idempotency: endpoint of %q: success status %d is not 2xx", op.Name(), o.SuccessStatus)
	}
	return &endpoint[In, S, Out]{cfg: c, op: op, opts: o}, nil
}

type endpoint[In, S, Out any] struct {
	cfg  Config
	op   *engine.Operation[In, S, Out]
	opts EndpointOpts[In]
}

func (ep *endpoint[In, S, Out]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	scope, err := ep.cfg.ScopeFunc(r)
	if err != nil {
		RefuseBody(w) // the body is not read
		WriteError(w, http.StatusUnauthorized, CodeUnauthenticated, err.Error(), nil)
		return
	}
	key, err := parseKey(r.Header.Values(HeaderKey))
	if err != nil {
		code := CodeKeyInvalid
		if errors.Is(err, errKeyMissing) {
			code = CodeKeyMissing
		}
		WriteError(w, http.StatusBadRequest, code, err.Error(), nil)
		ep.observe(ctx, OutcomeRejected)
		return
	}
	in, fp, ok := ep.readRequest(w, r)
	if !ok {
		ep.observe(ctx, OutcomeRejected)
		return
	}
	// Made only on the paths that log: a logger with attributes costs a few
	// microseconds, on every request.
	log := func() *slog.Logger {
		return ep.cfg.Logger.With(slog.String("operation", ep.op.Name()), slog.String("scope", scope), slog.String("key", key))
	}

	// No read first: the reservation finds a taken key, and only then does the
	// engine read the operation that holds it.
	// Start waits for the answer itself (StartOpts.Wait), so that the request
	// is woken once, with it, rather than once for the reservation and again
	// for the answer; what is left of Wait after it returns is waited below.
	rctx, cancel := context.WithTimeout(ctx, ep.cfg.ReserveTimeout)
	started, err := engine.Start(rctx, ep.cfg.Engine, ep.op, scope, key, in, &engine.StartOpts{Fingerprint: fp, Wait: ep.cfg.Wait})
	cancel()
	var reused *engine.ReusedError
	switch {
	case ctx.Err() != nil:
		return // the client has gone
	case engine.IsUnavailable(err):
		if !errors.Is(err, engine.ErrIncompatibleSchema) { // the engine has said why, once
			log().WarnContext(ctx, "the database did not answer the reservation", slog.Any("error", err))
		}
		WriteStartError(w, err, ep.cfg.RetryAfter, "retry with the same key")
		return
	case WriteStartError(w, err, ep.cfg.RetryAfter, "retry with the same key"):
		return
	case errors.As(err, &reused):
		w.Header().Set(HeaderOperationID, reused.Operation.String())
		WriteError(w, http.StatusUnprocessableEntity, CodeKeyReused,
			"this idempotency key was used for a different request; use a new key for a new request",
			map[string]any{"mismatchedFields": reused.Fields})
		ep.observe(ctx, OutcomeMismatch)
		return
	case err != nil:
		ep.internalError(ctx, w, log(), "start the operation", err)
		return
	case !started.Created:
		if started.Existing.Status == engine.StatusInProgress && started.Existing.PriorError == nil {
			ep.observe(ctx, OutcomeInProgress)
		} else {
			ep.observe(ctx, OutcomeReplayed)
		}
		ep.answerExisting(w, started.Existing)
		return
	}

	waitCtx, cancel := context.WithDeadline(ctx, started.ReservedAt.Add(ep.cfg.Wait))
	defer cancel()
	info, err := started.Wait(waitCtx)
	if err != nil || info.Status == engine.StatusInProgress {
		if ctx.Err() != nil {
			return // the client has gone; the operation goes on
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			// The operation holds the key and will finish: the client learns how
			// by retrying or by reading it, as after a timeout.
			log().WarnContext(ctx, "waiting for the operation failed; answering 202",
				slog.String("operation_id", started.ID.String()), slog.Any("error", err))
		}
		// Still in progress: the wait ran out, or the operation is parked
		// (it waits for an operator, not for this request).
		w.Header().Set(HeaderOperationID, started.ID.String())
		w.Header().Set("Location", ep.cfg.OperationPathFunc(started.ID))
		body, _ := json.Marshal(struct {
			OperationID string `json:"operationId"`
			Status      string `json:"status"`
		}{started.ID.String(), string(engine.StatusInProgress)})
		writeJSON(w, http.StatusAccepted, body)
		ep.observe(ctx, OutcomeAccepted)
		return
	}
	ep.answerFinished(w, info)
	ep.observe(ctx, OutcomeCreated)
}

// readRequest reads and decodes the body and fingerprints the request. When the
// request is not valid it answers it and returns false.
func (ep *endpoint[In, S, Out]) readRequest(w http.ResponseWriter, r *http.Request) (In, *engine.Fingerprint, bool) {
	var in In
	data, err := readBody(r, ep.cfg.MaxBodyBytes)
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		// The client stalled past the server's read deadline: no answer, the
		// connection is closed.
		panic(http.ErrAbortHandler)
	}
	if errors.Is(err, errTooLarge) {
		// The rest of the body is not read: the connection closes. (A client
		// sending a body this large is sending, not stalling: net/http gives
		// up on it at once when more than 256 KiB are left.)
		w.Header().Set("Connection", "close")
		WriteError(w, http.StatusRequestEntityTooLarge, CodeRequestTooLarge,
			fmt.Sprintf("the request body is larger than %d bytes", ep.cfg.MaxBodyBytes), nil)
		return in, nil, false
	}
	if err != nil {
		WriteError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error(), nil)
		return in, nil, false
	}
	body, err := parseBody(data)
	if err == nil {
		in, err = ep.opts.DecodeFunc(r, body.fields)
	}
	if err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			WriteError(w, http.StatusBadRequest, CodeInvalidRequest, fe.Error(), map[string]any{"param": fe.Param})
		} else {
			WriteError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error(), nil)
		}
		return in, nil, false
	}
	return in, fingerprint(r.Method, r.URL.Path, body.hashes, ep.opts.Unfingerprinted), true
}

var errTooLarge = errors.New("request body too large")

func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, errTooLarge
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("the request body could not be read: %w", err)
	}
	if int64(len(data)) > limit {
		return nil, errTooLarge
	}
	return data, nil
}

// answerExisting answers a request whose key an operation started by the same
// request already holds (the engine refused a different one): 409 while the
// operation runs, its stored answer once it finished. An operation that an
// operator reopened by force answers what its client was told before
// (engine.Info.PriorError) until it finishes again.
func (ep *endpoint[In, S, Out]) answerExisting(w http.ResponseWriter, info *engine.Info) {
	w.Header().Set(HeaderOperationID, info.ID.String())
	if info.Status == engine.StatusInProgress && info.PriorError != nil {
		w.Header().Set(HeaderReplayed, "true")
		ep.answerFinished(w, &engine.Info{ID: info.ID, Status: engine.StatusFailed, Error: info.PriorError})
		return
	}
	if info.Status == engine.StatusInProgress {
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(ep.cfg.RetryAfter), 10))
		WriteError(w, http.StatusConflict, CodeRequestInProgress,
			"a request with this idempotency key is still in progress; retry later with the same key", nil)
		return
	}
	w.Header().Set(HeaderReplayed, "true")
	ep.answerFinished(w, info)
}

// answerFinished writes the stored answer of a finished operation: the same
// status and bytes every time.
func (ep *endpoint[In, S, Out]) answerFinished(w http.ResponseWriter, info *engine.Info) {
	w.Header().Set(HeaderOperationID, info.ID.String())
	if info.Status == engine.StatusSucceeded {
		writeJSON(w, ep.opts.SuccessStatus, info.Result)
		return
	}
	pe := info.Error
	if pe == nil || pe.ServerFault() {
		// What broke is for operators (engine.Info.Error.Cause), not clients;
		// the answer is the same on every replay.
		writeJSON(w, http.StatusInternalServerError, errorBody(CodeOperationFailed,
			"the operation failed because of a server fault; it was not completed", nil))
		return
	}
	status := 0
	if ep.opts.ErrorStatusFunc != nil {
		status = ep.opts.ErrorStatusFunc(string(pe.Code))
	}
	if status == 0 {
		status = DefaultErrorStatus
	}
	writeJSON(w, status, errorBody(string(pe.Code), pe.Message, detailMembers(pe.Details)))
}

// detailMembers returns the members that a business error's details add to the
// error object: an object's members, or any other value as "details". They are in
// canonical form, so that the stored details (which the database may have
// reformatted) give the same bytes as the first answer's.
func detailMembers(details json.RawMessage) map[string]any {
	if len(details) == 0 {
		return nil
	}
	canon, err := canonicalJSON(details)
	if err != nil {
		return nil
	}
	if canon[0] != '{' {
		return map[string]any{"details": json.RawMessage(canon)}
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(canon, &members); err != nil {
		return nil
	}
	extra := make(map[string]any, len(members))
	for k, v := range members {
		extra[k] = v
	}
	return extra
}

func (ep *endpoint[In, S, Out]) internalError(ctx context.Context, w http.ResponseWriter, log *slog.Logger, doing string, err error) {
	log.ErrorContext(ctx, "could not "+doing, slog.Any("error", err))
	WriteError(w, http.StatusInternalServerError, CodeInternalError, "an internal error occurred; retry with the same key", nil)
}
