package schedule_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/entry/schedule"
)

func mustLoad(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

func TestSlot(t *testing.T) {
	t.Parallel()
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return v
	}
	paris, newYork, kolkata := mustLoad(t, "Europe/Paris"), mustLoad(t, "America/New_York"), mustLoad(t, "Asia/Kolkata")

	cases := []struct {
		name   string
		t      time.Time
		period time.Duration
		want   string
	}{
		{"the start of a slot is its own slot", utc("2026-12-01T10:00:00Z"), time.Hour, "2026-12-01T10:00:00Z"},
		{"a nanosecond before the start is the slot before", utc("2026-12-01T09:59:59.999999999Z"), time.Hour, "2026-12-01T09:00:00Z"},
		{"a nanosecond after the start", utc("2026-12-01T10:00:00.000000001Z"), time.Hour, "2026-12-01T10:00:00Z"},
		{"minutes", utc("2026-12-01T10:07:59Z"), time.Minute, "2026-12-01T10:07:00Z"},
		{"fifteen minutes", utc("2026-12-01T10:44:59Z"), 15 * time.Minute, "2026-12-01T10:30:00Z"},
		{"seconds", utc("2026-12-01T10:00:09.5Z"), 10 * time.Second, "2026-12-01T10:00:00Z"},
		{"a day starts at midnight UTC", utc("2026-12-01T23:59:59Z"), 24 * time.Hour, "2026-12-01T00:00:00Z"},
		{"a day across a year's end", utc("2027-01-01T00:00:00Z").Add(-time.Nanosecond), 24 * time.Hour, "2026-12-31T00:00:00Z"},
		{"a leap day", utc("2028-02-29T12:00:00Z"), 24 * time.Hour, "2028-02-29T00:00:00Z"},
		{"a week starts on Monday at midnight UTC", utc("2026-12-06T23:00:00Z"), 7 * 24 * time.Hour, "2026-11-30T00:00:00Z"},
		{"six hours", utc("2026-12-01T17:59:59Z"), 6 * time.Hour, "2026-12-01T12:00:00Z"},
		{"a local time is its UTC instant's slot", time.Date(2026, 12, 1, 11, 30, 0, 0, paris), time.Hour, "2026-12-01T10:00:00Z"},
		{"a local day is the UTC day of the instant", time.Date(2026, 12, 1, 21, 0, 0, 0, newYork), 24 * time.Hour, "2026-12-02T00:00:00Z"},
		{"a half-hour zone", time.Date(2026, 12, 1, 15, 45, 0, 0, kolkata), time.Hour, "2026-12-01T10:00:00Z"},
		// Paris leaves summer time on 2026-10-25 at 03:00 local: 02:30 happens
		// twice, an hour apart, and each is its own UTC hour.
		{"the first 02:30 of a DST change", time.Date(2026, 10, 25, 0, 30, 0, 0, time.UTC).In(paris), time.Hour, "2026-10-25T00:00:00Z"},
		{"the second 02:30 of a DST change", time.Date(2026, 10, 25, 1, 30, 0, 0, time.UTC).In(paris), time.Hour, "2026-10-25T01:00:00Z"},
		{"a day across a DST change is 24 UTC hours", time.Date(2026, 3, 29, 23, 0, 0, 0, paris), 24 * time.Hour, "2026-03-29T00:00:00Z"},
		{"the monotonic reading is dropped", utc("2026-12-01T10:20:00Z").Round(0), 30 * time.Minute, "2026-12-01T10:00:00Z"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := schedule.Slot(tc.t, tc.period)
			require.Equal(t, tc.want, got.Format(time.RFC3339Nano))
			require.Equal(t, time.UTC, got.Location())
			require.Equal(t, got, schedule.Slot(got, tc.period), "a slot is its own slot")
			require.Equal(t, got, schedule.Slot(got.Add(tc.period-time.Nanosecond), tc.period), "the slot's last instant")
		})
	}

	t.Run("now, as every process computes it", func(t *testing.T) {
		t.Parallel()
		now := time.Now() // with a monotonic reading
		got := schedule.Slot(now, time.Minute)
		require.Equal(t, got.String(), schedule.Slot(now.In(newYork), time.Minute).String())
		require.NotContains(t, got.String(), "m=", "no monotonic reading")
	})

	for _, period := range []time.Duration{0, -time.Hour, 1500 * time.Millisecond, time.Millisecond} {
		t.Run("period "+period.String()+" panics", func(t *testing.T) {
			t.Parallel()
			require.PanicsWithValue(t, "schedule: the period must be a positive whole number of seconds, not "+period.String(),
				func() { schedule.Slot(time.Now(), period) })
		})
	}
}

func TestKey(t *testing.T) {
	t.Parallel()
	slot := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	tokyo := mustLoad(t, "Asia/Tokyo")

	cases := []struct {
		name string
		op   string
		slot time.Time
		want string
	}{
		{"a UTC slot", "statement", slot, "schedule statement 2026-12-01T10:00:00Z"},
		{"a local time gives its UTC instant", "statement", slot.In(tokyo), "schedule statement 2026-12-01T10:00:00Z"},
		{"midnight", "fee", time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), "schedule fee 2027-01-01T00:00:00Z"},
		{"the operation's name is part of it", "interest", slot, "schedule interest 2026-12-01T10:00:00Z"},
		{"a name with spaces", "monthly fee", slot, "schedule monthly fee 2026-12-01T10:00:00Z"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := schedule.Key(tc.op, tc.slot)
			require.Equal(t, tc.want, got)
			require.True(t, strings.HasPrefix(got, schedule.KeyPrefix))
			// A space: idempotency.Handler takes visible ASCII only (0x21 to
			// 0x7E), so no client sends this key.
			require.Contains(t, got, " ")
		})
	}

	t.Run("consecutive slots have different keys", func(t *testing.T) {
		t.Parallel()
		seen := map[string]bool{}
		for i := range 1000 {
			k := schedule.Key("fee", slot.Add(time.Duration(i)*time.Second))
			require.False(t, seen[k], k)
			seen[k] = true
		}
	})
}
