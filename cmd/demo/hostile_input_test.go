package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idempotency"

	"github.com/idemflow/idemflow/internal/testdb"
)

// TestHostileInput sends malformed, oversized, wrongly typed and hostile bodies,
// headers and path parameters to every endpoint of the demo (the fake provider's
// included): each gets a clear 4xx, never a 5xx, and none has any effect: no
// operation, order, refund, ledger entry, provider refund or fault is created.
//
// What the demo's handlers answer is a JSON error. A few requests never reach
// them: net/http itself refuses a header field with a control character, an
// invalid percent-encoding in the path and a header section over 1 MB, with a
// plain-text 400 or 431; those only have to be 4xx.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	d := startDemo(t, dbURL, nil)
	a, b := d.client(t, tokenA), d.client(t, tokenB)
	a.createOrder("H-1", "cus_1", 5000)
	r := a.post("/refunds", newKey(), map[string]any{"orderId": "H-1", "amount": 100})
	requireStatus(t, r, http.StatusCreated)
	b.createOrder("H-1", "cus_9", 700)
	before := takeEffects(t, dbURL, a, b)

	const (
		order  = `{"orderId": "X-1", "customerId": "cus_1", "amount": 10}`
		refund = `{"orderId": "H-1", "amount": 10}`
	)
	deepArrays := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	deepObjects := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	// withField returns body (an object) with one more member, name: value raw.
	withField := func(body, name, value string) string {
		return strings.TrimSuffix(body, "}") + `, "` + name + `": ` + value + "}"
	}
	// with returns body with the value of the member name replaced by value raw.
	with := func(body, name, value string) string {
		start := strings.Index(body, `"`+name+`": `) + len(name) + 4
		end := start + strings.IndexAny(body[start:], ",}")
		return body[:start] + value + body[end:]
	}

	// bodyCase is a body that POST /orders and POST /refunds must refuse with 400
	// invalid_request, naming param when it is not empty.
	type bodyCase struct {
		name, body, param string
	}
	// hostileBodies returns the cases for an endpoint whose valid body is valid.
	hostileBodies := func(valid string) []bodyCase {
		return []bodyCase{
			{"Empty", "", ""},
			{"WhiteSpace", " \r\n\t ", ""},
			{"Null", "null", ""},
			{"String", `"orderId"`, ""},
			{"Number", "42", ""},
			{"True", "true", ""},
			{"ArrayOfTheObject", "[" + valid + "]", ""},
			{"EmptyArray", "[]", ""},
			{"DeepArrays", deepArrays, ""},
			{"DeepObjects", deepObjects, "a" + strings.Repeat(".a", idempotency.MaxDepth-1)},
			{"DeepArraysInMetadata", withField(valid, "metadata", `{"x": `+deepArrays+`}`), "metadata.x" + strings.Repeat("[0]", idempotency.MaxDepth-2)},
			{"AmountHugeExponent", with(valid, "amount", "1e400"), "amount"},
			{"AmountNegativeHugeExponent", with(valid, "amount", "-1e400"), "amount"},
			{"AmountTinyExponent", with(valid, "amount", "1e-400"), "amount"},
			{"AmountOverInt64", with(valid, "amount", "99999999999999999999"), "amount"},
			{"AmountOverMax", with(valid, "amount", "1000000000000"), "amount"},
			{"AmountMinInt64", with(valid, "amount", "-9223372036854775808"), "amount"},
			{"AmountString", with(valid, "amount", `"10"`), "amount"},
			{"AmountBool", with(valid, "amount", "true"), "amount"},
			{"AmountArray", with(valid, "amount", "[10]"), "amount"},
			{"AmountObject", with(valid, "amount", `{"value": 10}`), "amount"},
			{"AmountNull", with(valid, "amount", "null"), "amount"},
			{"AmountNaN", with(valid, "amount", "NaN"), ""},
			{"AmountHex", with(valid, "amount", "0x10"), ""},
			{"OrderIDNumber", with(valid, "orderId", "7"), "orderId"},
			{"OrderIDArray", with(valid, "orderId", `["X-1"]`), "orderId"},
			{"OrderIDObject", with(valid, "orderId", `{}`), "orderId"},
			{"OrderIDEmpty", with(valid, "orderId", `""`), "orderId"},
			{"OrderIDTooLong", with(valid, "orderId", `"`+strings.Repeat("i", 256)+`"`), "orderId"},
			{"OrderIDHuge", with(valid, "orderId", `"`+strings.Repeat("i", 60000)+`"`), "orderId"},
			{"OrderIDEscapedNUL", with(valid, "orderId", `"X\u0000"`), "orderId"},
			{"OrderIDEscapedControl", with(valid, "orderId", `"X\u001b[2J"`), "orderId"},
			{"RawNULInString", with(valid, "orderId", "\"X\x00\""), ""},
			{"RawNULOutside", "\x00" + valid, ""},
			{"NULAfter", valid + "\x00", ""},
			{"InvalidUTF8InString", with(valid, "orderId", "\"X-\xff\xfe\""), ""},
			{"InvalidUTF8InName", strings.Replace(valid, `"amount"`, "\"am\xc3ount\"", 1), ""},
			{"OverlongUTF8", with(valid, "orderId", "\"\xc0\xaf\""), ""},
			{"UTF16", "\xff\xfe{\x00}\x00", ""},
			{"ByteOrderMark", "\xef\xbb\xbf" + valid, ""},
			{"DuplicateKey", withField(valid, "amount", "11"), "amount"},
			{"DuplicateKeySameValue", withField(valid, "orderId", `"X-1"`), "orderId"},
			{"DuplicateNestedKey", withField(valid, "metadata", `{"a": 1, "a": 2}`), "metadata.a"},
			{"MetadataString", withField(valid, "metadata", `"x"`), "metadata"},
			{"MetadataArray", withField(valid, "metadata", `[]`), "metadata"},
			{"MetadataNumber", withField(valid, "metadata", `1e400`), "metadata"},
			{"UnknownField", withField(valid, "refundAll", "true"), "refundAll"},
			{"ProtoField", withField(valid, "__proto__", `{"admin": true}`), "__proto__"},
			{"TrailingComma", strings.TrimSuffix(valid, "}") + ",}", ""},
			{"SingleQuotes", strings.ReplaceAll(valid, `"`, `'`), ""},
			{"Comment", "/* x */" + valid, ""},
			{"Unterminated", strings.TrimSuffix(valid, "}"), ""},
			{"TwoObjects", valid + valid, ""},
			{"TrailingGarbage", valid + "garbage", ""},
			{"FormEncoded", "orderId=X-1&customerId=cus_1&amount=10", ""},
			{"XML", "<order><orderId>X-1</orderId></order>", ""},
		}
	}

	for _, ep := range []struct{ path, valid string }{{"/orders", order}, {"/refunds", refund}} {
		t.Run("Bodies"+ep.path, func(t *testing.T) {
			a := a.in(t)
			for _, tt := range hostileBodies(ep.valid) {
				e := requireError(t, a.post(ep.path, newKey(), tt.body), http.StatusBadRequest, "invalid_request")
				require.Equal(t, tt.param, e.Param, "%s: %s", tt.name, e.Message)
			}
		})

		t.Run("ContentTypes"+ep.path, func(t *testing.T) {
			for _, tt := range []struct{ contentType, body string }{
				{"application/x-www-form-urlencoded", "orderId=X-1&customerId=cus_1&amount=10"},
				{"multipart/form-data; boundary=x", "--x\r\nContent-Disposition: form-data; name=\"orderId\"\r\n\r\nX-1\r\n--x--\r\n"},
				{"application/xml", "<order><orderId>X-1</orderId></order>"},
				{"text/plain; charset=utf-16", "\xff\xfe{\x00}\x00"},
				{"application/json; charset=ebcdic", "\xc0\xd0"},
			} {
				h := header("Authorization", "Bearer "+tokenA, "Idempotency-Key", newKey(), "Content-Type", tt.contentType)
				requireError(t, sendRaw(t, d, http.MethodPost, ep.path, h, tt.body), http.StatusBadRequest, "invalid_request")
			}
		})

		t.Run("Oversized"+ep.path, func(t *testing.T) {
			a := a.in(t)
			big := withField(ep.valid, "metadata", `{"pad": "`+strings.Repeat("x", 1<<20)+`"}`)
			requireError(t, a.post(ep.path, newKey(), big), http.StatusRequestEntityTooLarge, "request_too_large")
			// Streamed without a length.
			requireError(t, a.post(ep.path, newKey(), io.MultiReader(strings.NewReader(big), strings.NewReader(strings.Repeat(" ", 8<<20)))),
				http.StatusRequestEntityTooLarge, "request_too_large")
			// A length that announces more than the limit is refused before it is read.
			raw := "POST " + ep.path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tokenA + "\r\nIdempotency-Key: " + newKey() +
				"\r\nContent-Type: application/json\r\nContent-Length: 1000000000000\r\nConnection: close\r\n\r\n" + ep.valid
			requireError(t, rawExchange(t, d.base, raw), http.StatusRequestEntityTooLarge, "request_too_large")
			// A length that announces less than is sent: the body is cut short.
			raw = "POST " + ep.path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tokenA + "\r\nIdempotency-Key: " + newKey() +
				"\r\nContent-Type: application/json\r\nContent-Length: 5\r\nConnection: close\r\n\r\n" + ep.valid
			requireError(t, rawExchange(t, d.base, raw), http.StatusBadRequest, "invalid_request")
		})

		t.Run("Headers"+ep.path, func(t *testing.T) {
			post := func(h http.Header) *response { return sendRaw(t, d, http.MethodPost, ep.path, h, ep.valid) }
			auth := "Bearer " + tokenA
			for _, key := range []string{
				strings.Repeat("k", 256),
				strings.Repeat("k", 60<<10),
				"ké", "k\xff", "a b", `"unterminated`, `"a\b"`, `""`, " ",
			} {
				requireError(t, post(header("Authorization", auth, "Idempotency-Key", key)), http.StatusBadRequest, "idempotency_key_invalid")
			}
			for _, n := range []int{2, 100} {
				h := header("Authorization", auth)
				for range n {
					h.Add("Idempotency-Key", newKey())
				}
				requireError(t, post(h), http.StatusBadRequest, "idempotency_key_invalid")
			}
			same := newKey()
			requireError(t, post(header("Authorization", auth, "Idempotency-Key", same, "Idempotency-Key", same)), http.StatusBadRequest, "idempotency_key_invalid")

			// Credentials: many, mixed, huge, in another scheme.
			for _, h := range []http.Header{
				header("Authorization", auth, "Authorization", "Bearer "+tokenB),
				header("Authorization", auth, "Authorization", "Bearer junk"),
				header("Authorization", "Bearer junk", "Authorization", auth),
				header("Authorization", "Bearer "+strings.Repeat("t", 60<<10)),
				header("Authorization", "Basic "+tokenA),
				header("Authorization", "Bearer"),
				header("Authorization", "Bearer "+tokenA+"\xff"),
				header("Authorization", "Bearer "+tokenA+tokenA),
			} {
				h.Set("Idempotency-Key", newKey())
				requireError(t, post(h), http.StatusUnauthorized, "unauthenticated")
			}
			many := header("Idempotency-Key", newKey())
			for i := range 500 {
				many.Add("Authorization", fmt.Sprintf("Bearer junk-%d", i))
			}
			requireError(t, post(many), http.StatusUnauthorized, "unauthenticated")

			// Header fields that net/http refuses before any handler sees them.
			for _, field := range []string{
				"Idempotency-Key: k\x00ey",
				"Idempotency-Key: k\x01ey",
				"Idempotency-Key: k\x7fey",
				"Idempotency-Key: k\rey",
				"Authorization: Bearer " + tokenA + "\x00",
				"Idempotency-Key: " + strings.Repeat("k", 2<<20),
				"Idem potency-Key: k",
			} {
				raw := "POST " + ep.path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tokenA + "\r\n" + field +
					"\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(ep.valid)) + "\r\nConnection: close\r\n\r\n" + ep.valid
				requireRefused(t, rawExchange(t, d.base, raw), field)
			}
		})
	}

	t.Run("Paths", func(t *testing.T) {
		type endpoint struct{ prefix, code string }
		endpoints := []endpoint{
			{"/orders/", "order_not_found"},
			{"/refunds/", "refund_not_found"},
			{"/operations/", "operation_not_found"},
			{"/provider/refunds/by-key/", "refund_not_found"},
		}
		// Escaped ids: each reaches the handler, decoded.
		ids := []string{
			strings.Repeat("x", 256),
			strings.Repeat("x", 10<<10),
			strings.Repeat("x", 60<<10), // within the 64 KiB of headers
			"%00", "a%00b", "%ff", "%C3%28", "%c0%af", "%ed%a0%80", "%01", "%0A", "%0D%0A", "%7F", "%1b%5B2J",
			"%E2%80%AE", "%F0%9F%92%A9", "%EF%BB%BF",
			"..%2F..%2Faccounts", "..%2f", "%2e%2e%2faccounts", "%2F", "%5C..%5C", "%252e%252e",
			"%27%20OR%201%3D1--", "%22%3B%20DROP%20TABLE%20demo_order%3B--", "%25", "%3F", "%23",
			"00000000-0000-0000-0000-000000000000", "%7B%7D", "re_", "pr_", "re_%00",
		}
		for _, ep := range endpoints {
			for _, id := range ids {
				r := sendRaw(t, d, http.MethodGet, ep.prefix+id, header("Authorization", "Bearer "+tokenA), "")
				require.Equal(t, http.StatusNotFound, r.status, "%.100s: %s", ep.prefix+id, r.body)
				// ServeMux matches no route for some of them (an id that is an
				// escaped slash alone): the catch-all's 404 not_found.
				require.Contains(t, []string{ep.code, "not_found"}, errorOf(t, r).Code, "%.100s: %s", ep.prefix+id, r.body)
				requireJSONError(t, r)
			}
		}
		// Raw request targets that Go's client would refuse or normalise.
		for _, ep := range endpoints {
			for _, id := range []string{"%zz", "%", "%0", "a%g1", "\x7f", "\xff", "..", "../../accounts", "./x", ".%2e/accounts", "x/../../../etc/passwd"} {
				raw := "GET " + ep.prefix + id + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tokenA + "\r\nConnection: close\r\n\r\n"
				r := rawExchange(t, d.base, raw)
				if r.status >= 300 && r.status < 400 {
					// ServeMux redirects a path with dot segments to its clean form:
					// the same server, which then answers for that path.
					loc, err := url.Parse(r.header.Get("Location"))
					require.NoError(t, err)
					require.Empty(t, loc.Host, "a redirect stays on the server: %s", loc)
					require.True(t, strings.HasPrefix(loc.Path, "/"), "location %s", loc)
					continue
				}
				requireRefused(t, r, ep.prefix+id)
			}
		}
		// Past 64 KiB of request line and headers: 431.
		big := sendRaw(t, d, http.MethodGet, "/orders/"+strings.Repeat("x", 100<<10), header("Authorization", "Bearer "+tokenA), "")
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, big.status)
		// An overlong request line: net/http refuses it.
		raw := "GET /orders/" + strings.Repeat("x", 2<<20) + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tokenA + "\r\nConnection: close\r\n\r\n"
		requireRefused(t, rawExchange(t, d.base, raw), "2 MiB path")
	})

	t.Run("ReadCredentials", func(t *testing.T) {
		for _, path := range []string{"/accounts", "/orders/H-1", "/refunds/re_X", "/operations/" + r.header.Get("Operation-Id")} {
			for _, h := range []http.Header{
				header("Authorization", "Bearer "+tokenA, "Authorization", "Bearer "+tokenB),
				header("Authorization", "Bearer "+tokenB, "Authorization", "Bearer "+tokenA),
				header("Authorization", "Bearer "+strings.Repeat("t", 60<<10)),
				header("Authorization", "Bearer "+tokenA+"\xff"),
				header("Authorization", "Bearer "+tokenA+"\x80", "X-Forwarded-User", "merchant-a"),
			} {
				requireError(t, sendRaw(t, d, http.MethodGet, path, h, ""), http.StatusUnauthorized, "unauthenticated")
			}
		}
	})

	t.Run("Methods", func(t *testing.T) {
		a := a.in(t)
		for _, path := range []string{"/orders", "/refunds", "/orders/H-1", "/refunds/re_X", "/accounts", "/operations/x", "/healthz"} {
			for _, method := range []string{http.MethodPut, http.MethodPatch, http.MethodDelete, "PROPFIND"} {
				r := a.do(method, path, newKey(), deepArrays)
				requireError(t, r, http.StatusMethodNotAllowed, "method_not_allowed")
			}
		}
	})

	t.Run("ProviderRefunds", func(t *testing.T) {
		valid := `{"orderId": "H-1", "amount": 10, "reference": "re_X"}`
		post := func(key, body string) *response {
			return sendRaw(t, d, http.MethodPost, "/provider/refunds", header("Idempotency-Key", key, "Content-Type", "application/json"), body)
		}
		for _, tt := range []struct{ name, body string }{
			{"Empty", ""},
			{"Null", "null"},
			{"Array", "[" + valid + "]"},
			{"DeepArrays", deepArrays},
			{"DeepObjects", deepObjects},
			{"AmountHugeExponent", with(valid, "amount", "1e400")},
			{"AmountOverInt64", with(valid, "amount", "99999999999999999999")},
			{"AmountZero", with(valid, "amount", "0")},
			{"AmountString", with(valid, "amount", `"10"`)},
			{"OrderIDMissing", `{"amount": 10, "reference": "re_X"}`},
			{"OrderIDEscapedNUL", with(valid, "orderId", `"H\u0000"`)},
			{"ReferenceEscapedNUL", with(valid, "reference", `"re_\u0000"`)},
			// encoding/json takes the last of duplicate keys: a zero amount.
			{"DuplicateKey", withField(valid, "amount", "0")},
			{"UnknownField", withField(valid, "refundAll", "true")},
			{"TwoObjects", valid + valid},
			{"Oversized", withField(valid, "pad", `"`+strings.Repeat("x", 1<<20)+`"`)},
		} {
			r := post(newKey(), tt.body)
			require.True(t, r.status == http.StatusBadRequest || r.status == http.StatusRequestEntityTooLarge, "%s: %d %s", tt.name, r.status, r.body)
			requireJSONError(t, r)
		}
		for _, key := range []string{"", strings.Repeat("k", 256), "a b", "ké"} {
			r := post(key, valid)
			require.Equal(t, http.StatusBadRequest, r.status, "key %q: %s", key, r.body)
			requireJSONError(t, r)
		}
	})

	t.Run("ProviderFaults", func(t *testing.T) {
		for _, body := range []string{
			"", "null", "[]", deepArrays, deepObjects,
			`{"mode": "teapot"}`,
			`{"mode": "error\u0000"}`,
			`{"mode": "slow", "count": -1}`,
			`{"mode": "slow", "count": 1e400}`,
			`{"mode": "slow", "count": 99999999999999999999}`,
			`{"mode": "slow", "count": 1000001}`,
			`{"mode": "slow", "delayMs": -1}`,
			`{"mode": "slow", "delayMs": 600001}`,
			`{"mode": "slow", "delayMs": 10000000000000}`,
			`{"mode": "slow", "delayMs": 18446744073710}`,
			`{"mode": "slow", "delayMs": 9223372036854775807}`,
			`{"mode": "slow", "delayMs": "1"}`,
			`{"mode": "slow", "count": 1, "mode": "teapot"}`,
			`{"mode": "slow", "colour": "red"}`,
		} {
			r := sendRaw(t, d, http.MethodPost, "/provider/faults", header("Content-Type", "application/json"), body)
			require.Equal(t, http.StatusBadRequest, r.status, "body %.100q: %s", body, r.body)
			requireJSONError(t, r)
		}
	})

	require.Equal(t, before, takeEffects(t, dbURL, a, b), "the hostile requests had no effect")
	d.stop()
}

// effects is what a request could have changed.
type effects struct {
	AccountsA, AccountsB []account
	Rows                 map[string]int64
}

// takeEffects reads both clients' accounts and the number of rows of every table
// that a request could add to.
func takeEffects(t *testing.T, dbURL string, a, b *apiClient) effects {
	t.Helper()
	// The provider's webhooks about the refunds made so far, which come on
	// their own, have come.
	awaitWebhooks(t, a)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	e := effects{AccountsA: a.accounts(), AccountsB: b.accounts(), Rows: map[string]int64{}}
	for _, table := range []string{"idemflow_operation", "idemflow_step_row", "demo_order", "demo_refund", "demo_ledger_entry", "provider.refund", "provider.fault"} {
		var n int64
		require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n), table)
		e.Rows[table] = n
	}
	return e
}

// header builds a header from name, value pairs, adding repeated names.
func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// sendRaw sends a request with exactly the header h (no Content-Type unless h has
// one) and the target path as written (already escaped), and reads the answer.
func sendRaw(t *testing.T, d *demo, method, path string, h http.Header, body string) *response {
	t.Helper()
	u, err := url.Parse(d.base)
	require.NoError(t, err)
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, d.base, rd)
	require.NoError(t, err)
	req.URL = &url.URL{Scheme: u.Scheme, Host: u.Host, Opaque: path}
	req.Header = h
	resp, err := httpClient.Do(req)
	require.NoError(t, err, "%s %.200s", method, path)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return &response{status: resp.StatusCode, header: resp.Header, body: data}
}

// rawExchange writes raw, one HTTP/1.1 request as bytes, on a connection of its
// own to the server at base, and reads the answer: for requests that Go's client
// refuses to send. The request is written while the answer is read, since a
// server may answer before it read all of it.
func rawExchange(t *testing.T, base, raw string) *response {
	t.Helper()
	u, err := url.Parse(base)
	require.NoError(t, err)
	conn, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(time.Minute)))
	go func() { _, _ = io.WriteString(conn, raw) }() // the server may close before it read everything
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "answer to %.200q", raw)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return &response{status: resp.StatusCode, header: resp.Header, body: data}
}

// requireRefused requires a 4xx: a JSON error when the demo answered it, or
// net/http's own plain-text refusal.
func requireRefused(t *testing.T, r *response, what string) {
	t.Helper()
	require.True(t, r.status >= 400 && r.status < 500, "%.200q: %d %s", what, r.status, r.body)
	if strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
		requireJSONError(t, r)
	}
}

// requireJSONError requires a JSON error body with a code and a message.
func requireJSONError(t *testing.T, r *response) {
	t.Helper()
	require.Equal(t, "application/json", r.header.Get("Content-Type"), "body %s", r.body)
	e := errorOf(t, r)
	require.NotEmpty(t, e.Code, "body %s", r.body)
	require.NotEmpty(t, e.Message, "body %s", r.body)
}
