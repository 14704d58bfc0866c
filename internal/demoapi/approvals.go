package demoapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/workflows/refund"
)

const (
	// maxDecisionBody bounds the body of an approval or a rejection, and
	// maxDecisionText its reason and actor, in bytes: the bounds of the
	// operators' other requests.
	maxDecisionBody = 16 << 10
	maxDecisionText = 1000
	// decisionTimeout bounds an approval or a rejection, which goes on if the
	// client goes away meanwhile.
	decisionTimeout = 15 * time.Second
	// maxApprovals bounds the list of GET /admin/approvals.
	maxApprovals = 1000
	// defaultActor is who an approval or a rejection over /admin is by when
	// its body names nobody, as for the operators' other requests there.
	defaultActor = "admin"
)

// approvals mounts GET /admin/approvals and POST
// /admin/operations/{id}/approve and /reject, behind the admin token. The
// other operator requests (retry, cancel, resolve) are opsweb's, under the
// same /admin.
func (s *server) approvals() {
	s.mux.Handle("GET /admin/approvals", s.adminOnly(bounded(s.listApprovals)))
	s.mux.Handle("POST /admin/operations/{id}/approve", s.adminOnly(sameOrigin(s.decision(engine.ActionApprove))))
	s.mux.Handle("POST /admin/operations/{id}/reject", s.adminOnly(sameOrigin(s.decision(engine.ActionReject))))
	// Behind the token even for a wrong method, as all of /admin.
	for _, p := range []string{"/admin/approvals", "/admin/operations/{id}/approve", "/admin/operations/{id}/reject"} {
		s.mux.Handle(p, s.adminOnly(http.HandlerFunc(methodNotAllowed)))
	}
}

// listApprovals serves GET /admin/approvals: the refunds that wait for
// approval, oldest first.
func (s *server) listApprovals(w http.ResponseWriter, r *http.Request) {
	list, err := refund.ListApprovals(r.Context(), s.cfg.Pool, s.cfg.Engine, maxApprovals)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"approvals": list})
}

// decision serves POST /admin/operations/{id}/approve or /reject, body
// {"reason": "...", "actor": "..."} (reason required, actor "admin" unless
// given): done, it answers 200 with the operation as GET
// /admin/operations/{id} does; refused, 409 operation_final (the operation
// ended, or its wait for approval expired) or not_awaiting_approval.
func (s *server) decision(action engine.Action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := uuid.Parse(r.PathValue("id"))
		if err != nil {
			idempotency.RefuseBody(w)
			idempotency.WriteError(w, http.StatusNotFound, "operation_not_found", "no such operation", nil)
			return
		}
		reason, actor, ok := readDecision(w, r, action)
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), decisionTimeout)
		defer cancel()
		ctx = engine.WithActor(ctx, actor)
		if action == engine.ActionApprove {
			_, err = s.cfg.Engine.Approve(ctx, id, reason)
		} else {
			_, err = s.cfg.Engine.Reject(ctx, id, reason)
		}
		log := s.cfg.Logger.With(slog.String("action", string(action)), slog.String("operation_id", id.String()),
			slog.String("actor", actor))
		if err == nil {
			log.InfoContext(ctx, "operator action", slog.String("reason", reason), slog.String("remote_addr", r.RemoteAddr))
			s.answerOperation(w, r, id)
			return
		}
		status, code, message := decisionRefusal(action, err)
		if status == 0 {
			s.internalError(w, r, err)
			return
		}
		log.InfoContext(ctx, "operator action refused", slog.String("code", code), slog.String("error", err.Error()))
		idempotency.WriteError(w, status, code, message, nil)
	}
}

// decisionRefusal is the answer to an approval or a rejection that the engine
// refused, changing nothing; status 0 for an error that is no refusal.
func decisionRefusal(action engine.Action, err error) (status int, code, message string) {
	verb, done := "approve", "approved"
	if action == engine.ActionReject {
		verb, done = "reject", "rejected"
	}
	switch {
	case errors.Is(err, engine.ErrNotFound):
		return http.StatusNotFound, "operation_not_found", "no such operation"
	case errors.Is(err, engine.ErrReasonRequired):
		return http.StatusBadRequest, idempotency.CodeInvalidRequest, "a reason is required"
	case errors.Is(err, engine.ErrWaitOver):
		return http.StatusConflict, "operation_final", "the operation's wait for approval has expired, so it can no longer be " +
			done + ": it ends with " + refund.CodeApprovalExpired
	case errors.Is(err, engine.ErrFinished):
		return http.StatusConflict, "operation_final", "the operation has ended: its answer is final, there is nothing to " + verb
	case errors.Is(err, engine.ErrNotAwaitingApproval):
		message = "the operation is in progress but does not wait for approval (not yet, or no more: it was approved or rejected already)"
		// The engine's text after its sentinel says why, when it knows.
		if _, why, ok := strings.Cut(err.Error(), engine.ErrNotAwaitingApproval.Error()+": "); ok {
			message += ": " + why
		}
		return http.StatusConflict, "not_awaiting_approval", message
	}
	return 0, "", ""
}

// readDecision reads the body of an approval or a rejection: a JSON object
// (or nothing) with "reason", required, and "actor", both strings of at most
// 1000 bytes, trimmed. On failure it answers 400 (413) and returns false.
func readDecision(w http.ResponseWriter, r *http.Request, action engine.Action) (reason, actor string, ok bool) {
	fail := func(param, message string) (string, string, bool) {
		extra := map[string]any{}
		if param != "" {
			extra["param"] = param
		}
		idempotency.WriteError(w, http.StatusBadRequest, idempotency.CodeInvalidRequest, message, extra)
		return "", "", false
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxDecisionBody))
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		w.Header().Set("Connection", "close")
		idempotency.WriteError(w, http.StatusRequestEntityTooLarge, idempotency.CodeRequestTooLarge,
			fmt.Sprintf("the request body is larger than %d bytes", maxDecisionBody), nil)
		return "", "", false
	}
	if err != nil {
		return fail("", "the request body could not be read")
	}
	f := idempotency.Fields{}
	if len(strings.TrimSpace(string(data))) > 0 {
		if json.Unmarshal(data, &f) != nil || f == nil {
			return fail("", "the request body must be a JSON object, such as {\"reason\": \"...\", \"actor\": \"...\"}")
		}
	}
	if fe := (*idempotency.FieldError)(nil); errors.As(f.Only("reason", "actor"), &fe) {
		return fail(fe.Param, fmt.Sprintf("%s: unknown field; %s takes only reason and actor", fe.Param, action))
	}
	text := func(name string, dst *string) bool {
		if fe := (*idempotency.FieldError)(nil); errors.As(f.Optional(name, dst), &fe) {
			return false
		}
		*dst = strings.TrimSpace(*dst)
		return len(*dst) <= maxDecisionText
	}
	if !text("reason", &reason) {
		return fail("reason", "reason: must be a string of at most 1000 bytes")
	}
	if reason == "" {
		return fail("reason", "reason: the field is required: say why you "+string(action))
	}
	if !text("actor", &actor) {
		return fail("actor", "actor: must be a string of at most 1000 bytes")
	}
	if actor == "" {
		actor = defaultActor
	}
	return reason, actor, true
}

// answerOperation answers 200 with the operation id as GET
// /admin/operations/{id} does: it asks the operators' API (opsweb), which
// owns that shape, with this request's credentials.
func (s *server) answerOperation(w http.ResponseWriter, r *http.Request, id uuid.UUID) {
	get := r.Clone(context.WithoutCancel(r.Context()))
	get.Method = http.MethodGet
	get.URL = &url.URL{Path: "/admin/operations/" + id.String()}
	get.RequestURI = get.URL.Path
	get.Body, get.ContentLength = http.NoBody, 0
	get.Header.Del("Content-Type")
	get.Header.Del("Content-Length")
	s.ops.ServeHTTP(w, get)
}
