// Package idempotency turns an engine operation type into a net/http endpoint with
// Idempotency-Key semantics, as Stripe's API and the IETF draft
// draft-ietf-httpapi-idempotency-key-header describe them: a client sends a key it
// chose once per operation, on every attempt, and every attempt gets the answer of
// the one operation that the key started.
//
//	cfg := &idempotency.Config{Engine: e, ScopeFunc: clientOf}
//	h, err := idempotency.Handler(cfg, refundOp, &idempotency.EndpointOpts[refundIn]{
//		DecodeFunc:      decodeRefund,
//		Unfingerprinted: []string{"metadata"},
//		ErrorStatusFunc: refundErrorStatus,
//	})
//	mux.Handle("POST /refunds", h)
//
// # Keys
//
//	curl $URL/refunds -H 'Authorization: Bearer ...' -H 'Idempotency-Key: 8e03978e' -d '{...}'
//
// The key comes from the Idempotency-Key header: 1 to 255 characters from 0x21 to
// 0x7E. A value that starts with a double quote is a structured-field string (RFC
// 8941), whose content is the key: "8e03978e" and 8e03978e are the same key. No
// header answers 400 idempotency_key_missing; an empty, too long or malformed
// key, or the header sent twice, 400 idempotency_key_invalid. Keys are scoped:
// Config.ScopeFunc names the client of a request (an error answers 401
// unauthenticated), and the keys of two clients never meet.
//
// # Validation
//
//	func decodeRefund(r *http.Request, f idempotency.Fields) (in refundIn, err error) {
//		err = cmp.Or(f.Only("orderId", "amount", "metadata"),
//			f.Required("orderId", &in.OrderID), f.Required("amount", &in.Amount), f.Optional("metadata", &in.Metadata))
//		if err == nil && in.Amount <= 0 {
//			err = &idempotency.FieldError{Param: "amount", Message: "must be positive"}
//		}
//		return in, err
//	}
//
// The body must be at most Config.MaxBodyBytes (else 413 request_too_large) and
// one JSON object in UTF-8 with no duplicate keys at any depth; the endpoint's
// DecodeFunc then checks its fields and builds the operation's input. A request
// that fails any of this answers 400 invalid_request, with error.param naming
// the field where there is one. None of these answers consumes the key: a
// corrected request with the same key runs.
//
// # Fingerprint
//
//	{"orderId": "A-1042", "amount": 1000, "metadata": {"note": "late"}}
//	{"amount": 1e3, "orderId": "A-1042"}  // the same request: metadata is Unfingerprinted
//
// A request is recognised by its fingerprint: the method, the path and, for each
// top-level body field, a SHA-256 hash of the field's value in canonical JSON
// form, in which the order of object keys, white space, string escapes and the
// way a number is written do not matter (1, 1.0 and 1e0 are equal; numbers are
// compared exactly, with no limit on precision). Fields listed in
// EndpointOpts.Unfingerprinted are stored with the input but left out. The
// handler passes the fingerprint to engine.Start (engine.StartOpts.Fingerprint),
// which stores it with the operation, one hash per field and never the body,
// and compares it when the key comes again.
//
// # Answers
//
//	201 {"refundId": "re_..."}                                   the operation's result
//	422 {"error": {"code": "amount_exceeds_refundable", ...}}    a business error (engine.Fail)
//	202 {"operationId": "...", "status": "in_progress"}          still running after Config.Wait
//	409 request_in_progress, 422 idempotency_key_reused, 503, 429
//
// The first request with a key starts the operation and waits up to Config.Wait
// for it. It answers the result with EndpointOpts.SuccessStatus (201), or the
// business error that a step ended it with (engine.Fail) with the status
// EndpointOpts.ErrorStatusFunc gives (422 by default). If the operation has not
// finished by then, it answers 202 with a Location header
// (Config.OperationPathFunc); the operation goes on, and its answer is stored
// when it finishes. Transient failures inside a step are never answers: the
// engine retries the step.
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
// other failure before the key is reserved answers 500 internal_error. A
// request refused without reading its body (a 401 from ScopeFunc, a 413)
// answers with Connection: close (see RefuseBody).
//
// Every answer that concerns an operation (201, 202, a stored error, a replay, 409
// and 422 idempotency_key_reused) carries the operation's id in the Operation-Id
// header. Every error is a JSON object {"error": {"code": ..., "message": ...}}
// with Content-Type application/json; WriteError writes one for an application's
// other endpoints.
//
// # Reading an operation
//
//	read, err := idempotency.OperationHandler(cfg, nil)
//	mux.Handle("GET /operations/{operationId}", read)
//
// OperationHandler is where a client reads what a 202 pointed it at. It
// answers the client's own operation as OperationJSON (its status, whether it
// needs an operator, every step with its attempts, derived key, how it
// resolved and the client's text of its last error), and 404
// operation_not_found for another client's, an unknown or a malformed id.
//
// # Retention
//
//	e, err := engine.New(pool, &engine.Config{Operations: ops, Retention: 7 * 24 * time.Hour})
//
// A key is kept as long as its operation: until a retention job deletes
// finished operations older than the retention period (engine.Config.Retention,
// 24 hours by default, or engine.OperationOpts.Retention per type), and never
// while the operation is in progress. A request that brings back a key whose
// operation was deleted is a first request: it starts a new operation. Clients
// must therefore not retry with a key after the retention period.
//
// # Cost
//
// A replay, a 409 and a 422 cost the reservation, which the unique key refuses
// (it leaves a dead tuple for vacuum and commits nothing), then one indexed read
// of the operation by (scope, key). A request that fails validation costs
// nothing. A first request reads nothing: it costs only the engine's work
// (the reservation commits with the operation's first database step; the
// repository's docs/architecture.md counts the rest), and waiting for an
// operation that runs in this process reads nothing either. Two first requests
// that race both try to reserve the key: one wins, and the other answers as a
// later request would, after one read.
package idempotency
