package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/redisstore"
)

// TestPlansAcrossTwoProcesses: two Plans over two go-redis clients of one
// real redis-server, as two processes of a fleet would be. A subject on free
// is denied by the first after free's allowance; the second assigns it pro;
// the first's watcher applies the change (waited for with a deadline far
// above its refresh interval, without Refresh), and from then on it admits
// the subject at pro's rate: its first check under pro, denied, converts
// the bucket and says when pro's next token comes. The buckets follow an injected clock.
func TestPlansAcrossTwoProcesses(t *testing.T) {
	ctx := context.Background()
	srv := redistest.StartServer(t)
	clock := testkit.NewClock(testkit.Start)
	plans := []ratelimit.Plan{
		{Name: "free", Limits: []ratelimit.Limit{ratelimit.PerMinute(3)}},
		{Name: "pro", Limits: []ratelimit.Limit{ratelimit.PerMinute(60)}},
	}
	process := func(refresh time.Duration) *ratelimit.Plans[string] {
		t.Helper()
		p, err := ratelimit.NewPlans[string](redisstore.New(redistest.Client(t, srv.Addr())), plans, "free",
			ratelimit.WithNamespace("api"), ratelimit.WithClock(clock.Now), ratelimit.WithPlanRefresh(refresh))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	first, second := process(10*time.Millisecond), process(time.Second)
	check := func(what string, wantPlan string, wantAllowed bool, wantRetry time.Duration) {
		t.Helper()
		plan, lim := first.For("acme")
		d, err := lim.TryAcquire(ctx, "acme")
		if err != nil || plan != wantPlan || d.Allowed != wantAllowed || d.RetryAfter != wantRetry {
			t.Fatalf("%s: plan %q, %+v, %v; want plan %q, allowed %v, retry %v", what, plan, d, err, wantPlan, wantAllowed, wantRetry)
		}
	}
	for range 3 {
		check("free", "free", true, 0)
	}
	check("free, its allowance spent", "free", false, 20*time.Second)

	if _, err := second.Assign(ctx, "acme", ratelimit.Assignment{Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for deadline := start.Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if plan, _ := first.For("acme"); plan == "pro" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first process does not see pro 10 s after the assignment")
		}
	}
	t.Logf("FIGURE the first process applied the change %v after it was made (refresh every 10ms)", time.Since(start))

	// The empty bucket carries over empty, and the denial that converts it
	// writes it: its next token comes at pro's rate, a second later, as the
	// denial says, and pro's rate holds from then on.
	check("pro, at once", "pro", false, time.Second)
	clock.Add(time.Second)
	check("pro, a second later", "pro", true, 0)
	check("pro, at once again", "pro", false, time.Second)
	for range 5 {
		clock.Add(time.Second)
		check("pro, a second later", "pro", true, 0)
	}
	if a, err := first.Assignment(ctx, "acme"); err != nil || a.Plan != "pro" {
		t.Fatalf("the first process reads %+v, %v from the store; want pro", a, err)
	}
}
