package opsweb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/internal/redact"
)

// maxLimit bounds a page of the list.
const maxLimit = 1000

// maxReason bounds a cancel's reason, in bytes; maxActionBody the body of a
// retry or a cancel.
const (
	maxReason     = 1000
	maxActionBody = 16 << 10
)

// listItem is an operation of the list: the shape of the client API's
// operation without its steps, plus the client.
type listItem struct {
	OperationID    uuid.UUID  `json:"operationId"`
	Client         string     `json:"client"`
	Name           string     `json:"name"`
	Version        int        `json:"version"`
	Key            string     `json:"key"`
	Status         string     `json:"status"`
	NeedsAttention bool       `json:"needsAttention"`
	CreatedAt      time.Time  `json:"createdAt"`
	FinishedAt     *time.Time `json:"finishedAt"`
}

func itemOf(info *engine.Info) listItem {
	return listItem{
		OperationID: info.ID, Client: info.Scope, Name: info.Name, Version: info.Version, Key: info.Key,
		Status: string(info.Status), NeedsAttention: info.NeedsAttention(), CreatedAt: info.CreatedAt, FinishedAt: info.FinishedAt,
	}
}

// operationBody is one operation, for operators.
type operationBody struct {
	listItem
	// Parked: no run takes it up until an operator retries or cancels it.
	Parked bool `json:"parked"`
	// Attention is why the unfinished operation waits for an operator.
	Attention *attentionBody `json:"attention"`
	// Failure is the error that ended a failed operation.
	Failure *failureBody    `json:"failure"`
	Runs    int             `json:"runs"`
	Result  json.RawMessage `json:"result"`
	Steps   []stepBody      `json:"steps"`
	// Audit is every operator request on it, oldest first.
	Audit []auditBody `json:"audit"`
	// Mismatches are the reconciliation mismatches that name it.
	Mismatches []mismatchBody `json:"mismatches"`
}

type auditBody struct {
	At     time.Time `json:"at"`
	Action string    `json:"action"`
	Actor  string    `json:"actor"`
	Reason string    `json:"reason"`
	Result string    `json:"result"`
	Detail string    `json:"detail"`
}

type attentionBody struct {
	Code   string `json:"code"`
	Reason string `json:"reason"`
}

type failureBody struct {
	Code string `json:"code"`
	// Message is the client's text, Cause the operators'.
	Message     string `json:"message"`
	Cause       string `json:"cause,omitempty"`
	Step        string `json:"step,omitempty"`
	ServerFault bool   `json:"serverFault"`
}

// stepBody is a step as its client reads it (idempotency.StepJSON), with its
// kind, the operators' cause of its last failure and, while it waits, what
// for.
type stepBody struct {
	idempotency.StepJSON
	Kind      string    `json:"kind,omitempty"`
	LastCause *string   `json:"lastCause"`
	Wait      *waitBody `json:"wait,omitempty"`
}

// waitBody is what a waiting step waits for (engine.WaitInfo).
type waitBody struct {
	// Reason is an engine.WaitReason: "outcome", "signal", "timer" or
	// "approval".
	Reason string `json:"reason"`
	// Since is when it began to wait; Until when the wait ends (null: no end
	// is fixed), both by the database's clock.
	Since *time.Time `json:"since"`
	Until *time.Time `json:"until"`
	// Signal is the signal a signal step waits for ("" for the others).
	Signal string `json:"signal"`
	// Need is how many distinct actors must approve an approval step (0 for
	// the others); ApprovedBy those who did, in the order they did.
	Need       int      `json:"need"`
	ApprovedBy []string `json:"approvedBy"`
}

func waitOf(s *engine.StepInfo) *waitBody {
	w := s.Wait
	if w == nil || s.Status != engine.StepStatusWaiting {
		return nil
	}
	return &waitBody{Reason: string(w.Reason), Since: s.WaitingSince, Until: w.Until, Signal: w.Signal, Need: w.Need,
		ApprovedBy: append([]string{}, w.ApprovedBy...)}
}

func operationOf(info *engine.Info) operationBody {
	body := operationBody{listItem: itemOf(info), Parked: info.Parked, Runs: info.Runs, Result: info.Result, Steps: []stepBody{}, Audit: []auditBody{},
		Mismatches: make([]mismatchBody, len(info.Mismatches))}
	for i := range info.Mismatches {
		body.Mismatches[i] = mismatchOf(&info.Mismatches[i])
	}
	for _, a := range info.Audit {
		body.Audit = append(body.Audit, auditBody{At: a.At, Action: string(a.Action), Actor: a.Actor, Reason: a.Reason, Result: a.Result, Detail: redact.Addresses(a.Detail)})
	}
	if a := info.Attention; a != nil {
		body.Attention = &attentionBody{Code: string(a.Code), Reason: a.Reason}
	}
	f := info.Error
	if f == nil {
		f = info.Compensating // the failure it is undoing, parked or not
	}
	if f != nil {
		body.Failure = &failureBody{Code: string(f.Code), Message: f.Message, Cause: f.Cause, Step: f.Step, ServerFault: f.ServerFault()}
	}
	for i, st := range idempotency.NewOperationJSON(info).Steps {
		sb := stepBody{StepJSON: st, Kind: string(info.Steps[i].Kind), Wait: waitOf(&info.Steps[i])}
		if c := info.Steps[i].LastCause; c != "" {
			sb.LastCause = &c
		}
		body.Steps = append(body.Steps, sb)
	}
	return body
}

// listQuery is a list's filters, as the query string gives them.
type listQuery struct {
	opts  engine.ListOpts
	limit int
	// values are the filters as given, without after: what the next page's
	// URL and the pages' form repeat.
	values url.Values
}

// listParams are the query parameters of the list.
var listParams = []string{"status", "name", "client", "olderThan", "needsAttention", "limit", "after"}

// paramError is a query parameter or body field at fault.
type paramError struct {
	param, message string
}

// parseList reads the list's filters from q. strict refuses parameters that
// the list does not know (the API's; the pages ignore them). after reads the
// cursor's operation.
func (h *handler) parseList(ctx context.Context, q url.Values, strict bool) (*listQuery, *paramError, error) {
	if strict {
		for name := range q {
			if !slices.Contains(listParams, name) {
				return nil, &paramError{name, "unknown query parameter " + strconv.Quote(name) + "; the list takes " + strings.Join(listParams, ", ")}, nil
			}
		}
	}
	lq := &listQuery{limit: 100, values: url.Values{}}
	for _, name := range listParams {
		if len(q[name]) > 1 {
			return nil, &paramError{name, name + " is given more than once"}, nil
		}
		v := strings.TrimSpace(q.Get(name))
		if v == "" {
			continue
		}
		switch name {
		case "status":
			switch s := engine.Status(v); s {
			case engine.StatusInProgress, engine.StatusSucceeded, engine.StatusFailed:
				lq.opts.Status = s
			default:
				return nil, &paramError{name, "status is one of in_progress, succeeded, failed"}, nil
			}
		case "name":
			lq.opts.Name = v
		case "client":
			lq.opts.Scope = v
		case "olderThan":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return nil, &paramError{name, "olderThan is a positive duration, such as 15m or 2h"}, nil
			}
			lq.opts.OlderThan = d
		case "needsAttention":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, &paramError{name, "needsAttention is true or false"}, nil
			}
			lq.opts.NeedsAttention = b
		case "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxLimit {
				return nil, &paramError{name, "limit is an integer from 1 to 1000"}, nil
			}
			lq.limit = n
		case "after":
			id, err := uuid.Parse(v)
			if err != nil {
				return nil, &paramError{name, "after is the id of the last operation of the previous page"}, nil
			}
			last, err := h.e.Get(ctx, id)
			if errors.Is(err, engine.ErrNotFound) {
				return nil, &paramError{name, "no operation " + id.String() + " (deleted since?): start again without after"}, nil
			}
			if err != nil {
				return nil, nil, err
			}
			lq.opts.After = last
			continue // not repeated: the next page has its own
		}
		lq.values.Set(name, v)
	}
	lq.opts.Max = lq.limit
	return lq, nil, nil
}

// next returns the query of the page after list, or nil when list is the
// last page.
func (lq *listQuery) next(list []*engine.Info) url.Values {
	if len(list) < lq.limit {
		return nil
	}
	v := url.Values{}
	for name, vs := range lq.values {
		v[name] = vs
	}
	v.Set("after", list[len(list)-1].ID.String())
	return v
}

// list reads the list that r asks for.
func (h *handler) list(w http.ResponseWriter, r *http.Request, strict bool) (*listQuery, []*engine.Info, bool) {
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.ReadTimeout)
	defer cancel()
	lq, perr, err := h.parseList(ctx, r.URL.Query(), strict)
	if err == nil && perr == nil {
		var list []*engine.Info
		if list, err = h.e.List(ctx, &lq.opts); err == nil {
			return lq, list, true
		}
	}
	if perr != nil {
		h.fail(w, r, http.StatusBadRequest, "invalid_request", perr.message, perr.param)
	} else {
		h.internalError(w, r, err)
	}
	return nil, nil, false
}

func (h *handler) listAPI(w http.ResponseWriter, r *http.Request) {
	lq, list, ok := h.list(w, r, true)
	if !ok {
		return
	}
	items := make([]listItem, len(list))
	for i, info := range list {
		items[i] = itemOf(info)
	}
	if next := lq.next(list); next != nil {
		w.Header().Set("Link", "<"+h.cfg.APIPath+"/operations?"+next.Encode()+`>; rel="next"`)
	}
	writeJSON(w, http.StatusOK, map[string]any{"operations": items})
}

// get reads the operation of r's path, with its steps; it answers 404 and
// returns false when there is none.
func (h *handler) get(w http.ResponseWriter, r *http.Request) (*engine.Info, bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		h.fail(w, r, http.StatusNotFound, "operation_not_found", "no such operation", "")
		return nil, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.ReadTimeout)
	defer cancel()
	info, err := h.e.Get(ctx, id)
	if errors.Is(err, engine.ErrNotFound) {
		h.fail(w, r, http.StatusNotFound, "operation_not_found", "no such operation", "")
		return nil, false
	}
	if err != nil {
		h.internalError(w, r, err)
		return nil, false
	}
	return info, true
}

func (h *handler) operationAPI(w http.ResponseWriter, r *http.Request) {
	info, ok := h.get(w, r)
	if !ok {
		return
	}
	w.Header().Set("Operation-Id", info.ID.String())
	writeJSON(w, http.StatusOK, operationOf(info))
}

// action is what an operator does to an operation.
type action string

const (
	actionRetry   action = "retry"
	actionCancel  action = "cancel"
	actionResolve action = "resolve"
	actionApprove action = "approve"
	actionReject  action = "reject"
)

// decides reports whether a is an approval or a rejection.
func (a action) decides() bool { return a == actionApprove || a == actionReject }

// request is an operator's request as a form or a body gives it.
type request struct {
	action action
	actor  string
	reason string
	// force: a retry of a server fault; resolution: a resolve's word.
	force      bool
	resolution engine.Resolution
}

// refusal is an action that the engine refused by rule, changing nothing.
type refusal struct {
	Status        int
	Code, Message string
	// Param is the field at fault of a 400.
	Param string
}

// act carries out an operator's request on the operation id and returns it
// afterwards, with its steps; a refusal when the engine refused (or there is
// no such operation).
// The action is bounded by ActionTimeout and goes on if the client goes away.
func (h *handler) act(r *http.Request, id uuid.UUID, req request) (*engine.Info, *refusal, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.cfg.ActionTimeout)
	defer cancel()
	ctx = engine.WithActor(ctx, req.actor)
	a, reason := req.action, req.reason
	var err error
	switch a {
	case actionRetry:
		_, err = h.e.Retry(ctx, id, &engine.RetryOpts{Force: req.force, Reason: reason})
	case actionCancel:
		_, err = h.e.Cancel(ctx, id, reason)
	case actionResolve:
		_, err = h.e.Resolve(ctx, id, req.resolution)
	case actionApprove:
		_, err = h.e.Approve(ctx, id, reason)
	case actionReject:
		_, err = h.e.Reject(ctx, id, reason)
	}
	var ref *refusal
	var why engine.Refusal
	switch {
	case err == nil:
		h.cfg.Logger.InfoContext(ctx, "operator action", slog.String("action", string(a)), slog.String("operation_id", id.String()),
			slog.String("reason", reason), slog.String("remote_addr", r.RemoteAddr))
	case !errors.As(err, &why):
		return nil, nil, err
	case why == engine.ErrNotFound:
		ref = &refusal{Status: http.StatusNotFound, Code: "operation_not_found", Message: "no such operation"}
	case a.decides():
		ref = decisionRefusal(a, why, err)
	default:
		ref = operatorRefusal(why, err)
	}
	if ref != nil {
		h.cfg.Logger.InfoContext(ctx, "operator action refused", slog.String("action", string(a)), slog.String("operation_id", id.String()),
			slog.String("code", ref.Code), slog.String("error", err.Error()))
		// The engine's text is for operators, but the URLs and addresses
		// its Go errors name (a lookup's, say) are for the log above.
		ref.Message = redact.Addresses(ref.Message)
		if ref.Code != "operation_not_found" {
			if info, gerr := h.e.Get(ctx, id); gerr == nil && info.NeedsAttention() {
				ref.Message += "; the operation needs attention (" + string(info.Attention.Code) + "), see " + runbookURL(h.cfg.RunbookURL, string(info.Attention.Code))
			}
		}
		return nil, ref, nil
	}
	info, err := h.e.Get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	return info, nil, nil
}

func (h *handler) actionAPI(a action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := uuid.Parse(r.PathValue("id"))
		if err != nil {
			h.fail(w, r, http.StatusNotFound, "operation_not_found", "no such operation", "")
			return
		}
		body := map[string]json.RawMessage{}
		raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxActionBody))
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			refuseBody(w)
			h.fail(w, r, http.StatusRequestEntityTooLarge, "request_too_large", "the body is larger than 16 KiB", "")
			return
		}
		if err != nil {
			h.fail(w, r, http.StatusBadRequest, "invalid_request", "the body could not be read", "")
			return
		}
		if len(strings.TrimSpace(string(raw))) > 0 {
			dec := json.NewDecoder(strings.NewReader(string(raw)))
			if err := dec.Decode(&body); err != nil || dec.More() {
				h.fail(w, r, http.StatusBadRequest, "invalid_request", "the body is a JSON object or empty", "")
				return
			}
		}
		req, param, msg := h.requestFromBody(a, body)
		if msg != "" {
			h.fail(w, r, http.StatusBadRequest, "invalid_request", msg, param)
			return
		}
		info, ref, err := h.act(r, id, req)
		if err != nil {
			h.internalError(w, r, err)
			return
		}
		if ref != nil {
			h.fail(w, r, ref.Status, ref.Code, ref.Message, ref.Param)
			return
		}
		w.Header().Set("Operation-Id", info.ID.String())
		writeJSON(w, http.StatusOK, operationOf(info))
	}
}

// requestFromBody reads an action's JSON body: "reason" and "actor" for
// every action (the actor defaults to "admin"), "force" for a retry,
// "outcome" ("made" or "not_made") and Config.ReferenceField for a resolve,
// which needs a reason. A bad body returns the field at fault and why.
func (h *handler) requestFromBody(a action, body map[string]json.RawMessage) (req request, param, msg string) {
	req = request{action: a, actor: "admin"}
	allowed := map[string]bool{"reason": true, "actor": true}
	switch a {
	case actionRetry:
		allowed["force"] = true
	case actionResolve:
		allowed["outcome"], allowed[h.cfg.ReferenceField] = true, true
	}
	for k := range body {
		if !allowed[k] {
			return req, k, fmt.Sprintf("a %s takes no %q", a, k)
		}
	}
	text := func(k string, dst *string) bool {
		raw, ok := body[k]
		if !ok {
			return true
		}
		if json.Unmarshal(raw, dst) != nil {
			return false
		}
		*dst = strings.TrimSpace(*dst)
		return true
	}
	if !text("reason", &req.reason) {
		return req, "reason", "reason is a string"
	}
	if len(req.reason) > maxReason {
		return req, "reason", "the reason is longer than 1000 bytes"
	}
	var actor string
	if !text("actor", &actor) || len(actor) > maxReason {
		return req, "actor", "actor is a string of at most 1000 bytes"
	}
	if actor != "" {
		req.actor = actor
	}
	if raw, ok := body["force"]; ok && json.Unmarshal(raw, &req.force) != nil {
		return req, "force", "force is true or false"
	}
	if a != actionResolve {
		return req, "", ""
	}
	var outcome, reference string
	if !text("outcome", &outcome) || outcome != "made" && outcome != "not_made" {
		return req, "outcome", `outcome is "made" or "not_made"`
	}
	if !text(h.cfg.ReferenceField, &reference) || len(reference) > maxReason {
		return req, h.cfg.ReferenceField, h.cfg.ReferenceField + " is a string"
	}
	if outcome == "not_made" && reference != "" {
		return req, h.cfg.ReferenceField, "a call that was not made has no " + h.cfg.ReferenceField
	}
	if req.reason == "" {
		return req, "reason", "a resolve needs a reason"
	}
	req.resolution = engine.Resolution{Made: outcome == "made", Reference: reference, Reason: req.reason}
	return req, "", ""
}

// operatorRefusal is the answer to a retry, a cancel or a resolve that the
// engine refused with why.
func operatorRefusal(why engine.Refusal, err error) *refusal {
	switch why {
	case engine.ErrNotFailed:
		return &refusal{Status: http.StatusConflict, Code: "operation_not_failed", Message: "only a failed or parked operation can be retried: this one has neither failed nor been parked"}
	case engine.ErrCompensated:
		return &refusal{Status: http.StatusConflict, Code: "operation_compensated", Message: "a step of the operation that calls out was compensated: run again under the same derived key, its call would be answered with the one that was undone, so it cannot be retried; start a new operation under a new key"}
	case engine.ErrFinished:
		return &refusal{Status: http.StatusConflict, Code: "operation_finished", Message: "the operation has finished: there is nothing to cancel"}
	case engine.ErrRunning:
		return &refusal{Status: http.StatusConflict, Code: "held_by_live_process", Message: "a live process holds the operation (a step or a lookup runs): try again in a moment"}
	case engine.ErrNotResolvable:
		return &refusal{Status: http.StatusConflict, Code: "not_resolvable", Message: "only an operation in progress whose call out waits past its settle window, or that is parked at one, can be resolved: " + err.Error()}
	case engine.ErrResolutionContradicts:
		return &refusal{Status: http.StatusConflict, Code: "resolution_contradicts_provider", Message: "the outside service, asked by the step's derived key, says otherwise: " + err.Error()}
	case engine.ErrInvalidResolution:
		return &refusal{Status: http.StatusBadRequest, Code: "invalid_request", Message: err.Error()}
	case engine.ErrFinal:
		return &refusal{Status: http.StatusConflict, Code: "operation_final", Message: "the operation's answer is final: it ended with a business answer or an operator's cancel, which its key keeps; one that failed with a server fault is reopened only when forced"}
	case engine.ErrOutcomeUnknown:
		return &refusal{Status: http.StatusConflict, Code: "outcome_unknown", Message: outcomeUnknownMessage(err)}
	case engine.ErrPastPivot:
		return &refusal{Status: http.StatusConflict, Code: "past_point_of_no_return", Message: "the operation is past its point of no return (a step that cannot be undone has succeeded, or may have): it only goes forward, so it cannot be cancelled"}
	}
	return otherRefusal(why, err)
}

// decisionRefusal is the answer to an approval or a rejection that the
// engine refused with why.
func decisionRefusal(a action, why engine.Refusal, err error) *refusal {
	switch why {
	case engine.ErrReasonRequired:
		what := "an approval"
		if a == actionReject {
			what = "a rejection"
		}
		return &refusal{Status: http.StatusBadRequest, Code: "invalid_request", Message: what + " needs a reason", Param: "reason"}
	case engine.ErrFinished:
		return &refusal{Status: http.StatusConflict, Code: "operation_final", Message: "the operation has ended: its answer is final, there is nothing to " + string(a)}
	case engine.ErrWaitOver:
		return &refusal{Status: http.StatusConflict, Code: "operation_final", Message: "the operation's wait for approval has expired: it fails as expired, whatever is decided now"}
	case engine.ErrNotAwaitingApproval:
		msg := "the operation is in progress and does not wait for approval: not yet, or no more (approved or rejected already)"
		if _, why, ok := strings.Cut(err.Error(), engine.ErrNotAwaitingApproval.Error()+": "); ok {
			msg += ": " + why
		}
		return &refusal{Status: http.StatusConflict, Code: "not_awaiting_approval", Message: msg}
	}
	return otherRefusal(why, err)
}

// otherRefusal answers a refusal that has no answer of its own (cannot_cancel,
// say): a refusal changes nothing, so it is a 409 with the engine's code.
func otherRefusal(why engine.Refusal, err error) *refusal {
	return &refusal{Status: http.StatusConflict, Code: string(why), Message: err.Error()}
}

// outcomeUnknownMessage says why a cancel must wait, and until when when that
// is known.
func outcomeUnknownMessage(err error) string {
	msg := "the outcome of the operation's call to the outside service is not known yet, so nothing can be undone"
	var ou *engine.RefusedError
	if errors.As(err, &ou) {
		switch {
		case ou.Accepted:
			msg += ": the outside service has it pending"
		case !ou.KnownAt.IsZero():
			msg += "; it will be known by " + ou.KnownAt.UTC().Format(time.RFC3339)
		default:
			msg += ": " + ou.Reason
		}
	}
	return msg
}

// internalError answers an error the handler has no better answer for: 503
// when the database did not answer, else 500 with the engine's text, which is
// for operators, as the whole handler is, without the addresses it names
// (the log has them).
func (h *handler) internalError(w http.ResponseWriter, r *http.Request, err error) {
	if engine.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded) {
		h.cfg.Logger.WarnContext(r.Context(), "opsweb: the database did not answer", slog.String("path", r.URL.Path), slog.String("error", err.Error()))
		w.Header().Set("Retry-After", "1")
		h.fail(w, r, http.StatusServiceUnavailable, "service_unavailable", "the database is not available; try again", "")
		return
	}
	h.cfg.Logger.ErrorContext(r.Context(), "opsweb: request failed", slog.String("path", r.URL.Path), slog.String("error", err.Error()))
	h.fail(w, r, http.StatusInternalServerError, "internal_error", redact.Addresses(err.Error()), "")
}
