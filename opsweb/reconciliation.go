package opsweb

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/redact"
)

// mismatchBody is a reconciliation mismatch: an outside service's record and
// how it disagrees with the step that holds its key.
type mismatchBody struct {
	Source          string          `json:"source"`
	Kind            string          `json:"kind"`
	Key             string          `json:"key"`
	Reference       string          `json:"reference"`
	Amount          int64           `json:"amount"`
	RecordStatus    string          `json:"recordStatus"`
	RecordCreatedAt time.Time       `json:"recordCreatedAt"`
	Data            json.RawMessage `json:"data"`
	// Step is empty for a record under no key of ours (unknown_key).
	Step      string    `json:"step"`
	Detail    string    `json:"detail"`
	FirstSeen time.Time `json:"firstSeen"`
	LastSeen  time.Time `json:"lastSeen"`
}

func mismatchOf(m *engine.Mismatch) mismatchBody {
	data := m.Data
	if len(data) == 0 {
		data = nil // null, not an empty message that does not encode
	}
	return mismatchBody{
		Source: m.Source, Kind: string(m.Kind), Key: m.Key, Reference: m.Reference, Amount: m.Amount,
		RecordStatus: string(m.RecordStatus), RecordCreatedAt: m.RecordCreatedAt, Data: data,
		Step: m.Step, Detail: m.Detail, FirstSeen: m.FirstSeen, LastSeen: m.LastSeen,
	}
}

// mismatchItem is a mismatch of the list, with the operation it names.
type mismatchItem struct {
	mismatchBody
	// OperationID is null for a record under no key of ours; Operation,
	// Client and OperationStatus are empty then, and once the operation was
	// deleted.
	OperationID     *uuid.UUID `json:"operationId"`
	Operation       string     `json:"operation"`
	Client          string     `json:"client"`
	OperationStatus string     `json:"operationStatus"`
}

// mismatchParams are the query parameters of {APIPath}/mismatches.
var mismatchParams = []string{"limit", "after"}

// mismatchesAPI serves {APIPath}/mismatches: a page of every source's
// mismatches, oldest first, with their total and the cursor of the next page.
func (h *handler) mismatchesAPI(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := &engine.MismatchListOpts{}
	for name, vs := range q {
		if !slices.Contains(mismatchParams, name) {
			h.fail(w, r, http.StatusBadRequest, "invalid_request", "unknown query parameter "+strconv.Quote(name)+"; the mismatches take limit and after", name)
			return
		}
		if len(vs) > 1 {
			h.fail(w, r, http.StatusBadRequest, "invalid_request", name+" is given more than once", name)
			return
		}
	}
	if v := strings.TrimSpace(q.Get("limit")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			h.fail(w, r, http.StatusBadRequest, "invalid_request", "limit is an integer from 1 to 1000", "limit")
			return
		}
		opts.Limit = n
	}
	opts.After = strings.TrimSpace(q.Get("after"))
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.ReadTimeout)
	defer cancel()
	res, err := h.e.MismatchList(ctx, opts)
	if errors.Is(err, engine.ErrInvalidCursor) {
		h.fail(w, r, http.StatusBadRequest, "invalid_request", "after is the next of the previous page", "after")
		return
	}
	if err != nil {
		h.internalError(w, r, err)
		return
	}
	items := make([]mismatchItem, len(res.Mismatches))
	for i := range res.Mismatches {
		m := &res.Mismatches[i]
		items[i] = mismatchItem{mismatchBody: mismatchOf(m), Operation: m.Operation, Client: m.Scope, OperationStatus: string(m.OperationStatus)}
		if m.OperationID != uuid.Nil {
			items[i].OperationID = &m.OperationID
		}
	}
	var next *string
	if res.Next != "" {
		next = &res.Next
		v := url.Values{"after": {res.Next}}
		if opts.Limit != 0 {
			v.Set("limit", strconv.Itoa(opts.Limit))
		}
		w.Header().Set("Link", "<"+h.cfg.APIPath+"/mismatches?"+v.Encode()+`>; rel="next"`)
	}
	writeJSON(w, http.StatusOK, map[string]any{"mismatches": items, "total": res.Total, "next": next})
}

type reconciliationPage struct {
	common
	Sources []sourceSection
	Flash   string
	Problem *refusal
}

// sourceSection is a source's part of the reconciliation page.
type sourceSection struct {
	Name string
	// Report is the source's last run; nil when the engine has no source of
	// that name (a name of Config.ReconcileSources that is wrong, or a source
	// removed since its mismatches were found).
	Report     *engine.ReconcileReport
	Mismatches []engine.Mismatch
}

// newReconciliationPage reads every source's last run: those of
// Config.ReconcileSources, then any other that a mismatch names.
func (h *handler) newReconciliationPage(ctx context.Context) (*reconciliationPage, error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.ReadTimeout)
	defer cancel()
	all, err := h.e.Mismatches(ctx)
	if err != nil {
		return nil, err
	}
	names := slices.Clone(h.cfg.ReconcileSources)
	for _, m := range all {
		if !slices.Contains(names, m.Source) {
			names = append(names, m.Source)
		}
	}
	page := &reconciliationPage{Sources: []sourceSection{}}
	for _, name := range names {
		s := sourceSection{Name: name}
		rep, err := h.e.Reconciliation(ctx, name)
		switch {
		case errors.Is(err, engine.ErrUnknownSource):
			for _, m := range all {
				if m.Source == name {
					s.Mismatches = append(s.Mismatches, m)
				}
			}
		case err != nil:
			return nil, err
		default:
			s.Report, s.Mismatches = rep, rep.Mismatches
		}
		page.Sources = append(page.Sources, s)
	}
	return page, nil
}

func (h *handler) reconciliationPage(w http.ResponseWriter, r *http.Request) {
	page, err := h.newReconciliationPage(r.Context())
	if err != nil {
		h.internalError(w, r, err)
		return
	}
	// Only a source of the page's: a link cannot make it say anything else.
	if ran := r.URL.Query().Get("ran"); slices.ContainsFunc(page.Sources, func(s sourceSection) bool { return s.Name == ran && s.Report != nil }) {
		page.Flash = "Ran " + ran + " now: its last run below is that one."
	}
	h.render(w, r, http.StatusOK, "reconciliation", page)
}

// reconcilePage is the "Run now" button: a run of the form's source, then 303
// to the reconciliation page; a failure renders the page with it.
func (h *handler) reconcilePage(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxActionBody)
	if err := r.ParseForm(); err != nil {
		refuseBody(w)
		h.fail(w, r, http.StatusBadRequest, "invalid_request", "the form could not be read", "")
		return
	}
	source := r.PostForm.Get("source")
	if source == "" {
		h.fail(w, r, http.StatusBadRequest, "invalid_request", "the form names no source to run", "source")
		return
	}
	actor := "admin"
	if user, _, ok := r.BasicAuth(); ok && user != "" {
		actor = user
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.cfg.ActionTimeout)
	defer cancel()
	rep, err := h.e.Reconcile(ctx, source)
	var ref *refusal
	switch {
	case err == nil:
		h.cfg.Logger.InfoContext(ctx, "operator action", slog.String("action", "reconcile"), slog.String("source", source),
			slog.String("actor", actor), slog.Int("mismatches", len(rep.Mismatches)), slog.String("remote_addr", r.RemoteAddr))
		http.Redirect(w, r, h.cfg.BasePath+"/reconciliation?ran="+url.QueryEscape(source), http.StatusSeeOther)
		return
	case errors.Is(err, engine.ErrUnknownSource):
		ref = &refusal{Status: http.StatusNotFound, Code: "source_not_found", Message: "the engine has no reconciliation source " + strconv.Quote(source)}
	case ctx.Err() != nil:
		// Before IsUnavailable, which would blame the database for a slow source.
		ref = &refusal{Status: http.StatusGatewayTimeout, Code: "reconcile_timed_out", Message: "the run did not end within " + h.cfg.ActionTimeout.String() +
			": the mismatches of the pages it read are kept, not its report; a later run checks the rest"}
	case engine.IsUnavailable(err):
		h.internalError(w, r, err)
		return
	default:
		// A source's error names its URL: the log below has it.
		ref = &refusal{Status: http.StatusInternalServerError, Code: "reconcile_failed", Message: redact.Addresses(err.Error())}
	}
	h.cfg.Logger.WarnContext(ctx, "operator action failed", slog.String("action", "reconcile"), slog.String("source", source),
		slog.String("code", ref.Code), slog.String("error", err.Error()))
	if ref.Status == http.StatusNotFound || !acceptsHTML(r) {
		h.fail(w, r, ref.Status, ref.Code, ref.Message, "")
		return
	}
	page, err := h.newReconciliationPage(r.Context())
	if err != nil {
		h.internalError(w, r, err)
		return
	}
	page.Problem = ref
	h.render(w, r, ref.Status, "reconciliation", page)
}
