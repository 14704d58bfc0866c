package idempotency_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
)

const (
	okBody       = `{"account":"acct-1","amount":100}`
	blockedBody  = `{"account":"blocked","amount":100}`
	declinedBody = `{"account":"declined","amount":100}`
)

// exchange is one request of a scenario and what its answer must be.
type exchange struct {
	req request
	// releaseFirst releases the blocked operations and waits until the operation
	// of the previous answer has finished, before the request is sent.
	releaseFirst bool

	status   int
	code     string // the error code; empty for a success or a 202
	param    string
	mismatch []string
	replayed bool
	// retryAfter is the Retry-After of a 409; default "1".
	retryAfter string
	// sameBodyAs and sameOperationAs are 1-based indexes of an earlier exchange
	// whose body must be byte-identical, whose Operation-Id must be the same.
	sameBodyAs      int
	sameOperationAs int
	// newOperation says the answer concerns a different operation from every
	// earlier one.
	newOperation bool
}

// scenario is a sequence of exchanges with one engine and database.
type scenario struct {
	name      string
	opts      harnessOpts
	exchanges []exchange
	// charges and operations are the counts at the end.
	charges, operations int
}

// preOperation are the codes of answers given before an operation is involved:
// they carry no Operation-Id and consume no key.
var preOperation = map[string]bool{
	idempotency.CodeUnauthenticated: true,
	idempotency.CodeKeyMissing:      true,
	idempotency.CodeKeyInvalid:      true,
	idempotency.CodeInvalidRequest:  true,
	idempotency.CodeRequestTooLarge: true,
}

// TestHandler plays the rows of the contract's Idempotency table, and the
// behaviours around them, against a real engine.
func TestHandler(t *testing.T) {
	t.Parallel()

	// corrected is the request that follows a rejected one with the same key: it
	// runs, as a first request.
	corrected := exchange{req: request{body: okBody}, status: http.StatusCreated}
	// invalidBody is a rejected body, then a corrected request with the same key.
	invalidBody := func(name, body, param string) scenario {
		return scenario{name: name, exchanges: []exchange{
			{req: request{body: body}, status: http.StatusBadRequest, code: idempotency.CodeInvalidRequest, param: param},
			corrected,
		}, charges: 1, operations: 1}
	}
	invalidKey := func(name string, keys ...string) scenario {
		return scenario{name: name, exchanges: []exchange{
			{req: request{keys: keys, body: okBody}, status: http.StatusBadRequest, code: idempotency.CodeKeyInvalid},
		}}
	}
	large := `{"account":"acct-1","amount":100,"metadata":{"note":"` + strings.Repeat("x", 64<<10) + `"}}`

	tests := []scenario{
		{
			name: "NoKey",
			exchanges: []exchange{
				{req: request{noKey: true, body: okBody}, status: http.StatusBadRequest, code: idempotency.CodeKeyMissing},
				corrected,
			},
			charges: 1, operations: 1,
		},
		invalidKey("KeyEmpty", ""),
		invalidKey("KeyTooLong", strings.Repeat("k", 256)),
		invalidKey("KeySpace", "key 1"),
		invalidKey("KeyNotASCII", "clé"),
		invalidKey("KeyQuotedEmpty", `""`),
		invalidKey("KeyQuoteAlone", `"`),
		invalidKey("KeyQuoteUnterminated", `"key-1`),
		invalidKey("KeyQuotedBadEscape", `"key\1"`),
		invalidKey("KeyQuotedWithParameter", `"key-1";a=1`),
		invalidKey("KeyTwice", "key-1", "key-2"),
		{
			name: "KeyLongest",
			exchanges: []exchange{
				{req: request{keys: []string{strings.Repeat("k", 255)}, body: okBody}, status: http.StatusCreated},
			},
			charges: 1, operations: 1,
		},
		{
			name: "KeyQuotedIsBareKey",
			exchanges: []exchange{
				{req: request{keys: []string{`"key-1"`}, body: okBody}, status: http.StatusCreated},
				{req: request{keys: []string{"key-1"}, body: okBody}, status: http.StatusCreated, replayed: true, sameBodyAs: 1, sameOperationAs: 1},
				{req: request{keys: []string{`"a\"b\\c"`}, body: okBody}, status: http.StatusCreated, newOperation: true},
				{req: request{keys: []string{`a"b\c`}, body: okBody}, status: http.StatusCreated, replayed: true, sameBodyAs: 3, sameOperationAs: 3},
			},
			charges: 2, operations: 2,
		},
		{
			name: "Unauthenticated",
			exchanges: []exchange{
				{req: request{scope: "-", body: okBody}, status: http.StatusUnauthorized, code: idempotency.CodeUnauthenticated},
			},
		},
		invalidBody("BodyNotJSON", `{"account":"acct-1",`, ""),
		invalidBody("BodyEmpty", "", ""),
		invalidBody("BodyNotObject", `[{"account":"acct-1","amount":100}]`, ""),
		invalidBody("BodyTrailingData", okBody+` {}`, ""),
		invalidBody("BodyNotUTF8", "{\"account\":\"acct-\xff\",\"amount\":100}", ""),
		invalidBody("FieldDuplicate", `{"account":"acct-1","amount":100,"amount":100}`, "amount"),
		invalidBody("FieldDuplicateNested", `{"account":"acct-1","amount":100,"options":{"a":[{"b":1,"b":2}]}}`, "options.a[0].b"),
		invalidBody("FieldUnknown", `{"account":"acct-1","amount":100,"colour":"red"}`, "colour"),
		invalidBody("FieldsUnknownFirstNamed", `{"account":"acct-1","amount":100,"metadata":{"a":1},"options":{"b":2},"zz":0,"aa":0}`, "aa"),
		invalidBody("FieldMissing", `{"amount":100}`, "account"),
		invalidBody("FieldNull", `{"account":null,"amount":100}`, "account"),
		invalidBody("FieldWrongType", `{"account":"acct-1","amount":"100"}`, "amount"),
		invalidBody("FieldNotInteger", `{"account":"acct-1","amount":1.5}`, "amount"),
		invalidBody("FieldOutOfRange", `{"account":"acct-1","amount":0}`, "amount"),
		{
			name: "BodyTooLarge",
			exchanges: []exchange{
				{req: request{body: large}, status: http.StatusRequestEntityTooLarge, code: idempotency.CodeRequestTooLarge},
				{req: request{body: large, chunked: true}, status: http.StatusRequestEntityTooLarge, code: idempotency.CodeRequestTooLarge},
				corrected,
			},
			charges: 1, operations: 1,
		},
		{
			name: "FirstRequestRuns",
			exchanges: []exchange{
				{req: request{body: okBody}, status: http.StatusCreated},
			},
			charges: 1, operations: 1,
		},
		{
			name: "SameRequestFinishedReplays",
			exchanges: []exchange{
				{req: request{body: `{"account":"acct-1","amount":100,"options":{"a":1,"b":[true,null,"é"]}}`}, status: http.StatusCreated},
				{req: request{body: `{"account":"acct-1","amount":100,"options":{"a":1,"b":[true,null,"é"]}}`}, status: http.StatusCreated, replayed: true, sameBodyAs: 1, sameOperationAs: 1},
				// Key order, white space, escapes and the way numbers are written do not matter.
				{req: request{body: "{ \"options\" : {\"b\": [true, null, \"\\u00e9\"], \"a\": 1.0e0},\n\t\"amount\": 100, \"account\": \"acct-1\" }"}, status: http.StatusCreated, replayed: true, sameBodyAs: 1, sameOperationAs: 1},
				// Nor does metadata, added, changed or removed.
				{req: request{body: `{"account":"acct-1","amount":100,"options":{"a":1,"b":[true,null,"é"]},"metadata":{"note":"retry"}}`}, status: http.StatusCreated, replayed: true, sameBodyAs: 1, sameOperationAs: 1},
			},
			charges: 1, operations: 1,
		},
		{
			name: "DifferentRequestRejected",
			exchanges: []exchange{
				{req: request{body: okBody}, status: http.StatusCreated},
				{req: request{body: `{"account":"acct-1","amount":200}`}, status: http.StatusUnprocessableEntity, code: idempotency.CodeKeyReused, mismatch: []string{"amount"}, sameOperationAs: 1},
				{req: request{body: `{"account":"acct-2","amount":100,"options":{}}`}, status: http.StatusUnprocessableEntity, code: idempotency.CodeKeyReused, mismatch: []string{"account", "options"}, sameOperationAs: 1},
				{req: request{method: http.MethodPut, body: okBody}, status: http.StatusUnprocessableEntity, code: idempotency.CodeKeyReused, mismatch: []string{"method"}, sameOperationAs: 1},
				{req: request{path: "/payments", body: okBody}, status: http.StatusUnprocessableEntity, code: idempotency.CodeKeyReused, mismatch: []string{"path"}, sameOperationAs: 1},
				{req: request{method: http.MethodPut, path: "/payments", body: `{"account":"acct-1","amount":200}`}, status: http.StatusUnprocessableEntity, code: idempotency.CodeKeyReused, mismatch: []string{"amount", "method", "path"}, sameOperationAs: 1},
				// The key still answers its own request.
				{req: request{body: okBody}, status: http.StatusCreated, replayed: true, sameBodyAs: 1, sameOperationAs: 1},
			},
			charges: 1, operations: 1,
		},
		{
			name: "KeysAreScoped",
			exchanges: []exchange{
				{req: request{scope: "client-a", body: okBody}, status: http.StatusCreated},
				{req: request{scope: "client-b", body: okBody}, status: http.StatusCreated, newOperation: true},
				{req: request{scope: "client-b", body: `{"account":"acct-1","amount":300}`}, status: http.StatusUnprocessableEntity, code: idempotency.CodeKeyReused, mismatch: []string{"amount"}, sameOperationAs: 2},
			},
			charges: 2, operations: 2,
		},
		{
			name: "NotFinishedWithinWait",
			opts: harnessOpts{wait: time.Millisecond, retryAfter: 1500 * time.Millisecond},
			exchanges: []exchange{
				{req: request{body: blockedBody}, status: http.StatusAccepted},
				{req: request{body: blockedBody}, status: http.StatusConflict, code: idempotency.CodeRequestInProgress, retryAfter: "2", sameOperationAs: 1},
				{req: request{body: `{"account":"blocked","amount":1}`}, status: http.StatusUnprocessableEntity, code: idempotency.CodeKeyReused, mismatch: []string{"amount"}, sameOperationAs: 1},
				{releaseFirst: true, req: request{body: blockedBody}, status: http.StatusCreated, replayed: true, sameOperationAs: 1},
				{req: request{body: blockedBody}, status: http.StatusCreated, replayed: true, sameBodyAs: 4, sameOperationAs: 1},
			},
			charges: 1, operations: 1,
		},
		{
			name: "BusinessErrorStoredAndReplayed",
			exchanges: []exchange{
				{req: request{body: declinedBody}, status: http.StatusPaymentRequired, code: "card_declined"},
				{req: request{body: declinedBody}, status: http.StatusPaymentRequired, code: "card_declined", replayed: true, sameBodyAs: 1, sameOperationAs: 1},
				{req: request{keys: []string{"key-2"}, body: `{"account":"unknown","amount":100}`}, status: http.StatusNotFound, code: "account_not_found", newOperation: true},
				{req: request{keys: []string{"key-2"}, body: `{"account":"unknown","amount":100}`}, status: http.StatusNotFound, code: "account_not_found", replayed: true, sameBodyAs: 3, sameOperationAs: 3},
			},
			charges: 1, operations: 2, // the declined charge is recorded, the unknown account's is not
		},
		{
			name: "TransientFailureRetriedNotAnswered",
			opts: harnessOpts{workers: true},
			exchanges: []exchange{
				{req: request{body: `{"account":"flaky","amount":100}`}, status: http.StatusCreated},
				{req: request{body: `{"account":"flaky","amount":100}`}, status: http.StatusCreated, replayed: true, sameBodyAs: 1, sameOperationAs: 1},
			},
			charges: 1, operations: 1,
		},
		{
			name: "AttemptsExhaustedStoredAsServerFault",
			opts: harnessOpts{maxAttempts: 1},
			exchanges: []exchange{
				{req: request{body: `{"account":"broken","amount":100}`}, status: http.StatusInternalServerError, code: "operation_failed"},
				{req: request{body: `{"account":"broken","amount":100}`}, status: http.StatusInternalServerError, code: "operation_failed", replayed: true, sameBodyAs: 1, sameOperationAs: 1},
			},
			charges: 1, operations: 1,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t, tt.opts)
			var answers []response
			seen := map[string]bool{}
			for i, ex := range tt.exchanges {
				if ex.releaseFirst {
					h.release()
					waitFinished(t, h, answers[i-1])
				}
				res := h.do(t, ex.req)
				answers = append(answers, res)
				n := i + 1
				require.Equal(t, ex.status, res.status, "exchange %d: body %s", n, res.body)
				require.Equal(t, "application/json", res.header.Get("Content-Type"), "exchange %d", n)
				if ex.replayed {
					require.Equal(t, "true", res.header.Get(idempotency.HeaderReplayed), "exchange %d", n)
				} else {
					require.Empty(t, res.header.Values(idempotency.HeaderReplayed), "exchange %d", n)
				}

				opID := res.header.Get(idempotency.HeaderOperationID)
				if preOperation[ex.code] {
					require.Empty(t, opID, "exchange %d", n)
				} else {
					_, err := uuid.Parse(opID)
					require.NoError(t, err, "exchange %d: Operation-Id", n)
				}
				if ex.sameOperationAs > 0 {
					require.Equal(t, answers[ex.sameOperationAs-1].header.Get(idempotency.HeaderOperationID), opID, "exchange %d", n)
				}
				if ex.newOperation {
					require.False(t, seen[opID], "exchange %d: a new operation", n)
				}
				seen[opID] = true
				if ex.sameBodyAs > 0 {
					require.Equal(t, string(answers[ex.sameBodyAs-1].body), string(res.body), "exchange %d: byte-identical body", n)
				}

				switch {
				case ex.code != "":
					e := decodeError(t, res.body)
					require.EqualValues(t, ex.code, e.Error.Code, "exchange %d", n)
					require.NotEmpty(t, e.Error.Message, "exchange %d", n)
					require.Equal(t, ex.param, e.Error.Param, "exchange %d", n)
					require.Equal(t, ex.mismatch, e.Error.MismatchedFields, "exchange %d", n)
				case res.status == http.StatusAccepted:
					require.JSONEq(t, `{"operationId":"`+opID+`","status":"in_progress"}`, string(res.body))
					require.Equal(t, "/operations/"+opID, res.header.Get("Location"))
				default:
					var out chargeOut
					require.NoError(t, json.Unmarshal(res.body, &out), "exchange %d", n)
					require.NotZero(t, out.ChargeID)
					require.NotEmpty(t, out.Account)
				}
				if res.status == http.StatusConflict {
					want := ex.retryAfter
					if want == "" {
						want = "1"
					}
					require.Equal(t, want, res.header.Get("Retry-After"), "exchange %d", n)
				}
			}
			charges, operations := h.counts(t)
			require.Equal(t, tt.charges, charges, "charges recorded")
			require.Equal(t, tt.operations, operations, "operations")
		})
	}
}

// waitFinished waits until the operation that res concerns has finished.
func waitFinished(t *testing.T, h *harness, res response) {
	t.Helper()
	id, err := uuid.Parse(res.header.Get(idempotency.HeaderOperationID))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = h.e.Wait(ctx, id)
	require.NoError(t, err)
}

// TestAnswers checks the exact bytes of answers that clients parse.
func TestAnswers(t *testing.T) {
	t.Parallel()

	t.Run("BusinessErrorWithDetails", func(t *testing.T) {
		t.Parallel()
		h := setup(t, harnessOpts{})
		res := h.do(t, request{body: declinedBody})
		require.Equal(t, http.StatusPaymentRequired, res.status)
		require.Equal(t, `{"error":{"code":"card_declined","message":"the card was declined","declineCode":"insufficient_funds","limit":150,"retryable":false}}`, string(res.body))
	})

	t.Run("Mismatch", func(t *testing.T) {
		t.Parallel()
		h := setup(t, harnessOpts{})
		require.Equal(t, http.StatusCreated, h.do(t, request{body: okBody}).status)
		res := h.do(t, request{body: `{"account":"acct-1","amount":7}`})
		require.Equal(t, http.StatusUnprocessableEntity, res.status)
		require.Equal(t, `{"error":{"code":"idempotency_key_reused","message":"this idempotency key was used for a different request; use a new key for a new request","mismatchedFields":["amount"]}}`, string(res.body))
	})

	t.Run("EngineFaultHidesItsMessage", func(t *testing.T) {
		t.Parallel()
		h := setup(t, harnessOpts{maxAttempts: 1})
		res := h.do(t, request{body: `{"account":"broken","amount":100}`})
		require.Equal(t, http.StatusInternalServerError, res.status)
		require.Equal(t, `{"error":{"code":"operation_failed","message":"the operation failed because of a server fault; it was not completed"}}`, string(res.body))
	})

	// An operation started without HTTP has the engine's fingerprint of its
	// input: the same fields, and no method or path.
	t.Run("KeyOfOperationStartedWithoutHTTP", func(t *testing.T) {
		t.Parallel()
		h := setup(t, harnessOpts{})
		started, err := engine.Start(context.Background(), h.e, h.op, "client-a", "key-1", chargeIn{Account: "acct-1", Amount: 100}, nil)
		require.NoError(t, err)
		waitFinished(t, h, response{header: http.Header{idempotency.HeaderOperationID: {started.ID.String()}}})
		res := h.do(t, request{body: okBody})
		require.Equal(t, http.StatusUnprocessableEntity, res.status)
		require.Equal(t, started.ID.String(), res.header.Get(idempotency.HeaderOperationID))
		require.Equal(t, []string{"method", "path"}, decodeError(t, res.body).Error.MismatchedFields)
	})

	t.Run("InvalidRequest", func(t *testing.T) {
		t.Parallel()
		h := setup(t, harnessOpts{})
		res := h.do(t, request{body: `{"account":"acct-1","amount":"ten"}`})
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Equal(t, `{"error":{"code":"invalid_request","message":"amount: expected an integer, got string","param":"amount"}}`, string(res.body))
	})
}

// TestStorm sends one key from 50 goroutines at once, some with a different body:
// exactly one operation runs, and every other request gets what the contract says.
func TestStorm(t *testing.T) {
	t.Parallel()
	const n = 50
	// bodyOf gives every fifth request a different amount.
	bodyOf := func(account string, i int) string {
		if i%5 == 0 {
			return `{"account":"` + account + `","amount":200}`
		}
		return `{"account":"` + account + `","amount":100}`
	}
	// storm sends the n requests at once and returns their answers; answered, when
	// not nil, receives one value per answer as it comes.
	storm := func(t *testing.T, h *harness, account string, answered chan<- struct{}) []response {
		answers := make([]response, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var done sync.WaitGroup
		for i := range n {
			done.Add(1)
			go func() {
				defer done.Done()
				<-start
				answers[i], errs[i] = h.send(request{body: bodyOf(account, i)})
				if answered != nil {
					answered <- struct{}{}
				}
			}()
		}
		close(start)
		done.Wait()
		for i := range n {
			require.NoError(t, errs[i], "request %d", i)
		}
		return answers
	}
	// winner returns the index of the one first answer, checking there is one.
	winner := func(t *testing.T, answers []response) int {
		first := -1
		for i, res := range answers {
			if res.status == http.StatusCreated && res.header.Get(idempotency.HeaderReplayed) == "" {
				require.Equal(t, -1, first, "one first answer")
				first = i
			}
		}
		require.NotEqual(t, -1, first, "one first answer")
		return first
	}

	t.Run("Finishing", func(t *testing.T) {
		t.Parallel()
		h := setup(t, harnessOpts{})
		answers := storm(t, h, "acct-1", nil)
		first := winner(t, answers)
		opID := answers[first].header.Get(idempotency.HeaderOperationID)
		statuses := map[int]int{}
		for _, res := range answers {
			statuses[res.status]++
		}
		t.Logf("answers by status: %v", statuses)
		for i, res := range answers {
			require.Equal(t, opID, res.header.Get(idempotency.HeaderOperationID), "request %d", i)
			switch {
			case i == first:
			case (i%5 == 0) != (first%5 == 0):
				require.Equal(t, http.StatusUnprocessableEntity, res.status, "request %d", i)
				require.Equal(t, []string{"amount"}, decodeError(t, res.body).Error.MismatchedFields)
			case res.status == http.StatusConflict:
				require.EqualValues(t, idempotency.CodeRequestInProgress, decodeError(t, res.body).Error.Code)
			default:
				require.Equal(t, http.StatusCreated, res.status, "request %d", i)
				require.Equal(t, "true", res.header.Get(idempotency.HeaderReplayed), "request %d", i)
				require.Equal(t, string(answers[first].body), string(res.body), "request %d", i)
			}
		}
		charges, operations := h.counts(t)
		require.Equal(t, 1, charges)
		require.Equal(t, 1, operations)
	})

	t.Run("WhileRunning", func(t *testing.T) {
		t.Parallel()
		// The operation blocks until every other request has answered: they all
		// find it running.
		h := setup(t, harnessOpts{})
		answered := make(chan struct{}, n)
		go func() {
			for range n - 1 {
				<-answered
			}
			h.release()
		}()
		answers := storm(t, h, "blocked", answered)
		first := winner(t, answers)
		for i, res := range answers {
			switch {
			case i == first:
			case (i%5 == 0) != (first%5 == 0):
				require.Equal(t, http.StatusUnprocessableEntity, res.status, "request %d", i)
			default:
				require.Equal(t, http.StatusConflict, res.status, "request %d", i)
			}
		}
		charges, operations := h.counts(t)
		require.Equal(t, 1, charges)
		require.Equal(t, 1, operations)
	})
}

func TestHandlerConfig(t *testing.T) {
	t.Parallel()
	h := setup(t, harnessOpts{})
	tests := []struct {
		name string
		cfg  *idempotency.Config
		opts *idempotency.EndpointOpts[chargeIn]
	}{
		{name: "NilConfig", opts: &idempotency.EndpointOpts[chargeIn]{DecodeFunc: decodeCharge}},
		{name: "NoEngine", cfg: &idempotency.Config{ScopeFunc: bearerScope}, opts: &idempotency.EndpointOpts[chargeIn]{DecodeFunc: decodeCharge}},
		{name: "NoScope", cfg: &idempotency.Config{Engine: h.e}, opts: &idempotency.EndpointOpts[chargeIn]{DecodeFunc: decodeCharge}},
		{name: "NegativeWait", cfg: &idempotency.Config{Engine: h.e, ScopeFunc: bearerScope, Wait: -1}, opts: &idempotency.EndpointOpts[chargeIn]{DecodeFunc: decodeCharge}},
		{name: "NilOpts", cfg: &idempotency.Config{Engine: h.e, ScopeFunc: bearerScope}},
		{name: "NoDecode", cfg: &idempotency.Config{Engine: h.e, ScopeFunc: bearerScope}, opts: &idempotency.EndpointOpts[chargeIn]{}},
		{name: "SuccessNot2xx", cfg: &idempotency.Config{Engine: h.e, ScopeFunc: bearerScope}, opts: &idempotency.EndpointOpts[chargeIn]{DecodeFunc: decodeCharge, SuccessStatus: 302}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := idempotency.Handler(tt.cfg, h.op, tt.opts)
			require.Error(t, err)
		})
	}
}

// TestObserveFunc: how each keyed request was answered, as metrics see it.
func TestObserveFunc(t *testing.T) {
	t.Parallel()
	h := setup(t, harnessOpts{wait: 50 * time.Millisecond})
	body := `{"account":"acct-1","amount":100}`
	h.do(t, request{body: body})
	h.do(t, request{body: body})
	h.do(t, request{body: `{"account":"acct-1","amount":5}`})
	h.do(t, request{body: body, noKey: true})
	h.do(t, request{body: `{"account":`, keys: []string{"key-2"}})
	h.do(t, request{body: blockedBody, keys: []string{"key-3"}})
	h.do(t, request{body: blockedBody, keys: []string{"key-3"}})
	h.release()
	require.Equal(t, []string{
		"charge:created", "charge:replayed", "charge:mismatch", "charge:rejected", "charge:rejected",
		"charge:accepted", "charge:in_progress",
	}, h.observed())
}
