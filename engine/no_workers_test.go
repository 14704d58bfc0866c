package engine_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
)

// syncBuffer is a bytes.Buffer safe for a logger and a test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestNoWorkersWarning: a process that hands operations to River without
// running workers says so, once.
func TestNoWorkersWarning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setupPool(t)
	b := &bundle{pool: pool}
	op := b.transferOp(t, engine.RetryPolicy{})
	var logs syncBuffer
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	for _, key := range []string{"k1", "k2"} {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := engine.StartTx(ctx, tx, e, op, "c", key, transferIn{From: "a", To: "b", Amount: 1}, nil)
			return err
		}))
	}
	require.Equal(t, 1, strings.Count(logs.String(), "this process runs no workers"), logs.String())
}
