package main

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestParseConfigFailure checks the flags of the failure semantics: their
// defaults, flags and environment, and that an invalid value is refused with a
// message naming the flag, which makes the demo exit 2.
func TestParseConfigFailure(t *testing.T) {
	t.Parallel()

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		c, err := parseConfig("demo", nil, envOf(map[string]string{"HOME": "/h"}), io.Discard)
		require.NoError(t, err)
		require.Equal(t, 10, c.maxAttempts)
		require.Equal(t, 24*time.Hour, c.retention)
		require.Nil(t, c.panics)
		require.Nil(t, c.fails)
		require.Equal(t, 10*time.Second, c.providerTimeout)
		require.Equal(t, 2*time.Minute, c.providerSettle)
	})

	t.Run("Valid", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			name  string
			args  []string
			env   map[string]string
			check func(t *testing.T, c *config)
		}{
			{"Flags", []string{"-max-attempts", "2", "-retention", "1s"}, nil, func(t *testing.T, c *config) {
				require.Equal(t, 2, c.maxAttempts)
				require.Equal(t, time.Second, c.retention)
			}},
			{"Environment", nil, map[string]string{"DEMO_MAX_ATTEMPTS": "3", "DEMO_RETENTION": "90m"}, func(t *testing.T, c *config) {
				require.Equal(t, 3, c.maxAttempts)
				require.Equal(t, 90*time.Minute, c.retention)
			}},
			{"FlagBeatsEnvironment", []string{"-max-attempts", "4"}, map[string]string{"DEMO_MAX_ATTEMPTS": "9"}, func(t *testing.T, c *config) {
				require.Equal(t, 4, c.maxAttempts)
			}},
			{"Faults", nil, map[string]string{"DEMO_PANIC": "provider:2", "DEMO_FAIL": "finalize:6"}, func(t *testing.T, c *config) {
				require.Equal(t, &stepFault{step: "provider", n: 2}, c.panics)
				require.Equal(t, &stepFault{step: "finalize", n: 6}, c.fails)
			}},
			{"FaultsEveryStep", nil, map[string]string{"DEMO_PANIC": "ledger:1", "DEMO_FAIL": "record:1"}, func(t *testing.T, c *config) {
				require.Equal(t, &stepFault{step: "ledger", n: 1}, c.panics)
				require.Equal(t, &stepFault{step: "record", n: 1}, c.fails)
			}},
			{"SettleAsLongAsTimeout", []string{"-provider-timeout", "500ms", "-provider-settle", "500ms"}, nil, func(t *testing.T, c *config) {
				require.Equal(t, 500*time.Millisecond, c.providerTimeout)
				require.Equal(t, 500*time.Millisecond, c.providerSettle)
			}},
			{"SettleShortWithShorterTimeout", nil, map[string]string{"DEMO_PROVIDER_TIMEOUT": "300ms", "DEMO_PROVIDER_SETTLE": "1s"}, func(t *testing.T, c *config) {
				require.Equal(t, 300*time.Millisecond, c.providerTimeout)
				require.Equal(t, time.Second, c.providerSettle)
			}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				env := map[string]string{"HOME": "/h"}
				for k, v := range tt.env {
					env[k] = v
				}
				c, err := parseConfig("demo", tt.args, envOf(env), io.Discard)
				require.NoError(t, err)
				tt.check(t, c)
			})
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			name string
			args []string
			env  map[string]string
			want string
		}{
			{"MaxAttemptsZero", []string{"-max-attempts", "0"}, nil, "-max-attempts"},
			{"MaxAttemptsNegative", []string{"-max-attempts", "-1"}, nil, "-max-attempts"},
			{"MaxAttemptsNotNumber", []string{"-max-attempts", "x"}, nil, "-max-attempts"},
			{"MaxAttemptsEnv", nil, map[string]string{"DEMO_MAX_ATTEMPTS": "1.5"}, "-max-attempts"},
			{"RetentionZero", []string{"-retention", "0"}, nil, "-retention"},
			{"RetentionNegative", []string{"-retention", "-1s"}, nil, "-retention"},
			{"RetentionEnv", nil, map[string]string{"DEMO_RETENTION": "soon"}, "-retention"},
			{"PanicUnknownStep", nil, map[string]string{"DEMO_PANIC": "nosuchstep:1"}, "DEMO_PANIC"},
			{"PanicNoCount", nil, map[string]string{"DEMO_PANIC": "provider"}, "DEMO_PANIC"},
			{"PanicZero", nil, map[string]string{"DEMO_PANIC": "provider:0"}, "DEMO_PANIC"},
			{"FailZero", nil, map[string]string{"DEMO_FAIL": "provider:0"}, "DEMO_FAIL"},
			{"FailNegative", nil, map[string]string{"DEMO_FAIL": "ledger:-2"}, "DEMO_FAIL"},
			{"FailNotNumber", nil, map[string]string{"DEMO_FAIL": "finalize:x"}, "DEMO_FAIL"},
			{"FailUnknownStep", nil, map[string]string{"DEMO_FAIL": "refund:1"}, "DEMO_FAIL"},
			{"SettleShorterThanDefaultTimeout", []string{"-provider-settle", "1s"}, nil, "-provider-settle: 1s is shorter than -provider-timeout (10s)"},
			{"SettleShorterThanTimeout", []string{"-provider-timeout", "30s", "-provider-settle", "20s"}, nil, "-provider-settle: 20s is shorter than -provider-timeout (30s)"},
			{"SettleShorterThanTimeoutEnv", nil, map[string]string{"DEMO_PROVIDER_TIMEOUT": "3m"}, "-provider-settle: 2m0s is shorter than -provider-timeout (3m0s)"},
			{"SettleZero", []string{"-provider-settle", "0"}, nil, "-provider-settle"},
			{"TimeoutZero", []string{"-provider-timeout", "0s"}, nil, "-provider-timeout"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				env := map[string]string{"HOME": "/h"}
				for k, v := range tt.env {
					env[k] = v
				}
				_, err := parseConfig("demo", tt.args, envOf(env), io.Discard)
				require.ErrorContains(t, err, tt.want)
				// The demo refuses it before it opens a database: exit status 2.
				var stdout, stderr bytes.Buffer
				require.Equal(t, 2, run(tt.args, envOf(env), &stdout, &stderr))
				require.Contains(t, stderr.String(), tt.want)
				require.Empty(t, stdout.String())
			})
		}
	})

	// demo ops takes the server's flags and refuses what the server refuses,
	// before it opens a database: a shorter window would let an operator's
	// "not made" come before the request can no longer land.
	t.Run("OpsSettleShorterThanTimeout", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{
			{"ops", "-provider-settle", "1s", "list"},
			{"ops", "-provider-timeout", "5s", "-provider-settle", "4s", "resolve", "00000000-0000-0000-0000-000000000001", "not-made", "why"},
		} {
			var stdout, stderr bytes.Buffer
			require.Equal(t, 2, run(args, envOf(map[string]string{"HOME": "/h"}), &stdout, &stderr), args)
			require.Contains(t, stderr.String(), "demo ops: -provider-settle")
			require.Contains(t, stderr.String(), "is shorter than -provider-timeout")
			require.Empty(t, stdout.String())
		}
	})
}
