package main

// The harness of the end-to-end tests: the demo binary, built once per test
// process, started as a child process on a database of its own, and a client of
// its HTTP API. The tests check docs/demo-api.md from the outside.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

const (
	// listeningOn precedes the URL in the line that the demo (and the provider
	// run alone) prints once it accepts requests.
	listeningOn = " listening on "
	// startTimeout bounds how long a demo takes to migrate and listen.
	startTimeout = 90 * time.Second
	// stopTimeout bounds how long a demo takes to exit after a signal. The demo
	// drains for at most 10 seconds.
	stopTimeout = 30 * time.Second
	// finalTimeout bounds how long a client retries a key until it gets a final
	// answer: a resumed operation waits for its lease to expire and for the
	// sweeper, which needs River's leadership, which a crashed leader holds for
	// up to 15 seconds.
	finalTimeout = 90 * time.Second
	// pollInterval is how often a client retries a key or reads an operation
	// that is still running.
	pollInterval = 100 * time.Millisecond
	// testParallel is how many tests run at once unless -test.parallel says
	// otherwise: the tests mostly wait for child processes, so more than
	// GOMAXPROCS of them (the default) can run at once.
	testParallel = 8
)

// The demo's default clients.
const (
	tokenA = "demo-token-a"
	tokenB = "demo-token-b"
)

var (
	// binDir holds the demo binary, built by demoBinary; TestMain removes it.
	binDir string
	// demoBinary builds the demo once per test process, with the race detector
	// when the tests run with it.
	demoBinary = sync.OnceValues(func() (string, error) {
		bin := filepath.Join(binDir, "demo")
		args := []string{"build", "-o", bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("go build the demo: %w\n%s", err, out)
		}
		return bin, nil
	})
)

func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", strconv.Itoa(testParallel))
	}
	var err error
	if binDir, err = os.MkdirTemp("", "idemflow-demo-e2e-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(binDir)
	os.Exit(code)
}

// demoOpts are the optional parts of startDemo.
type demoOpts struct {
	// crash is DEMO_CRASH, such as "provider:after-effect".
	crash string
	// args replace the defaults for the flags they name and add the others; see
	// startDemo.
	args []string
	// bare passes no flag but args.
	bare bool
	// env is added to the demo's environment.
	env []string
	// provider runs the fake provider alone: "demo provider".
	provider bool
	// noWait returns as soon as the process started, before it listens; call
	// waitListening or awaitListening.
	noWait bool
	// nofile, when positive, is the demo's file limit (soft and hard: Go raises
	// the soft one to the hard one at start), set through /bin/sh's ulimit.
	nofile int
}

// demo is a running demo process.
type demo struct {
	t   *testing.T
	cmd *exec.Cmd
	// base is the base URL it listens on, such as "http://127.0.0.1:41234".
	base string

	listening chan string // the URL, once printed
	exited    chan struct{}
	exitCode  int // once exited is closed; -1 when killed by a signal
	stdout    lockedBuffer
	stderr    lockedBuffer
}

// startDemo starts the demo binary, listening on a port of its own, with
// DATABASE_URL=dbURL unless dbURL is empty and with -retry-backoff 50ms -wait 5s
// -lease 1s unless opts say otherwise, and waits until it accepts requests. The
// process is killed at cleanup if it still runs; its output is logged when the
// test failed.
func startDemo(t *testing.T, dbURL string, opts *demoOpts) *demo {
	t.Helper()
	if opts == nil {
		opts = &demoOpts{}
	}
	bin, err := demoBinary()
	require.NoError(t, err)

	var args []string
	switch {
	case opts.bare:
	case opts.provider:
		args = []string{"-addr", "127.0.0.1:0"}
	default:
		args = []string{"-addr", "127.0.0.1:0", "-retry-backoff", "50ms", "-wait", "5s", "-lease", "1s"}
	}
	for i := 0; i+1 < len(opts.args); i += 2 {
		if j := slices.Index(args, opts.args[i]); j >= 0 {
			args[j+1] = opts.args[i+1]
		} else {
			args = append(args, opts.args[i], opts.args[i+1])
		}
	}
	if opts.provider {
		args = append([]string{"provider"}, args...)
	}
	cmd := exec.Command(bin, args...)
	if opts.nofile > 0 {
		cmd = exec.Command("/bin/sh", append([]string{"-c", `ulimit -n ` + strconv.Itoa(opts.nofile) + ` && exec "$0" "$@"`, bin}, args...)...)
	}
	cmd.Env = append(demoEnviron(), opts.env...)
	if dbURL != "" {
		cmd.Env = append(cmd.Env, "DATABASE_URL="+dbURL)
	}
	if opts.crash != "" {
		cmd.Env = append(cmd.Env, "DEMO_CRASH="+opts.crash)
	}
	setDeathSignal(cmd)
	d := &demo{t: t, cmd: cmd, listening: make(chan string, 1), exited: make(chan struct{})}
	cmd.Stderr = &d.stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			_, _ = d.stdout.Write([]byte(line + "\n"))
			if _, u, ok := strings.Cut(line, listeningOn); ok {
				select {
				case d.listening <- strings.TrimSpace(u):
				default: // printed once; never block the output
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		d.exitCode = cmd.ProcessState.ExitCode()
		close(d.exited)
	}()

	t.Cleanup(func() {
		d.kill()
		if strings.Contains(d.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("the demo (pid %d) reported a data race", cmd.Process.Pid)
		}
		if t.Failed() {
			t.Logf("demo pid %d %s\nstdout:\n%s\nstderr:\n%s", cmd.Process.Pid, strings.Join(args, " "), d.stdout.String(), d.stderr.String())
		}
	})
	if !opts.noWait {
		d.waitListening()
	}
	return d
}

// kill kills the demo with SIGKILL, unless it exited, and waits until it did.
func (d *demo) kill() {
	select {
	case <-d.exited:
	default:
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// waitListening waits until the demo prints the URL it listens on.
func (d *demo) waitListening() {
	d.t.Helper()
	require.NoError(d.t, d.awaitListening())
}

// awaitListening is waitListening for any goroutine: it returns an error rather
// than failing the test.
func (d *demo) awaitListening() error {
	select {
	case u := <-d.listening:
		d.base = u
		return nil
	case <-d.exited:
		return fmt.Errorf("the demo exited with status %d before it listened", d.exitCode)
	case <-time.After(startTimeout):
		return fmt.Errorf("the demo did not listen within %s", startTimeout)
	}
}

// demoEnviron is the test's environment without the demo's own variables, so
// that a developer's settings do not change the tests.
func demoEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "DATABASE_URL" || strings.HasPrefix(name, "DEMO_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// waitExit waits for the process to exit and returns its exit status.
func (d *demo) waitExit() int {
	d.t.Helper()
	select {
	case <-d.exited:
		return d.exitCode
	case <-time.After(stopTimeout):
		d.t.Fatalf("the demo did not exit within %s", stopTimeout)
		return 0
	}
}

// stop sends SIGTERM and requires that the demo exits with status 0.
func (d *demo) stop() {
	d.t.Helper()
	d.stopWith(syscall.SIGTERM)
}

// stopWith sends sig and requires that the demo exits with status 0.
func (d *demo) stopWith(sig os.Signal) {
	d.t.Helper()
	require.NoError(d.t, d.cmd.Process.Signal(sig))
	require.Equal(d.t, 0, d.waitExit(), "exit status after %s", sig)
}

// client returns an API client of the demo for the test t, with the bearer
// token (none when empty).
func (d *demo) client(t *testing.T, token string) *apiClient {
	return &apiClient{t: t, base: d.base, token: token}
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// httpClient sends every test request. Its timeout is longer than any answer
// takes (-wait bounds them) and shorter than a test's patience.
var httpClient = &http.Client{Timeout: 30 * time.Second}

// apiClient calls a demo's API as one client.
type apiClient struct {
	t     *testing.T
	base  string
	token string // empty: no Authorization header
}

// in returns the client for the test t: a subtest must not fail its parent.
func (c *apiClient) in(t *testing.T) *apiClient {
	cc := *c
	cc.t = t
	return &cc
}

// response is an answer, its body read.
type response struct {
	status int
	header http.Header
	body   []byte
}

// send sends a request and reads its answer. body is sent as is when it is a
// string or []byte, streamed without a length when it is an io.Reader, else
// encoded as JSON; nil sends no body. key, when not empty, is the
// Idempotency-Key header.
func (c *apiClient) send(method, path, key string, body any) (*response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	case io.Reader:
		rd = b
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(c.t.Context(), method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: data}, nil
}

// do is send that fails the test when the request gets no answer.
func (c *apiClient) do(method, path, key string, body any) *response {
	c.t.Helper()
	r, err := c.send(method, path, key, body)
	require.NoError(c.t, err, "%s %s", method, path)
	return r
}

func (c *apiClient) get(path string) *response {
	c.t.Helper()
	return c.do(http.MethodGet, path, "", nil)
}

func (c *apiClient) post(path, key string, body any) *response {
	c.t.Helper()
	return c.do(http.MethodPost, path, key, body)
}

// postUntilFinal sends the request again and again, as a client retries its key,
// until it gets a final answer: not a cut connection, a 202 or a 409
// request_in_progress.
func (c *apiClient) postUntilFinal(path, key string, body any) *response {
	c.t.Helper()
	deadline := time.Now().Add(finalTimeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var last string
	for time.Now().Before(deadline) {
		r, err := c.send(http.MethodPost, path, key, body)
		switch {
		case err != nil:
			last = err.Error()
		case r.status == http.StatusAccepted:
			last = "202 " + string(r.body)
		case r.status == http.StatusConflict && errorOf(c.t, r).Code == "request_in_progress":
			require.NotEmpty(c.t, r.header.Get("Retry-After"), "409 request_in_progress without Retry-After")
			last = "409 " + string(r.body)
		default:
			return r
		}
		<-tick.C
	}
	c.t.Fatalf("POST %s with key %s got no final answer within %s; last: %s", path, key, finalTimeout, last)
	return nil
}

// apiError is the body of every error answer.
type apiError struct {
	Code             string   `json:"code"`
	Message          string   `json:"message"`
	Param            string   `json:"param"`
	MismatchedFields []string `json:"mismatchedFields"`
}

// errorOf decodes an error answer's error object.
func errorOf(t *testing.T, r *response) apiError {
	t.Helper()
	var body struct {
		Error *apiError `json:"error"`
	}
	require.NoError(t, json.Unmarshal(r.body, &body), "error body %s", r.body)
	require.NotNil(t, body.Error, "error body %s", r.body)
	return *body.Error
}

// requireError requires an error answer of status and code, as JSON with a
// message, and returns its error object.
func requireError(t *testing.T, r *response, status int, code string) apiError {
	t.Helper()
	require.Equal(t, status, r.status, "body %s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	e := errorOf(t, r)
	require.EqualValues(t, code, e.Code, "body %s", r.body)
	require.NotEmpty(t, e.Message, "body %s", r.body)
	return e
}

// requireStatus requires status and a JSON answer.
func requireStatus(t *testing.T, r *response, status int) {
	t.Helper()
	require.Equal(t, status, r.status, "body %s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
}

// decodeAs decodes a JSON answer into a T, refusing fields that T lacks.
func decodeAs[T any](t *testing.T, r *response) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&v), "body %s", r.body)
	return v
}

// requireKeys requires that the JSON object body has exactly these members.
func requireKeys(t *testing.T, body []byte, keys ...string) {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body, &m), "body %s", body)
	got := make([]string, 0, len(m))
	for k := range m {
		got = append(got, k)
	}
	require.ElementsMatch(t, keys, got, "members of %s", body)
}

// The API's objects, as the contract shows them.
type (
	order struct {
		OrderID    string        `json:"orderId"`
		CustomerID string        `json:"customerId"`
		Amount     int64         `json:"amount"`
		Refunded   int64         `json:"refunded"`
		Refunds    []orderRefund `json:"refunds"`
	}
	orderRefund struct {
		RefundID         string  `json:"refundId"`
		Amount           int64   `json:"amount"`
		Status           string  `json:"status"`
		ProviderRefundID *string `json:"providerRefundId"`
	}
	refundBody struct {
		RefundID         string  `json:"refundId"`
		OrderID          string  `json:"orderId"`
		Amount           int64   `json:"amount"`
		Status           string  `json:"status"`
		ProviderRefundID *string `json:"providerRefundId"`
		Receipt          *string `json:"receipt"`
		// ProviderConfirmed is GET /refunds/{id}'s: the provider's webhook
		// event was applied.
		ProviderConfirmed bool `json:"providerConfirmed"`
	}
	account struct {
		Account string `json:"account"`
		Balance int64  `json:"balance"`
	}
	operation struct {
		OperationID    string     `json:"operationId"`
		Name           string     `json:"name"`
		Version        int        `json:"version"`
		Key            string     `json:"key"`
		Status         string     `json:"status"`
		NeedsAttention bool       `json:"needsAttention"`
		CreatedAt      time.Time  `json:"createdAt"`
		FinishedAt     *time.Time `json:"finishedAt"`
		Steps          []step     `json:"steps"`
	}
	step struct {
		Name       string     `json:"name"`
		Status     string     `json:"status"`
		Attempts   int        `json:"attempts"`
		DerivedKey string     `json:"derivedKey"`
		ResolvedBy string     `json:"resolvedBy"`
		SettleBy   *time.Time `json:"settleBy"`
		StartedAt  *time.Time `json:"startedAt"`
		FinishedAt *time.Time `json:"finishedAt"`
		LastError  *string    `json:"lastError"`
	}
	providerRefund struct {
		ID             string    `json:"id"`
		IdempotencyKey string    `json:"idempotencyKey"`
		OrderID        string    `json:"orderId"`
		Amount         int64     `json:"amount"`
		Status         string    `json:"status"`
		Requests       int       `json:"requests"`
		CreatedAt      time.Time `json:"createdAt"`
	}
)

// createOrder creates an order under a new key and returns the 201's body.
func (c *apiClient) createOrder(orderID, customerID string, amount int64) order {
	c.t.Helper()
	r := c.post("/orders", newKey(), map[string]any{"orderId": orderID, "customerId": customerID, "amount": amount})
	requireStatus(c.t, r, http.StatusCreated)
	return decodeAs[order](c.t, r)
}

func (c *apiClient) getOrder(orderID string) order {
	c.t.Helper()
	r := c.get("/orders/" + url.PathEscape(orderID))
	requireStatus(c.t, r, http.StatusOK)
	return decodeAs[order](c.t, r)
}

func (c *apiClient) getRefund(refundID string) refundBody {
	c.t.Helper()
	r := c.get("/refunds/" + url.PathEscape(refundID))
	requireStatus(c.t, r, http.StatusOK)
	return decodeAs[refundBody](c.t, r)
}

func (c *apiClient) getOperation(id string) operation {
	c.t.Helper()
	r := c.get("/operations/" + id)
	requireStatus(c.t, r, http.StatusOK)
	require.Equal(c.t, id, r.header.Get("Operation-Id"))
	return decodeAs[operation](c.t, r)
}

func (c *apiClient) accounts() []account {
	c.t.Helper()
	r := c.get("/accounts")
	requireStatus(c.t, r, http.StatusOK)
	requireKeys(c.t, r.body, "accounts")
	body := decodeAs[struct {
		Accounts []account `json:"accounts"`
	}](c.t, r)
	require.NotNil(c.t, body.Accounts, "accounts must be [], not null")
	return body.Accounts
}

// providerRefunds lists every refund the fake provider made.
func (c *apiClient) providerRefunds() []providerRefund {
	c.t.Helper()
	r := c.get("/provider/refunds")
	// Right after a chaos run's faults, a read may meet a pooled connection
	// that the fault proxy reset (500): the provider's next read works.
	for try := 0; r.status >= 500 && try < 5; try++ {
		time.Sleep(200 * time.Millisecond)
		r = c.get("/provider/refunds")
	}
	requireStatus(c.t, r, http.StatusOK)
	body := decodeAs[struct {
		Refunds []providerRefund `json:"refunds"`
		Next    *string          `json:"next"`
	}](c.t, r)
	require.NotNil(c.t, body.Refunds, "refunds must be [], not null")
	return body.Refunds
}

// setFault injects a fault into the fake provider's next refund POSTs.
func (c *apiClient) setFault(mode string, count, delayMs int) {
	c.t.Helper()
	r := c.post("/provider/faults", "", map[string]any{"mode": mode, "count": count, "delayMs": delayMs})
	require.Equal(c.t, http.StatusNoContent, r.status, "body %s", r.body)
}

// requireBooks checks the client's ledger: accounts sorted by name, balances
// summing to zero, and the merchant's balance equal to its orders less its
// succeeded refunds (no refund may be pending when it is called).
func (c *apiClient) requireBooks(orders, refunds int64) []account {
	c.t.Helper()
	accounts := c.accounts()
	require.True(c.t, slices.IsSortedFunc(accounts, func(a, b account) int { return strings.Compare(a.Account, b.Account) }),
		"accounts sorted by name: %+v", accounts)
	var sum, merchant int64
	for _, a := range accounts {
		sum += a.Balance
		if a.Account == "merchant" {
			merchant = a.Balance
		}
	}
	require.Zero(c.t, sum, "balances sum to zero: %+v", accounts)
	require.Equal(c.t, orders-refunds, merchant, "merchant balance = orders - refunds: %+v", accounts)
	return accounts
}

// balance returns the balance of account among accounts, 0 when absent.
func balance(accounts []account, name string) int64 {
	for _, a := range accounts {
		if a.Account == name {
			return a.Balance
		}
	}
	return 0
}

// newKey returns a fresh idempotency key.
func newKey() string {
	return "key-" + rand.Text()
}

// emptyDatabaseURL creates an empty database (no migrations at all) on the test
// server and returns its URL. It is dropped at cleanup unless the test failed.
func emptyDatabaseURL(t *testing.T) string {
	t.Helper()
	admin := testdb.AdminURL(t)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	name := "e2e_empty_" + strings.ToLower(rand.Text())
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0")
	require.NoError(t, err)
	u, err := url.Parse(admin)
	require.NoError(t, err)
	u.Path = "/" + name
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kept the database of the failed test: %s", u)
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		require.NoError(t, err)
	})
	return u.String()
}
