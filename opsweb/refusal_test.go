package opsweb

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
)

// TestOtherRefusal: a refusal with no answer of its own is still a refusal
// (409, with the engine's code), never a 500.
func TestOtherRefusal(t *testing.T) {
	t.Parallel()
	why := engine.Refusal("cannot_cancel")
	err := fmt.Errorf("engine: cancel: %w", why)
	for name, ref := range map[string]*refusal{
		"cancel":  operatorRefusal(why, err),
		"approve": decisionRefusal(actionApprove, why, err),
	} {
		require.Equal(t, &refusal{Status: http.StatusConflict, Code: "cannot_cancel", Message: err.Error()}, ref, name)
	}
}
