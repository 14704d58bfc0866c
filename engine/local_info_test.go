package engine_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
)

// TestLocalWaitInfoIsTheRow: the Info that a first attempt hands its starter,
// without a read, is what Get reads of the row: times from the database, the
// fingerprint, the answer.
func TestLocalWaitInfoIsTheRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, op, _ := setup(t, setupOpts{})
	for _, in := range []transferIn{{From: "a", To: "b", Amount: 5}, {From: "a", To: "b", Amount: 0}} {
		s, err := engine.Start(ctx, e, op, "c", "k-"+string(rune('0'+in.Amount)), in, nil)
		require.NoError(t, err)
		local, err := s.Wait(ctx)
		require.NoError(t, err)
		stored, err := e.Get(ctx, s.ID)
		require.NoError(t, err)
		stored.Steps = nil
		require.False(t, local.CreatedAt.IsZero())
		require.Equal(t, stored.CreatedAt, local.CreatedAt)
		require.Equal(t, stored.FinishedAt, local.FinishedAt)
		require.Equal(t, stored.Fingerprint, local.Fingerprint)
		require.Equal(t, stored.Status, local.Status)
		require.JSONEq(t, string(orNull(stored.Result)), string(orNull(local.Result)))
		require.Equal(t, stored.Error, local.Error)
	}
}

func orNull(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}
