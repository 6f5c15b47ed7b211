package ratelimit_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

var (
	freePlan = ratelimit.Plan{Name: "free", Limits: []ratelimit.Limit{ratelimit.PerMinute(3)}}
	proPlan  = ratelimit.Plan{Name: "pro", Limits: []ratelimit.Limit{ratelimit.PerMinute(60)}}
)

// recordingAssigner is memstore's Assigner, counting the calls that would
// change an assignment.
type recordingAssigner struct {
	*memstore.Store
	assigns atomic.Int64
}

func (r *recordingAssigner) Assign(ctx context.Context, ns, subject, value string) (string, error) {
	r.assigns.Add(1)
	return r.Store.Assign(ctx, ns, subject, value)
}

func TestNewPlansRefusesWhatIsInvalid(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		plans []ratelimit.Plan
		def   string
		opts  []ratelimit.Option
		want  string
	}{
		{"no plan", nil, "free", nil, "at least one plan"},
		{"an empty name", []ratelimit.Plan{{Limits: freePlan.Limits}}, "", nil, "1 to 64 characters"},
		{"a name of 65 characters", []ratelimit.Plan{{Name: strings.Repeat("a", 65), Limits: freePlan.Limits}}, "free", nil, "1 to 64 characters"},
		{"a name with a space", []ratelimit.Plan{{Name: "pro plan", Limits: freePlan.Limits}}, "pro plan", nil, "letters, digits"},
		{"a name twice", []ratelimit.Plan{freePlan, freePlan}, "free", nil, `plan "free" is defined twice`},
		{"a plan without a limit", []ratelimit.Plan{{Name: "free"}}, "free", nil, `plan "free": ratelimit: invalid argument: a policy needs at least one limit`},
		{"an invalid quota", []ratelimit.Plan{{Name: "free", Limits: freePlan.Limits, Quotas: []ratelimit.Quota{{Allowance: 0, Period: ratelimit.Day}}}}, "free", nil, "quota 0: quota allowance must be at least 1"},
		{"a default plan not on offer", []ratelimit.Plan{freePlan, proPlan}, "gold", nil, `default plan "gold" is not one of the plans on offer (free, pro)`},
		{"quotas given as an option", []ratelimit.Plan{freePlan}, "free", []ratelimit.Option{ratelimit.WithQuotas(ratelimit.CalendarQuota(5, ratelimit.Day, paris))}, "Plan.Quotas, not WithQuotas"},
		{"leases", []ratelimit.Plan{freePlan}, "free", []ratelimit.Option{ratelimit.WithLeases(time.Second)}, "leases"},
		{"a refresh of 0", []ratelimit.Plan{freePlan}, "free", []ratelimit.Option{ratelimit.WithPlanRefresh(0)}, "plan refresh must be between 1ms and 1s"},
		{"a refresh of 2 s", []ratelimit.Plan{freePlan}, "free", []ratelimit.Option{ratelimit.WithPlanRefresh(2 * time.Second)}, "plan refresh must be between 1ms and 1s"},
		{"an empty namespace", []ratelimit.Plan{freePlan}, "free", []ratelimit.Option{ratelimit.WithNamespace("")}, "namespace must not be empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ratelimit.NewPlans[string](failingStore{Err: errors.New("the store was called")}, tc.plans, tc.def, tc.opts...)
			if p != nil || !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewPlans = %v, %v; want an invalid argument saying %q", p, err, tc.want)
			}
		})
	}
}

func TestAssignRefusesBeforeTheStore(t *testing.T) {
	store := &recordingAssigner{Store: memstore.New()}
	p, err := ratelimit.NewPlans[string](store, []ratelimit.Plan{freePlan, proPlan}, "free")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		subject string
		a       ratelimit.Assignment
		want    string
	}{
		{"an empty subject", "", ratelimit.Assignment{Plan: "pro"}, "subject must not be empty"},
		{"an unknown plan", "s", ratelimit.Assignment{Plan: "gold"}, `unknown plan "gold": the plans on offer are free, pro`},
		{"a plan and a policy", "s", ratelimit.Assignment{Plan: "pro", Limits: proPlan.Limits}, "not both"},
		{"a policy without a limit", "s", ratelimit.Assignment{Quotas: []ratelimit.Quota{ratelimit.CalendarQuota(5, ratelimit.Day, nil)}}, "at least one limit"},
		{"a fixed zone", "s", ratelimit.Assignment{Limits: proPlan.Limits, Quotas: []ratelimit.Quota{ratelimit.CalendarQuota(5, ratelimit.Day, time.FixedZone("UTC+1", 3600))}}, `time zone "UTC+1"`},
		{"the local zone", "s", ratelimit.Assignment{Limits: proPlan.Limits, Quotas: []ratelimit.Quota{ratelimit.CalendarQuota(5, ratelimit.Day, time.Local)}}, `time zone "Local"`},
		{"a zone named for another", "s", ratelimit.Assignment{Limits: proPlan.Limits, Quotas: []ratelimit.Quota{ratelimit.CalendarQuota(5, ratelimit.Day, time.FixedZone("Europe/Paris", 7*3600))}}, `is not the zone of that name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.Assign(ctx, tc.subject, tc.a)
			if !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Assign = %v; want an invalid argument saying %q", err, tc.want)
			}
			if n := store.assigns.Load(); n != 0 {
				t.Fatalf("the store was asked to assign %d times", n)
			}
		})
	}
}

func TestAssignmentEncoding(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		a    ratelimit.Assignment
		want string
	}{
		{"none", ratelimit.Assignment{}, ""},
		{"a plan", ratelimit.Assignment{Plan: "pro"}, "p:pro"},
		{"a limit", ratelimit.Assignment{Limits: []ratelimit.Limit{ratelimit.PerSecond(500)}}, `c:{"l":[[500,500,1000000]]}`},
		{"two limits", ratelimit.Assignment{Limits: []ratelimit.Limit{ratelimit.PerMinute(5), ratelimit.NewLimit(100, 24*time.Hour, 150)}}, `c:{"l":[[5,5,60000000],[150,100,86400000000]]}`},
		{"a monthly quota in Paris", ratelimit.Assignment{Limits: []ratelimit.Limit{ratelimit.PerSecond(10)}, Quotas: []ratelimit.Quota{ratelimit.CalendarQuota(100_000, ratelimit.Month, paris)}},
			`c:{"l":[[10,10,1000000]],"q":[{"a":100000,"p":"month","s":"2001-01-01T00:00:00+01:00","z":"Europe/Paris"}]}`},
		{"a daily quota from 09:30:00.000001 UTC in summer", ratelimit.Assignment{Limits: []ratelimit.Limit{ratelimit.PerSecond(10)}, Quotas: []ratelimit.Quota{{Allowance: 7, Period: ratelimit.Day, Start: time.Date(2026, 7, 1, 9, 30, 0, 1000, time.UTC)}}},
			`c:{"l":[[10,10,1000000]],"q":[{"a":7,"p":"day","s":"2026-07-01T09:30:00.000001Z","z":"UTC"}]}`},
		{"the zero anchor", ratelimit.Assignment{Limits: []ratelimit.Limit{ratelimit.PerSecond(10)}, Quotas: []ratelimit.Quota{{Allowance: 7, Period: ratelimit.Week}}},
			`c:{"l":[[10,10,1000000]],"q":[{"a":7,"p":"week","s":"0001-01-01T00:00:00Z","z":"UTC"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ratelimit.EncodeAssignment(tc.a)
			if err != nil || got != tc.want {
				t.Fatalf("encoded %q, %v; want %q", got, err, tc.want)
			}
			back, err := ratelimit.DecodeAssignment(got)
			if err != nil || back.Plan != tc.a.Plan || len(back.Limits) != len(tc.a.Limits) || len(back.Quotas) != len(tc.a.Quotas) {
				t.Fatalf("decoded %+v, %v; want %+v", back, err, tc.a)
			}
			for i, l := range tc.a.Limits {
				if back.Limits[i] != l {
					t.Fatalf("limit %d decoded %v, want %v", i, back.Limits[i], l)
				}
			}
			again, err := ratelimit.DecodeAssignment(got)
			if err != nil {
				t.Fatal(err)
			}
			for i, q := range tc.a.Quotas {
				b := back.Quotas[i]
				if b.Allowance != q.Allowance || b.Period != q.Period || !b.Start.Equal(q.Start) || b.Start.Location().String() != q.Start.Location().String() || b.String() != q.String() {
					t.Fatalf("quota %d decoded %v at %v, want %v at %v", i, b, b.Start, q, q.Start)
				}
				if again.Quotas[i] != b {
					t.Fatalf("quota %d decoded twice: %#v != %#v; want == (one *time.Location per zone)", i, again.Quotas[i], b)
				}
			}
		})
	}
}

func TestMalformedAssignmentsAreErrors(t *testing.T) {
	for _, v := range []string{
		"x",
		"p:",
		"p:pro plan",
		"p:" + strings.Repeat("a", 65),
		"c:",
		"c:{}",
		"c:null",
		`c:{"l":[]}`,
		`c:{"l":[[0,1,1000000]]}`,
		`c:{"l":[[1,1,0]]}`,
		`c:{"l":[[1,1,-5]]}`,
		`c:{"l":[[1,1,9223372036854775807]]}`,
		`c:{"l":[[5,5,60000000]],"x":1}`,
		`c:{"L":[[5,5,60000000]]}`,
		`c:{"l":[[5,5,60000000]] }`,
		`c:{"l":[[5,5,60000000]]}{}`,
		`c:{"l":[[5,5,60000000]],"q":[{"a":1,"p":"fortnight","s":"2001-01-01T00:00:00Z","z":"UTC"}]}`,
		`c:{"l":[[5,5,60000000]],"q":[{"a":1,"p":"day","s":"2001-01-01T00:00:00Z","z":"Local"}]}`,
		`c:{"l":[[5,5,60000000]],"q":[{"a":1,"p":"day","s":"2001-01-01T00:00:00Z","z":"Mars/Olympus"}]}`,
		`c:{"l":[[5,5,60000000]],"q":[{"a":1,"p":"day","s":"2001-01-01T00:00:00Z","z":"../../etc/passwd"}]}`,
		`c:{"l":[[5,5,60000000]],"q":[{"a":1,"p":"day","s":"2001-01-01T00:00:00Z","z":"Europe/Paris"}]}`, // the offset is not Paris's
		`c:{"l":[[5,5,60000000]],"q":[{"a":1,"p":"day","s":"yesterday","z":"UTC"}]}`,
		`c:{"l":[[5,5,60000000]],"q":[{"a":1,"p":"day","s":"2001-01-01T00:00:00.0000001Z","z":"UTC"}]}`,
		`c:{"l":[[5,5,60000000]],"q":[{"a":0,"p":"day","s":"2001-01-01T00:00:00Z","z":"UTC"}]}`,
		`c:{"l":[[5,5,60000000],[5,5,60000000],[5,5,60000000],[5,5,60000000],[5,5,60000000],[5,5,60000000],[5,5,60000000],[5,5,60000000],[5,5,60000000]]}`,
	} {
		if a, err := ratelimit.DecodeAssignment(v); err == nil {
			t.Errorf("DecodeAssignment(%q) = %+v; want an error", v, a)
		}
	}
}

// FuzzAssignment holds the decoder of stored assignments to never panic,
// and to read only what the encoder writes: a value it reads encodes back
// to itself.
func FuzzAssignment(f *testing.F) {
	for _, v := range []string{
		"", "p:pro", "p:a.b_c-1", `c:{"l":[[500,500,1000000]]}`,
		`c:{"l":[[10,10,1000000]],"q":[{"a":100000,"p":"month","s":"2001-01-01T00:00:00+01:00","z":"Europe/Paris"}]}`,
		`c:{"l":[[10,10,1000000]],"q":[{"a":7,"p":"day","s":"2026-07-01T09:30:00.000001Z","z":"UTC"}]}`,
		`c:{"l":[[1,1,1]],"q":[{"a":9007199254740992,"p":"year","s":"9999-12-31T23:59:59.999999-12:00","z":"Etc/GMT+12"}]}`,
		"c:{", `c:{"l":[[1,1,0]]}`,
	} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		a, err := ratelimit.DecodeAssignment(v)
		if err != nil {
			return
		}
		again, err := ratelimit.EncodeAssignment(a)
		if err != nil || again != v {
			t.Fatalf("DecodeAssignment(%q) = %+v, which encodes to %q, %v", v, a, again, err)
		}
	})
}

func TestPlansWithoutAnAssigner(t *testing.T) {
	ctx := context.Background()
	p, err := ratelimit.NewPlans[string](plain{memstore.New()}, []ratelimit.Plan{freePlan, proPlan}, "free")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Assign(ctx, "s", ratelimit.Assignment{Plan: "pro"}); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Assign = %v; want ErrUnsupported", err)
	}
	if err := p.Refresh(ctx); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Refresh = %v; want ErrUnsupported", err)
	}
	if a, err := p.Assignment(ctx, "s"); err != nil || a.Plan != "" || a.Limits != nil {
		t.Fatalf("Assignment = %+v, %v; want none", a, err)
	}
	if plan, lim := p.For("s"); plan != "free" || lim != p.Plan("free") || lim == nil {
		t.Fatalf("For = %q, %v; want the default plan", plan, lim)
	}
	if p.Plan("gold") != nil {
		t.Fatal(`Plan("gold") is not nil`)
	}
}

// plain is a Store with none of the optional capabilities.
type plain struct{ ratelimit.Store }

// TestPlansWatcher: a change through one Plans reaches another on the same
// store by the other's watcher alone, within a deadline far above its
// refresh interval.
func TestPlansWatcher(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	a, err := ratelimit.NewPlans[string](store, []ratelimit.Plan{freePlan, proPlan}, "free", ratelimit.WithNamespace("w"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := ratelimit.NewPlans[string](store, []ratelimit.Plan{freePlan, proPlan}, "free", ratelimit.WithNamespace("w"), ratelimit.WithPlanRefresh(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	waitForPlan := func(subject, want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if plan, _ := b.For(subject); plan == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("For(%q) is not %q after 10 s", subject, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if _, err := a.Assign(ctx, "s", ratelimit.Assignment{Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	waitForPlan("s", "pro")
	if _, err := a.Assign(ctx, "s", ratelimit.Assignment{}); err != nil {
		t.Fatal(err)
	}
	waitForPlan("s", "free")
	b.Close()
	b.Close() // a second Close is a no-op
}

// TestCustomLimitersAreBounded: a Plans keeps the Limiters of at most 1,024
// subjects' own policies, and builds one again when it is asked for.
func TestCustomLimitersAreBounded(t *testing.T) {
	ctx := context.Background()
	p, err := ratelimit.NewPlans[string](memstore.New(), []ratelimit.Plan{freePlan}, "free")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 1100 {
		subject := "s" + strconv.Itoa(i)
		if _, err := p.Assign(ctx, subject, ratelimit.Assignment{Limits: []ratelimit.Limit{ratelimit.PerMinute(int64(i + 1))}}); err != nil {
			t.Fatal(err)
		}
		if plan, lim := p.For(subject); plan != "" || lim.Limits()[0] != ratelimit.PerMinute(int64(i+1)) {
			t.Fatalf("For(%s) = %q, %v", subject, plan, lim.Limits())
		}
	}
	if n := ratelimit.CustomLimiters(p); n != 1024 {
		t.Fatalf("%d limiters kept, want 1024", n)
	}
	if plan, lim := p.For("s0"); plan != "" || lim.Limits()[0] != ratelimit.PerMinute(1) {
		t.Fatalf("For(s0) after its limiter went = %q, %v", plan, lim.Limits())
	}
	// Two subjects of one policy share its limiter.
	if _, err := p.Assign(ctx, "twin", ratelimit.Assignment{Limits: []ratelimit.Limit{ratelimit.PerMinute(1)}}); err != nil {
		t.Fatal(err)
	}
	if _, l1 := p.For("s0"); l1 != func() *ratelimit.Limiter[string] { _, l := p.For("twin"); return l }() {
		t.Fatal("two subjects of one policy have two limiters")
	}
}

// TestPlanOfAnotherProcess: a subject assigned a plan this Plans does not
// offer (another process's) has the default plan here.
func TestPlanOfAnotherProcess(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	gold := ratelimit.Plan{Name: "gold", Limits: []ratelimit.Limit{ratelimit.PerSecond(100)}}
	wide, err := ratelimit.NewPlans[string](store, []ratelimit.Plan{freePlan, gold}, "free")
	if err != nil {
		t.Fatal(err)
	}
	defer wide.Close()
	narrow, err := ratelimit.NewPlans[string](store, []ratelimit.Plan{freePlan, proPlan}, "free")
	if err != nil {
		t.Fatal(err)
	}
	defer narrow.Close()
	if _, err := wide.Assign(ctx, "s", ratelimit.Assignment{Plan: "gold"}); err != nil {
		t.Fatal(err)
	}
	if err := narrow.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if plan, _ := narrow.For("s"); plan != "free" {
		t.Fatalf("For = %q; want the default plan, free", plan)
	}
	if a, err := narrow.Assignment(ctx, "s"); err != nil || a.Plan != "gold" {
		t.Fatalf("Assignment = %+v, %v; want gold, as the store holds it", a, err)
	}
	// A value that is not an assignment (written by hand) is none.
	if _, err := store.Assign(ctx, "default", "s", "p:no such plan"); err != nil {
		t.Fatal(err)
	}
	if err := narrow.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if plan, _ := narrow.For("s"); plan != "free" {
		t.Fatalf("For = %q; want the default plan, free", plan)
	}
	if _, err := narrow.Assignment(ctx, "s"); err == nil {
		t.Fatal("Assignment of a malformed value: no error")
	}
}
