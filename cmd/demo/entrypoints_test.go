package main

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestParseEntryFlags: the entry points' flags, their variables and their
// checks.
func TestParseEntryFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(t *testing.T, c entryConfig)
		wantErr string
	}{
		{name: "Defaults", check: func(t *testing.T, c entryConfig) {
			require.Equal(t, [][]byte{[]byte("demo-webhook-secret")}, c.webhookSecrets)
			require.Empty(t, c.webhookURL)
			require.Zero(t, c.queueDuplicates)
			require.Zero(t, c.settlementInterval)
		}},
		{name: "FromTheEnvironment", env: map[string]string{
			"DEMO_WEBHOOK_SECRET": "s1", "DEMO_WEBHOOK_URL": "http://x/hook", "DEMO_QUEUE_DUPLICATES": "3", "DEMO_SETTLEMENT_INTERVAL": "1h",
		}, check: func(t *testing.T, c entryConfig) {
			require.Equal(t, [][]byte{[]byte("s1")}, c.webhookSecrets)
			require.Equal(t, "http://x/hook", c.webhookURL)
			require.Equal(t, 3, c.queueDuplicates)
			require.Equal(t, time.Hour, c.settlementInterval)
		}},
		{name: "Rotation", args: []string{"-webhook-secret", "new, old"}, check: func(t *testing.T, c entryConfig) {
			require.Equal(t, [][]byte{[]byte("new"), []byte("old")}, c.webhookSecrets)
		}},
		{name: "IntervalAtHalfTheRetention", args: []string{"-settlement-interval", "12h"}, check: func(t *testing.T, c entryConfig) {
			require.Equal(t, 12*time.Hour, c.settlementInterval)
		}},
		{name: "EmptySecret", args: []string{"-webhook-secret", "a,,b"}, wantErr: "-webhook-secret"},
		{name: "NegativeDuplicates", args: []string{"-queue-duplicates", "-1"}, wantErr: "-queue-duplicates"},
		{name: "TooManyDuplicates", args: []string{"-queue-duplicates", "101"}, wantErr: "-queue-duplicates"},
		{name: "IntervalNotSeconds", args: []string{"-settlement-interval", "1500ms"}, wantErr: "whole number of seconds"},
		{name: "IntervalNegative", args: []string{"-settlement-interval", "-1m"}, wantErr: "-settlement-interval"},
		{name: "IntervalTooLong", args: []string{"-settlement-interval", "13h"}, wantErr: "more than half of -retention"},
		{name: "IntervalAndRetention", args: []string{"-settlement-interval", "13h", "-retention", "48h"}, check: func(t *testing.T, c entryConfig) {
			require.Equal(t, 13*time.Hour, c.settlementInterval)
		}},
		{name: "CrashConsume", env: map[string]string{"DEMO_CRASH": "consume:after-effect"}, check: func(*testing.T, entryConfig) {}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"HOME": "/h"}
			for k, v := range tc.env {
				env[k] = v
			}
			c, err := parseConfig("demo", tc.args, envOf(env), io.Discard)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			tc.check(t, c.entry)
		})
	}
}
