// Package demoapi is the demo's HTTP API: the refund and order endpoints on
// idempotency.Handler, the reads, authentication by bearer token, the answers
// for bad paths and methods, the operators' pages (opsweb, at /ops and /admin),
// the approvals of refunds that wait for them (GET /admin/approvals, POST
// /admin/operations/{id}/approve and /reject) and River UI behind the admin
// token, and the HTTP server's limits
// (NewHTTPServer, ConnLimiter). cmd/demo serves it; cmd/bench's http mode measures the same
// handler. docs/demo-api.md describes what it answers.
package demoapi
