package demoapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// The HTTP server's bounds. A service that embeds idemflow can copy them: each
// keeps a slow, idle or hostile client from holding what others need.
const (
	// headerTimeout cuts a request whose headers have not all arrived.
	headerTimeout = 10 * time.Second
	// bodyTimeout cuts a request whose body has not all arrived, counted from
	// its start (http.Server.ReadTimeout): the client gets no answer, the
	// connection is closed.
	bodyTimeout = 10 * time.Second
	// idleTimeout closes a keep-alive connection that sent nothing more.
	idleTimeout = 60 * time.Second
	// maxHeaderBytes bounds a request's headers: larger ones answer 431.
	maxHeaderBytes = 64 << 10
	// writeSlack is what the write timeout allows beyond -wait and the
	// reservation's bound, for the answer itself.
	writeSlack = 5 * time.Second
	// readTimeout bounds the database reads of the GET endpoints: a database
	// that does not answer gets a 503 by then.
	readTimeout = 8 * time.Second
)

// ConnLimiter bounds the open connections of an http.Server (as its ConnState
// hook): when a new connection takes the server past max, or past perAddr
// connections from its client's address, the oldest connection in that scope
// that is not serving a request (one that sent nothing yet, or an idle
// keep-alive) is closed. A client that opens connections without using them
// so cannot keep others out, and the file limit is never reached; a
// connection that serves a request is never closed.
type ConnLimiter struct {
	max, perAddr int

	mu    sync.Mutex
	conns map[net.Conn]*connEntry
	// addrs counts the open connections of each client address.
	addrs map[string]int
}

type connEntry struct {
	addr   string
	active bool
	since  time.Time
}

// NewConnLimiter returns a limiter of max connections, perAddr from one client
// address.
func NewConnLimiter(max, perAddr int) *ConnLimiter {
	return &ConnLimiter{max: max, perAddr: perAddr, conns: map[net.Conn]*connEntry{}, addrs: map[string]int{}}
}

// DefaultMaxConns is the open connections the demo allows: what the file limit
// leaves after a margin for the database pools, the provider client and the
// process's own files, at most 10,000.
func DefaultMaxConns() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 512 {
		return 256
	}
	return int(min(lim.Cur-256, 10000))
}

// connState is the http.Server's ConnState hook.
func (l *ConnLimiter) connState(c net.Conn, state http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch state {
	case http.StateNew:
		addr := hostOf(c.RemoteAddr())
		l.conns[c] = &connEntry{addr: addr, since: time.Now()}
		l.addrs[addr]++
		if l.addrs[addr] > l.perAddr {
			l.shed(addr)
		}
		if len(l.conns) > l.max {
			l.shed("")
		}
	case http.StateActive:
		if e := l.conns[c]; e != nil {
			e.active = true
		}
	case http.StateIdle:
		if e := l.conns[c]; e != nil {
			e.active, e.since = false, time.Now()
		}
	case http.StateHijacked, http.StateClosed:
		l.forget(c)
	}
}

// shed closes the oldest connection that serves no request, from addr (any
// address when addr is empty). It must be called with mu held.
func (l *ConnLimiter) shed(addr string) {
	var oldest net.Conn
	var since time.Time
	for c, e := range l.conns {
		if e.active || addr != "" && e.addr != addr {
			continue
		}
		if oldest == nil || e.since.Before(since) {
			oldest, since = c, e.since
		}
	}
	if oldest != nil {
		l.forget(oldest)
		_ = oldest.Close() // its ConnState(StateClosed) finds it forgotten
	}
}

func (l *ConnLimiter) forget(c net.Conn) {
	e := l.conns[c]
	if e == nil {
		return
	}
	delete(l.conns, c)
	if l.addrs[e.addr]--; l.addrs[e.addr] <= 0 {
		delete(l.addrs, e.addr)
	}
}

func hostOf(a net.Addr) string {
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// NewHTTPServer returns the demo's http.Server for handler, with its bounds:
// header and body deadlines, a write timeout that fits wait, idle keep-alives
// closed, 64 KiB of headers, and its connections limited.
func NewHTTPServer(handler http.Handler, wait, reserve time.Duration, limiter *ConnLimiter) *http.Server {
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: headerTimeout,
		ReadTimeout:       bodyTimeout,
		WriteTimeout:      bodyTimeout + reserve + wait + writeSlack,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
	if limiter != nil {
		srv.ConnState = limiter.connState
	}
	return srv
}

// JSONErrors returns ln with the answers that net/http writes on a
// connection itself, before any handler runs (431 for headers past what it
// reads, 400 for a malformed request, 501 for an unknown transfer encoding),
// rewritten as the demo's JSON errors: every error the demo answers is JSON.
func JSONErrors(ln net.Listener) net.Listener { return jsonErrorListener{ln} }

type jsonErrorListener struct{ net.Listener }

func (l jsonErrorListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &jsonErrorConn{Conn: c}, nil
}

type jsonErrorConn struct{ net.Conn }

// netHTTPErrorHeaders ends the headers of net/http's own error answers, which
// it writes to the connection in one Write, never through a handler.
var netHTTPErrorHeaders = []byte("\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n")

func (c *jsonErrorConn) Write(p []byte) (int, error) {
	status, reason, ok := netHTTPError(p)
	if !ok {
		return c.Conn.Write(p)
	}
	code := "invalid_request"
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		code, reason = "request_headers_too_large", fmt.Sprintf("the request's headers are larger than %d bytes", maxHeaderBytes)
	case http.StatusNotImplemented:
		code = "not_implemented"
	}
	body := errorJSON(code, reason)
	answer := fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
	if _, err := io.WriteString(c.Conn, answer); err != nil {
		return 0, err
	}
	return len(p), nil
}

// netHTTPError reads the status and reason of one of net/http's own error
// answers ("HTTP/1.1 400 Bad Request: missing required Host header" and its
// plain-text headers), or false for anything else.
func netHTTPError(p []byte) (int, string, bool) {
	line, rest, ok := bytes.Cut(p, []byte("\r\n"))
	if !ok || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) || !bytes.HasPrefix(rest, netHTTPErrorHeaders[2:]) {
		return 0, "", false
	}
	codeText, reason, _ := bytes.Cut(line[len("HTTP/1.1 "):], []byte(" "))
	status, err := strconv.Atoi(string(codeText))
	if err != nil || status < 400 || status > 599 {
		return 0, "", false
	}
	return status, string(reason), true
}

// errorJSON is the demo's error body: {"error": {"code", "message"}}.
func errorJSON(code, message string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"code": code, "message": message}})
	return b
}
