package envoyrls

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/exactlimit/ratelimit/memstore"
)

// recorded counts what PeerStats' counters are told, by name.
type recorded struct {
	mu     sync.Mutex
	counts map[string]uint64
	asked  map[string]int
}

type recordedCounter struct {
	r    *recorded
	name string
}

func (c recordedCounter) Add(n uint64) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	c.r.counts[c.name] += n
}

func (r *recorded) stats(name string) PeerCounter {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked[name]++
	return recordedCounter{r, name}
}

// TestPeerStatsFromTheSameObservation: the peer's statistics count what the
// service's own series count, from one observation: the rule's hits,
// within, over and near, under the peer's rewritten key; an unlimited
// rule's hits are in the series but not the peer's; a request that is not
// valid is a service_error; each call is one of total_requests; the first
// load is a config_load_success; each name is asked for once.
func TestPeerStatsFromTheSameObservation(t *testing.T) {
	cfg, err := ParseConfig("edge.yaml", []byte(`domain: edge
descriptors:
  - key: ip
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorded{counts: map[string]uint64{}, asked: map[string]int{}}
	m := NewMetrics(0)
	m.SetPeerStats(rec.stats)
	svc, err := New(Options{Store: memstore.New(), Config: cfg, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 3 {
		if _, err := svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{entry("ip", "10.1.2.3"), entry("free", "x")}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge"}); err == nil {
		t.Fatal("a request without descriptors was answered")
	}
	const rule = "ratelimit.service.rate_limit.edge.ip_10_1_2_3."
	want := map[string]uint64{
		rule + "total_hits": 3, rule + "within_limit": 2, rule + "over_limit": 1, rule + "near_limit": 1, rule + "shadow_mode": 0,
		PeerConfigLoadSuccess: 1, PeerConfigLoadError: 0, PeerGlobalShadowMode: 0, PeerRedisError: 0, PeerServiceError: 1,
		PeerTotalRequests: 4,
	}
	for name, n := range want {
		if got := rec.counts[name]; got != n {
			t.Errorf("%s: %d, want %d", name, got, n)
		}
	}
	for name, n := range rec.asked {
		if n != 1 {
			t.Errorf("%s asked for %d times, want once", name, n)
		}
		if strings.Contains(name, "free") {
			t.Errorf("the peer counts no unlimited rule, yet %s", name)
		}
	}
	if len(rec.counts) > len(want) {
		t.Errorf("counted %v, want only %v", slices.Sorted(maps.Keys(rec.counts)), slices.Sorted(maps.Keys(want)))
	}
	if got := testutil.ToFloat64(m.hits.WithLabelValues("edge", "edge.free")); got != 3 {
		t.Errorf("the series of the unlimited rule: %v hits, want 3", got)
	}
	if got := testutil.ToFloat64(m.hits.WithLabelValues("edge", "edge.ip_10.1.2.3")); got != 3 {
		t.Errorf("the series of the rule: %v hits, want 3 (under its own key)", got)
	}
}
