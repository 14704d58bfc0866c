package httpstep

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{value: "", ok: false},
		{value: "0", ok: false},
		{value: "1", want: time.Second, ok: true},
		{value: " 90 ", want: 90 * time.Second, ok: true},
		{value: "-1", ok: false},
		{value: "1.5", ok: false},
		{value: "+3", ok: false},
		{value: "31622400", want: maxRetryAfter, ok: true},
		{value: "31622401", want: maxRetryAfter, ok: true},
		{value: "99999999999999999999", want: maxRetryAfter, ok: true},
		{value: "Sun, 01 Mar 2026 12:02:30 GMT", want: 150 * time.Second, ok: true}, // IMF-fixdate
		{value: "Sunday, 01-Mar-26 12:00:10 GMT", want: 10 * time.Second, ok: true}, // RFC 850
		{value: "Sun Mar  1 12:00:05 2026", want: 5 * time.Second, ok: true},        // ANSI C
		{value: "Sun, 01 Mar 2026 12:00:00 GMT", ok: false},                         // now
		{value: "Sun, 01 Mar 2026 11:00:00 GMT", ok: false},                         // past
		{value: "Mon, 01 Mar 2100 12:00:00 GMT", want: maxRetryAfter, ok: true},
		{value: "tomorrow", ok: false},
	} {
		got, ok := retryAfter(tc.value, now)
		require.Equal(t, tc.ok, ok, "%q", tc.value)
		if tc.ok {
			require.Equal(t, tc.want, got, "%q", tc.value)
		}
	}
}
