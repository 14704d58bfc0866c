package httpstep_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/steps/httpstep"
)

func TestClassify(t *testing.T) {
	t.Parallel()

	type want struct {
		ok bool
		// permanent: engine.Fail with code and message.
		permanent     bool
		code, message string
		// otherwise transient: a *httpstep.StatusError, with retryAfter when set.
		retryAfter time.Duration
	}
	longMessage := strings.Repeat("é", 400) // 800 bytes
	for _, tc := range []struct {
		name   string
		status int
		header http.Header
		body   string
		want   want
	}{
		{name: "200", status: 200, body: `{"id": "pay_1"}`, want: want{ok: true}},
		{name: "201", status: 201, want: want{ok: true}},
		{name: "204", status: 204, want: want{ok: true}},
		{name: "400NestedErrorBody", status: 400, body: `{"error": {"code": "amount_invalid", "message": "amount must be positive"}}`,
			want: want{permanent: true, code: "amount_invalid", message: "amount must be positive"}},
		{name: "422FlatErrorBody", status: 422, body: `{"code": "card_declined", "message": "the card was declined"}`,
			want: want{permanent: true, code: "card_declined", message: "the card was declined"}},
		{name: "402NestedWinsOverFlat", status: 402, body: `{"code": "flat", "error": {"code": "nested", "message": "m"}}`,
			want: want{permanent: true, code: "nested", message: "m"}},
		{name: "404NoBody", status: 404,
			want: want{permanent: true, code: "http_404", message: "the service refused the request (404 Not Found)"}},
		{name: "401NotJSON", status: 401, body: "<html>nope</html>",
			want: want{permanent: true, code: "http_401", message: "the service refused the request (401 Unauthorized)"}},
		{name: "403MessageWithoutCode", status: 403, body: `{"message": "not yours"}`,
			want: want{permanent: true, code: "http_403", message: "not yours"}},
		{name: "400CodeNotAString", status: 400, body: `{"code": 17, "message": "odd"}`,
			want: want{permanent: true, code: "http_400", message: "odd"}},
		{name: "400CodeNotAToken", status: 400, body: `{"error": {"code": "no spaces, please", "message": "m"}}`,
			want: want{permanent: true, code: "http_400", message: "m"}},
		{name: "400LongMessageIsCut", status: 400, body: `{"code": "c", "message": "` + longMessage + `"}`,
			want: want{permanent: true, code: "c", message: strings.Repeat("é", 150) + "..."}},
		{name: "499UnknownStatus", status: 499,
			want: want{permanent: true, code: "http_499", message: "the service refused the request (499)"}},
		{name: "408", status: 408, want: want{}},
		{name: "409", status: 409, body: `{"error": {"code": "idempotency_conflict"}}`, want: want{}},
		{name: "425", status: 425, want: want{}},
		{name: "429RetryAfterSeconds", status: 429, header: http.Header{"Retry-After": {"7"}}, want: want{retryAfter: 7 * time.Second}},
		{name: "500", status: 500, want: want{}},
		{name: "502NotJSON", status: 502, body: "bad gateway", want: want{}},
		{name: "503RetryAfterSeconds", status: 503, header: http.Header{"Retry-After": {"120"}}, want: want{retryAfter: 2 * time.Minute}},
		{name: "503RetryAfterZero", status: 503, header: http.Header{"Retry-After": {"0"}}, want: want{}},
		{name: "503RetryAfterGarbage", status: 503, header: http.Header{"Retry-After": {"soon"}}, want: want{}},
		{name: "503RetryAfterNegative", status: 503, header: http.Header{"Retry-After": {"-5"}}, want: want{}},
		{name: "503RetryAfterPastDate", status: 503, header: http.Header{"Retry-After": {"Fri, 31 Dec 1999 23:59:59 GMT"}}, want: want{}},
		{name: "503RetryAfterHuge", status: 503, header: http.Header{"Retry-After": {"99999999999999999999999"}}, want: want{retryAfter: 366 * 24 * time.Hour}},
		{name: "400IgnoresRetryAfter", status: 400, header: http.Header{"Retry-After": {"7"}},
			want: want{permanent: true, code: "http_400", message: "the service refused the request (400 Bad Request)"}},
		{name: "302NotFollowed", status: 302, header: http.Header{"Location": {"/elsewhere"}}, want: want{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := httpstep.Answer{Method: "POST", URL: "http://pay.test/payments", StatusCode: tc.status, Header: tc.header, Body: []byte(tc.body)}
			err := httpstep.Classify(a)
			switch {
			case tc.want.ok:
				require.NoError(t, err)
			case tc.want.permanent:
				var pe *engine.PermanentError
				require.ErrorAs(t, err, &pe)
				require.EqualValues(t, tc.want.code, pe.Code)
				require.Equal(t, tc.want.message, pe.Message)
				require.False(t, pe.ServerFault(), "a business answer")
				require.Contains(t, pe.Cause, "POST http://pay.test/payments answered", "the operators' text names the request")
			default:
				var pe *engine.PermanentError
				require.False(t, errors.As(err, &pe), "transient: %v", err)
				var se *httpstep.StatusError
				require.ErrorAs(t, err, &se)
				require.Equal(t, tc.status, se.StatusCode)
				var ra *engine.RetryAfterError
				if tc.want.retryAfter == 0 {
					require.False(t, errors.As(err, &ra), "no least delay: %v", err)
					return
				}
				require.ErrorAs(t, err, &ra)
				require.Equal(t, tc.want.retryAfter, ra.After)
			}
		})
	}

	t.Run("RetryAfterDate", func(t *testing.T) {
		t.Parallel()
		at := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
		err := httpstep.Classify(httpstep.Answer{StatusCode: 503, Header: http.Header{"Retry-After": {at}}})
		var ra *engine.RetryAfterError
		require.ErrorAs(t, err, &ra)
		// The date has whole seconds: up to a second early, and the test's own time.
		require.InDelta(t, time.Hour.Seconds(), ra.After.Seconds(), 5)
	})
}

func TestStatusError(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name string
		body string
		want httpstep.StatusError
		text string
	}{
		{name: "ErrorBody", body: `{"error": {"code": "service_unavailable", "message": "down"}}`,
			want: httpstep.StatusError{Code: "service_unavailable", Message: "down"},
			text: "GET http://pay.test/x answered 503 service_unavailable: down"},
		{name: "TextBody", body: "  upstream timed out\n",
			want: httpstep.StatusError{Message: "upstream timed out"},
			text: "GET http://pay.test/x answered 503: upstream timed out"},
		{name: "NoBody", text: "GET http://pay.test/x answered 503"},
		{name: "InvalidUTF8", body: "a\xffb", want: httpstep.StatusError{Message: "a\uFFFDb"}, text: "GET http://pay.test/x answered 503: a\uFFFDb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := httpstep.NewStatusError(httpstep.Answer{Method: "GET", URL: "http://pay.test/x", StatusCode: 503, Body: []byte(tc.body)})
			tc.want.Method, tc.want.URL, tc.want.StatusCode = "GET", "http://pay.test/x", 503
			require.Equal(t, &tc.want, got)
			require.Equal(t, tc.text, got.Error())
		})
	}
}

func TestHasCode(t *testing.T) {
	t.Parallel()
	notFound := httpstep.HasCode("payment_not_found")
	for body, want := range map[string]bool{
		`{"error": {"code": "payment_not_found", "message": "none"}}`: true,
		`{"code": "payment_not_found"}`:                               true,
		`{"error": {"code": "not_found"}}`:                            false,
		`404 page not found`:                                          false,
		``:                                                            false,
	} {
		require.Equal(t, want, notFound(httpstep.Answer{StatusCode: 404, Body: []byte(body)}), body)
	}
}

// TestClassifyKeyReused: a refusal because the key holds another request halts
// the operation: that request may have been carried out.
func TestClassifyKeyReused(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{"code":"idempotency_key_reused"}`, `{"error":{"code":"idempotency_key_reused","message":"m"}}`} {
		err := httpstep.Classify(httpstep.Answer{StatusCode: 422, Body: []byte(body)})
		var halt *engine.HaltError
		require.ErrorAs(t, err, &halt, body)
		require.EqualValues(t, httpstep.CodeKeyReused, halt.Code)
	}
}
