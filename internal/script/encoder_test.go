package script_test

import (
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/script"
)

// TestTheArgumentOfAQuotaFollowsItsWindow: an Encoder keeps the policy
// argument of a limit and a quota while its window holds, and gives the
// argument of the window that holds each request's time, as a fresh Encoder
// does: across the window's end, back before it, and for another quota.
func TestTheArgumentOfAQuotaFollowsItsWindow(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	day := ratelimit.CalendarQuota(100, ratelimit.Day, paris)
	month := ratelimit.CalendarQuota(1000, ratelimit.Month, nil)
	midnight := time.Date(2026, 3, 10, 0, 0, 0, 0, paris)
	var kept script.Encoder
	for i, tc := range []struct {
		quota ratelimit.Quota
		at    time.Time
	}{
		{day, midnight.Add(-time.Hour)},
		{day, midnight.Add(-time.Microsecond)}, // the same window
		{day, midnight},                        // the next
		{day, midnight.Add(time.Hour)},
		{day, midnight.Add(-time.Second)}, // back before it
		{month, midnight},
		{day, midnight.Add(25 * time.Hour)},
	} {
		r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(10)}, Quotas: []ratelimit.Quota{tc.quota}, Cost: 1, Now: tc.at}
		got, want := kept.Args(r), new(script.Encoder).Args(r)
		if got[3] != want[3] {
			t.Errorf("request %d at %v: the kept Encoder's policy %q, a fresh one's %q", i, tc.at, got[3], want[3])
		}
	}
}
