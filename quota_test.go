package ratelimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestQuotaWindows holds Quota.Window to the calendar: daylight-saving days
// of 23 and 25 hours, month lengths, leap years, anchors past a month's end.
func TestQuotaWindows(t *testing.T) {
	paris, newYork := mustZone(t, "Europe/Paris"), mustZone(t, "America/New_York")
	utc := func(y int, m time.Month, d, h, min int) time.Time { return time.Date(y, m, d, h, min, 0, 0, time.UTC) }
	for _, tc := range []struct {
		name       string
		q          ratelimit.Quota
		at         time.Time
		start, end time.Time
	}{
		{"a UTC day", ratelimit.Quota{Allowance: 1, Period: ratelimit.Day}, utc(2026, 12, 6, 15, 0), utc(2026, 12, 6, 0, 0), utc(2026, 12, 7, 0, 0)},
		{"a day of 23 hours in Paris", ratelimit.CalendarQuota(1, ratelimit.Day, paris), utc(2027, 3, 28, 12, 0), utc(2027, 3, 27, 23, 0), utc(2027, 3, 28, 22, 0)},
		{"a day of 25 hours in Paris", ratelimit.CalendarQuota(1, ratelimit.Day, paris), utc(2027, 10, 31, 12, 0), utc(2027, 10, 30, 22, 0), utc(2027, 10, 31, 23, 0)},
		{"a day of 23 hours in New York", ratelimit.CalendarQuota(1, ratelimit.Day, newYork), utc(2027, 3, 14, 12, 0), utc(2027, 3, 14, 5, 0), utc(2027, 3, 15, 4, 0)},
		{"a day of 25 hours in New York", ratelimit.CalendarQuota(1, ratelimit.Day, newYork), utc(2027, 11, 7, 12, 0), utc(2027, 11, 7, 4, 0), utc(2027, 11, 8, 5, 0)},
		{"a week from Monday (Sunday the 6th)", ratelimit.Quota{Allowance: 1, Period: ratelimit.Week}, utc(2026, 12, 6, 23, 59), utc(2026, 11, 30, 0, 0), utc(2026, 12, 7, 0, 0)},
		{"a week from Friday 18:00 in New York", ratelimit.Quota{Allowance: 1, Period: ratelimit.Week, Start: time.Date(2026, 1, 2, 18, 0, 0, 0, newYork)}, utc(2026, 12, 4, 22, 0), utc(2026, 11, 27, 23, 0), utc(2026, 12, 4, 23, 0)},
		{"February of a leap year", ratelimit.Quota{Allowance: 1, Period: ratelimit.Month}, utc(2028, 2, 29, 23, 0), utc(2028, 2, 1, 0, 0), utc(2028, 3, 1, 0, 0)},
		{"a month from the 31st falls on February's last day", ratelimit.Quota{Allowance: 1, Period: ratelimit.Month, Start: time.Date(2026, 1, 31, 9, 0, 0, 0, paris)}, utc(2027, 2, 15, 0, 0), utc(2027, 1, 31, 8, 0), utc(2027, 2, 28, 8, 0)},
		{"and then on the 31st of March", ratelimit.Quota{Allowance: 1, Period: ratelimit.Month, Start: time.Date(2026, 1, 31, 9, 0, 0, 0, paris)}, utc(2027, 3, 5, 0, 0), utc(2027, 2, 28, 8, 0), utc(2027, 3, 31, 7, 0)},
		{"a month from the 15th at 09:00 in Paris", ratelimit.Quota{Allowance: 1, Period: ratelimit.Month, Start: time.Date(2026, 1, 15, 9, 0, 0, 0, paris)}, utc(2026, 12, 15, 7, 59), utc(2026, 11, 15, 8, 0), utc(2026, 12, 15, 8, 0)},
		{"a calendar month in Paris", ratelimit.CalendarQuota(1, ratelimit.Month, paris), utc(2026, 11, 30, 23, 30), utc(2026, 11, 30, 23, 0), utc(2026, 12, 31, 23, 0)},
		{"a year from February 29th, in a common year", ratelimit.Quota{Allowance: 1, Period: ratelimit.Year, Start: time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC)}, utc(2029, 6, 1, 0, 0), utc(2029, 2, 28, 0, 0), utc(2030, 2, 28, 0, 0)},
		{"a year from February 29th, in a leap year", ratelimit.Quota{Allowance: 1, Period: ratelimit.Year, Start: time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC)}, utc(2028, 3, 1, 0, 0), utc(2028, 2, 29, 0, 0), utc(2029, 2, 28, 0, 0)},
		{"a calendar year", ratelimit.Quota{Allowance: 1, Period: ratelimit.Year}, utc(2026, 12, 31, 23, 59), utc(2026, 1, 1, 0, 0), utc(2027, 1, 1, 0, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, e := tc.q.Window(tc.at)
			if !s.Equal(tc.start) || !e.Equal(tc.end) {
				t.Fatalf("Window(%v) = [%v, %v), want [%v, %v)", tc.at.UTC(), s.UTC(), e.UTC(), tc.start, tc.end)
			}
			// The windows tile the time line: the one before ends at s,
			// the next starts at e.
			if _, pe := tc.q.Window(s.Add(-time.Microsecond)); !pe.Equal(s) {
				t.Fatalf("the window before ends at %v, not at %v", pe.UTC(), s.UTC())
			}
			if ns, _ := tc.q.Window(e); !ns.Equal(e) {
				t.Fatalf("the window after starts at %v, not at %v", ns.UTC(), e.UTC())
			}
		})
	}
}

func TestQuotaValidation(t *testing.T) {
	store := memstore.New()
	for _, tc := range []struct {
		name   string
		limits []ratelimit.Limit
		quotas []ratelimit.Quota
		want   string
	}{
		{"an allowance of 0", []ratelimit.Limit{ratelimit.PerSecond(1)}, []ratelimit.Quota{{Period: ratelimit.Day}}, "quota 0: quota allowance must be at least 1 (got 0)"},
		{"an allowance above 2^53", []ratelimit.Limit{ratelimit.PerSecond(1)}, []ratelimit.Quota{{Allowance: 1<<53 + 1, Period: ratelimit.Day}}, "quota allowance must be at most 2^53"},
		{"no period", []ratelimit.Limit{ratelimit.PerSecond(1)}, []ratelimit.Quota{{Allowance: 5}}, "quota 0: quota period must be day, week, month or year (got 0)"},
		{"a start within a microsecond", []ratelimit.Limit{ratelimit.PerSecond(1)}, []ratelimit.Quota{{Allowance: 5, Period: ratelimit.Day, Start: time.Unix(0, 1)}}, "quota start must be a whole number of microseconds"},
		{"nine limits and quotas", make8Limits(), []ratelimit.Quota{ratelimit.CalendarQuota(5, ratelimit.Day, nil)}, "a policy may combine at most 8 limits and quotas (got 9)"},
		{"quotas without a limit", nil, []ratelimit.Quota{ratelimit.CalendarQuota(5, ratelimit.Day, nil)}, "a policy needs at least one limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ratelimit.NewMulti[string](store, tc.limits, ratelimit.WithQuotas(tc.quotas...))
			if !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one wrapping ErrInvalidArgument saying %q", err, tc.want)
			}
		})
	}
	l, err := ratelimit.New[string](store, ratelimit.PerSecond(100), ratelimit.WithQuotas(ratelimit.CalendarQuota(5, ratelimit.Month, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.TryAcquireN(ctx, "s", 6); !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), "cost must not exceed quota 0's allowance (got 6 > 5)") {
		t.Fatalf("a cost above the allowance: %v", err)
	}
	if _, err := l.Reserve(ctx, "s", time.Minute, 1, 6); !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), "quota 0's cost must be between 1 and its allowance 5 (got 6)") {
		t.Fatalf("a reserve above the allowance: %v", err)
	}
	if store.Len() != 0 {
		t.Fatalf("the store holds %d buckets after refused checks", store.Len())
	}
}

func make8Limits() []ratelimit.Limit {
	l := make([]ratelimit.Limit, 8)
	for i := range l {
		l[i] = ratelimit.PerSecond(int64(i + 1))
	}
	return l
}

func TestQuotaString(t *testing.T) {
	paris := mustZone(t, "Europe/Paris")
	for _, tc := range []struct {
		q    ratelimit.Quota
		want string
	}{
		{ratelimit.CalendarQuota(100000, ratelimit.Month, paris), "100000 a month in Europe/Paris"},
		{ratelimit.Quota{Allowance: 10, Period: ratelimit.Day}, "10 a day in UTC"},
		{ratelimit.Quota{Allowance: 10, Period: ratelimit.Month, Start: time.Date(2026, 1, 15, 9, 0, 0, 0, paris)}, "10 a month from day 15 09:00:00 in Europe/Paris"},
	} {
		if got := tc.q.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.q, got, tc.want)
		}
	}
}
