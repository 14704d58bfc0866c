package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/cmd/internal/demoapi"
	"github.com/idemflow/idemflow/workflows/refund"
)

// config is the demo's configuration: each flag can also come from the environment
// variable named beside it; a flag given on the command line wins.
type config struct {
	addr         string        // -addr, DEMO_ADDR
	clients      []client      // -clients, DEMO_CLIENTS
	retryBackoff time.Duration // -retry-backoff, DEMO_RETRY_BACKOFF
	wait         time.Duration // -wait, DEMO_WAIT
	lease        time.Duration // -lease, DEMO_LEASE
	providerURL  string        // -provider-url, DEMO_PROVIDER_URL
	dataDir      string        // -data-dir, DEMO_DATA_DIR
	databaseURL  string        // DATABASE_URL
	// pooler is set when DATABASE_URL goes through a pooler in transaction
	// mode; direct, when set, reaches the same database without it, for the
	// liveness lock.
	pooler       bool            // -pooler, DEMO_POOLER
	direct       *pgx.ConnConfig // -direct-database-url, DEMO_DIRECT_DATABASE_URL
	crash        *crashPoint     // DEMO_CRASH
	entry        entryConfig     // -webhook-secret, -webhook-url, -queue-duplicates, -settlement-interval (entrypoints.go)
	maxAttempts  int             // -max-attempts, DEMO_MAX_ATTEMPTS
	retention    time.Duration   // -retention, DEMO_RETENTION
	panics       *stepFault      // DEMO_PANIC
	fails        *stepFault      // DEMO_FAIL
	groupSenders int             // DEMO_GROUP_SENDERS
	maxInFlight  int             // -max-in-flight, DEMO_MAX_IN_FLIGHT
	perClient    int             // -max-in-flight-per-client, DEMO_MAX_IN_FLIGHT_PER_CLIENT
	versions     []int           // -refund-versions, DEMO_REFUND_VERSIONS
	providerAddr string          // -provider-addr, DEMO_PROVIDER_ADDR
	adminToken   string          // -admin-token, DEMO_ADMIN_TOKEN
	// providerTimeout bounds one attempt of the provider step; providerSettle
	// is the provider's longest processing time (the step's settle window).
	providerTimeout time.Duration // -provider-timeout, DEMO_PROVIDER_TIMEOUT
	providerSettle  time.Duration // -provider-settle, DEMO_PROVIDER_SETTLE
	// reconcileInterval is how often the books are checked against the
	// provider's records (0: only on request); reconcileWindow how far back.
	reconcileInterval time.Duration // -reconcile-interval, DEMO_RECONCILE_INTERVAL
	reconcileWindow   time.Duration // -reconcile-window, DEMO_RECONCILE_WINDOW
	// Refunds of version 3 of at least approvalThreshold wait for approvals
	// distinct operators, for at most approvalTimeout.
	approvalThreshold int64         // -approval-threshold, DEMO_APPROVAL_THRESHOLD
	approvals         int           // -approvals, DEMO_APPROVALS
	approvalTimeout   time.Duration // -approval-timeout, DEMO_APPROVAL_TIMEOUT
}

// stepFault is a fault that DEMO_PANIC or DEMO_FAIL injects: the step's first n
// attempts panic, or fail transiently, before they do anything.
type stepFault struct {
	step string
	n    int
}

// client is an API client of the demo and its bearer token.
type client struct {
	name  string
	token string
}

// crashPoint is where DEMO_CRASH makes the process exit.
type crashPoint struct {
	step  string
	point string
}

const crashExitCode = 86

// apiClients are the clients as the API takes them.
func apiClients(cs []client) []demoapi.Client {
	out := make([]demoapi.Client, len(cs))
	for i, c := range cs {
		out[i] = demoapi.Client{Name: c.name, Token: c.token}
	}
	return out
}

// defaultAdminToken is the operators' secret unless -admin-token says
// otherwise.
const defaultAdminToken = "demo-admin-token"

var defaultClients = []client{{name: "merchant-a", token: "demo-token-a"}, {name: "merchant-b", token: "demo-token-b"}}

// parseConfig reads the flags in args (without the program name) and the
// environment through getenv.
func parseConfig(name string, args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	env := func(key, def string) string {
		if v := getenv(key); v != "" {
			return v
		}
		return def
	}
	addr := fs.String("addr", env("DEMO_ADDR", "127.0.0.1:8080"), "address to listen on (DEMO_ADDR)")
	clients := fs.String("clients", env("DEMO_CLIENTS", ""), "API clients as name=token,name=token (DEMO_CLIENTS); default: merchant-a=demo-token-a,merchant-b=demo-token-b")
	backoff := fs.String("retry-backoff", env("DEMO_RETRY_BACKOFF", "1s"), "base of the exponential backoff between attempts of a failed step (DEMO_RETRY_BACKOFF)")
	wait := fs.String("wait", env("DEMO_WAIT", "5s"), "how long a request waits for its operation before answering 202 (DEMO_WAIT)")
	lease := fs.String("lease", env("DEMO_LEASE", "15s"), "how long a crashed process's operations wait before another process takes them over (DEMO_LEASE)")
	providerURL := fs.String("provider-url", env("DEMO_PROVIDER_URL", ""), "the payment provider's base URL (DEMO_PROVIDER_URL); default: the fake provider under /provider of this server")
	dataDir := fs.String("data-dir", env("DEMO_DATA_DIR", ""), "data directory of the private PostgreSQL cluster used when DATABASE_URL is unset (DEMO_DATA_DIR); default: $XDG_DATA_HOME/idemflow/demo-pg")
	maxAttempts := fs.String("max-attempts", env("DEMO_MAX_ATTEMPTS", "10"), "attempts of a step that keeps failing transiently before the operation ends with a server fault (before the provider refunded) or needs attention (after) (DEMO_MAX_ATTEMPTS)")
	retention := fs.String("retention", env("DEMO_RETENTION", "24h"), "how long a finished operation, its key and its stored answer are kept (DEMO_RETENTION)")
	entryFlags := defineEntryFlags(fs, env)
	maxInFlight := fs.String("max-in-flight", env("DEMO_MAX_IN_FLIGHT", "1000"), "operations this process runs at once; beyond, a new keyed request answers 503 overloaded (DEMO_MAX_IN_FLIGHT)")
	perClient := fs.String("max-in-flight-per-client", env("DEMO_MAX_IN_FLIGHT_PER_CLIENT", "0"), "operations of one client this process runs at once; beyond, that client's new keyed requests answer 429 too_many_requests; 0: no bound (DEMO_MAX_IN_FLIGHT_PER_CLIENT)")
	versions := fs.String("refund-versions", env("DEMO_REFUND_VERSIONS", "1"), "versions of the refund definition this process runs (1, 2, 3), comma-separated; new refunds start on the highest (DEMO_REFUND_VERSIONS)")
	providerAddr := fs.String("provider-addr", env("DEMO_PROVIDER_ADDR", ""), "serve the fake provider on a listener of its own at this address instead of under /provider (DEMO_PROVIDER_ADDR)")
	adminToken := fs.String("admin-token", env("DEMO_ADMIN_TOKEN", defaultAdminToken), "the operators' secret for /ops, /riverui/ and /admin: HTTP Basic's password (any user name) or a bearer token (DEMO_ADMIN_TOKEN)")
	providerTimeout := fs.String("provider-timeout", env("DEMO_PROVIDER_TIMEOUT", "10s"), "how long one attempt of the provider step waits for the provider's answer (DEMO_PROVIDER_TIMEOUT)")
	providerSettle := fs.String("provider-settle", env("DEMO_PROVIDER_SETTLE", "2m"), "the provider's longest processing time: a refund request that got no definite answer may still be carried out this long after it was sent (DEMO_PROVIDER_SETTLE)")
	reconcileInterval := fs.String("reconcile-interval", env("DEMO_RECONCILE_INTERVAL", "1m"), "how often the books are checked against the provider's records; 0: only on POST /admin/reconciliation/run (DEMO_RECONCILE_INTERVAL)")
	reconcileWindow := fs.String("reconcile-window", env("DEMO_RECONCILE_WINDOW", ""), "how far back reconciliation reads the provider's records; default and at most -retention (DEMO_RECONCILE_WINDOW)")
	approvalThreshold := fs.String("approval-threshold", env("DEMO_APPROVAL_THRESHOLD", strconv.Itoa(refund.DefaultApprovalThreshold)), "refunds of version 3 of at least this amount (minor units) wait for operators' approval; 0: every one (DEMO_APPROVAL_THRESHOLD)")
	approvals := fs.String("approvals", env("DEMO_APPROVALS", strconv.Itoa(refund.DefaultApprovals)), "how many distinct operators must approve a refund that waits for approval (DEMO_APPROVALS)")
	approvalTimeout := fs.String("approval-timeout", env("DEMO_APPROVAL_TIMEOUT", refund.DefaultApprovalTimeout.String()), "how long a refund waits for its approvals before it expires (DEMO_APPROVAL_TIMEOUT)")
	pooler := fs.String("pooler", env("DEMO_POOLER", "none"), "none, or transaction: DATABASE_URL goes through a connection pooler in transaction mode (PgBouncer's pool_mode=transaction), and the demo keeps no session state on it (DEMO_POOLER)")
	directURL := fs.String("direct-database-url", env("DEMO_DIRECT_DATABASE_URL", ""), "with -pooler transaction, a URL of the same database that does not go through the pooler, for the liveness lock: a crashed process's operations are then taken over at once rather than when their lease ends (DEMO_DIRECT_DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}

	c := &config{addr: *addr, providerURL: strings.TrimRight(*providerURL, "/"), databaseURL: getenv("DATABASE_URL")}
	var err error
	if c.clients, err = parseClients(*clients); err != nil {
		return nil, fmt.Errorf("-clients: %w", err)
	}
	if c.retryBackoff, err = parsePositiveDuration(*backoff); err != nil {
		return nil, fmt.Errorf("-retry-backoff: %w", err)
	}
	if c.wait, err = parsePositiveDuration(*wait); err != nil {
		return nil, fmt.Errorf("-wait: %w", err)
	}
	if c.lease, err = parsePositiveDuration(*lease); err != nil {
		return nil, fmt.Errorf("-lease: %w", err)
	}
	if c.lease < time.Second {
		return nil, errors.New("-lease: must be at least 1s")
	}
	if c.dataDir = *dataDir; c.dataDir == "" {
		if c.dataDir, err = defaultDataDir(getenv); err != nil {
			return nil, err
		}
	}
	if c.crash, err = parseCrash(getenv("DEMO_CRASH")); err != nil {
		return nil, fmt.Errorf("DEMO_CRASH: %w", err)
	}
	if c.maxAttempts, err = strconv.Atoi(strings.TrimSpace(*maxAttempts)); err != nil || c.maxAttempts < 1 {
		return nil, fmt.Errorf("-max-attempts: %q is not a positive integer", *maxAttempts)
	}
	if c.retention, err = parsePositiveDuration(*retention); err != nil {
		return nil, fmt.Errorf("-retention: %w", err)
	}
	if c.entry, err = entryFlags.parse(c.retention); err != nil {
		return nil, err
	}
	if c.maxInFlight, err = strconv.Atoi(strings.TrimSpace(*maxInFlight)); err != nil || c.maxInFlight < 1 {
		return nil, fmt.Errorf("-max-in-flight: %q is not a positive integer", *maxInFlight)
	}
	if c.perClient, err = strconv.Atoi(strings.TrimSpace(*perClient)); err != nil || c.perClient < 0 {
		return nil, fmt.Errorf("-max-in-flight-per-client: %q is not an integer of 0 or more", *perClient)
	}
	if c.versions, err = parseVersions(*versions); err != nil {
		return nil, fmt.Errorf("-refund-versions: %w", err)
	}
	if c.providerTimeout, err = parsePositiveDuration(*providerTimeout); err != nil {
		return nil, fmt.Errorf("-provider-timeout: %w", err)
	}
	if c.providerSettle, err = parsePositiveDuration(*providerSettle); err != nil {
		return nil, fmt.Errorf("-provider-settle: %w", err)
	}
	// A request that timed out may land up to the provider's processing time
	// later: a window shorter than the call's timeout would let a lookup
	// conclude "not made" while the request may still be carried out.
	if c.providerSettle < c.providerTimeout {
		return nil, fmt.Errorf("-provider-settle: %s is shorter than -provider-timeout (%s): a request that timed out may still be carried out after its window", c.providerSettle, c.providerTimeout)
	}
	if c.reconcileInterval, err = time.ParseDuration(strings.TrimSpace(*reconcileInterval)); err != nil || c.reconcileInterval < 0 {
		return nil, fmt.Errorf("-reconcile-interval: %q is not a duration of 0 or more", *reconcileInterval)
	}
	c.reconcileWindow = c.retention
	if w := strings.TrimSpace(*reconcileWindow); w != "" {
		if c.reconcileWindow, err = parsePositiveDuration(w); err != nil {
			return nil, fmt.Errorf("-reconcile-window: %w", err)
		}
		if c.reconcileWindow > c.retention {
			return nil, fmt.Errorf("-reconcile-window: %s is longer than -retention (%s): refunds deleted by retention would look unknown", c.reconcileWindow, c.retention)
		}
	}
	if c.approvalThreshold, err = strconv.ParseInt(strings.TrimSpace(*approvalThreshold), 10, 64); err != nil || c.approvalThreshold < 0 {
		return nil, fmt.Errorf("-approval-threshold: %q is not an amount of 0 or more (minor units; 0: every refund of version 3 waits for approval)", *approvalThreshold)
	}
	if c.approvals, err = strconv.Atoi(strings.TrimSpace(*approvals)); err != nil || c.approvals < 1 {
		return nil, fmt.Errorf("-approvals: %q is not a positive integer", *approvals)
	}
	if c.approvalTimeout, err = parsePositiveDuration(strings.TrimSpace(*approvalTimeout)); err != nil {
		return nil, fmt.Errorf("-approval-timeout: %w", err)
	}
	switch strings.TrimSpace(*pooler) {
	case "none":
	case "transaction":
		c.pooler = true
	default:
		return nil, fmt.Errorf("-pooler: %q is not none or transaction", *pooler)
	}
	if d := strings.TrimSpace(*directURL); d != "" {
		if !c.pooler {
			return nil, errors.New("-direct-database-url is for -pooler transaction: without a pooler, DATABASE_URL is direct")
		}
		if c.direct, err = pgx.ParseConfig(d); err != nil {
			return nil, fmt.Errorf("-direct-database-url: %w", err)
		}
	}
	c.providerAddr = *providerAddr
	if c.providerAddr != "" && c.providerURL != "" {
		return nil, errors.New("-provider-addr serves the fake provider, -provider-url names another: give one")
	}
	if c.adminToken = strings.TrimSpace(*adminToken); c.adminToken == "" ||
		strings.ContainsFunc(c.adminToken, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return nil, fmt.Errorf("-admin-token: %q is not a token of visible ASCII characters", *adminToken)
	}
	for _, cl := range c.clients {
		if cl.token == c.adminToken {
			return nil, fmt.Errorf("-admin-token: client %s has the same token; a client's token must not open /ops", cl.name)
		}
	}
	if c.panics, err = parseStepFault(getenv("DEMO_PANIC")); err != nil {
		return nil, fmt.Errorf("DEMO_PANIC: %w", err)
	}
	if c.fails, err = parseStepFault(getenv("DEMO_FAIL")); err != nil {
		return nil, fmt.Errorf("DEMO_FAIL: %w", err)
	}
	if v := getenv("DEMO_GROUP_SENDERS"); v != "" {
		if c.groupSenders, err = strconv.Atoi(v); err != nil || c.groupSenders < 1 {
			return nil, fmt.Errorf("DEMO_GROUP_SENDERS: %q is not a positive integer", v)
		}
	}
	return c, nil
}

// parseStepFault reads <step>:<n>, n a positive integer. Empty means none.
func parseStepFault(s string) (*stepFault, error) {
	if s == "" {
		return nil, nil
	}
	step, count, ok := strings.Cut(s, ":")
	n, err := strconv.Atoi(count)
	if !ok || !slices.Contains(crashSteps, step) || err != nil || n < 1 {
		return nil, fmt.Errorf("%q is not <step>:<n> with step one of %s and n a positive integer", s, strings.Join(crashSteps, ", "))
	}
	return &stepFault{step: step, n: n}, nil
}

func parsePositiveDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, fmt.Errorf("%s is not positive", s)
	}
	return d, nil
}

// parseClients reads name=token,name=token. Empty means the default clients.
func parseClients(s string) ([]client, error) {
	if strings.TrimSpace(s) == "" {
		return slices.Clone(defaultClients), nil
	}
	var out []client
	names, tokens := map[string]bool{}, map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		name, token, ok := strings.Cut(strings.TrimSpace(part), "=")
		name, token = strings.TrimSpace(name), strings.TrimSpace(token)
		switch {
		case !ok || name == "" || token == "":
			return nil, fmt.Errorf("%q is not name=token", part)
		case strings.Contains(name, ":"):
			// The entry points' scopes are "webhook:..." and "queue:<client>":
			// a client's scope must never be one of them.
			return nil, fmt.Errorf("client %q: a client's name has no ':'", name)
		case names[name]:
			return nil, fmt.Errorf("client %q is named twice", name)
		case tokens[token]:
			return nil, fmt.Errorf("two clients share the token of %q", name)
		}
		names[name], tokens[token] = true, true
		out = append(out, client{name: name, token: token})
	}
	return out, nil
}

var crashSteps = append([]string{"ledger", "provider", "finalize", "receipt", "record"}, entryCrashSteps...)

// parseCrash reads DEMO_CRASH=<step>:<point>. Empty means no crash.
func parseCrash(s string) (*crashPoint, error) {
	if s == "" {
		return nil, nil
	}
	step, point, ok := strings.Cut(s, ":")
	if !ok || !slices.Contains(crashSteps, step) || (point != "before" && point != "after-effect") {
		return nil, fmt.Errorf("%q is not <step>:<point> with step one of %s and point before or after-effect", s, strings.Join(crashSteps, ", "))
	}
	return &crashPoint{step: step, point: point}, nil
}

func defaultDataDir(getenv func(string) string) (string, error) {
	if x := getenv("XDG_DATA_HOME"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "idemflow", "demo-pg"), nil
	}
	home := getenv("HOME")
	if home == "" {
		var err error
		if home, err = os.UserHomeDir(); err != nil {
			return "", fmt.Errorf("no -data-dir, and no home directory for the default: %w", err)
		}
	}
	return filepath.Join(home, ".local", "share", "idemflow", "demo-pg"), nil
}

// parseVersions parses a comma-separated list of refund versions: each 1, 2 or
// 3, none twice.
func parseVersions(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || v != refund.RefundV1 && v != refund.RefundV2 && v != refund.RefundV3 {
			return nil, fmt.Errorf("%q is not a version of the refund definition (1, 2 or 3)", strings.TrimSpace(part))
		}
		if slices.Contains(out, v) {
			return nil, fmt.Errorf("version %d given twice", v)
		}
		out = append(out, v)
	}
	return out, nil
}
