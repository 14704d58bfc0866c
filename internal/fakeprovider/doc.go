// Package fakeprovider is the demo's fake payment provider: an HTTP API that refunds
// orders the way a real provider such as Stripe does, so that the refund workflow
// has something outside its own database to call, to lose answers from and to
// retry against.
//
// # API
//
// Server.Handler serves these routes, relative to wherever it is mounted (the demo
// mounts it under /provider with http.StripPrefix):
//
//	POST   /refunds                 refund an order; needs an Idempotency-Key header
//	GET    /refunds/by-key/{key}    the refund made under an idempotency key, or 404
//	GET    /refunds                 every refund made, oldest first
//	POST   /faults                  inject faults into the next refund POSTs
//	DELETE /faults                  clear them
//
// Errors answer {"error": {"code": "...", "message": "..."}} with a JSON content
// type. There is no authentication.
//
// # Idempotency
//
// A refund POST with an idempotency key that the provider has seen answers the
// refund made under that key, whatever the body, and counts the request against it
// (the refund's requests): the same key never refunds twice, even when two
// requests with it arrive at once. An orderId that starts with "DECLINE-" is
// declined with 402 and the code "declined", and nothing is recorded.
//
// # Faults
//
// POST /faults with {"mode": ..., "count": N, "delayMs": D} makes the next N
// refund POSTs (count defaults to 1) fail in one of three ways:
//
//   - "error": answer 503 and record nothing.
//   - "lost_response": record the refund as usual, then answer 503, so that the
//     caller does not hear that it succeeded.
//   - "slow": wait D milliseconds (default 1000), then answer as usual. The
//     refund is made after the wait even when the caller gave up meanwhile.
//
// # State
//
// The refunds and the pending faults live in the database schema "provider", which
// Migrate creates, so that they survive a crash of the process that serves them
// and are shared by every process that serves the provider from one database.
package fakeprovider
