package opsweb

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/redact"
)

//go:embed pages.html
var pagesSource string

// styleSheet is the pages' only style, inline: its hash in the
// Content-Security-Policy lets it, and nothing else, apply.
const styleSheet = `
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d232a; background: #f6f7f9; }
header { display: flex; gap: 2em; align-items: baseline; padding: .6em 1.5em; background: #1d2b3a; }
header a { color: #dfe8f1; text-decoration: none; margin-right: 1.2em; }
header a.home { font-weight: 600; color: #fff; }
main { padding: 1em 1.5em 3em; }
h1 { font-size: 1.35em; margin: .4em 0 .8em; }
h1 .mono { font-size: .8em; color: #5b6673; font-weight: normal; }
h2 { font-size: 1.1em; margin: 1.6em 0 .5em; }
table { border-collapse: collapse; background: #fff; width: 100%; }
th, td { text-align: left; padding: .35em .6em; border-bottom: 1px solid #e1e5ea; vertical-align: top; }
th { background: #eef1f4; font-weight: 600; white-space: nowrap; }
caption { text-align: left; font-weight: 600; padding: .3em 0; }
table.summary { width: auto; margin-bottom: 1em; }
td.num { text-align: right; }
td.empty { color: #5b6673; text-align: center; padding: 1.5em; }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .92em; word-break: break-all; }
.status { padding: .05em .45em; border-radius: 3px; background: #e1e5ea; white-space: nowrap; }
.status.st-succeeded { background: #d6f0dc; color: #1b5e2b; }
.status.st-failed { background: #f8d9d9; color: #8a1c1c; }
.status.st-in_progress, .status.st-running { background: #fff0c2; color: #6b5000; }
.status.st-compensated, .status.st-skipped { background: #e4e0f5; color: #3f3474; }
.attention { color: #a04000; font-weight: 600; }
td.attention a { color: inherit; }
form.filters { display: flex; flex-wrap: wrap; gap: .8em; align-items: center; margin: 0 0 1em; }
input, select, button { font: inherit; }
button { padding: .3em 1em; border: 1px solid #2b5a8a; border-radius: 3px; background: #2b6cb0; color: #fff; cursor: pointer; }
button#cancel, button.reject { background: #b03030; border-color: #8a2020; }
form.decide { display: flex; gap: .4em; margin: 0 0 .3em; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: .2em 1.2em; margin: 0 0 1em; }
dl.facts dt { color: #5b6673; }
dl.facts dd { margin: 0; }
.box { border-left: 4px solid; padding: .5em 1em; margin: 1em 0; background: #fff; }
.box p { margin: .3em 0; }
.box.attention { border-color: #d97706; font-weight: normal; color: inherit; }
.box.failure { border-color: #b03030; }
.box.wait { border-color: #2b6cb0; }
.flash { padding: .5em 1em; border-radius: 3px; }
.flash.ok { background: #d6f0dc; }
.flash.error { background: #f8d9d9; }
.actions { display: flex; gap: 2em; flex-wrap: wrap; }
.actions form { background: #fff; padding: .8em 1em; max-width: 30em; }
.actions p { color: #5b6673; font-size: .9em; margin: .5em 0 0; }
td.error small { color: #5b6673; }
p.pager { margin-top: 1em; }
section.source { margin-bottom: 2.5em; }
table.mismatches { margin-top: 1em; }
`

// contentSecurityPolicy allows the pages nothing but their inline style and
// forms to this origin: no script at all, no framing.
var contentSecurityPolicy = func() string {
	sum := sha256.Sum256([]byte(styleSheet))
	return "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; " +
		"img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
}()

// parsePages parses the pages' templates, with links under base and to the
// runbook's sections.
func parsePages(base, runbook string) (*template.Template, error) {
	opURL := func(id uuid.UUID) string { return base + "/operations/" + id.String() }
	return template.New("pages").Funcs(template.FuncMap{
		"styleSheet": func() template.CSS { return template.CSS(styleSheet) },
		"opURL":      opURL,
		// runbook takes a code or a reconcile.Kind.
		"runbook": func(code any) string { return runbookURL(runbook, fmt.Sprint(code)) },
		// redact: an answer's text, without internal addresses.
		"redact": redact.Addresses,
		"when":   formatTime,
		"whenp": func(t *time.Time) string {
			if t == nil {
				return ""
			}
			return formatTime(*t)
		},
		"duration": func(d time.Duration) string { return d.Round(time.Second).String() },
		"inc":      func(i int) int { return i + 1 },
		"join":     strings.Join,
		// named: a mismatch's operation id names one (not unknown_key's nil).
		"named": func(id uuid.UUID) bool { return id != uuid.Nil },
	}).Parse(pagesSource)
}

// runbookURL is the link to the runbook's section on code (an attention
// code, a mismatch kind): base#code, the code lower case with anything but
// letters, digits, '_' and '-' as '-', which is the anchor that GitHub, and
// most Markdown renderers, give a heading that is the code.
func runbookURL(base, code string) string {
	anchor := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '-'
	}, code)
	return base + "#" + anchor
}

func formatTime(t time.Time) string {
	return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
}

// common is what every page has.
type common struct {
	Title string
	Base  string
	// Refresh, when positive, reloads the page after so many seconds.
	Refresh int
}

func (c *common) setCommon(title, base string) { c.Title, c.Base = title, base }

// commonPage is every page's data.
type commonPage interface{ setCommon(title, base string) }

type errorPage struct {
	common
	Status     int
	StatusText string
	Code       string
	Message    string
	Param      string
}

// render executes the page name with data and answers it with status.
func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, name string, data commonPage) {
	title := name
	switch d := data.(type) {
	case *errorPage:
		title = d.StatusText
	case *operationPage:
		title = d.Info.Name + " " + d.Info.ID.String()
	case *listPage:
		title = "Operations"
	case *reconciliationPage:
		title = "Reconciliation"
	case *approvalsPage:
		title = "Approvals"
	}
	data.setCommon(title, h.cfg.BasePath)
	var buf bytes.Buffer
	if err := h.pages.ExecuteTemplate(&buf, name, data); err != nil {
		h.cfg.Logger.ErrorContext(r.Context(), "opsweb: a page did not render", slog.String("page", name), slog.String("error", err.Error()))
		http.Error(w, "the page did not render", http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Content-Security-Policy", contentSecurityPolicy)
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

type statusOption struct {
	Value, Label string
	Selected     bool
}

type listPage struct {
	common
	Query          url.Values
	Statuses       []statusOption
	NeedsAttention bool
	Summary        []engine.InProgress
	// Names are the types of Summary, for the filter's suggestions.
	Names   []string
	Items   []*engine.Info
	Next    string
	Problem string
}

func (h *handler) listPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	page := &listPage{Query: q, NeedsAttention: q.Get("needsAttention") == "true"}
	for _, s := range []statusOption{{"", "any", false}, {"in_progress", "in progress", false}, {"succeeded", "succeeded", false}, {"failed", "failed", false}} {
		s.Selected = s.Value == q.Get("status")
		page.Statuses = append(page.Statuses, s)
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.ReadTimeout)
	defer cancel()
	summary, err := h.e.InProgress(ctx)
	if err != nil {
		h.internalError(w, r, err)
		return
	}
	page.Summary = summary
	for _, s := range summary {
		if !slices.Contains(page.Names, s.Name) {
			page.Names = append(page.Names, s.Name)
		}
	}
	lq, perr, err := h.parseList(ctx, q, false)
	switch {
	case err != nil:
		h.internalError(w, r, err)
		return
	case perr != nil:
		page.Problem = perr.message
		page.Items = []*engine.Info{}
		h.render(w, r, http.StatusBadRequest, "list", page)
		return
	}
	if page.Items, err = h.e.List(ctx, &lq.opts); err != nil {
		h.internalError(w, r, err)
		return
	}
	if next := lq.next(page.Items); next != nil {
		page.Next = h.cfg.BasePath + "?" + next.Encode()
	}
	h.render(w, r, http.StatusOK, "list", page)
}

type operationPage struct {
	common
	Info      *engine.Info
	CanRetry  bool
	CanCancel bool
	// ForceRetry: the retry reopens an operation whose client was told of a
	// server fault (a forced retry).
	ForceRetry bool
	// CanResolve: the operation may be resolved (a parked one, or one whose
	// step waits for its outcome); RefField is the reference's form field.
	CanResolve bool
	RefField   string
	// Approval is the step that waits for approval, which the operator may
	// approve or reject; nil when none waits.
	Approval *engine.StepInfo
	Flash    string
	Problem  *refusal
}

// doneMessage is the flash of ?done= after an action, for the operation as it
// is now.
func doneMessage(done string, info *engine.Info) string {
	switch {
	case done == "cancelled":
		return "Cancelled: its succeeded steps were undone, last first."
	case done == "resolved":
		return "Resolved: the operation goes on from your word (" + string(info.Status) + ")."
	case done == "approved":
		return approvedMessage(info)
	case done == "rejected":
		return rejectedMessage(info)
	case done != "retried":
		return ""
	case info.Parked:
		return "Reopened, and parked again: see why below."
	case info.Status == engine.StatusInProgress:
		return "Reopened: a worker runs it again. This page reloads until the run ends or waits."
	}
	return "Reopened: the new run " + string(info.Status) + "."
}

func (h *handler) operationPage(w http.ResponseWriter, r *http.Request) {
	info, ok := h.get(w, r)
	if !ok {
		return
	}
	done := r.URL.Query().Get("done")
	page := h.newOperationPage(info)
	page.Flash = doneMessage(done, info)
	if followsRun(done, info) {
		page.Refresh = 1 // follow the run the operator asked for
		if done != "retried" {
			page.Flash += " This page reloads until the run ends or waits."
		}
	}
	h.render(w, r, http.StatusOK, "operation", page)
}

func (h *handler) newOperationPage(info *engine.Info) *operationPage {
	return &operationPage{
		Info:       info,
		CanRetry:   info.Parked || reopenable(info),
		ForceRetry: reopenable(info),
		CanCancel:  info.Status == engine.StatusInProgress,
		CanResolve: resolvable(info),
		RefField:   h.cfg.ReferenceField,
		Approval:   approvalWait(info),
	}
}

// actionPage is a form's button: the action, then 303 to the operation's
// page, which says what happened; a refusal renders the page with it.
func (h *handler) actionPage(a action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := uuid.Parse(r.PathValue("id"))
		if err != nil {
			h.fail(w, r, http.StatusNotFound, "operation_not_found", "no such operation", "")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxActionBody)
		if err := r.ParseForm(); err != nil {
			refuseBody(w)
			h.fail(w, r, http.StatusBadRequest, "invalid_request", "the form could not be read", "")
			return
		}
		// back: the approvals page's forms lead back to it.
		back := a.decides() && r.PostForm.Get("back") == "approvals"
		form := map[string]json.RawMessage{}
		for k := range r.PostForm {
			if k == "back" {
				continue
			}
			if k == "force" {
				form[k] = json.RawMessage("true")
				continue
			}
			v, _ := json.Marshal(r.PostForm.Get(k))
			form[k] = v
		}
		// The actor is the HTTP Basic user name, whatever the form says.
		delete(form, "actor")
		if user, _, ok := r.BasicAuth(); ok && user != "" {
			form["actor"], _ = json.Marshal(user)
		}
		req, param, msg := h.requestFromBody(a, form)
		if msg != "" {
			h.fail(w, r, http.StatusBadRequest, "invalid_request", msg, param)
			return
		}
		_, ref, err := h.act(r, id, req)
		if err != nil {
			h.internalError(w, r, err)
			return
		}
		if ref == nil {
			done := map[action]string{actionRetry: "retried", actionCancel: "cancelled", actionResolve: "resolved",
				actionApprove: "approved", actionReject: "rejected"}[a]
			to := h.cfg.BasePath + "/operations/" + id.String() + "?done=" + done
			if back {
				to = h.cfg.BasePath + "/approvals?done=" + done + "&operation=" + id.String()
			}
			http.Redirect(w, r, to, http.StatusSeeOther)
			return
		}
		if ref.Code == "operation_not_found" || !acceptsHTML(r) {
			h.fail(w, r, ref.Status, ref.Code, ref.Message, ref.Param)
			return
		}
		if back {
			h.renderApprovals(w, r, ref.Status, &approvalsPage{Problem: ref, Operation: id})
			return
		}
		info, ok := h.get(w, r)
		if !ok {
			return
		}
		page := h.newOperationPage(info)
		page.Problem = ref
		h.render(w, r, ref.Status, "operation", page)
	}
}

// reopenable reports whether info ended with an answer that only a forced
// retry reopens: a server fault (not a business answer, nor a cancel, which
// are final).
func reopenable(info *engine.Info) bool {
	return info.Status == engine.StatusFailed && info.Error != nil && info.Error.ServerFault() && info.Error.Code != engine.CodeCancelled
}

// resolvable reports whether an operator may be offered Resolve for info: it
// is in progress, and parked or waiting for an external step's outcome (the
// engine refuses one whose settle window has not passed, saying until when),
// not for a signal, a moment or approvals.
func resolvable(info *engine.Info) bool {
	if info.Status != engine.StatusInProgress {
		return false
	}
	if info.Parked {
		return true
	}
	for _, s := range info.Steps {
		if s.Status == engine.StepStatusWaiting && (s.Wait == nil || s.Wait.Reason == engine.WaitOutcome) {
			return true
		}
	}
	return false
}
