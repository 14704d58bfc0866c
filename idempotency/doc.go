// Package idempotency turns an engine operation type into a net/http endpoint with
// Idempotency-Key semantics, as Stripe's API and the IETF draft
// draft-ietf-httpapi-idempotency-key-header describe them: a client sends a key it
// chose once per operation, on every attempt, and every attempt gets the answer of
// the one operation that the key started.
//
//	h, err := idempotency.Handler(cfg, refundOp, &idempotency.EndpointOpts[refundIn]{
//		DecodeFunc:      decodeRefund,
//		Unfingerprinted: []string{"metadata"},
//		ErrorStatusFunc: refundErrorStatus,
//	})
//	mux.Handle("POST /refunds", h)
//
// # Keys
//
// The key comes from the Idempotency-Key header: 1 to 255 characters from 0x21 to
// 0x7E. A value that starts with a double quote is a structured-field string (RFC
// 8941), whose content is the key: "8e03978e" and 8e03978e are the same key. A
// request without the header answers 400 idempotency_key_missing; one with an
// empty, too long or malformed key, or with the header sent twice, answers 400
// idempotency_key_invalid.
//
// Keys are scoped: Config.ScopeFunc names the client of a request (an error
// answers 401 unauthenticated), and the keys of two clients never meet.
//
// # Validation
//
// The body must be at most Config.MaxBodyBytes (else 413 request_too_large) and be
// one JSON object in UTF-8 with no duplicate keys at any depth; the endpoint's
// DecodeFunc then checks its fields and builds the operation's input. A request
// that fails any of this answers 400 invalid_request, with error.param naming the
// field where there is one. None of these answers consumes the key: a corrected
// request with the same key runs.
//
// # Fingerprint
//
// A request is recognised by its fingerprint: the method, the path and, for each
// top-level body field, a SHA-256 hash of the field's value in canonical JSON
// form, in which the order of object keys, white space, string escapes and the
// way a number is written do not matter (1, 1.0 and 1e0 are equal; numbers are
// compared exactly, with no limit on precision). Fields listed in
// EndpointOpts.Unfingerprinted are stored with the input but left out of the
// fingerprint. The handler passes the fingerprint to engine.Start
// (engine.StartOpts.Fingerprint), which stores it with the operation, one hash
// per field and never the body, and compares it when the key comes again.
//
// # Answers
//
// The first request with a key starts the operation and waits up to Config.Wait
// for it to finish. It answers the operation's result with
// EndpointOpts.SuccessStatus (201), or the business error that a step ended it
// with (engine.Fail) with the status EndpointOpts.ErrorStatusFunc gives (422 by
// default). If the operation has not finished by then, it answers 202
// {"operationId": "...", "status": "in_progress"} with a Location header
// (Config.OperationPathFunc); the operation goes on, and its answer is stored when
// it finishes. Transient failures inside a step are never answers: the engine
// retries the step.
//
// A business error answers {"error": {"code": ..., "message": ...}} followed by
// the members of the error's Details when those are an object (else a member
// "details"), in canonical form, so that every answer of the operation has the
// same bytes. An operation that ended with a server fault
// (engine.PermanentError.ServerFault: a step out of attempts, a failed
// compensation or result function) answers 500 operation_failed with a fixed
// message: what broke is for operators (the error's Cause), never for clients.
//
// A later request with the same key answers:
//
//   - 422 idempotency_key_reused when its fingerprint differs, with
//     error.mismatchedFields listing, sorted, the top-level fields that differ (a
//     field present in only one of the two requests differs) and "method" and
//     "path" where those differ;
//   - 409 request_in_progress with Retry-After (Config.RetryAfter) while the
//     operation runs;
//   - once the operation finished, its stored answer: the same status and a
//     byte-identical body, with the header Idempotent-Replayed: true, which a
//     first answer never carries.
//
// A request that cannot be served answers 503 with Retry-After, and the key
// stays free: service_unavailable while the engine stops, or when the database
// does not answer the reservation within Config.ReserveTimeout (should the
// reservation commit after all, a retry finds the operation); overloaded when
// the process runs engine.Config.MaxInFlight operations already. A client that
// runs engine.Config.MaxInFlightPerScope operations in the process already is
// over its share: 429 too_many_requests with Retry-After, the key free too. Any
// other failure before the key is reserved answers 500 internal_error.
//
// A request refused without reading its body (a 401 from ScopeFunc, a 413)
// answers with Connection: close (see RefuseBody).
//
// Every answer that concerns an operation (201, 202, a stored error, a replay, 409
// and 422 idempotency_key_reused) carries the operation's id in the Operation-Id
// header. Every error is a JSON object {"error": {"code": ..., "message": ...}}
// with Content-Type application/json; WriteError writes one for an application's
// other endpoints.
//
// OperationHandler is where a client reads what a 202 pointed it at:
//
//	read, err := idempotency.OperationHandler(cfg, nil)
//	mux.Handle("GET /operations/{operationId}", read)
//
// It answers the client's own operation as OperationJSON (its status, whether
// it needs an operator, every step with its attempts, derived key, how it
// resolved and the client's text of its last error), and 404
// operation_not_found for another client's, an unknown or a malformed id.
//
// # Retention
//
// A key is kept as long as its operation: until a retention job deletes finished
// operations older than the retention period (engine.Config.Retention, 24 hours by
// default, or engine.OperationOpts.Retention per type), and never while the
// operation is in progress. A request
// that brings back a key whose operation was deleted is a first request: it starts
// a new operation. Clients must therefore not retry with a key after the
// retention period.
//
// # Cost
//
// In database round trips, per request:
//
//   - a replay, a 409 and a 422: the reservation, which the unique key refuses
//     (it leaves a dead tuple for vacuum and commits nothing), then one indexed
//     read of the operation by (scope, key);
//   - a request that fails validation: none;
//   - a first request: no read, only the engine's work: the
//     reservation of the key commits in the same transaction as the first step's
//     work (or alone, just before a first step that calls out), and each further
//     database step commits once, with the checkpoint of the call-out step before
//     it. An operation of a database step, a call out and a database step (the
//     demo's refund) commits twice: once before its call, once after. Waiting for
//     an operation that runs in this process reads nothing.
//
// Two first requests that race both try to reserve the key: one wins, the
// other's insert finds the key taken and writes nothing, and that request
// answers as a later one would, after one read.
package idempotency
