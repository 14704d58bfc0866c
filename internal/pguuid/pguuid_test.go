package pguuid_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/internal/testdb"
)

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.Pool(t)
	id := uuid.Must(uuid.NewV7())

	var got pguuid.UUID
	var text string
	require.NoError(t, pool.QueryRow(ctx, `SELECT $1::uuid, $1::uuid::text`, pguuid.UUID(id)).Scan(&got, &text))
	require.Equal(t, id, uuid.UUID(got))
	require.Equal(t, id.String(), text)
	require.Equal(t, id.String(), got.String())

	var ptr *pguuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT $1::uuid`, pguuid.Ptr(nil)).Scan(&ptr))
	require.Nil(t, ptr)
	require.Nil(t, pguuid.FromPtr(ptr))
	require.NoError(t, pool.QueryRow(ctx, `SELECT $1::uuid`, pguuid.Ptr(&id)).Scan(&ptr))
	require.Equal(t, &id, pguuid.FromPtr(ptr))

	require.ErrorContains(t, pool.QueryRow(ctx, `SELECT NULL::uuid`).Scan(&got), "NULL")
}
