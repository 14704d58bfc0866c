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
//	GET    /webhooks                every webhook event, oldest first
//	POST   /webhooks/redeliver      send every event again, some copies at once
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
// # Webhooks
//
// With a Config.WebhookURL, every refund the provider makes gets an event,
// inserted by the statement that makes the refund:
//
//	{"id": "evt_...", "type": "refund.succeeded", "data": {"refundId": "pr_...", "idempotencyKey": "...", "orderId": "...", "amount": 1499}}
//
// RunWebhooks POSTs it to the URL, signed with Config.WebhookSecret in the
// header Provider-Signature (entry/webhook.Sign), and sends it again with a
// backoff until an attempt gets a 2xx, as real providers do: every delivery of
// an event is the same body, with the same id. The events live in the
// provider's schema, so an event that a process did not deliver before it died
// is sent by the next process to run RunWebhooks on the database. (A sender
// loop rather than River: the provider stands for a system outside the
// merchant's, and shares none of the merchant's machinery.)
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
// The refunds, the webhook events and the pending faults live in the database schema "provider", which
// Migrate creates, so that they survive a crash of the process that serves them
// and are shared by every process that serves the provider from one database.
package fakeprovider
