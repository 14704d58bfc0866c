package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestIsUnavailable(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("engine: commit: %w", &pgconn.PgError{Code: code}) }
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"Nil", nil, false},
		{"errUnavailable", fmt.Errorf("start: %w", errUnavailable), true},
		{"LeaseExpiring", errLeaseExpiring, true},
		{"Deadline", context.DeadlineExceeded, true},
		{"EOF", io.ErrUnexpectedEOF, true},
		{"ConnectionException", pg("08006"), true},
		{"ShuttingDown", pg("57P01"), true},
		{"TooManyConnections", pg("53300"), true},
		{"StatementTimeout", pg("57014"), true},
		{"LockTimeout", pg("55P03"), true},
		{"UniqueViolation", pg("23505"), false},
		{"CheckViolation", pg("23514"), false},
		{"Fenced", pg("IF001"), false},
		{"Other", errors.New("boom"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, IsUnavailable(tt.err))
		})
	}
}
