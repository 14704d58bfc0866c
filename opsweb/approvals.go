package opsweb

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
)

// approvalItem is an operation that waits for approvals
// (engine.AwaitingApproval), for operators.
type approvalItem struct {
	OperationID uuid.UUID `json:"operationId"`
	Client      string    `json:"client"`
	Name        string    `json:"name"`
	Version     int       `json:"version"`
	Key         string    `json:"key"`
	// Step is the approval step that waits.
	Step string `json:"step"`
	// RequestedAt is when the operation reached it, ExpiresAt when its wait
	// expires (null: never).
	RequestedAt time.Time  `json:"requestedAt"`
	ExpiresAt   *time.Time `json:"expiresAt"`
	// Need is how many distinct actors must approve it, ApprovedBy those who
	// did, in the order they did.
	Need       int      `json:"need"`
	ApprovedBy []string `json:"approvedBy"`
}

func approvalOf(a *engine.AwaitingApproval) approvalItem {
	return approvalItem{OperationID: a.OperationID, Client: a.Scope, Name: a.Name, Version: a.Version, Key: a.Key, Step: a.Step,
		RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt, Need: a.Need, ApprovedBy: append([]string{}, a.ApprovedBy...)}
}

// approvalsLimit reads the approvals list's query: limit, from 1 to 1000,
// 100 when not given. strict refuses other parameters (the API's; the page
// ignores them).
func approvalsLimit(q url.Values, strict bool) (int, *paramError) {
	for name := range q {
		if strict && name != "limit" {
			return 0, &paramError{name, "unknown query parameter " + strconv.Quote(name) + "; the approvals take limit"}
		}
	}
	if len(q["limit"]) > 1 {
		return 0, &paramError{"limit", "limit is given more than once"}
	}
	v := strings.TrimSpace(q.Get("limit"))
	if v == "" {
		return 100, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxLimit {
		return 0, &paramError{"limit", "limit is an integer from 1 to 1000"}
	}
	return n, nil
}

func (h *handler) approvalsAPI(w http.ResponseWriter, r *http.Request) {
	limit, perr := approvalsLimit(r.URL.Query(), true)
	if perr != nil {
		h.fail(w, r, http.StatusBadRequest, "invalid_request", perr.message, perr.param)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.ReadTimeout)
	defer cancel()
	list, err := h.e.Approvals(ctx, limit)
	if err != nil {
		h.internalError(w, r, err)
		return
	}
	items := make([]approvalItem, len(list))
	for i := range list {
		items[i] = approvalOf(&list[i])
	}
	writeJSON(w, http.StatusOK, map[string]any{"approvals": items})
}

type approvalsPage struct {
	common
	Items []engine.AwaitingApproval
	// Full: there may be more than Items, the oldest Limit.
	Full  bool
	Limit int
	// Flash says what became of Operation after an approval or a
	// rejection; Problem why it was refused.
	Flash     string
	Problem   *refusal
	Operation uuid.UUID
}

// renderApprovals renders the approvals page, with the operation id's
// flash or refusal, and status.
func (h *handler) renderApprovals(w http.ResponseWriter, r *http.Request, status int, page *approvalsPage) {
	limit, perr := approvalsLimit(r.URL.Query(), false)
	if perr != nil {
		page.Problem = &refusal{Status: http.StatusBadRequest, Code: "invalid_request", Message: perr.message, Param: perr.param}
		page.Items = []engine.AwaitingApproval{}
		h.render(w, r, http.StatusBadRequest, "approvals", page)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.ReadTimeout)
	defer cancel()
	list, err := h.e.Approvals(ctx, limit)
	if err != nil {
		h.internalError(w, r, err)
		return
	}
	page.Items, page.Limit, page.Full = list, limit, len(list) == limit
	h.render(w, r, status, "approvals", page)
}

// approvalsPageGet is the approvals page; after an approval or a rejection
// from it, ?done=approved|rejected&operation=<id> says what became of the
// operation.
func (h *handler) approvalsPageGet(w http.ResponseWriter, r *http.Request) {
	page := &approvalsPage{}
	q := r.URL.Query()
	if done := q.Get("done"); done == "approved" || done == "rejected" {
		if id, err := uuid.Parse(q.Get("operation")); err == nil {
			ctx, cancel := context.WithTimeout(r.Context(), h.cfg.ReadTimeout)
			info, err := h.e.Get(ctx, id)
			cancel()
			if err == nil {
				page.Operation, page.Flash = id, doneMessage(done, info)
			}
		}
	}
	h.renderApprovals(w, r, http.StatusOK, page)
}

// approvalWait returns the step of info that waits for approval, if any.
func approvalWait(info *engine.Info) *engine.StepInfo {
	if info.Status != engine.StatusInProgress {
		return nil
	}
	for i := range info.Steps {
		s := &info.Steps[i]
		if s.Status == engine.StepStatusWaiting && s.Wait != nil && s.Wait.Reason == engine.WaitApproval {
			return s
		}
	}
	return nil
}

// approvedMessage is the flash of an approval that was done, for the
// operation as it is now: an approval by an operator who had approved it
// before is done too, and changes nothing.
func approvedMessage(info *engine.Info) string {
	if s := approvalWait(info); s != nil && len(s.Wait.ApprovedBy) < s.Wait.Need {
		return "Approved: " + strconv.Itoa(len(s.Wait.ApprovedBy)) + " of " + strconv.Itoa(s.Wait.Need) + " approvals (" +
			strings.Join(s.Wait.ApprovedBy, ", ") + "); it waits for more, each by another operator."
	}
	if info.Status == engine.StatusInProgress {
		return "Approved: it goes on."
	}
	return "Approved: it went on and " + string(info.Status) + "."
}

// rejectedMessage is the flash of a rejection that was done.
func rejectedMessage(info *engine.Info) string {
	if info.Status == engine.StatusInProgress {
		return "Rejected: its succeeded steps are undone, last first, and it fails."
	}
	return "Rejected: it " + string(info.Status) + "."
}

// followsRun reports whether the page of info, after done, should reload
// until the run that carries it on ends or waits: it is in progress, not
// parked, and waits for nothing but an approval that was decided.
func followsRun(done string, info *engine.Info) bool {
	if info.Status != engine.StatusInProgress || info.Parked {
		return false
	}
	if done == "retried" {
		return true
	}
	if done != "approved" && done != "rejected" {
		return false
	}
	for _, s := range info.Steps {
		if s.Status != engine.StepStatusWaiting {
			continue
		}
		if s.Wait == nil || s.Wait.Reason != engine.WaitApproval || done == "approved" && len(s.Wait.ApprovedBy) < s.Wait.Need {
			return false
		}
	}
	return true
}
