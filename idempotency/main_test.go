package idempotency_test

import (
	"testing"

	"github.com/idemflow/idemflow/internal/testmain"
)

func TestMain(m *testing.M) { testmain.Run(m) }
