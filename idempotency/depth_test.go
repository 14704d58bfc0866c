package idempotency_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idempotency"
)

func TestMaxDepth(t *testing.T) {
	t.Parallel()
	nested := func(levels int) string { // levels of arrays inside the body's object
		return `{"options":` + strings.Repeat("[", levels) + strings.Repeat("]", levels) + `}`
	}
	_, err := idempotency.FieldHashes([]byte(nested(idempotency.MaxDepth - 1)))
	require.NoError(t, err, "the body and MaxDepth-1 arrays make MaxDepth levels")
	_, err = idempotency.FieldHashes([]byte(nested(idempotency.MaxDepth)))
	var fe *idempotency.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "options"+strings.Repeat("[0]", idempotency.MaxDepth-1), fe.Param)
	require.Contains(t, fe.Message, "nested more than")
}
