// Package fakeservice is a fake external service for tests: it stands in for the
// bank or payment provider that an external step (engine.ExternalStep) calls, so
// that a test can count what took effect, lose answers, time out and decline,
// without a database and without the real service.
//
// A Service keeps everything in memory, is safe for concurrent use and is an
// http.Handler. Start serves one on an httptest server for the length of a test:
//
//	svc := fakeservice.Start(t, nil)
//	svc.FailNext(1, fakeservice.FaultLostResponse)
//	// ... run the operation whose step POSTs to svc.URL()+"/payments" ...
//	require.Equal(t, 1, svc.Effects())
//	require.Empty(t, svc.Duplicates())
//
// # Protocol
//
// Every answer has a JSON body and the content type application/json. Errors
// answer {"code": "...", "message": "..."}.
//
//	POST <any path>         make a request; needs an Idempotency-Key header and a JSON body
//	GET  /by-key/<key>      the answer of the request made under key, or 404
//
// A POST's first request under a key is made: it takes effect, is recorded with
// its body and is answered 201 Created with
//
//	{"id": "fs_1", "key": "<the key>", "request": <the body as sent, white space removed>}
//
// where ids are fs_1, fs_2... in the order the Service makes them. Options.Status changes
// the status; Options.AnswerFunc builds the answer instead (see "Refusals").
// Then, under the same key:
//
//   - the same body (equal as JSON: white space and the order of object members do
//     not matter) replays the stored answer, status and body byte for byte, with
//     the header Idempotent-Replayed: true, and takes no effect;
//   - another body is refused with 422 {"code": "idempotency_key_reused"}, as
//     real providers such as Stripe do, and takes no effect.
//
// A POST without the key header answers 400 {"code": "missing_idempotency_key"},
// one whose body is not JSON 400 {"code": "invalid_body"}. Keys are the
// Service's, not a path's: a key made on one path replays on another.
// Options.KeyHeader renames the header.
//
// Requests under one key are handled one at a time, in the order they arrive:
// of N requests sent at once under one key, exactly one takes effect and the
// others replay its answer.
//
// # Lookups
//
// GET <Options.LookupPrefix>/<key> (the prefix defaults to "/by-key"; the key is
// path-escaped) asks whether a request was made under key: 200 with the stored
// answer's body, or 404 {"code": "not_found"} when nothing took effect under it.
// This is what an external step's lookup asks after an attempt whose answer was
// lost. Any other GET answers 404 {"code": "no_route"}, so that a client that
// takes only a 404 with the code not_found for "not made" can tell a wrong
// lookup URL from it; other methods answer 405. A step that looks up at
// base+"/payments/by-key/"+url.PathEscape(key) wants the LookupPrefix
// "/payments/by-key".
//
// # Refusals
//
// Options.AnswerFunc, when set, is asked for the answer of every first request
// under a key: a 2xx status takes effect and is stored as above; any other status
// is a refusal, such as 422 {"code": "declined", "message": "..."}, which is
// answered as it is and takes no effect. Nothing is stored for a refusal: a lookup
// of its key answers 404, and a later request under the key is a first request
// again, asked of AnswerFunc again.
//
// # Faults
//
// Faults make a request fail, one at a time and deterministically. FailNext
// queues them for the next requests; Options.FaultFunc chooses one per request
// (by its body, its key, its attempt) when the queue is empty:
//
//   - FaultError answers 503 {"code": "unavailable"} with Retry-After: 0, before
//     anything happens: nothing takes effect.
//   - FaultLostResponse handles the request as usual (a first request takes
//     effect and is recorded), then drops the connection without an answer, so
//     that the client sees an error and does not know that it succeeded.
//   - FaultTimeout handles the request as usual, then holds the answer until the
//     client gives up (the request's context ends), Options.TimeoutDelay has
//     passed or the Service is closed, and drops the connection: a client whose
//     timeout is shorter than the delay times out.
//   - FaultLookupError answers a lookup 503, as FaultError answers a POST.
//
// FailNext gives FaultLookupError to lookups and the other faults to POSTs.
// FaultFunc is asked for lookups too: there FaultError is FaultLookupError, and
// FaultLostResponse and FaultTimeout drop the lookup's answer. A POST refused
// for its form (no key, a body that is not JSON) takes no fault.
//
// # Connections
//
// Every answer carries Connection: close, so that a client opens a connection
// per request. Go's http.Transport sends a request with an Idempotency-Key again
// on its own when a reused connection closes before any answer, which would
// hide a lost response from the client.
//
// # Inspection
//
// Effects counts the requests that took effect, EffectsFor those under one key
// (0 or 1, by construction), Requests every POST received, Lookups every lookup.
// Keys and Calls show every POST under a key and how it was answered.
// Duplicates finds equal bodies that took effect under different keys: the mark
// of a client that sends a fresh key on each attempt instead of a derived one.
package fakeservice
