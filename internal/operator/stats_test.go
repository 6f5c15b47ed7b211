package operator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// decide tells st about n acquires in namespace ns of subject, allowed or
// denied, each taking latency.
func decide(st *Stats, ns, subject string, n int, allowed bool, latency time.Duration) {
	key := fmt.Sprintf("%d:%s:%s", len(ns), ns, subject)
	for range n {
		st.ObserveDecision(context.Background(), ratelimit.DecisionEvent{
			Namespace: ns, Key: key, Cost: 1, Latency: latency,
			Decision: ratelimit.Decision{Allowed: allowed},
		})
	}
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newStats returns Stats of options so on a test clock that starts at t0.
func newStats(t *testing.T, so StatsOptions) (*Stats, *testkit.Clock) {
	t.Helper()
	c := testkit.NewClock(t0)
	so.Clock = c.Now
	return NewStats(so), c
}

// report returns st's report of a service with the namespace default only.
func report(st *Stats) Report {
	return st.Report(context.Background(), Source{Namespaces: config.Default()})
}

func nsReport(t *testing.T, r Report, name string) NamespaceReport {
	t.Helper()
	for _, ns := range r.Namespaces {
		if ns.Name == name {
			return ns
		}
	}
	t.Fatalf("namespace %q not in the report %+v", name, r.Namespaces)
	return NamespaceReport{}
}

func TestStatsRates(t *testing.T) {
	st, c := newStats(t, StatsOptions{})
	// t0 is on a step boundary: steps [t0, t0+5s), [t0+5s, t0+10s), ...
	decide(st, "default", "alice", 10, true, time.Millisecond)
	decide(st, "default", "alice", 5, false, time.Millisecond)
	c.Add(RateStep)
	decide(st, "default", "bob", 20, true, time.Millisecond)
	c.Add(RateStep)
	decide(st, "default", "bob", 3, false, time.Millisecond)
	c.Add(time.Second) // 1 s into the third step

	ns := nsReport(t, report(st), "default")
	if ns.Allowed != 30 || ns.Denied != 8 {
		t.Errorf("totals: allowed %d denied %d, want 30 and 8", ns.Allowed, ns.Denied)
	}
	if len(ns.Rate.Allowed) != RatePoints || len(ns.Rate.Denied) != RatePoints {
		t.Fatalf("rate series of %d and %d points, want %d", len(ns.Rate.Allowed), len(ns.Rate.Denied), RatePoints)
	}
	if want := t0.Add(2 * RateStep); !ns.Rate.End.Equal(want) {
		t.Errorf("rate series ends at %v, want %v (the start of the step in progress)", ns.Rate.End, want)
	}
	last := RatePoints - 1
	gotA, gotD := ns.Rate.Allowed[last-1:], ns.Rate.Denied[last-1:]
	if gotA[0] != 10 || gotD[0] != 5 || gotA[1] != 20 || gotD[1] != 0 {
		t.Errorf("last two whole steps: allowed %v denied %v, want [10 20] and [5 0]", gotA, gotD)
	}
	for i := range last - 1 {
		if ns.Rate.Allowed[i] != 0 || ns.Rate.Denied[i] != 0 {
			t.Fatalf("step %d before the traffic counts %d and %d", i, ns.Rate.Allowed[i], ns.Rate.Denied[i])
		}
	}
	// The last whole step (20) and the one in progress (3) over 6 s.
	if want := 23.0 / 6; ns.DecisionsPerSecond != want {
		t.Errorf("decisions per second %v, want %v", ns.DecisionsPerSecond, want)
	}

	// Five minutes and a step later the series has moved on: only zeros,
	// but the totals stay.
	c.Add((RatePoints + 1) * RateStep)
	ns = nsReport(t, report(st), "default")
	for i := range RatePoints {
		if ns.Rate.Allowed[i] != 0 || ns.Rate.Denied[i] != 0 {
			t.Fatalf("after five minutes, step %d counts %d and %d", i, ns.Rate.Allowed[i], ns.Rate.Denied[i])
		}
	}
	if ns.DecisionsPerSecond != 0 || ns.Allowed != 30 || ns.Denied != 8 {
		t.Errorf("after five minutes: %v/s, totals %d and %d", ns.DecisionsPerSecond, ns.Allowed, ns.Denied)
	}
}

func TestStatsRateSinceStart(t *testing.T) {
	st, c := newStats(t, StatsOptions{})
	c.Add(2 * time.Second)
	decide(st, "default", "alice", 8, true, 0)
	// Started 2 s ago: the rate is over those 2 s, not over a whole step
	// before the start.
	if got := nsReport(t, report(st), "default").DecisionsPerSecond; got != 4 {
		t.Errorf("decisions per second %v, want 4", got)
	}
}

func TestRateRing(t *testing.T) {
	var r rateRing
	r.add(100, true)
	r.add(100, false)
	r.add(100+rateSlots, true) // the same slot, a later step: it starts over
	r.add(100, true)           // late: older than its slot's step, dropped
	a, d := r.counts(100+rateSlots, 1)
	if a[0] != 1 || d[0] != 0 {
		t.Errorf("reused slot: allowed %d denied %d, want 1 and 0", a[0], d[0])
	}
	a, d = r.counts(100, 1)
	if a[0] != 0 || d[0] != 0 {
		t.Errorf("the old step is still counted: %d and %d", a[0], d[0])
	}
}

func TestLatencyBins(t *testing.T) {
	if checkLatency.Len() != latencyBins {
		t.Fatalf("the layout has %d bins, the ring's slots %d", checkLatency.Len(), latencyBins)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		d := time.Duration(1<<latencyMinOctave + rng.Int64N(1<<latencyMaxOctave))
		up := checkLatency.Upper(checkLatency.Bin(d))
		if up <= d || float64(up) > 1.25*float64(d) {
			t.Fatalf("%v falls in the bin with upper bound %v: want above it by at most 25%%", d, up)
		}
	}
	for _, tc := range []struct {
		d   time.Duration
		bin int
	}{
		{0, 0}, {-time.Second, 0}, {time.Nanosecond, 0}, {1023, 0}, {1024, 0}, {1280, 1},
		{time.Hour, latencyBins - 1},
	} {
		if got := checkLatency.Bin(tc.d); got != tc.bin {
			t.Errorf("checkLatency.Bin(%v) = %d, want %d", tc.d, got, tc.bin)
		}
	}
}

func TestStatsLatencyPercentiles(t *testing.T) {
	st, c := newStats(t, StatsOptions{})
	decide(st, "default", "a", 98, true, time.Millisecond)
	decide(st, "default", "a", 2, true, 100*time.Millisecond)
	lat := nsReport(t, report(st), "default").Latency
	if lat.Count != 100 {
		t.Errorf("count %d, want 100", lat.Count)
	}
	if lat.P50Ms < 1 || lat.P50Ms > 1.25 {
		t.Errorf("p50 %v ms, want 1 ms (up to its bin's bound)", lat.P50Ms)
	}
	if lat.P99Ms < 100 || lat.P99Ms > 125 {
		t.Errorf("p99 %v ms, want 100 ms (up to its bin's bound)", lat.P99Ms)
	}

	// A minute and a step later, only the new checks count.
	c.Add(LatencyWindow + RateStep)
	decide(st, "default", "a", 10, false, 10*time.Microsecond)
	lat = nsReport(t, report(st), "default").Latency
	if lat.Count != 10 || lat.P99Ms > 0.0125 || lat.P99Ms < 0.010 {
		t.Errorf("after the window: %+v, want 10 checks of 10 µs", lat)
	}
}

func TestTopDeniedFindsHeavyHittersInFixedMemory(t *testing.T) {
	sk := newSpaceSaving(TopDeniedCounters)
	// 100 000 subjects denied once and five denied thousands of times,
	// shuffled: 130 000 denials, so 64 counters must find every subject
	// with more than 130 000/64 = 2031.
	heavy := map[string]uint64{"mallory": 8000, "trudy": 7000, "eve": 6000, "oscar": 5000, "chuck": 4000}
	var stream []string
	for name, n := range heavy {
		for range n {
			stream = append(stream, name)
		}
	}
	const distinct = 100_000
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range distinct {
		stream = append(stream, fmt.Sprintf("subject-%d", i))
	}
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })

	var before uint64
	for i, name := range stream {
		sk.add("default", name, 0)
		if i == len(stream)/10 {
			before = testkit.LiveHeap()
		}
		if len(sk.counters) > TopDeniedCounters || cap(sk.counters) != TopDeniedCounters {
			t.Fatalf("after %d denials the sketch holds %d counters of capacity %d, want at most %d", i+1, len(sk.counters), cap(sk.counters), TopDeniedCounters)
		}
	}
	stream = nil
	after := testkit.LiveHeap()
	// 90% of the stream, about 90 000 new subjects, went through the
	// sketch: a map of them would hold megabytes.
	if grew := int64(after) - int64(before); grew > 256<<10 {
		t.Errorf("the heap grew by %d bytes while the sketch took 90 000 more subjects", grew)
	}

	top := sk.top(len(heavy), 0)
	for i, c := range top {
		n, ok := heavy[c.subject]
		if !ok {
			t.Errorf("rank %d is %q (%d, ±%d), not a heavy hitter", i+1, c.subject, c.count, c.err)
			continue
		}
		// Space-Saving never underestimates, and overestimates by at most
		// the counter's err.
		if c.count < n || c.count-c.err > n {
			t.Errorf("%s: count %d ± %d, true count %d", c.subject, c.count, c.err, n)
		}
	}
	// The ranking follows the true counts wherever they differ by more
	// than the counts' possible overestimates.
	for i := 1; i < len(top); i++ {
		a, b := top[i-1], top[i]
		if heavy[a.subject]+max(a.err, b.err) < heavy[b.subject] {
			t.Errorf("ranks %d and %d out of order: %s (%d) then %s (%d)", i, i+1, a.subject, heavy[a.subject], b.subject, heavy[b.subject])
		}
	}
}

func TestTopDeniedDecays(t *testing.T) {
	st, c := newStats(t, StatsOptions{TopDenied: true})
	decide(st, "default", "alice", 100, false, 0)
	decide(st, "login", "alice", 1, false, 0)
	decide(st, "default", "bob", 40, true, 0)                         // allowed: not counted
	st.ObserveDecision(context.Background(), ratelimit.DecisionEvent{ // fail-closed denies everyone: not counted
		Namespace: "default", Key: "7:default:carol", Decision: ratelimit.Decision{Source: ratelimit.SourceFailClosed},
	})
	c.Add(TopDeniedHalfLife)
	decide(st, "default", "bob", 60, false, 0)

	top := report(st).TopDenied
	if top == nil {
		t.Fatal("no top_denied with TopDenied set")
	}
	want := []DeniedSubject{{"default", "bob", 60, 0}, {"default", "alice", 50, 0}}
	if len(top.Subjects) != 2 || top.Subjects[0] != want[0] || top.Subjects[1] != want[1] {
		t.Errorf("after a half-life: %+v, want %+v (alice halved, login's single denial halved to nothing)", top.Subjects, want)
	}
	c.Add(10 * TopDeniedHalfLife)
	if top := report(st).TopDenied; len(top.Subjects) != 0 {
		t.Errorf("ten half-lives later: %+v, want none", top.Subjects)
	}
}

func TestTopDeniedOffByDefault(t *testing.T) {
	st, _ := newStats(t, StatsOptions{})
	decide(st, "default", "alice", 100, false, 0)
	if r := report(st); r.TopDenied != nil || st.top != nil {
		t.Errorf("top_denied without TopDenied: %+v", r.TopDenied)
	}
}

func TestSubjectOf(t *testing.T) {
	lim, err := ratelimit.New[string](memstore.New(), ratelimit.PerSecond(1), ratelimit.WithNamespace("api:v2"))
	if err != nil {
		t.Fatal(err)
	}
	if got := subjectOf(lim.Key("alice")); got != "alice" {
		t.Errorf("subject of the limiter's key %q: %q, want alice", lim.Key("alice"), got)
	}
	rule, err := ratelimit.New[string](memstore.New(), ratelimit.PerSecond(1), ratelimit.WithNamespace("envoy:4:edge:14:remote_address:0:"))
	if err != nil {
		t.Fatal(err)
	}
	if got := subjectOf(rule.Key("10.0.0.1")); got != "10.0.0.1" {
		t.Errorf("subject of an Envoy rule's key %q: %q, want 10.0.0.1", rule.Key("10.0.0.1"), got)
	}
	if got := subjectOf("other:key"); got != "other:key" {
		t.Errorf("a key without the prefix: %q", got)
	}
	long1 := strings.Repeat("é", 200) + "1"
	long2 := strings.Repeat("é", 200) + "2"
	a, b := subjectOf(long1), subjectOf(long2)
	if len(a) > MaxTopSubjectBytes || len(b) > MaxTopSubjectBytes || !utf8.ValidString(a) {
		t.Errorf("long subject kept as %d bytes (valid UTF-8: %v), want at most %d", len(a), utf8.ValidString(a), MaxTopSubjectBytes)
	}
	if a == b {
		t.Errorf("two long subjects differing at the end are kept as the same %q", a)
	}
}

// TestStatsConcurrent records from many goroutines while reports are read
// (run with -race); the totals come out exact.
func TestStatsConcurrent(t *testing.T) {
	st, c := newStats(t, StatsOptions{TopDenied: true})
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				decide(st, "default", fmt.Sprintf("s%d-%d", g, i%50), 1, i%3 != 0, time.Millisecond)
				if i%100 == 0 {
					c.Add(time.Second)
					st.ObserveFallback(ctx, fallback.Event{Alive: i%200 == 0, At: c.Now()})
				}
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			report(st)
		}
	})
	wg.Wait()
	ns := nsReport(t, report(st), "default")
	if ns.Allowed+ns.Denied != 8000 || ns.Denied != 8*334 {
		t.Errorf("totals: %d allowed, %d denied; want 8000 in all, %d denied", ns.Allowed, ns.Denied, 8*334)
	}
}

// TestStatsEnvoyDomains: the domains of Source.Envoy follow the
// namespaces, sorted, with their figures and their rules, and no policy.
func TestStatsEnvoyDomains(t *testing.T) {
	st, _ := newStats(t, StatsOptions{})
	src := Source{Namespaces: config.Default(), Envoy: func() []EnvoyDomain {
		return []EnvoyDomain{{Name: "envoy:web", Domain: "web", Rules: 1}, {Name: "envoy:edge", Domain: "edge", Rules: 3}}
	}}
	decide(st, "envoy:edge", "10.0.0.1", 4, true, time.Millisecond)
	decide(st, "envoy:edge", "10.0.0.1", 1, false, time.Millisecond)
	r := st.Report(context.Background(), src)
	var names []string
	for _, ns := range r.Namespaces {
		names = append(names, ns.Name)
	}
	if got := strings.Join(names, " "); got != "default envoy:edge envoy:web" {
		t.Errorf("namespaces %q, want default, then the domains sorted", got)
	}
	edge := nsReport(t, r, "envoy:edge")
	if edge.Allowed != 4 || edge.Denied != 1 || edge.Envoy == nil || *edge.Envoy != (EnvoyReport{Domain: "edge", Rules: 3}) || !reflect.DeepEqual(edge.Policy, (config.PolicyJSON{})) {
		t.Errorf("envoy:edge: %+v, envoy %+v", edge, edge.Envoy)
	}
	if d := nsReport(t, r, "default"); d.Envoy != nil {
		t.Errorf("the namespace default reports an Envoy domain: %+v", d.Envoy)
	}
}
