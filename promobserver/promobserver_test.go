package promobserver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/promobserver"
	"github.com/exactlimit/ratelimit/tokenbucket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func limiter(t testing.TB, obs ratelimit.Observer, ns string, opts ...ratelimit.Option) *ratelimit.Limiter[string] {
	t.Helper()
	clock := testkit.NewClock(testkit.Start)
	opts = append([]ratelimit.Option{ratelimit.WithNamespace(ns), ratelimit.WithClock(clock.Now), ratelimit.WithObserver(obs)}, opts...)
	l, err := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(2), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestDecisionsAndTokens(t *testing.T) {
	obs := promobserver.New()
	ctx := context.Background()
	api := limiter(t, obs, "api", ratelimit.WithDenyCache(8))
	api.TryAcquireN(ctx, "a", 2) // allowed, 2 tokens
	api.TryAcquire(ctx, "a")     // denied by the store
	api.TryAcquire(ctx, "a")     // denied by the cache
	api.Peek(ctx, "a")           // a denied peek, no tokens
	login := limiter(t, obs, "login")
	login.TryAcquire(ctx, "b")
	err := testutil.CollectAndCompare(obs, strings.NewReader(`
# HELP ratelimit_decisions_total Rate limit checks decided, by namespace, operation, result and what decided them.
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{namespace="api",op="acquire",result="allowed",source="cache"} 0
ratelimit_decisions_total{namespace="api",op="acquire",result="allowed",source="fail-closed"} 0
ratelimit_decisions_total{namespace="api",op="acquire",result="allowed",source="fail-open"} 0
ratelimit_decisions_total{namespace="api",op="acquire",result="allowed",source="lease"} 0
ratelimit_decisions_total{namespace="api",op="acquire",result="allowed",source="local"} 0
ratelimit_decisions_total{namespace="api",op="acquire",result="allowed",source="store"} 1
ratelimit_decisions_total{namespace="api",op="acquire",result="denied",source="cache"} 1
ratelimit_decisions_total{namespace="api",op="acquire",result="denied",source="fail-closed"} 0
ratelimit_decisions_total{namespace="api",op="acquire",result="denied",source="fail-open"} 0
ratelimit_decisions_total{namespace="api",op="acquire",result="denied",source="lease"} 0
ratelimit_decisions_total{namespace="api",op="acquire",result="denied",source="local"} 0
ratelimit_decisions_total{namespace="api",op="acquire",result="denied",source="store"} 1
ratelimit_decisions_total{namespace="api",op="peek",result="allowed",source="cache"} 0
ratelimit_decisions_total{namespace="api",op="peek",result="allowed",source="fail-closed"} 0
ratelimit_decisions_total{namespace="api",op="peek",result="allowed",source="fail-open"} 0
ratelimit_decisions_total{namespace="api",op="peek",result="allowed",source="lease"} 0
ratelimit_decisions_total{namespace="api",op="peek",result="allowed",source="local"} 0
ratelimit_decisions_total{namespace="api",op="peek",result="allowed",source="store"} 0
ratelimit_decisions_total{namespace="api",op="peek",result="denied",source="cache"} 0
ratelimit_decisions_total{namespace="api",op="peek",result="denied",source="fail-closed"} 0
ratelimit_decisions_total{namespace="api",op="peek",result="denied",source="fail-open"} 0
ratelimit_decisions_total{namespace="api",op="peek",result="denied",source="lease"} 0
ratelimit_decisions_total{namespace="api",op="peek",result="denied",source="local"} 0
ratelimit_decisions_total{namespace="api",op="peek",result="denied",source="store"} 1
ratelimit_decisions_total{namespace="login",op="acquire",result="allowed",source="cache"} 0
ratelimit_decisions_total{namespace="login",op="acquire",result="allowed",source="fail-closed"} 0
ratelimit_decisions_total{namespace="login",op="acquire",result="allowed",source="fail-open"} 0
ratelimit_decisions_total{namespace="login",op="acquire",result="allowed",source="lease"} 0
ratelimit_decisions_total{namespace="login",op="acquire",result="allowed",source="local"} 0
ratelimit_decisions_total{namespace="login",op="acquire",result="allowed",source="store"} 1
ratelimit_decisions_total{namespace="login",op="acquire",result="denied",source="cache"} 0
ratelimit_decisions_total{namespace="login",op="acquire",result="denied",source="fail-closed"} 0
ratelimit_decisions_total{namespace="login",op="acquire",result="denied",source="fail-open"} 0
ratelimit_decisions_total{namespace="login",op="acquire",result="denied",source="lease"} 0
ratelimit_decisions_total{namespace="login",op="acquire",result="denied",source="local"} 0
ratelimit_decisions_total{namespace="login",op="acquire",result="denied",source="store"} 0
ratelimit_decisions_total{namespace="login",op="peek",result="allowed",source="cache"} 0
ratelimit_decisions_total{namespace="login",op="peek",result="allowed",source="fail-closed"} 0
ratelimit_decisions_total{namespace="login",op="peek",result="allowed",source="fail-open"} 0
ratelimit_decisions_total{namespace="login",op="peek",result="allowed",source="lease"} 0
ratelimit_decisions_total{namespace="login",op="peek",result="allowed",source="local"} 0
ratelimit_decisions_total{namespace="login",op="peek",result="allowed",source="store"} 0
ratelimit_decisions_total{namespace="login",op="peek",result="denied",source="cache"} 0
ratelimit_decisions_total{namespace="login",op="peek",result="denied",source="fail-closed"} 0
ratelimit_decisions_total{namespace="login",op="peek",result="denied",source="fail-open"} 0
ratelimit_decisions_total{namespace="login",op="peek",result="denied",source="lease"} 0
ratelimit_decisions_total{namespace="login",op="peek",result="denied",source="local"} 0
ratelimit_decisions_total{namespace="login",op="peek",result="denied",source="store"} 0
# HELP ratelimit_tokens_total Tokens asked for by the acquires decided, by namespace and result.
# TYPE ratelimit_tokens_total counter
ratelimit_tokens_total{namespace="api",result="allowed"} 2
ratelimit_tokens_total{namespace="api",result="denied"} 2
ratelimit_tokens_total{namespace="login",result="allowed"} 1
ratelimit_tokens_total{namespace="login",result="denied"} 0
`), "ratelimit_decisions_total", "ratelimit_tokens_total")
	if err != nil {
		t.Fatal(err)
	}
	// Every decision is timed, by source.
	if n := testutil.CollectAndCount(obs, "ratelimit_decision_duration_seconds"); n != 2*6 {
		t.Fatalf("%d duration series, want 6 sources × 2 namespaces", n)
	}
	h := histogramCount(t, obs, "api", "store")
	if h != 3 {
		t.Fatalf("api's store decisions timed %d times, want 3", h)
	}
}

// histogramCount returns the sample count of the duration histogram of ns
// and source.
func histogramCount(t *testing.T, c prometheus.Collector, ns, source string) uint64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "ratelimit_decision_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == ns && labels["source"] == source {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	t.Fatalf("no duration series for %s/%s", ns, source)
	return 0
}

func TestErrors(t *testing.T) {
	tests := []struct {
		err    error
		reason string
	}{
		{fmt.Errorf("x: %w", ratelimit.ErrInvalidArgument), "invalid_argument"},
		{fmt.Errorf("x: %w", tokenbucket.ErrCorruptState), "corrupt_state"},
		{fmt.Errorf("redis: %w", context.Canceled), "canceled"},
		{context.DeadlineExceeded, "deadline"},
		{errors.New("dial tcp: connection refused"), "store"},
	}
	obs := promobserver.New()
	for _, tt := range tests {
		if got := promobserver.Reason(tt.err); got != tt.reason {
			t.Errorf("Reason(%v) = %q, want %q", tt.err, got, tt.reason)
		}
		obs.ObserveError(context.Background(), ratelimit.ErrorEvent{Namespace: "api", Op: "acquire", Err: tt.err})
	}
	obs.ObserveError(context.Background(), ratelimit.ErrorEvent{Namespace: "api", Op: "reset", Err: errors.New("down")})
	err := testutil.CollectAndCompare(obs, strings.NewReader(`
# HELP ratelimit_errors_total Rate limit checks and resets that returned an error, by namespace, operation and reason.
# TYPE ratelimit_errors_total counter
ratelimit_errors_total{namespace="api",op="acquire",reason="canceled"} 1
ratelimit_errors_total{namespace="api",op="acquire",reason="corrupt_state"} 1
ratelimit_errors_total{namespace="api",op="acquire",reason="deadline"} 1
ratelimit_errors_total{namespace="api",op="acquire",reason="invalid_argument"} 1
ratelimit_errors_total{namespace="api",op="acquire",reason="store"} 1
ratelimit_errors_total{namespace="api",op="reset",reason="store"} 1
`), "ratelimit_errors_total")
	if err != nil {
		t.Fatal(err)
	}
}

func TestFallbackState(t *testing.T) {
	obs := promobserver.New()
	at := testkit.Start
	obs.ObserveFallback(context.Background(), fallback.Event{Partition: "10.0.0.1:6379", Outage: fallback.LocalFallback, Cause: errors.New("refused"), At: at})
	obs.ObserveFallback(context.Background(), fallback.Event{Partition: "10.0.0.1:6379", Alive: true, Outage: fallback.LocalFallback, At: at.Add(time.Second)})
	obs.ObserveFallback(context.Background(), fallback.Event{Partition: "10.0.0.2:6379", Outage: fallback.LocalFallback, At: at})
	err := testutil.CollectAndCompare(obs, strings.NewReader(`
# HELP ratelimit_primary_transitions_total Changes of a fallback store's primary between up and down, by partition and new state.
# TYPE ratelimit_primary_transitions_total counter
ratelimit_primary_transitions_total{partition="10.0.0.1:6379",state="down"} 1
ratelimit_primary_transitions_total{partition="10.0.0.1:6379",state="up"} 1
ratelimit_primary_transitions_total{partition="10.0.0.2:6379",state="down"} 1
# HELP ratelimit_primary_up 1 while a fallback store sends checks to its primary store, 0 while the primary is marked down.
# TYPE ratelimit_primary_up gauge
ratelimit_primary_up{partition="10.0.0.1:6379"} 1
ratelimit_primary_up{partition="10.0.0.2:6379"} 0
`), "ratelimit_primary_up", "ratelimit_primary_transitions_total")
	if err != nil {
		t.Fatal(err)
	}
}

func TestDenyCacheCollector(t *testing.T) {
	obs := promobserver.New()
	l := limiter(t, obs, "api", ratelimit.WithDenyCache(100))
	ctx := context.Background()
	for range 5 {
		l.TryAcquire(ctx, "a")
	}
	c := promobserver.NewDenyCacheCollector("api", l.DenyCacheStats)
	err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP ratelimit_deny_cache_capacity Most subjects a limiter's denial cache holds.
# TYPE ratelimit_deny_cache_capacity gauge
ratelimit_deny_cache_capacity{namespace="api"} 100
# HELP ratelimit_deny_cache_entries Subjects a limiter's denial cache holds a denial for.
# TYPE ratelimit_deny_cache_entries gauge
ratelimit_deny_cache_entries{namespace="api"} 1
# HELP ratelimit_deny_cache_evictions_total Denials a limiter's denial cache dropped early to make room.
# TYPE ratelimit_deny_cache_evictions_total counter
ratelimit_deny_cache_evictions_total{namespace="api"} 0
# HELP ratelimit_deny_cache_hits_total Checks a limiter's denial cache denied without asking the store.
# TYPE ratelimit_deny_cache_hits_total counter
ratelimit_deny_cache_hits_total{namespace="api"} 2
# HELP ratelimit_deny_cache_misses_total Checks a limiter's denial cache passed to the store.
# TYPE ratelimit_deny_cache_misses_total counter
ratelimit_deny_cache_misses_total{namespace="api"} 3
`))
	if err != nil {
		t.Fatal(err)
	}
}

func TestRegistersCleanly(t *testing.T) {
	obs := promobserver.New(promobserver.WithBuckets([]float64{0.001, 0.01}))
	l := limiter(t, obs, "api", ratelimit.WithDenyCache(4))
	l.TryAcquire(context.Background(), "a")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(obs, promobserver.NewDenyCacheCollector("api", l.DenyCacheStats))
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

func BenchmarkObserveDecision(b *testing.B) {
	obs := promobserver.New()
	e := ratelimit.DecisionEvent{Namespace: "api", Key: "3:api:u", Cost: 1, Decision: ratelimit.Decision{Allowed: true}, Latency: 300 * time.Microsecond}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			obs.ObserveDecision(ctx, e)
		}
	})
}

func TestPolicyConversionsAreCounted(t *testing.T) {
	obs := promobserver.New()
	ctx := context.Background()
	store := memstore.New()
	clock := testkit.NewClock(testkit.Start)
	mk := func(l ratelimit.Limit) *ratelimit.Limiter[string] {
		lim, err := ratelimit.New[string](store, l, ratelimit.WithNamespace("shared"), ratelimit.WithClock(clock.Now), ratelimit.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	// Two limiters with different policies on one namespace fight over its
	// buckets: each check converts the other's bucket.
	a, b := mk(ratelimit.PerSecond(10)), mk(ratelimit.PerSecond(20))
	a.TryAcquire(ctx, "s")
	for range 3 {
		b.TryAcquire(ctx, "s")
		a.TryAcquire(ctx, "s")
	}
	err := testutil.CollectAndCompare(obs, strings.NewReader(`
# HELP ratelimit_policy_conversions_total Checks that met a bucket another policy wrote and converted it, by namespace: a rolling deploy makes one per bucket; a steady rate means two limiters with different policies share the namespace.
# TYPE ratelimit_policy_conversions_total counter
ratelimit_policy_conversions_total{namespace="shared"} 6
`), "ratelimit_policy_conversions_total")
	if err != nil {
		t.Fatal(err)
	}
}
