package idempotency

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"path"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
)

// OperationJSON is an operation as its client reads it (OperationHandler):
// what it is, how far it got and whether it waits for an operator, naming
// nothing internal (no causes, no SQL, no URLs: those are for operators).
type OperationJSON struct {
	OperationID uuid.UUID `json:"operationId"`
	Name        string    `json:"name"`
	Version     int       `json:"version"`
	// Key is the client's idempotency key.
	Key string `json:"key"`
	// Status is "in_progress", "succeeded" or "failed".
	Status string `json:"status"`
	// NeedsAttention is engine.Info.NeedsAttention: the operation waits for
	// an operator (why is for operators only).
	NeedsAttention bool       `json:"needsAttention"`
	CreatedAt      time.Time  `json:"createdAt"`
	FinishedAt     *time.Time `json:"finishedAt"`
	// Steps are every step the operation started with, in order.
	Steps []StepJSON `json:"steps"`
}

// StepJSON is a step as its operation's client reads it.
type StepJSON struct {
	Name string `json:"name"`
	// Status is an engine.StepStatus: "pending", "running", "waiting",
	// "succeeded", "failed", "compensated" or "skipped".
	Status   string `json:"status"`
	Attempts int    `json:"attempts"`
	// DerivedKey is the idempotency key a step that calls out sends.
	DerivedKey string `json:"derivedKey,omitempty"`
	// ResolvedBy says what told a succeeded step's outcome: "call", "lookup",
	// "event" or "operator".
	ResolvedBy string `json:"resolvedBy,omitempty"`
	// SettleBy, for a step that calls out, is the JSON of when a request of it
	// that got no definite answer can no longer land (RFC 3339, fixed when
	// the request was sent), or null when it sent none that failed; absent
	// for other steps.
	SettleBy   json.RawMessage `json:"settleBy,omitempty"`
	StartedAt  *time.Time      `json:"startedAt"`
	FinishedAt *time.Time      `json:"finishedAt"`
	// LastError is the client's text of the step's last failure
	// (engine.StepInfo.LastError).
	LastError *string `json:"lastError"`
}

// NewOperationJSON returns info, read with its steps (engine.Engine.Get), as
// its client reads it.
func NewOperationJSON(info *engine.Info) OperationJSON {
	body := OperationJSON{
		OperationID: info.ID, Name: info.Name, Version: info.Version, Key: info.Key, Status: string(info.Status),
		NeedsAttention: info.NeedsAttention(), CreatedAt: info.CreatedAt, FinishedAt: info.FinishedAt,
		Steps: make([]StepJSON, 0, len(info.Steps)),
	}
	for _, st := range info.Steps {
		sb := StepJSON{
			Name: st.Name, Status: string(st.Status), Attempts: st.Attempts, DerivedKey: st.DerivedKey,
			ResolvedBy: string(st.ResolvedBy), StartedAt: st.StartedAt, FinishedAt: st.FinishedAt,
		}
		if st.LastError != "" {
			msg := st.LastError
			sb.LastError = &msg
		}
		if st.DerivedKey != "" {
			sb.SettleBy = json.RawMessage("null")
			if st.SettleBy != nil {
				sb.SettleBy, _ = json.Marshal(st.SettleBy.UTC())
			}
		}
		body.Steps = append(body.Steps, sb)
	}
	return body
}

// OperationOpts are the optional parts of OperationHandler.
type OperationOpts struct {
	// OwnsFunc reports whether the client scope (Config.ScopeFunc) may read an
	// operation of scope opScope. Defaults to equality; a service whose client
	// also starts operations under scopes of its own (its queue's, say) says
	// so here.
	OwnsFunc func(scope, opScope string) bool
}

// OperationHandler returns the handler where a client reads an operation it
// started, such as the one a 202 points at (Config.OperationPathFunc): mount
// it on "GET /operations/{operationId}" (the id is the path value
// operationId, else the path's last segment). It answers 200 with
// OperationJSON and the Operation-Id header; 404 operation_not_found for an
// id that is malformed, unknown or another client's (the same answer, so that
// ids of others cannot be probed); 401 as the endpoints do; 503
// service_unavailable with Retry-After when the database does not answer.
// opts may be nil.
func OperationHandler(cfg *Config, opts *OperationOpts) (http.Handler, error) {
	if cfg == nil {
		return nil, errors.New("idempotency: a config is required")
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, errors.New("idempotency: invalid config: " + err.Error())
	}
	owns := func(scope, opScope string) bool { return scope == opScope }
	if opts != nil && opts.OwnsFunc != nil {
		owns = opts.OwnsFunc
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scope, err := c.ScopeFunc(r)
		if err != nil {
			WriteError(w, http.StatusUnauthorized, CodeUnauthenticated, err.Error(), nil)
			return
		}
		notFound := func() {
			WriteError(w, http.StatusNotFound, CodeOperationNotFound, "no such operation", nil)
		}
		raw := r.PathValue("operationId")
		if raw == "" {
			raw = path.Base(r.URL.Path)
		}
		id, err := uuid.Parse(raw)
		if err != nil {
			notFound()
			return
		}
		info, err := c.Engine.Get(r.Context(), id)
		switch {
		case errors.Is(err, engine.ErrNotFound), err == nil && !owns(scope, info.Scope):
			notFound()
			return
		case engine.IsUnavailable(err):
			w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(c.RetryAfter), 10))
			WriteError(w, http.StatusServiceUnavailable, CodeServiceUnavailable, "the database is not available; try again", nil)
			return
		case err != nil:
			c.Logger.ErrorContext(r.Context(), "could not read an operation", slog.String("operation_id", id.String()), slog.Any("error", err))
			WriteError(w, http.StatusInternalServerError, CodeInternalError, "the server could not answer; try again", nil)
			return
		}
		body, err := json.Marshal(NewOperationJSON(info))
		if err != nil {
			WriteError(w, http.StatusInternalServerError, CodeInternalError, "could not encode the answer", nil)
			return
		}
		w.Header().Set(HeaderOperationID, info.ID.String())
		writeJSON(w, http.StatusOK, body)
	}), nil
}
