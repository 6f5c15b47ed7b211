package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// assignEnv is what a case of a ratelimit.Assigner works with: the store, a
// namespace of its own, and a clock for the Plans it builds.
type assignEnv struct {
	ctx   context.Context
	store ratelimit.Assigner
	ns    string
	clock *testkit.Clock
}

// The suite's plans: free, 3 a minute and 10 a day; pro, 60 a minute and
// 1000 a day (days in Paris); and strict, 1 a minute.
var (
	free   = ratelimit.Plan{Name: "free", Limits: []ratelimit.Limit{ratelimit.PerMinute(3)}, Quotas: []ratelimit.Quota{ratelimit.CalendarQuota(10, ratelimit.Day, paris)}}
	pro    = ratelimit.Plan{Name: "pro", Limits: []ratelimit.Limit{ratelimit.PerMinute(60)}, Quotas: []ratelimit.Quota{ratelimit.CalendarQuota(1000, ratelimit.Day, paris)}}
	strict = ratelimit.Plan{Name: "strict", Limits: []ratelimit.Limit{ratelimit.PerMinute(1)}}
)

// plans returns a Plans of free (the default), pro and strict on the
// case's namespace and clock, closed when the test ends. Its watcher
// refreshes every second; the cases call Refresh.
func (e *assignEnv) plans(t *testing.T) *ratelimit.Plans[string] {
	t.Helper()
	p, err := ratelimit.NewPlans[string](e.store, []ratelimit.Plan{free, pro, strict}, "free",
		ratelimit.WithNamespace(e.ns), ratelimit.WithClock(e.clock.Now), ratelimit.WithPlanRefresh(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.Refresh(e.ctx); err != nil {
		t.Fatal(err)
	}
	return p
}

// assign sets subject's assignment through the store and checks the value
// it replaced.
func (e *assignEnv) assign(t *testing.T, subject, value, wantOld string) {
	t.Helper()
	old, err := e.store.Assign(e.ctx, e.ns, subject, value)
	if err != nil || old != wantOld {
		t.Fatalf("Assign(%q, %q) = %q, %v; want %q", subject, value, old, err, wantOld)
	}
}

// since asks for the changes after cursor and checks them.
func (e *assignEnv) since(t *testing.T, cursor string, want map[string]string, wantFull bool) string {
	t.Helper()
	changes, next, full, err := e.store.AssignmentsSince(e.ctx, e.ns, cursor)
	if err != nil || full != wantFull || !maps.Equal(changes, want) {
		t.Fatalf("AssignmentsSince(%q) = %v, %q, full %v, %v; want %v, full %v", cursor, changes, next, full, err, want, wantFull)
	}
	return next
}

// forPlan checks the plan For gives subject.
func forPlan(t *testing.T, p *ratelimit.Plans[string], subject, want string) *ratelimit.Limiter[string] {
	t.Helper()
	plan, lim := p.For(subject)
	if plan != want || lim == nil {
		t.Fatalf("For(%q) = %q, %v; want plan %q", subject, plan, lim, want)
	}
	return lim
}

// assignCases are the cases of a ratelimit.Assigner: its own methods, and
// ratelimit.Plans over it.
var assignCases = []struct {
	name string
	run  func(t *testing.T, e *assignEnv)
}{
	{"an assignment is set, replaced and removed, each returning the value it replaced", func(t *testing.T, e *assignEnv) {
		e.assign(t, "s", "p:pro", "")
		e.assign(t, "s", "p:pro", "p:pro")
		e.assign(t, "s", "p:free", "p:pro")
		if v, err := e.store.Assigned(e.ctx, e.ns, "s"); err != nil || v != "p:free" {
			t.Fatalf("Assigned = %q, %v; want p:free", v, err)
		}
		e.assign(t, "s", "", "p:free")
		e.assign(t, "s", "", "")
		if v, err := e.store.Assigned(e.ctx, e.ns, "s"); err != nil || v != "" {
			t.Fatalf("Assigned after the removal = %q, %v; want none", v, err)
		}
	}},
	{"the changes since a cursor are each subject's latest value, a removal empty", func(t *testing.T, e *assignEnv) {
		start := e.since(t, "", map[string]string{}, true)
		e.assign(t, "a", "p:pro", "")
		e.assign(t, "b", "p:pro", "")
		c1 := e.since(t, start, map[string]string{"a": "p:pro", "b": "p:pro"}, start == "")
		e.assign(t, "a", "p:free", "p:pro")
		e.assign(t, "a", "p:strict", "p:free")
		e.assign(t, "b", "", "p:pro")
		e.assign(t, "c", "p:pro", "")
		c2 := e.since(t, c1, map[string]string{"a": "p:strict", "b": "", "c": "p:pro"}, false)
		e.since(t, c2, map[string]string{}, false)
		e.assign(t, "c", "p:pro", "p:pro") // the same value: nothing to log
		if e.since(t, c2, map[string]string{}, false) != c2 {
			t.Fatal("an assignment that changed nothing moved the cursor")
		}
		e.since(t, "", map[string]string{"a": "p:strict", "c": "p:pro"}, true)
	}},
	{"a cursor the store did not give lists the whole set", func(t *testing.T, e *assignEnv) {
		e.assign(t, "a", "p:pro", "")
		for _, cursor := range []string{"not a cursor", "99999999999999-0", "18446744073709551615"} {
			e.since(t, cursor, map[string]string{"a": "p:pro"}, true)
		}
	}},
	{"namespaces keep their own assignments", func(t *testing.T, e *assignEnv) {
		other := e.ns + "-other"
		e.assign(t, "s", "p:pro", "")
		if v, err := e.store.Assigned(e.ctx, other, "s"); err != nil || v != "" {
			t.Fatalf("Assigned in another namespace = %q, %v; want none", v, err)
		}
		changes, _, _, err := e.store.AssignmentsSince(e.ctx, other, "")
		if err != nil || len(changes) != 0 {
			t.Fatalf("another namespace's assignments: %v, %v; want none", changes, err)
		}
	}},
	{"an empty namespace or subject is refused as invalid", func(t *testing.T, e *assignEnv) {
		for _, err := range []error{
			func() error { _, err := e.store.Assign(e.ctx, "", "s", "p:pro"); return err }(),
			func() error { _, err := e.store.Assign(e.ctx, e.ns, "", "p:pro"); return err }(),
			func() error { _, err := e.store.Assigned(e.ctx, e.ns, ""); return err }(),
			func() error { _, _, _, err := e.store.AssignmentsSince(e.ctx, "", ""); return err }(),
		} {
			if !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Fatalf("error %v; want one wrapping ErrInvalidArgument", err)
			}
		}
	}},
	{"a subject assigned another plan is checked by it, its bucket and quota carried over", func(t *testing.T, e *assignEnv) {
		p := e.plans(t)
		lim := forPlan(t, p, "s", "free")
		for i := range 3 {
			if d, err := lim.TryAcquire(e.ctx, "s"); err != nil || !d.Allowed {
				t.Fatalf("free check %d: %+v, %v", i, d, err)
			}
		}
		d, err := lim.TryAcquire(e.ctx, "s")
		if err != nil || d.Allowed || d.RetryAfter != 20*time.Second {
			t.Fatalf("fourth free check %+v, %v; want denied for 20s", d, err)
		}
		old, err := p.Assign(e.ctx, "s", ratelimit.Assignment{Plan: "pro"})
		if err != nil || old.Plan != "" || old.Limits != nil || old.Quotas != nil {
			t.Fatalf("Assign pro: old %+v, %v; want none", old, err)
		}
		lim = forPlan(t, p, "s", "pro")
		// The bucket free wrote is empty: pro carries it over empty, and the
		// check that converts it writes it, denied, so that from then on it
		// refills at pro's rate (tokenbucket's State.Step): its token comes
		// a second later, as its RetryAfter says, not on free's schedule.
		d, err = lim.TryAcquire(e.ctx, "s")
		if err != nil || d.Allowed || !d.Converted || d.RetryAfter != time.Second {
			t.Fatalf("first pro check %+v, %v; want denied for 1s, converted", d, err)
		}
		e.clock.Add(time.Second)
		d, err = lim.TryAcquire(e.ctx, "s")
		if err != nil || !d.Allowed || d.Converted || d.Remaining != 0 || len(d.Standings) != 2 || d.Standings[1].Remaining != 1000-4 {
			t.Fatalf("pro check a second later %+v, %v; want allowed, 996 of the day's 1000 left", d, err)
		}
		// Then at pro's rate: a token a second.
		e.clock.Add(time.Second)
		d, err = lim.TryAcquire(e.ctx, "s")
		if err != nil || !d.Allowed || d.Converted || d.Remaining != 0 || d.Standings[1].Remaining != 1000-5 {
			t.Fatalf("pro check a second later %+v, %v; want allowed at pro's rate, 995 left", d, err)
		}
		// Back to free: a token in hand, 5 of the day's 10 used.
		if old, err := p.Assign(e.ctx, "s", ratelimit.Assignment{}); err != nil || old.Plan != "pro" {
			t.Fatalf("removal: old %+v, %v; want pro", old, err)
		}
		lim = forPlan(t, p, "s", "free")
		e.clock.Add(time.Second)
		d, err = lim.TryAcquire(e.ctx, "s")
		if err != nil || !d.Allowed || !d.Converted || d.Standings[0].Remaining != 0 || d.Standings[1].Remaining != 10-6 {
			t.Fatalf("free check after pro %+v, %v; want allowed, 0 tokens and 4 of 10 left", d, err)
		}
		d, err = lim.TryAcquire(e.ctx, "s")
		if err != nil || d.Allowed || d.RetryAfter != 20*time.Second {
			t.Fatalf("free check after that %+v, %v; want denied for 20 s", d, err)
		}
	}},
	{"a policy of its own is a Limiter of that policy on the namespace", func(t *testing.T, e *assignEnv) {
		p := e.plans(t)
		own := ratelimit.Assignment{Limits: []ratelimit.Limit{ratelimit.PerSecond(500)}, Quotas: []ratelimit.Quota{ratelimit.CalendarQuota(1_000_000, ratelimit.Month, paris)}}
		if _, err := p.Assign(e.ctx, "acme", own); err != nil {
			t.Fatal(err)
		}
		lim := forPlan(t, p, "acme", "")
		if got := lim.Limits(); len(got) != 1 || got[0] != ratelimit.PerSecond(500) || lim.Namespace() != e.ns {
			t.Fatalf("limiter of acme: %v in %q; want 500 a second in %q", got, lim.Namespace(), e.ns)
		}
		q := lim.Quotas()
		if len(q) != 1 || q[0].String() != own.Quotas[0].String() || !q[0].Start.Equal(own.Quotas[0].Start) {
			t.Fatalf("acme's quotas %v; want %v", q, own.Quotas)
		}
		got, err := p.Assignment(e.ctx, "acme")
		if err != nil || len(got.Quotas) != 1 || got.Quotas[0] != q[0] || got.Limits[0] != own.Limits[0] || got.Plan != "" {
			t.Fatalf("Assignment(acme) = %+v, %v; want the policy, its quota == the limiter's", got, err)
		}
		for i := range 500 {
			if d, err := lim.TryAcquire(e.ctx, "acme"); err != nil || !d.Allowed {
				t.Fatalf("check %d of acme: %+v, %v", i, d, err)
			}
		}
		if d, err := lim.TryAcquire(e.ctx, "acme"); err != nil || d.Allowed {
			t.Fatalf("check 501 of acme: %+v, %v; want denied", d, err)
		}
	}},
	{"an unknown plan or an invalid policy is refused, naming the plans on offer, and nothing changes", func(t *testing.T, e *assignEnv) {
		p := e.plans(t)
		if _, err := p.Assign(e.ctx, "s", ratelimit.Assignment{Plan: "pro"}); err != nil {
			t.Fatal(err)
		}
		for _, a := range []ratelimit.Assignment{
			{Plan: "gold"},
			{Plan: "pro", Limits: []ratelimit.Limit{ratelimit.PerSecond(1)}},
			{Limits: []ratelimit.Limit{{Capacity: 0, RefillTokens: 1, RefillPeriod: time.Second}}},
			{Limits: []ratelimit.Limit{ratelimit.PerSecond(1)}, Quotas: []ratelimit.Quota{ratelimit.CalendarQuota(5, ratelimit.Day, time.FixedZone("UTC+1", 3600))}},
		} {
			_, err := p.Assign(e.ctx, "s", a)
			if !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Fatalf("Assign(%+v) = %v; want ErrInvalidArgument", a, err)
			}
			if a.Plan == "gold" && !strings.Contains(err.Error(), "free, pro, strict") {
				t.Fatalf("the error %q does not name the plans on offer", err)
			}
		}
		if v, err := e.store.Assigned(e.ctx, e.ns, "s"); err != nil || v != "p:pro" {
			t.Fatalf("after the refusals: %q, %v; want p:pro still", v, err)
		}
	}},
	{"another process's Plans applies a change at its next refresh", func(t *testing.T, e *assignEnv) {
		a, b := e.plans(t), e.plans(t)
		if _, err := a.Assign(e.ctx, "s", ratelimit.Assignment{Plan: "strict"}); err != nil {
			t.Fatal(err)
		}
		forPlan(t, a, "s", "strict")
		if err := b.Refresh(e.ctx); err != nil {
			t.Fatal(err)
		}
		forPlan(t, b, "s", "strict")
		if _, err := b.Assign(e.ctx, "s", ratelimit.Assignment{}); err != nil {
			t.Fatal(err)
		}
		if err := a.Refresh(e.ctx); err != nil {
			t.Fatal(err)
		}
		forPlan(t, a, "s", "free")
	}},
}

// runAssignCases runs assignCases over the store, or skips each when it is
// not a ratelimit.Assigner.
func runAssignCases(t *testing.T, newStore func(*testing.T) ratelimit.Store) {
	for _, tc := range assignCases {
		t.Run(tc.name, func(t *testing.T) {
			store := newStore(t)
			a, ok := store.(ratelimit.Assigner)
			if !ok {
				t.Skipf("%T is not a ratelimit.Assigner", store)
			}
			ns := fmt.Sprintf("suite-%s-%d", t.Name(), time.Now().UnixNano())
			tc.run(t, &assignEnv{ctx: context.Background(), store: a, ns: ns, clock: testkit.NewClock(testkit.Start)})
		})
	}
}
