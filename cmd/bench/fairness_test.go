package main

import (
	"encoding/json"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFairnessOptions(t *testing.T) {
	t.Parallel()
	getenv := func(string) string { return "" }
	for _, tc := range []struct {
		name     string
		args     []string
		perScope int
		err      string
	}{
		{name: "Defaults", args: []string{"-mode", "fairness"}, perScope: 3},
		{name: "PerScopeOfMaxInFlight", args: []string{"-mode", "fairness", "-max-in-flight", "40"}, perScope: 8},
		{name: "PerScopeAtLeastOne", args: []string{"-mode", "fairness", "-max-in-flight", "2"}, perScope: 1},
		{name: "PerScopeGiven", args: []string{"-mode", "fairness", "-max-in-flight-per-scope", "5"}, perScope: 5},
		{name: "NotWithOtherModes", args: []string{"-mode", "fairness,engine"}, err: "-mode fairness runs on its own"},
		{name: "NoRate", args: []string{"-mode", "fairness", "-rate", "0"}, err: "-rate must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseOptions(tc.args, getenv, io.Discard)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, []string{modeFairness}, o.modes)
			require.Equal(t, tc.perScope, o.fair.perScope)
		})
	}
}

func TestFairCompare(t *testing.T) {
	t.Parallel()
	alone := &fairResult{LightRate: 100, LightP99ms: 4, LightOpsPerS: 100, TotalOpsPerS: 400}
	before := &fairResult{LightRate: 100, LightP99ms: 40, LightOpsPerS: 30, TotalOpsPerS: 400}
	after := &fairResult{LightRate: 100, LightP99ms: 6, LightOpsPerS: 76, TotalOpsPerS: 390}
	fairCompare(alone, before, alone, before, after)
	// The share is a fifth of what the process did in before (80), below the
	// offered 100.
	require.InDelta(t, 80.0, after.Share, 1e-9)
	require.InDelta(t, 0.95, after.OfShare, 1e-9)
	require.InDelta(t, 1.5, after.P99VsAlone, 1e-9)
	require.InDelta(t, 10.0, before.P99VsAlone, 1e-9)
	require.InDelta(t, 1.0, alone.P99VsAlone, 1e-9)
}

// TestFairness runs the fairness mode briefly against the test cluster: the
// program works and counts what it should. It asserts counts, never speed.
func TestFairness(t *testing.T) {
	t.Parallel()
	results := map[string]fairResult{}
	for _, line := range runJSON(t, "-mode", "fairness", "-duration", "500ms", "-rate", "10", "-max-in-flight", "5") {
		var r fairResult
		require.NoError(t, json.Unmarshal(line, &r), string(line))
		results[r.Scenario] = r
	}
	require.Len(t, results, 3)
	for name, r := range results {
		require.Equal(t, modeFairness, r.Mode, name)
		require.Zero(t, r.Errors, name)
		require.Equal(t, 5, r.MaxInFlight, name)
		require.InDelta(t, 10.0, r.LightRate, 1e-9, name)
		require.Positive(t, r.LightOpsPerS, name)
		require.Positive(t, r.LightP99ms, name)
		require.GreaterOrEqual(t, r.LightP99ms, r.LightP50ms, name)
		require.Positive(t, r.Share, name)
	}
	require.Zero(t, results["alone"].HeavyRate)
	require.Equal(t, 1, results["alone"].PerScope)
	require.Zero(t, results["before"].PerScope)
	require.Equal(t, 1, results["after"].PerScope)
	for _, name := range []string{"before", "after"} {
		require.InDelta(t, 200.0, results[name].HeavyRate, 1e-9, name)
		require.Positive(t, results[name].HeavyOpsPerS, name)
	}
}
