package engine

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	policy := RetryPolicy{Base: time.Second, Factor: 2, Cap: time.Minute}.withDefaults()
	failed := errors.New("503")
	tests := []struct {
		name    string
		attempt int
		err     error
		want    time.Duration
	}{
		{"PlainError", 1, failed, time.Second},
		{"ThirdAttempt", 3, failed, 4 * time.Second},
		{"RetryAfterLonger", 1, RetryAfter(failed, 10*time.Second), 10 * time.Second},
		{"RetryAfterShorter", 3, RetryAfter(failed, time.Second), 4 * time.Second},
		{"RetryAfterPastCap", 1, RetryAfter(failed, time.Hour), time.Minute},
		{"Wrapped", 1, fmt.Errorf("call: %w", RetryAfter(failed, 30*time.Second)), 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := backoff(policy, tt.attempt, tt.err); got != tt.want {
				t.Fatalf("backoff = %s, want %s", got, tt.want)
			}
		})
	}
	if RetryAfter(nil, time.Second) != nil {
		t.Fatal("RetryAfter(nil) is not nil")
	}
	if err := RetryAfter(failed, time.Second); !errors.Is(err, failed) || err.Error() != "503" {
		t.Fatalf("RetryAfter hides its error: %v", err)
	}
}
