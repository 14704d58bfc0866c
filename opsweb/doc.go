// Package opsweb is the operators' view of an engine over HTTP: server-rendered
// pages and a JSON API that list operations, show one with every step, and
// retry (Engine.Retry), cancel (Engine.Cancel) or resolve (Engine.Resolve)
// it, list the operations that wait for approval (Engine.Approvals) and
// approve (Engine.Approve) or reject (Engine.Reject) them, and a page of the
// engine's reconciliation (Engine.Reconcile). A service that embeds
// idemflow mounts the one handler that New returns, behind its own
// authentication:
//
//	ops, err := opsweb.New(e, &opsweb.Config{AuthFunc: opsweb.TokenAuth(adminToken)})
//	mux.Handle("/ops", ops)
//	mux.Handle("/ops/", ops)
//
// It uses the standard library only (html/template, net/http); the pages need
// no front-end build and run no script at all.
//
// # Paths
//
// The pages live under Config.BasePath ("/ops" by default) and the JSON API
// under Config.APIPath (BasePath+"/api" by default); mount the handler on
// both, without http.StripPrefix: the pages' links and forms name full paths.
//
//	GET  {BasePath}                                the list, newest first, with filters
//	GET  {BasePath}/operations/{id}                one operation and every step, with the forms
//	POST {BasePath}/operations/{id}/retry          the retry button: 303 back to the operation
//	POST {BasePath}/operations/{id}/cancel         the cancel button (form field "reason")
//	POST {BasePath}/operations/{id}/resolve        the resolve button (see engine.Engine.Resolve)
//	GET  {BasePath}/approvals                      the operations that wait for approval, oldest first, with the forms (see "Approvals")
//	POST {BasePath}/operations/{id}/approve        the approve button (form field "reason", required)
//	POST {BasePath}/operations/{id}/reject         the reject button (form field "reason", required)
//	GET  {BasePath}/reconciliation                 every source's last run and mismatches (see "Reconciliation")
//	POST {BasePath}/reconciliation/run             the run now button (form field "source"): 303 back to the page
//	GET  {APIPath}/operations                      {"operations": [...]}
//	GET  {APIPath}/operations/{id}                 one operation with its steps
//	POST {APIPath}/operations/{id}/retry           200 with the operation, reopened
//	POST {APIPath}/operations/{id}/cancel          body {"reason": "..."} (optional); 200 with the operation, cancelled
//	POST {APIPath}/operations/{id}/resolve         body {"outcome": "made"|"not_made", ReferenceField: "...", "reason": "..."}
//	GET  {APIPath}/approvals                       {"approvals": [...]}: those that wait for approval, oldest first
//	POST {APIPath}/operations/{id}/approve         body {"reason": "..."}; 200 with the operation
//	POST {APIPath}/operations/{id}/reject          body {"reason": "..."}; 200 with the operation
//	GET  {APIPath}/mismatches                      {"mismatches": [...], "total": N, "next": ...}: every source's, oldest first
//
// The list takes the query parameters status (in_progress, succeeded,
// failed), name (the operation type), client (the scope), olderThan (a Go
// duration: created longer ago than that), needsAttention (true: unfinished
// operations that wait for an operator, and any that a reconciliation
// mismatch names), limit (1 to 1000, default 100) and
// after (the id of the last operation of the previous page). A full page
// carries a Link header with rel="next", the URL of the next page. Each
// operation of the list has operationId, client, name, version, key, status,
// needsAttention, createdAt and finishedAt; one operation adds parked,
// attention (code and reason, for operators), failure (the error that ended
// it: the client's message and the operators' cause), runs, result and steps
// (name, kind, status, attempts, derivedKey, resolvedBy, startedAt,
// finishedAt, lastError for the client, lastCause for operators, and wait
// for a waiting step: reason, since, until, signal, need and approvedBy, as
// engine.WaitInfo has them), audit and mismatches (always an array: source, kind, key, reference, amount,
// recordStatus, recordCreatedAt, data, step, detail, firstSeen, lastSeen).
// A mismatch of {APIPath}/mismatches adds the operation it names:
// operationId (null for unknown_key), operation, client and operationStatus.
// The mismatches come in pages: limit (1 to 1000, default 100) and after (the
// next of the previous page, an opaque cursor); total counts every mismatch,
// and next is null on the last page, else the after of the next one, whose
// URL a Link header with rel="next" gives too.
//
// # Approvals
//
// An operation whose engine.ApprovalStep waits is listed on the approvals
// page and by {APIPath}/approvals (limit: 1 to 1000, default 100), the
// oldest first, each with operationId, client, name, version, key, step,
// requestedAt, expiresAt (null: never), need and approvedBy; the page has
// a form to approve it and one to reject it, each with a reason, and so
// does the operation's page while it waits. The actor is the HTTP Basic
// user name on the pages (so that each operator counts once), the body's
// "actor" (default "admin") on the API. An approval by an actor who
// approved the operation before is done and changes nothing. A form of the
// approvals page leads back to it (form field back=approvals), saying what
// became of the operation or why the request was refused; one of the
// operation's page to that page. The list is generic: a service that
// wants to show what each operation asks in its own terms (an amount, an
// order) serves a list of its own.
//
// # Reconciliation
//
// The reconciliation page shows, for each source of Config.ReconcileSources
// (the engine does not list its sources), its last run (when, records
// checked, not yet judged, unverifiable, pages), its mismatches, each
// linking to the operation it names, and a button that runs it now, bounded
// by ActionTimeout. A source that a mismatch names and the list leaves out
// shows too, without the button when the engine has no such source (any
// more). An operation that a mismatch names lists it on its own page, and
// needs attention (code reconciliation_mismatch) even once finished.
// Nothing is served at {APIPath}/reconciliation, which a service may keep
// for its own report.
//
// # Runbook
//
// The operation page links its attention code (the box that says why it
// needs attention), and the pages every mismatch kind, to the runbook's
// section on it: Config.RunbookURL#<code>, idemflow's docs/runbook.md on
// GitHub by default, which has a section per attention code of the engine
// and per mismatch kind. A refusal of retry, cancel or resolve of an
// operation that needs attention ends its message with that code and link.
// A service whose steps halt with codes of their own (engine.Halt) keeps a
// runbook with those sections too, and points RunbookURL at it.
//
// # Errors
//
// The JSON API's errors are {"error": {"code": "...", "message": "..."}}, with
// "param" naming the query parameter or field at fault. A page answers the
// same JSON to a client that does not accept text/html, and an HTML page to a
// browser. A message that carries the engine's text (a refusal's reason, an
// internal error, a source's failure), and an audit entry's detail, has every
// URL and network address in it replaced by "[address withheld]": a lookup's
// or a source's Go error names the outside service's address, which is for
// the log (the handler logs every refusal and failure whole), not for an
// answer.
//
//	400 invalid_request           a bad query parameter or body; a resolve, approve or reject without a reason (param "reason")
//	401 unauthenticated           Config.AuthFunc refused the request
//	403 cross_origin_request      a state-changing request from another origin (see "Forgery")
//	404 operation_not_found       no such operation (or not a UUID)
//	404 not_found, 405 method_not_allowed
//	409 operation_not_failed      retry of an operation that has neither failed nor been parked
//	409 operation_finished        cancel of a finished operation
//	409 operation_final           retry of an operation whose answer is final; approve or reject of one that ended, or whose wait for approval expired
//	409 not_awaiting_approval     approve or reject of an operation in progress that does not wait for approval (not yet, or approved or rejected already)
//	409 operation_running         cancel of an operation that a live run holds: try again once its lease expires
//	409 past_point_of_no_return   cancel of an operation whose step that cannot be undone has succeeded, or may have
//	409 outcome_unknown, held_by_live_process, not_resolvable, resolution_contradicts_provider, operation_compensated
//	                              see engine.Engine.Retry, Cancel and Resolve
//	404 source_not_found          run now of a source the engine does not have
//	500 reconcile_failed          run now failed (the source's listing, say); the message is the engine's
//	504 reconcile_timed_out       run now did not end within ActionTimeout; the mismatches it found so far are kept
//	500 internal_error            anything else; the message is the engine's, for operators
//	503 service_unavailable       the database did not answer in time (Retry-After: 1)
//
// # Authentication
//
// Config.AuthFunc sees every request before anything else happens; an error
// answers 401 unauthenticated, with WWW-Authenticate: Basic on the pages so
// that a browser asks for credentials, and nothing of the request is read.
// TokenAuth is such a function for one shared secret, taken as HTTP Basic
// authentication's password (any user name) or as a bearer token.
//
// # Forgery
//
// A browser sends HTTP Basic credentials with every request to the site,
// whoever made the page that sends it, so the forms' POSTs must tell a form of
// these pages from one of another site. The handler uses Go's
// http.CrossOriginProtection, and no token: every POST, of the pages and of the
// JSON API, whose Sec-Fetch-Site header (sent by every browser since 2023) says
// it comes from another site, or, without that header, whose Origin names
// another host than the request's Host, is refused with 403
// cross_origin_request before it reaches the engine. Requests without either
// header (curl, programs) are not a browser's and pass. GET and HEAD change
// nothing. The pages also forbid being framed (Content-Security-Policy
// frame-ancestors 'none', X-Frame-Options: DENY), so that another site cannot
// trick an operator into pressing a button, allow no script at all and forms
// only to this origin, and are never cached.
package opsweb
