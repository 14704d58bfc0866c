package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(t *testing.T, c *config)
		wantErr string
	}{
		{name: "Defaults", env: map[string]string{"HOME": "/home/ann"}, check: func(t *testing.T, c *config) {
			require.Equal(t, "127.0.0.1:8080", c.addr)
			require.Equal(t, defaultClients, c.clients)
			require.Equal(t, time.Second, c.retryBackoff)
			require.Equal(t, 5*time.Second, c.wait)
			require.Equal(t, 15*time.Second, c.lease)
			require.Equal(t, "/home/ann/.local/share/idemflow/demo-pg", c.dataDir)
			require.Empty(t, c.providerURL)
			require.Nil(t, c.crash)
			require.Equal(t, "demo-admin-token", c.adminToken)
		}},
		{name: "AdminToken", env: map[string]string{"HOME": "/h", "DEMO_ADMIN_TOKEN": "ops-1"}, check: func(t *testing.T, c *config) {
			require.Equal(t, "ops-1", c.adminToken)
		}},
		{name: "AdminTokenFlag", args: []string{"-admin-token", "ops-2"}, env: map[string]string{"HOME": "/h", "DEMO_ADMIN_TOKEN": "ops-1"}, check: func(t *testing.T, c *config) {
			require.Equal(t, "ops-2", c.adminToken)
		}},
		{name: "Pooler", env: map[string]string{"HOME": "/h", "DEMO_POOLER": "transaction", "DEMO_DIRECT_DATABASE_URL": "postgres://u@db:5433/d"}, check: func(t *testing.T, c *config) {
			require.True(t, c.pooler)
			require.Equal(t, "db", c.direct.Host)
			require.Equal(t, uint16(5433), c.direct.Port)
		}},
		{name: "PoolerNone", args: []string{"-pooler", "none"}, env: map[string]string{"HOME": "/h", "DEMO_POOLER": "transaction"}, check: func(t *testing.T, c *config) {
			require.False(t, c.pooler)
			require.Nil(t, c.direct)
		}},
		{name: "PoolerSession", args: []string{"-pooler", "session"}, wantErr: `-pooler: "session" is not none or transaction`},
		{name: "DirectWithoutPooler", args: []string{"-direct-database-url", "postgres://db"}, wantErr: "-direct-database-url is for -pooler transaction"},
		{name: "DirectBad", args: []string{"-pooler", "transaction", "-direct-database-url", "postgres://db:port"}, wantErr: "-direct-database-url"},
		{name: "AdminTokenWithSpace", args: []string{"-admin-token", "ops 2"}, wantErr: "-admin-token"},
		{name: "AdminTokenBlank", args: []string{"-admin-token", "  "}, wantErr: "-admin-token"},
		{name: "AdminTokenIsAClients", args: []string{"-clients", "a=x,b=y", "-admin-token", "y"}, wantErr: "client b has the same token"},
		{name: "Environment", env: map[string]string{
			"DEMO_ADDR": "127.0.0.1:9000", "DEMO_CLIENTS": "x=tx, y=ty", "DEMO_RETRY_BACKOFF": "100ms",
			"DEMO_WAIT": "2s", "DEMO_LEASE": "3s", "DEMO_PROVIDER_URL": "http://p/", "XDG_DATA_HOME": "/xdg",
			"DEMO_CRASH": "provider:after-effect", "DATABASE_URL": "postgres://db",
		}, check: func(t *testing.T, c *config) {
			require.Equal(t, "127.0.0.1:9000", c.addr)
			require.Equal(t, []client{{"x", "tx"}, {"y", "ty"}}, c.clients)
			require.Equal(t, 100*time.Millisecond, c.retryBackoff)
			require.Equal(t, 2*time.Second, c.wait)
			require.Equal(t, 3*time.Second, c.lease)
			require.Equal(t, "http://p", c.providerURL)
			require.Equal(t, "/xdg/idemflow/demo-pg", c.dataDir)
			require.Equal(t, &crashPoint{step: "provider", point: "after-effect"}, c.crash)
			require.Equal(t, "postgres://db", c.databaseURL)
		}},
		{name: "FlagBeatsEnvironment", args: []string{"-wait", "1s", "-data-dir", "/d"}, env: map[string]string{"DEMO_WAIT": "9s"}, check: func(t *testing.T, c *config) {
			require.Equal(t, time.Second, c.wait)
			require.Equal(t, "/d", c.dataDir)
		}},
		{name: "BadBackoff", args: []string{"-retry-backoff", "soon"}, wantErr: "-retry-backoff"},
		{name: "NegativeWait", env: map[string]string{"DEMO_WAIT": "-1s"}, wantErr: "-wait"},
		{name: "ShortLease", args: []string{"-lease", "10ms"}, wantErr: "at least 1s"},
		{name: "ClientWithoutToken", args: []string{"-clients", "a="}, wantErr: "not name=token"},
		{name: "DuplicateClient", args: []string{"-clients", "a=1,a=2"}, wantErr: "named twice"},
		{name: "SharedToken", args: []string{"-clients", "a=1,b=1"}, wantErr: "share the token"},
		{name: "ClientNameWithColon", args: []string{"-clients", "queue:a=1"}, wantErr: "no ':'"},
		{name: "CrashUnknownStep", env: map[string]string{"DEMO_CRASH": "refund:before"}, wantErr: "DEMO_CRASH"},
		{name: "CrashUnknownPoint", env: map[string]string{"DEMO_CRASH": "ledger:after"}, wantErr: "DEMO_CRASH"},
		{name: "StrayArgument", args: []string{"extra"}, wantErr: "unexpected argument"},
		{name: "ReconcileDefaults", check: func(t *testing.T, c *config) {
			require.Equal(t, time.Minute, c.reconcileInterval)
			require.Equal(t, 24*time.Hour, c.retention)
			require.Equal(t, c.retention, c.reconcileWindow, "the window defaults to -retention")
		}},
		{name: "ReconcileWindowFollowsRetention", args: []string{"-retention", "2h"}, check: func(t *testing.T, c *config) {
			require.Equal(t, 2*time.Hour, c.reconcileWindow)
		}},
		{name: "ReconcileFlags", args: []string{"-reconcile-interval", "0", "-reconcile-window", "1h"}, check: func(t *testing.T, c *config) {
			require.Zero(t, c.reconcileInterval, "0: only on request")
			require.Equal(t, time.Hour, c.reconcileWindow)
			require.Equal(t, -time.Duration(1), reconcileConfig(c, "http://p").Interval, "0 is the engine's only on request")
		}},
		{name: "ReconcileEnvironment", env: map[string]string{"HOME": "/h", "DEMO_RECONCILE_INTERVAL": "30s", "DEMO_RECONCILE_WINDOW": "24h"}, check: func(t *testing.T, c *config) {
			require.Equal(t, 30*time.Second, c.reconcileInterval)
			require.Equal(t, 24*time.Hour, c.reconcileWindow, "as long as -retention is allowed")
			rc := reconcileConfig(c, "http://p")
			require.Equal(t, 30*time.Second, rc.Interval)
			require.Equal(t, 24*time.Hour, rc.Window)
			require.Len(t, rc.Sources, 1)
		}},
		{name: "ReconcileWindowOverRetention", args: []string{"-retention", "1h", "-reconcile-window", "90m"}, wantErr: "-reconcile-window: 1h30m0s is longer than -retention (1h0m0s)"},
		{name: "ReconcileWindowOverDefaultRetention", env: map[string]string{"HOME": "/h", "DEMO_RECONCILE_WINDOW": "25h"}, wantErr: "longer than -retention"},
		{name: "ReconcileWindowZero", args: []string{"-reconcile-window", "0"}, wantErr: "-reconcile-window"},
		{name: "ReconcileWindowNegative", args: []string{"-reconcile-window", "-1h"}, wantErr: "-reconcile-window"},
		{name: "ReconcileIntervalNegative", args: []string{"-reconcile-interval", "-1s"}, wantErr: "-reconcile-interval: \"-1s\" is not a duration of 0 or more"},
		{name: "ApprovalDefaults", check: func(t *testing.T, c *config) {
			require.Equal(t, int64(100000), c.approvalThreshold)
			require.Equal(t, 1, c.approvals)
			require.Equal(t, 72*time.Hour, c.approvalTimeout)
			rc := refundConfig(c)
			require.Equal(t, int64(100000), rc.ApprovalThreshold)
			require.Equal(t, 1, rc.Approvals)
			require.Equal(t, 72*time.Hour, rc.ApprovalTimeout)
		}},
		{name: "ApprovalFlags", args: []string{"-approval-threshold", "0", "-approvals", "2", "-approval-timeout", "90s", "-refund-versions", "1,2,3"},
			env: map[string]string{"HOME": "/h", "DEMO_APPROVALS": "5"}, check: func(t *testing.T, c *config) {
				require.Zero(t, c.approvalThreshold, "0: every refund of version 3 waits")
				require.Equal(t, 2, c.approvals)
				require.Equal(t, 90*time.Second, c.approvalTimeout)
				require.Equal(t, []int{1, 2, 3}, c.versions)
			}},
		{name: "ApprovalEnvironment", env: map[string]string{"HOME": "/h", "DEMO_APPROVAL_THRESHOLD": "5000", "DEMO_APPROVALS": "3", "DEMO_APPROVAL_TIMEOUT": "1h"},
			check: func(t *testing.T, c *config) {
				require.Equal(t, int64(5000), c.approvalThreshold)
				require.Equal(t, 3, c.approvals)
				require.Equal(t, time.Hour, c.approvalTimeout)
			}},
		{name: "ApprovalThresholdNegative", args: []string{"-approval-threshold", "-1"}, wantErr: "-approval-threshold"},
		{name: "ApprovalThresholdNotANumber", env: map[string]string{"HOME": "/h", "DEMO_APPROVAL_THRESHOLD": "10.5"}, wantErr: "-approval-threshold"},
		{name: "ApprovalsZero", args: []string{"-approvals", "0"}, wantErr: `-approvals: "0" is not a positive integer`},
		{name: "ApprovalsNotANumber", env: map[string]string{"HOME": "/h", "DEMO_APPROVALS": "two"}, wantErr: "-approvals"},
		{name: "ApprovalTimeoutZero", args: []string{"-approval-timeout", "0s"}, wantErr: "-approval-timeout"},
		{name: "ApprovalTimeoutNegative", env: map[string]string{"HOME": "/h", "DEMO_APPROVAL_TIMEOUT": "-1h"}, wantErr: "-approval-timeout"},
		{name: "RefundVersion4", args: []string{"-refund-versions", "3,4"}, wantErr: `-refund-versions: "4" is not a version of the refund definition (1, 2 or 3)`},
		{name: "ReconcileIntervalNotADuration", env: map[string]string{"HOME": "/h", "DEMO_RECONCILE_INTERVAL": "often"}, wantErr: "-reconcile-interval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := tt.env
			if env == nil {
				env = map[string]string{"HOME": "/h"}
			}
			c, err := parseConfig("demo", tt.args, envOf(env), io.Discard)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

// FuzzParseConfig feeds the environment variables arbitrary values: a clear error
// or a valid configuration, never a panic.
func FuzzParseConfig(f *testing.F) {
	f.Add("a=b,c=d", "1s", "5s", "15s", "ledger:before")
	f.Add("", "100ms", "0", "1h", "")
	f.Add("=,=", "-1s", "1e9", "15", "provider:")
	f.Add("a=b=c, d = e", "9223372036854775807ns", "5s", "2562047h", "finalize:after-effect")
	f.Fuzz(func(t *testing.T, clients, backoff, wait, lease, crash string) {
		env := map[string]string{"HOME": "/h", "DEMO_CLIENTS": clients, "DEMO_RETRY_BACKOFF": backoff,
			"DEMO_WAIT": wait, "DEMO_LEASE": lease, "DEMO_CRASH": crash}
		c, err := parseConfig("demo", nil, envOf(env), io.Discard)
		if err != nil {
			return
		}
		require.NotEmpty(t, c.clients)
		for _, cl := range c.clients {
			require.NotEmpty(t, cl.name)
			require.NotEmpty(t, cl.token)
			require.False(t, strings.ContainsAny(cl.name+cl.token, ","))
		}
		require.Positive(t, c.retryBackoff)
		require.Positive(t, c.wait)
		require.GreaterOrEqual(t, c.lease, time.Second)
		if crash == "" {
			require.Nil(t, c.crash)
		} else {
			require.Equal(t, crash, c.crash.step+":"+c.crash.point)
		}
	})
}
