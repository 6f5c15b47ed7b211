package envoyrls

import (
	"context"
	"fmt"
	"sync"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// events records an Observer's events.
type events struct {
	mu        sync.Mutex
	decisions []ratelimit.DecisionEvent
	errors    []ratelimit.ErrorEvent
}

func (e *events) ObserveDecision(_ context.Context, d ratelimit.DecisionEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.decisions = append(e.decisions, d)
}

func (e *events) ObserveError(_ context.Context, x ratelimit.ErrorEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.errors = append(e.errors, x)
}

// summary lists the decisions as "op allowed|denied" in order.
func (e *events) summary() []string {
	var out []string
	for _, d := range e.decisions {
		op := "acquire"
		if d.Peek {
			op = "peek"
		}
		res := "denied"
		if d.Decision.Allowed {
			res = "allowed"
		}
		out = append(out, fmt.Sprintf("%s %s %s cost %d", d.Namespace, op, res, d.Cost))
	}
	return out
}

func entry(k, v string) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
}

// TestObserverSeesEveryBucketOnce: each bucket a request decides is one
// event under envoy: and the domain, allowed only when the request charged
// it; a rule of requests_per_unit 0 and an unknown domain are none.
func TestObserverSeesEveryBucketOnce(t *testing.T) {
	cfg, err := ParseConfig("edge.yaml", []byte(`domain: edge
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	var obs events
	svc, err := New(Options{Store: memstore.New(), Config: cfg, Observer: &obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ask := func(domain string, ds ...*rlv3.RateLimitDescriptor) {
		t.Helper()
		if _, err := svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}); err != nil {
			t.Fatal(err)
		}
	}
	ask("edge", entry("ip", "a"))                     // the fast path: allowed
	ask("edge", entry("ip", "a"), entry("user", "u")) // all or nothing: ip over, user not charged
	ask("edge", entry("blocked", "x"))                // rpu 0: no bucket
	ask("other", entry("ip", "a"))                    // an unknown domain decides nothing
	want := []string{
		"envoy:edge acquire allowed cost 1",
		"envoy:edge acquire denied cost 1",
		"envoy:edge acquire denied cost 1",
	}
	got := obs.summary()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events:\n got %q\nwant %q", got, want)
	}
	for _, d := range obs.decisions {
		if d.Key == "" || d.Latency <= 0 {
			t.Errorf("an event without its key or latency: %+v", d)
		}
	}
}

// TestOverrideLimitersAreReused: a descriptor with its own limit reuses the
// Limiter of an earlier request with the same limit, and a different limit
// gets its own; past maxOverrides none is kept.
func TestOverrideLimitersAreReused(t *testing.T) {
	cfg, err := ParseConfig("edge.yaml", []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Options{Store: memstore.New(), Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	limiter := func(rpu uint32, value string) *ratelimit.Limiter[string] {
		t.Helper()
		d := entry("user", value)
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit_HOUR}
		var c check
		if err := svc.overrideCheck(&c, "edge", d); err != nil {
			t.Fatal(err)
		}
		return c.lim
	}
	first := limiter(7, "u1")
	if again := limiter(7, "u2"); again != first {
		t.Error("a second request with the same limit built a new Limiter")
	}
	if other := limiter(8, "u1"); other == first {
		t.Error("another limit shares the first one's Limiter")
	}
	for rpu := range uint32(maxOverrides) {
		limiter(100+rpu, "u")
	}
	if n := svc.nOverrides.Load(); n != maxOverrides {
		t.Errorf("%d Limiters kept, want the bound %d", n, maxOverrides)
	}
	if limiter(1_000_000, "u") == limiter(1_000_000, "u") {
		t.Error("past the bound, a limit's Limiter was kept")
	}
}
