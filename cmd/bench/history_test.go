package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHistoryMode runs -mode history briefly against the test cluster: the
// refunds run on both databases, the deletes remove the history's operations
// as they come due, and the samples read the tables. It asserts counts, never
// speed.
func TestHistoryMode(t *testing.T) {
	t.Parallel()
	sums := map[string]historySummary{}
	samples := 0
	for _, line := range runJSON(t, "-mode", "history", "-history", "300", "-c", "4", "-warmup", "4",
		"-history-duration", "4s", "-phase", "2s", "-sample", "1s", "-expire-rate", "1000", "-retention-interval", "200ms") {
		var s historySummary
		require.NoError(t, json.Unmarshal(line, &s), string(line))
		if s.Summary {
			sums[s.Database] = s
			continue
		}
		var sample historySample
		require.NoError(t, json.Unmarshal(line, &sample), string(line))
		require.Len(t, sample.Tables, len(historyTablesStats))
		require.Zero(t, sample.ErrorsWindow)
		samples++
	}
	require.GreaterOrEqual(t, samples, 3)
	require.Len(t, sums, 2)
	for _, db := range []string{"history", "empty"} {
		require.Positive(t, sums[db].Refunds, db)
		require.Equal(t, 1, sums[db].Phases, db)
	}
	// 2 s of the history's phase at 1,000 a second: all 300 came due, and the
	// deletes took them in one batch each run.
	require.Equal(t, int64(300), sums["history"].Deleted)
	require.Positive(t, sums["history"].Batches)
	require.Zero(t, sums["empty"].Deleted)
}
