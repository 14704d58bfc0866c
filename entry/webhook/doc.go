// Package webhook turns a provider's webhooks into net/http endpoints, of two
// kinds:
//
//   - Outcomes, for the provider's word on a call the service made (a refund
//     it asked for, answered "pending", has succeeded): it records each
//     event's outcome in the engine's inbox under the call's derived key, and
//     the external step that made the call applies it whenever it waits.
//   - Handler, for an event that is work of its own (a payment received): it
//     starts an operation keyed by the event's id.
//
// Both check each request's signature before anything in its body is
// believed, and act on an event exactly once, however often the provider
// delivers it (providers retry until they get a 2xx, and sometimes deliver
// twice anyway).
//
//	outcomes, err := webhook.Outcomes(e, &webhook.OutcomeConfig{
//		Secrets:     [][]byte{secret},
//		OutcomeFunc: refundOutcome, // the provider's event as an engine.Outcome
//	})
//	mux.Handle("POST /webhooks/stripe/refunds", outcomes)
//
//	h, err := webhook.Handler(e, paymentOp, &webhook.Config[payment]{
//		Scope:   "webhook:stripe",
//		Secrets: [][]byte{secret},
//	})
//	mux.Handle("POST /webhooks/stripe/payments", h)
//
// # Outcomes
//
// An external step whose call the provider accepted as pending
// (engine.Accepted), or whose answer was lost, waits; the provider tells the
// outcome later, by an event that names the idempotency key it was called
// with: the step's derived key. OutcomeConfig.OutcomeFunc, the application's
// mapping, reads such an event into an engine.Outcome:
//
//	func refundOutcome(_ *http.Request, body []byte) (engine.Outcome, error) {
//		var ev refundEvent // {"id", "type", "data": {"idempotencyKey", "refundId", "amount"}}
//		if err := json.Unmarshal(body, &ev); err != nil {
//			return engine.Outcome{}, errors.New("the body is not a refund event")
//		}
//		o := engine.Outcome{EventID: ev.ID, Record: reconcile.Record{
//			Key: ev.Data.IdempotencyKey, Reference: ev.Data.RefundID, Amount: ev.Data.Amount}}
//		switch ev.Type {
//		case "refund.succeeded":
//			o.Record.Status = reconcile.Succeeded
//		case "refund.failed":
//			o.Record.Status, o.Failure = reconcile.Failed, engine.Fail("refund_failed", "the provider could not refund")
//		default:
//			return o, webhook.ErrIgnore
//		}
//		return o, nil
//	}
//
// The endpoint records the outcome with engine.Engine.RecordOutcome in a
// transaction on the engine's pool, together with what OutcomeConfig.TxFunc
// writes there (the application's own record of the event, say), and answers
// 2xx only once that has committed. The inbox keeps each event once per key,
// whatever the step's state when it comes (not begun, calling, waiting,
// finished) and whichever process runs the operation: a success for what was
// asked (the step's reconcile function) settles the step (resolved by
// "event") even while its lookup lags behind, and forbids every "not made"
// under its key; a failure counts when the step's lookup, asked then, does
// not contradict it. There is nothing to loop over and no operation type to
// name: an outcome for a key that no step holds yet is kept for the step
// that will.
//
// Outcomes answers:
//
//   - 200 {"received":true} once the outcome, and TxFunc's writes, have
//     committed.
//   - 200 {"received":true,"duplicate":true} for every later delivery of the
//     event, however many come at once (TxFunc runs with added false).
//   - 200 {"received":true,"ignored":true} when OutcomeFunc returned ErrIgnore.
//   - 400 invalid_signature, as Handler; 400 invalid_event with
//     OutcomeFunc's error as message, or for an event id or key that is
//     empty, longer than MaxEventIDLen bytes or not text. Neither records
//     anything.
//   - 413 request_too_large for a body over OutcomeConfig.MaxBodyBytes (1 MiB).
//   - 422 idempotency_key_reused when the inbox holds another outcome under
//     the event's id and key (engine.ReusedError), with
//     error.mismatchedFields naming the parts of the outcome that differ
//     (engine.ReusedError): providers never do this, and the first
//     outcome stands. The same answer, with its fields, when TxFunc returns
//     an *engine.ReusedError: its own check of the event id, for a
//     delivery that the inbox, keyed by the event's id and key, cannot tell
//     from a new event (the id came before under another key, or with
//     another body than the outcome carries); nothing of it is kept.
//   - 503 service_unavailable with Retry-After when nothing could be recorded
//     and a delivery again will be: a database that does not answer within
//     OutcomeConfig.RecordTimeout (engine.IsUnavailable), a BEGIN or a COMMIT
//     that fails, secrets that cannot be read. A transient fault within the
//     transaction (a lock wait past lock_timeout, as when many deliveries of
//     one event come at once and queue on its key) is first tried again, in a
//     new transaction, while RecordTimeout lasts.
//   - 500 internal_error for any other failure (an outcome the engine refuses,
//     an error of TxFunc): nothing was committed, and the provider delivers
//     the event again.
//
// # Signatures
//
// Nothing in a body is believed before its signature is checked, by both
// endpoints alike: Config and OutcomeConfig have the same settings for it,
// named below by Config's. The built-in verifier (SignatureVerifier) reads
// Stripe's scheme from the header Provider-Signature (Config.Header):
//
//	Provider-Signature: t=1700000000,v1=7ba6fbbe0bbf311d25431bfe1d26233e7812cfdbe94f027f836eb08bdeb3eb18
//
// v1 is the hex HMAC-SHA256, under the endpoint's secret, of the timestamp (unix
// seconds) as written, a dot and the body (see ExampleSign). The timestamp must be within Config.Tolerance (5
// minutes) of the handler's clock, either way, so that a captured request
// cannot be replayed later; the event id stops a replay within the tolerance.
// Signatures are compared in constant time (hmac.Equal). Sign makes the header,
// for a sender.
//
// Several secrets are accepted at once (Config.Secrets, or Config.SecretsFunc
// for secrets that change without a restart), and the header may carry several
// v1 entries: one match is enough. To rotate a secret, add the new one beside
// the old, switch the provider to it, wait until no delivery signed with the old
// one can still come (the provider's retry window), then remove the old one.
//
// # Other providers
//
// A provider with another scheme gets a Verifier of its own (Config.Verifier,
// VerifierFunc for a function), which is given the request, the body already
// read, the secrets and the handler's clock. GitHub's, which signs the body
// alone in X-Hub-Signature-256, with no timestamp:
//
//	webhook.VerifierFunc(func(r *http.Request, body []byte, secrets [][]byte, _ time.Time) error {
//		sig, ok := strings.CutPrefix(r.Header.Get("X-Hub-Signature-256"), "sha256=")
//		got, err := hex.DecodeString(sig)
//		if !ok || err != nil {
//			return webhook.ErrMalformedSignature
//		}
//		for _, s := range secrets {
//			mac := hmac.New(sha256.New, s)
//			mac.Write(body)
//			if hmac.Equal(mac.Sum(nil), got) {
//				return nil
//			}
//		}
//		return webhook.ErrSignatureMismatch
//	})
//
// and, since GitHub puts the delivery's id in a header, an EventFunc that reads
// it there (see the package's tests).
//
// # Events
//
// Handler's Config.EventFunc reads the event (its id and type) and the operation's input
// from a signed request. The default takes the members "id" and "type" of the
// JSON body (ParseEvent), and the input from the whole body with encoding/json.
// The event's id is the operation's idempotency key within Config.Scope: 1 to
// MaxEventIDLen bytes of UTF-8 without control characters.
//
// A delivery again is told from another event under the same id by the
// engine's fingerprint of the input, one hash per top-level field: members of
// the body that the input does not keep (Stripe's pending_webhooks, which
// may change from one delivery to the next) take no part, and the operation's
// engine.OperationOpts.Unfingerprinted leaves out fields it keeps.
//
// # Answers
//
// Handler answers:
//
//   - 200 {"received":true} for the first delivery of an event, once its
//     operation is reserved (the reservation commits with the operation's
//     first database step). The answer does not wait for the operation to
//     finish unless Config.Wait says so, and does not say how it ended: the
//     engine retries and resumes it, and Engine.GetByKey(ctx, scope, id)
//     shows it. The Operation-Id header names it.
//   - 200 {"received":true,"duplicate":true} for every later delivery, whatever
//     became of the operation, and however many come at once: one of them
//     starts it.
//   - 200 {"received":true,"ignored":true} when EventFunc returned ErrIgnore.
//   - 400 invalid_signature for a missing, malformed or wrong signature, or a
//     timestamp outside the tolerance; 400 invalid_event for a signed body that
//     is not an event (not JSON, no id). Neither records anything, and a
//     provider that gets them stops retrying only when it gives up.
//   - 413 request_too_large for a body over Config.MaxBodyBytes (1 MiB).
//   - 422 idempotency_key_reused, with error.mismatchedFields, when an event id
//     comes again with a different event: providers never do this, and the
//     operation does not run twice.
//   - 503 with Retry-After when nothing could be recorded and a delivery again
//     will be: service_unavailable for a database that does not answer the
//     reservation within Config.ReserveTimeout (engine.IsUnavailable), an
//     engine that stops, secrets that cannot be read; overloaded for a process
//     that runs engine.Config.MaxInFlight operations already.
//   - 500 internal_error for any other failure before the reservation.
//
// Every error is idempotency's JSON {"error": {"code": ..., "message": ...}}.
//
// # Retention
//
// With Handler, an event's id stays taken as long as its operation is kept: until the
// retention job deletes it, after the operation type's retention
// (engine.OperationOpts.Retention, else engine.Config.Retention, 24 hours by
// default). A delivery after that starts the operation again. Keep a webhook's
// operations longer than the provider retries (Stripe: 3 days).
package webhook
