package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
)

// paris is the zone of the suite's quotas: the suite's clock starts at noon
// UTC, 13:00 in Paris, 11 hours before the day's window ends.
var paris = func() *time.Location {
	loc, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		panic("storetest: the tz database has no Europe/Paris: " + err.Error())
	}
	return loc
}()

// untilMidnight is the wait from the suite's start to the end of its day in
// Paris.
const untilMidnight = 11 * time.Hour

// quotaCases are the cases of a policy with calendar quotas (see
// ratelimit.Quota): every Store decides them with its limits.
var quotaCases = []envCase{
	{"a quota denies once its window is spent, until the window ends", func(t *testing.T, e *env) {
		l := e.newWith([]ratelimit.Limit{ratelimit.PerSecond(100)}, ratelimit.WithQuotas(ratelimit.CalendarQuota(5, ratelimit.Day, paris)))
		for i := range 5 {
			d, err := l.TryAcquire(e.ctx, "s")
			if err != nil || !d.Allowed || d.Remaining != int64(4-i) {
				t.Fatalf("check %d: %+v %v", i+1, d, err)
			}
		}
		d, err := l.TryAcquire(e.ctx, "s")
		if err != nil || d.Allowed || d.Binding != 1 || d.Limit != (ratelimit.Limit{}) || d.RetryAfter != untilMidnight {
			t.Fatalf("sixth check %+v %v; want denied by the quota until midnight in Paris", d, err)
		}
		if len(d.Standings) != 2 || d.Standings[1] != (ratelimit.Standing{Remaining: 0, ResetAfter: untilMidnight}) || d.Standings[0].Remaining != 95 {
			t.Fatalf("standings %+v", d.Standings)
		}
		e.clock.Add(untilMidnight - time.Microsecond)
		if d, err := l.TryAcquire(e.ctx, "s"); err != nil || d.Allowed || d.RetryAfter != time.Microsecond {
			t.Fatalf("a µs before midnight: %+v %v", d, err)
		}
		e.clock.Add(time.Microsecond)
		d, err = l.TryAcquire(e.ctx, "s")
		if err != nil || !d.Allowed || d.Standings[1] != (ratelimit.Standing{Remaining: 4, ResetAfter: 24 * time.Hour}) {
			t.Fatalf("at midnight, a new window: %+v %v", d, err)
		}
	}},
	{"a denial takes nothing: from the bucket when the quota denies, from the quota when the bucket does", func(t *testing.T, e *env) {
		l := e.newWith([]ratelimit.Limit{ratelimit.PerMinute(3)}, ratelimit.WithQuotas(ratelimit.CalendarQuota(2, ratelimit.Day, paris)))
		for range 2 {
			if d, err := l.TryAcquire(e.ctx, "s"); err != nil || !d.Allowed {
				t.Fatalf("%+v %v", d, err)
			}
		}
		d, err := l.TryAcquire(e.ctx, "s")
		if err != nil || d.Allowed || d.Binding != 1 {
			t.Fatalf("third check %+v %v; want denied by the quota", d, err)
		}
		p, err := l.Peek(e.ctx, "s")
		if err != nil || p.Standings[0].Remaining != 1 || p.Standings[1].Remaining != 0 {
			t.Fatalf("peek %+v %v; want the bucket's 1 token untouched", p, err)
		}
		m := e.newWith([]ratelimit.Limit{ratelimit.PerMinute(1)}, ratelimit.WithQuotas(ratelimit.CalendarQuota(10, ratelimit.Day, paris)))
		m.TryAcquire(e.ctx, "t")
		d, err = m.TryAcquire(e.ctx, "t")
		if err != nil || d.Allowed || d.Binding != 0 || d.RetryAfter != time.Minute || d.Standings[1].Remaining != 9 {
			t.Fatalf("denied by the bucket: %+v %v; want the quota's 9 untouched", d, err)
		}
	}},
	{"peek reports every limit and quota without consuming", func(t *testing.T, e *env) {
		q := []ratelimit.Quota{ratelimit.CalendarQuota(1000, ratelimit.Month, paris), ratelimit.CalendarQuota(100, ratelimit.Day, nil)}
		l := e.newWith([]ratelimit.Limit{ratelimit.PerSecond(10), ratelimit.PerMinute(50)}, ratelimit.WithQuotas(q...))
		l.TryAcquireN(e.ctx, "s", 4)
		for range 2 {
			d, err := l.Peek(e.ctx, "s")
			if err != nil || !d.Allowed || d.Remaining != 6 {
				t.Fatalf("peek %+v %v", d, err)
			}
			want := []int64{6, 46, 996, 96}
			for i, s := range d.Standings {
				if s.Remaining != want[i] {
					t.Fatalf("standing %d: %+v, want %d left", i, s, want[i])
				}
			}
			// November 29th, 13:00 in Paris: the month ends on December
			// 1st at midnight, 35 hours on; the UTC day in 12 hours.
			if d.Standings[2].ResetAfter != 35*time.Hour || d.Standings[3].ResetAfter != 12*time.Hour {
				t.Fatalf("quota resets %v and %v", d.Standings[2].ResetAfter, d.Standings[3].ResetAfter)
			}
		}
	}},
	{"a policy change keeps what the window used", func(t *testing.T, e *env) {
		lim := []ratelimit.Limit{ratelimit.PerSecond(1000)}
		small := e.newWith(lim, ratelimit.WithQuotas(ratelimit.CalendarQuota(10, ratelimit.Day, paris)))
		if d, err := small.TryAcquireN(e.ctx, "s", 9); err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
		raised := e.newWith(lim, ratelimit.WithQuotas(ratelimit.CalendarQuota(100, ratelimit.Day, paris)))
		if d, err := raised.TryAcquire(e.ctx, "s"); err != nil || !d.Allowed || d.Standings[1].Remaining != 90 {
			t.Fatalf("raised to 100 with 9 used: %+v %v; want 90 left after this one", d, err)
		}
		lowered := e.newWith(lim, ratelimit.WithQuotas(ratelimit.CalendarQuota(5, ratelimit.Day, paris)))
		if d, err := lowered.TryAcquire(e.ctx, "s"); err != nil || d.Allowed || d.RetryAfter != untilMidnight {
			t.Fatalf("lowered to 5 with 10 used: %+v %v; want denied until midnight", d, err)
		}
	}},
	{"a batch decides each item with its quotas, as single checks would", func(t *testing.T, e *env) {
		l := e.newWith([]ratelimit.Limit{ratelimit.PerSecond(100)}, ratelimit.WithQuotas(ratelimit.CalendarQuota(3, ratelimit.Day, paris), ratelimit.CalendarQuota(50, ratelimit.Month, paris)))
		res := l.TryAcquireMany(e.ctx, []ratelimit.Item[string]{{Subject: "a", Cost: 2}, {Subject: "a", Cost: 2}, {Subject: "b", Cost: 3}, {Subject: "a", Cost: 1}})
		wantAllowed := []bool{true, false, true, true}
		wantLeft := []int64{1, 1, 0, 0}
		for i, r := range res {
			if r.Err != nil || r.Decision.Allowed != wantAllowed[i] || len(r.Decision.Standings) != 3 || r.Decision.Standings[1].Remaining != wantLeft[i] {
				t.Fatalf("item %d: %+v; want allowed %v with %d left today", i, r, wantAllowed[i], wantLeft[i])
			}
		}
		if d := res[1].Decision; d.Binding != 1 || d.RetryAfter != untilMidnight {
			t.Fatalf("the denied item %+v; want bound by the day's quota until midnight", d)
		}
	}},
	{"a cost above a quota's allowance is refused", func(t *testing.T, e *env) {
		l := e.newWith([]ratelimit.Limit{ratelimit.PerSecond(100)}, ratelimit.WithQuotas(ratelimit.CalendarQuota(5, ratelimit.Day, paris)))
		if _, err := l.TryAcquireN(e.ctx, "s", 6); !errors.Is(err, ratelimit.ErrInvalidArgument) {
			t.Fatalf("cost 6 of an allowance of 5: %v", err)
		}
	}},
}

// reserveQuotaCases are the reservation cases of quotas.
var reserveQuotaCases = []envCase{
	{"a settle refunds or charges the quota in its window, and leaves the next one alone", func(t *testing.T, e *env) {
		l := e.newWith([]ratelimit.Limit{ratelimit.PerSecond(1000)}, ratelimit.WithQuotas(ratelimit.CalendarQuota(100, ratelimit.Day, paris)))
		rv, err := l.Reserve(e.ctx, "s", time.Hour, 1, 40)
		if err != nil || !rv.Decision.Allowed {
			t.Fatalf("reserve %+v %v", rv, err)
		}
		d, err := rv.Settle(e.ctx, 1, 10)
		if err != nil || d.Standings[1].Remaining != 90 {
			t.Fatalf("settled 10 of 40: %+v %v; want 90 left", d, err)
		}
		over, err := l.Reserve(e.ctx, "s", time.Hour, 1, 50)
		if err != nil || !over.Decision.Allowed {
			t.Fatalf("reserve %+v %v", over, err)
		}
		d, err = over.Settle(e.ctx, 1, 200)
		if err != nil || d.Allowed || d.Standings[1].Remaining != 0 || d.RetryAfter != untilMidnight {
			t.Fatalf("an overrun of 150: %+v %v; want denied until midnight", d, err)
		}
		late, err := l.Reserve(e.ctx, "u", 48*time.Hour, 1, 30)
		if err != nil || !late.Decision.Allowed {
			t.Fatalf("reserve %+v %v", late, err)
		}
		e.clock.Add(untilMidnight)
		d, err = late.Settle(e.ctx, 1, 0)
		if err != nil || d.Standings[1].Remaining != 100 {
			t.Fatalf("cancelled in the next window: %+v %v; want that window's 100 untouched", d, err)
		}
		if d, err := l.TryAcquireN(e.ctx, "s", 100); err != nil || !d.Allowed {
			t.Fatalf("the overrun's subject in the next window: %+v %v", d, err)
		}
	}},
}

// quotaBatchCases are the BatchStore cases of quotas.
var quotaBatchCases = []struct {
	name string
	run  func(t *testing.T, e *batchEnv)
}{
	{"one batch of a policy of one limit, one of several limits and one with quotas", func(t *testing.T, e *batchEnv) {
		one := e.item("one", 1, ratelimit.PerSecond(10))
		two := e.item("two", 1, ratelimit.PerSecond(10), ratelimit.PerMinute(100))
		quota := e.item("quota", 2, ratelimit.PerSecond(10))
		quota.Request.Quotas = []ratelimit.Quota{ratelimit.CalendarQuota(2, ratelimit.Day, paris)}
		again := quota
		again.Request.Cost = 1
		items := []ratelimit.BatchItem{one, two, quota, again}
		e.store.ApplyBatch(e.ctx, items)
		for i, want := range []struct {
			allowed    bool
			remaining  int64
			standings  int
			binding    int
			retryAfter time.Duration
		}{
			{true, 9, 0, 0, 0},
			{true, 9, 2, 0, 0},
			{true, 0, 2, 1, 0},
			{false, 0, 2, 1, untilMidnight},
		} {
			d := items[i].Decision
			if items[i].Err != nil || d.Allowed != want.allowed || d.Remaining != want.remaining || len(d.Standings) != want.standings ||
				d.Binding != want.binding || d.RetryAfter != want.retryAfter {
				t.Fatalf("item %d: %+v %v; want %+v", i, d, items[i].Err, want)
			}
		}
	}},
}
