package demoapi

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestJSONErrors: what net/http answers itself, before any handler, reaches
// the client as the demo's JSON errors; what handlers answer is untouched.
func TestJSONErrors(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "handled")
	}), time.Second, 0, nil)
	go func() { _ = srv.Serve(JSONErrors(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })

	send := func(raw string) *http.Response {
		conn, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		go func() { _, _ = io.WriteString(conn, raw) }()
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		return res
	}
	for name, c := range map[string]struct {
		raw    string
		status int
		code   string
	}{
		"headers past what net/http reads": {"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("p", 80<<10) + "\r\n\r\n", 431, "request_headers_too_large"},
		"no Host":                          {"GET / HTTP/1.1\r\n\r\n", 400, "invalid_request"},
		"a malformed header":               {"GET / HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n", 400, "invalid_request"},
		"an unknown transfer encoding":     {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: zip\r\n\r\n", 501, "not_implemented"},
	} {
		res := send(c.raw)
		require.Equal(t, c.status, res.StatusCode, name)
		require.Equal(t, "application/json", res.Header.Get("Content-Type"), name)
		var body struct {
			Error struct{ Code, Message string }
		}
		require.NoError(t, json.NewDecoder(res.Body).Decode(&body), name)
		require.EqualValues(t, c.code, body.Error.Code, name)
		require.NotEmpty(t, body.Error.Message, name)
	}
	res := send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.Equal(t, http.StatusOK, res.StatusCode)
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, "handled", string(b), "a handler's plain text is its own")
}
