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
//	GET    /refunds                 the refunds made, oldest first, paged on request
//	POST   /faults                  inject faults into the next refund POSTs or lookups
//	DELETE /faults                  clear them
//	GET    /webhooks                every webhook event, oldest first
//	POST   /webhooks/redeliver      send every event again, some copies at once
//
// Errors answer {"error": {"code": "...", "message": "..."}} with a JSON content
// type. There is no authentication.
//
// # Refunds
//
// A refund POST answers 200 {"id": "pr_...", "status": ..., "orderId", "amount"}.
// A refund's status is "succeeded", "pending" or "failed": every refund
// succeeds at once but those made under the fault "pending" (see Faults),
// which are pending until their time comes and then succeed or fail. A failed
// refund paid nothing. The lookup by key answers {"id", "idempotencyKey",
// "orderId", "amount", "status", "requests", "createdAt"}, and GET /refunds
// answers {"refunds": [...], "next": ...} with a list of those, oldest first.
// GET /refunds takes, for reconciliation:
//
//   - createdAfter=<RFC 3339>: only the refunds made after that time;
//   - after=<refund id>: only those listed after that refund;
//   - limit=<1 to 1000>: at most that many. "next" is then the id to pass as
//     after for the next page, or null on the last one; it is always null
//     without a limit.
//
// A bad limit, a time that is not RFC 3339 or the id of no refund answers 400
// invalid_request naming the parameter; an empty createdAfter or after is as
// absent.
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
// POST /faults with {"mode": ..., "count": N, "delayMs": D, "outcome": O}
// makes the next N refund POSTs (count defaults to 1) fail in one of five
// ways, or the next N lookups by key in a sixth:
//
//   - "error": answer 503 and record nothing.
//   - "lost_response": record the refund as usual, then answer 503, so that the
//     caller does not hear that it succeeded.
//   - "slow": carry the request out D milliseconds (default 1000) after it
//     arrived, then answer as usual if the caller is still there. The request
//     is carried out whatever happened to its connection meanwhile.
//   - "pending": record the refund as pending and answer so; D milliseconds
//     (default 1000) later it becomes O, "succeeded" (the default) or
//     "failed", and gets its webhook event then (none while it is pending).
//     A repeated POST, the lookup and the list show it with its status of the
//     moment.
//   - "lagging_lookup": as "lost_response" (the refund is recorded, with its
//     webhook event, and the caller gets 503), and the lookup under its key
//     answers 404 refund_not_found until D milliseconds (default 1000) after
//     the refund was made, by the database's clock, as a provider's search
//     index that lags behind its records. The list shows it at once, and a
//     repeated POST answers it as usual.
//   - "lookup_error": the next N lookups, GET /refunds/by-key/{key}, answer
//     503 service_unavailable, whether or not a refund was made under the
//     key; refund POSTs take nothing from it.
//
// There is one fault at a time: a POST /faults replaces the one before, with
// what is left of it, whichever requests it was for.
//
// Every refund POST is carried out apart from its request, on a context that
// the caller's leaving does not cancel: once the provider has read a request,
// a caller that hangs up does not undo it, as with a real provider.
//
// A pending refund's outcome and the time it settles live in its row, and it
// settles either way: Run settles the pending refunds as they come due, and a
// request that shows a pending refund whose time has come (a repeated POST,
// the lookup, the list) settles it first. So a refund that was pending when
// its process died settles all the same, under the next process that runs
// Run or answers for it, and the statement that settles a refund makes its
// event, so that none settles without it.
//
// # Webhooks
//
// With a Config.WebhookURL, every refund the provider makes gets an event once
// it has its final status, inserted by the statement that makes the refund
// (one that succeeds at once) or that settles it (one that was pending):
//
//	{"id": "evt_...", "type": "refund.succeeded", "data": {"refundId": "pr_...", "idempotencyKey": "...", "orderId": "...", "amount": 1499, "status": "succeeded"}}
//
// with the type "refund.failed" and the status "failed" for a pending refund
// that failed. Whether a pending refund gets an event is settled when it is
// made, by the configuration of the process that makes it. Run (or
// RunWebhooks, the same) POSTs each event to the URL, signed with
// Config.WebhookSecret in the header Provider-Signature (entry/webhook.Sign),
// and sends it again with a backoff until an attempt gets a 2xx, as real
// providers do: every delivery of an event is the same body, with the same id.
// The events live in the provider's schema, so an event that a process did not
// deliver before it died is sent by the next process to run Run on the
// database. (A sender loop rather than River: the provider stands for a system
// outside the merchant's, and shares none of the merchant's machinery.)
//
// POST /webhooks/redeliver with {"copies": N} (1 to 100) sends every event made
// so far N more times, the copies of an event at once, and answers when they
// were sent: {"events": E, "sent": E*N, "delivered": D}, D those that got a
// 2xx. GET /webhooks answers {"events": [{"id", "type", "deliveries",
// "delivered"}]}: deliveries counts every POST of the event begun, delivered says
// whether one got a 2xx.
//
// # State
//
// The refunds (with the outcome and time of those pending), the webhook events
// and the pending faults live in the database schema "provider", which Migrate
// creates, so that they survive a crash of the process that serves them and
// are shared by every process that serves the provider from one database.
package fakeprovider
