package envoyrls

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// recordedTimer keeps the durations a PeerTimer is told.
type recordedTimer struct {
	mu sync.Mutex
	ds []time.Duration
}

func (r *recordedTimer) AddDuration(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ds = append(r.ds, d)
}

// steppingClock is a clock that moves on by step at each read, and counts
// its reads.
type steppingClock struct {
	mu    sync.Mutex
	now   time.Time
	step  time.Duration
	reads int
}

func (c *steppingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	c.now = c.now.Add(c.step)
	return c.now
}

// TestPeerResponseTimeTimesEveryCall: the peer's response_time is told the
// duration of every ShouldRateLimit call that total_requests counts, over
// gRPC and /json, a refused request's too, each read on the clock once at
// its start and once at its answer; without a timer the clock is not read.
func TestPeerResponseTimeTimesEveryCall(t *testing.T) {
	cfg, err := ParseConfig("edge.yaml", []byte("domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	clk := &steppingClock{now: time.Unix(1_700_000_000, 0), step: 3 * time.Millisecond}
	timer := &recordedTimer{}
	rec := &recorded{counts: map[string]uint64{}, asked: map[string]int{}}
	m := NewMetrics(0)
	m.SetPeerStats(rec.stats)
	m.SetPeerTimer(timer, clk.Now)
	svc, err := New(Options{Store: memstore.New(), Config: cfg, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	client := dial(t, svc)
	ctx := context.Background()
	ip := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{entry("ip", "10.1.2.3")}}
	for range 2 { // OK, then OVER_LIMIT
		if _, err := client.ShouldRateLimit(ctx, ip); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a request without descriptors: %v, want INVALID_ARGUMENT", err)
	}
	srv := httptest.NewServer(NewHTTP(svc, http.NotFoundHandler(), nil))
	t.Cleanup(srv.Close)
	res, err := http.Post(srv.URL+"/json", "application/json", strings.NewReader(`{"domain": "other", "descriptors": [{"entries": [{"key": "ip", "value": "x"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()

	want := []time.Duration{3 * time.Millisecond, 3 * time.Millisecond, 3 * time.Millisecond, 3 * time.Millisecond}
	if !slices.Equal(timer.ds, want) {
		t.Errorf("response_time told %v, want %v", timer.ds, want)
	}
	if got := rec.counts[PeerTotalRequests]; got != uint64(len(want)) {
		t.Errorf("total_requests %d, want %d: one timing a counted call", got, len(want))
	}
	if clk.reads != 2*len(want) {
		t.Errorf("the clock was read %d times for %d calls, want twice a call", clk.reads, len(want))
	}

	untimed := &steppingClock{step: time.Millisecond}
	m2 := NewMetrics(0)
	m2.SetPeerStats(rec.stats)
	m2.SetPeerTimer(nil, untimed.Now)
	svc2, err := New(Options{Store: memstore.New(), Config: cfg, Metrics: m2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc2.ShouldRateLimit(ctx, ip); err != nil {
		t.Fatal(err)
	}
	if untimed.reads != 0 {
		t.Errorf("without a timer the clock was read %d times, want none", untimed.reads)
	}
	var sum summedTimer
	m3 := NewMetrics(0)
	m3.SetPeerTimer(&sum, nil)
	if n := testing.AllocsPerRun(1000, func() { m3.callEnded(m3.callStarted()) }); n != 0 {
		t.Errorf("timing a call allocates %v times, want none", n)
	}
}

// summedTimer adds up what it is told, allocating nothing.
type summedTimer struct{ total atomic.Int64 }

func (s *summedTimer) AddDuration(d time.Duration) { s.total.Add(int64(d)) }

// TestNearLimitRatioAsThePeers: NEAR_LIMIT_RATIO's threshold is the peer's,
// computed in float32 (0.57 of 100 is 57, not float64's 56), a ratio of 1
// is honoured (no hit within the limit is near it), and the threshold is
// never above the capacity.
func TestNearLimitRatioAsThePeers(t *testing.T) {
	for _, tc := range []struct {
		capacity int64
		ratio    float64
		want     int64
	}{
		{100, 0.57, 57}, {10, 0.8, 8}, {10, 1, 10}, {3, 0.5, 1}, {1<<25 + 3, 1, 1<<25 + 3},
	} {
		if got := nearThreshold(tc.capacity, tc.ratio); got != tc.want {
			t.Errorf("nearThreshold(%d, %v) = %d, want %d", tc.capacity, tc.ratio, got, tc.want)
		}
	}
	cfg, err := ParseConfig("near.yaml", []byte("domain: near\ndescriptors:\n  - key: n\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: t\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ratio float64
		key   string
		hits  []uint32
		want  float64
	}{
		{0.57, "n", []uint32{57, 40, 5}, 43}, // 40 past 57, then 3 of the 5 (2 over)
		{1, "t", []uint32{9, 1, 1}, 0},
		{0, "t", []uint32{9, 1}, 2}, // the default, 0.8
	} {
		m := NewMetrics(tc.ratio)
		svc, err := New(Options{Store: memstore.New(), Config: cfg, Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range tc.hits {
			if _, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "near", HitsAddend: h, Descriptors: []*rlv3.RateLimitDescriptor{entry(tc.key, "1")}}); err != nil {
				t.Fatal(err)
			}
		}
		if got := testutil.ToFloat64(m.near.WithLabelValues("near", "near."+tc.key)); got != tc.want {
			t.Errorf("ratio %v, hits %v on %s: near_limit %v, want %v", tc.ratio, tc.hits, tc.key, got, tc.want)
		}
	}
}
