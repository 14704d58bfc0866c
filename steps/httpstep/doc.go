// Package httpstep makes an external step of an idempotent HTTP call: what
// every step that calls a provider writes again. Each attempt sends the request
// under the step's derived key (engine.Attempt.Key, the same on every attempt),
// says what the answer means, and a retry first asks the service, by that key,
// whether a lost attempt went through.
//
//	engine.NewOperation("payout", []engine.Step[In, State]{
//		engine.TxStep("debit", debit).Compensate(credit),
//		httpstep.Step("pay", httpstep.Call[In, State]{
//			RequestFunc: func(ctx context.Context, at engine.Attempt, in In, s *State) (httpstep.Request, error) {
//				return httpstep.Request{URL: base + "/payments", Body: payment{Owner: in.Owner, Amount: in.Amount}}, nil
//			},
//			DecodeFunc: func(at engine.Attempt, in In, s *State, a httpstep.Answer) error {
//				return json.Unmarshal(a.Body, &s.Payment)
//			},
//			CheckFunc: func(in In, s *State) error {
//				if s.Payment.Amount != in.Amount {
//					return engine.Halt("payment_mismatch", "the payment under the key is for another amount")
//				}
//				return nil
//			},
//			Lookup: &httpstep.Lookup[In, State]{
//				URLFunc: func(at engine.Attempt, in In, s *State) string {
//					return base + "/payments/by-key/" + url.PathEscape(at.Key)
//				},
//				NotFoundFunc: httpstep.HasCode("payment_not_found"),
//			},
//		}).Retries(engine.RetryPolicy{MaxAttempts: 5}),
//	}, result, nil)
//
// It is built on engine's public API only: Step returns an
// engine.ExternalStepDef, whose Compensate and Retries can be chained, and
// Call.Run and Call.Find are the step's function and lookup, which a test (or
// a program outside an engine) can call too.
//
// # The call
//
// An attempt builds its request with RequestFunc: a method (POST by default),
// a URL, a body encoded as JSON, headers. The derived key goes in KeyHeader
// ("Idempotency-Key"), on the lookup's request too, and the request carries the
// step's context, so that deadlines and traces propagate. The answer's body is
// read whole, at most MaxBody bytes (1 MiB): a longer one fails the attempt,
// transiently. Requests go through Client, by default one client for the
// process with timeouts (never http.DefaultClient, which has none) that does
// not follow redirects: a POST turned into a GET by a 302 is no answer to it.
//
// # Answers
//
// ClassifyFunc says what an answer means; the default, Classify, follows
// Stripe's conventions. A 2xx is a success, which DecodeFunc reads into the
// state. A 4xx other than 408, 409, 425 and 429 is a refusal no retry changes:
// engine.Fail with the code and message of the body ({"code", "message"} or
// {"error": {"code", "message"}}), else "http_<status>", so the operation fails
// with the service's own code and the steps before are compensated. Everything
// else, a 5xx, a 408, 409, 425 or 429, a request that could not be sent, is
// transient: retried with the same key, after the answer's Retry-After (seconds
// or an HTTP date) when it is longer than the backoff. Wrap Classify to give a
// service's answers the meaning they have for the operation (a 402 that is a
// decline with the operation's own code, say).
//
// # Lookup
//
// Lookup says where the call made under a key can be read: Find GETs that URL.
// A 2xx is the call found: it is decoded into the state as the call's answer
// would have been (Lookup.DecodeFunc, by default Call.DecodeFunc), and the step
// succeeds without calling again. A 404 is the call not made, and the attempt
// calls, but only a 404 that NotFoundFunc (required) says is the service's own
// "not found": a 404 from a wrong URL or a proxy says nothing about the call.
// Every other answer is an error, and never a permanent one: the engine
// compensates an external step only after its lookup said "not made", so a
// lookup that cannot tell leaves the money where it is.
//
// # Checks
//
// A service that answers, under a key it has seen, the call made under it may
// answer a call for another amount or order than this attempt asks for. That is
// no success, and nothing may be undone on it either: CheckFunc compares what
// the call's answer and the lookup's filled in the state with the input, and
// any error it returns halts the operation (engine.Halt; CodeMismatch unless it
// is a *engine.HaltError already), which waits for an operator. When the state
// does not keep what is compared, DecodeFunc can compare and return engine.Halt
// itself.
package httpstep
