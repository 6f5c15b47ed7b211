package envoyrls

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// peerConfig holds the rules of the cases where this service once answered
// otherwise than envoyproxy/ratelimit.
const peerConfig = `
domain: edge
descriptors:
  - key: three
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: one
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: deny
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: two
    metadata: {team: {name: edge}, tier: gold}
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: free
    metadata: {team: {oncall: ops}}
    rate_limit: {unlimited: true, name: free}
  - key: paid
    rate_limit:
      unit: minute
      requests_per_unit: 5
      replaces: [{name: free}]
  - key: user
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
`

func serveWith(t *testing.T, o Options) *fixture {
	t.Helper()
	cfg, err := ParseConfig("peer.yaml", []byte(peerConfig))
	if err != nil {
		t.Fatal(err)
	}
	clock := testkit.NewClock(time.Unix(1_700_000_000, 0))
	if o.Metrics == nil {
		o.Metrics = NewMetrics(0)
	}
	o.Store, o.Config, o.Clock = memstore.New(), cfg, clock.Now
	svc, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{svc: svc, client: dial(t, svc), clock: clock, metrics: o.Metrics}
}

func hitsOf(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func headerMap(r *rlsv3.RateLimitResponse) map[string]string {
	got := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	return got
}

func TestGlobalShadowMode(t *testing.T) {
	f := serveWith(t, Options{ShadowMode: true, Headers: Headers{Enabled: true}})
	f.ask(t, 0, desc("one=a"))
	r := f.ask(t, 0, desc("one=a"), desc("three=a"))
	wantOverall(t, "SHADOW_MODE", r, ok)
	wantStatus(t, "the status still says over", r.Statuses[0], over, 0, 1)
	wantStatus(t, "the other is counted", r.Statuses[1], ok, 2, 3)
	if got := testutil.ToFloat64(f.metrics.globalShadowN); got != 1 {
		t.Errorf("global shadow counter: got %v, want 1", got)
	}
	// Decided as when enforced: the denied request charged nothing.
	wantStatus(t, "three untouched", f.ask(t, 0, desc("three=a")).Statuses[0], ok, 2, 3)
}

func TestStatusesCountedInTurn(t *testing.T) {
	f := serveWith(t, Options{Headers: Headers{Enabled: true}})
	for _, tc := range []struct {
		name  string
		hits  uint64
		ds    []*rlv3.RateLimitDescriptor
		code  rlsv3.RateLimitResponse_Code
		want  []rlsv3.RateLimitResponse_Code
		left  []uint32
		after uint32 // three=<name>'s remaining afterwards with one more hit
	}{
		{"5 hits on 3 a minute", 0, []*rlv3.RateLimitDescriptor{hitsOf(desc("three=a"), 5)}, over, []rlsv3.RateLimitResponse_Code{over}, []uint32{0}, 2},
		{"2^32+1 hits", 0, []*rlv3.RateLimitDescriptor{hitsOf(desc("three=b"), 1<<32+1)}, over, []rlsv3.RateLimitResponse_Code{over}, []uint32{0}, 2},
		{"2^64-1 hits", 0, []*rlv3.RateLimitDescriptor{hitsOf(desc("three=c"), math.MaxUint64)}, over, []rlsv3.RateLimitResponse_Code{over}, []uint32{0}, 2},
		{"the same descriptor twice on 1 a minute", 0, []*rlv3.RateLimitDescriptor{desc("one=d"), desc("one=d"), desc("three=d")}, over, []rlsv3.RateLimitResponse_Code{ok, over, ok}, []uint32{0, 0, 2}, 2},
		{"2 then 2 on 3", 2, []*rlv3.RateLimitDescriptor{desc("three=e"), desc("three=e")}, over, []rlsv3.RateLimitResponse_Code{ok, over}, []uint32{1, 0}, 2},
		{"hits 0 on rpu 0 alone", 0, []*rlv3.RateLimitDescriptor{hitsOf(desc("deny=h"), 0)}, ok, []rlsv3.RateLimitResponse_Code{ok}, []uint32{0}, 2},
		{"hits 0 on rpu 0 and another", 0, []*rlv3.RateLimitDescriptor{hitsOf(desc("deny=f"), 0), desc("three=f")}, ok, []rlsv3.RateLimitResponse_Code{ok, ok}, []uint32{0, 2}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := f.ask(t, uint32(tc.hits), tc.ds...)
			wantOverall(t, "the request", r, tc.code)
			for i, st := range r.Statuses {
				if st.Code != tc.want[i] || st.LimitRemaining != tc.left[i] {
					t.Errorf("status %d: %v remaining %d, want %v remaining %d", i, st.Code, st.LimitRemaining, tc.want[i], tc.left[i])
				}
				if st.Code == over && st.DurationUntilReset.AsDuration() <= 0 {
					t.Errorf("status %d: over with duration_until_reset %v", i, st.DurationUntilReset.AsDuration())
				}
			}
			h := headerMap(r)
			if tc.code == over && (h["RateLimit-Remaining"] != "0" || h["RateLimit-Reset"] == "0") {
				t.Errorf("a denial's headers: %v", h)
			}
			// All or nothing: a denied request charged none of its buckets.
			last := tc.ds[len(tc.ds)-1].Entries[0].Value
			wantStatus(t, "afterwards", f.ask(t, 0, desc("three="+last)).Statuses[0], ok, tc.after, 3)
		})
	}
	t.Run("a look at an empty bucket is OK", func(t *testing.T) {
		for range 3 {
			f.ask(t, 0, desc("three=g"))
		}
		r := f.ask(t, 0, hitsOf(desc("three=g"), 0), desc("one=g"))
		wantOverall(t, "a look denies nothing", r, ok)
		wantStatus(t, "the look", r.Statuses[0], ok, 0, 3)
		wantStatus(t, "the other, charged", r.Statuses[1], ok, 0, 1)
	})
}

func TestHeadersDescribeTheLastDenial(t *testing.T) {
	f := serveWith(t, Options{Headers: Headers{Enabled: true}})
	f.ask(t, 0, desc("one=a"))
	f.ask(t, 2, desc("two=a"))
	r := f.ask(t, 0, desc("one=a"), desc("three=a"), desc("two=a"))
	if h := headerMap(r); h["RateLimit-Limit"] != "2" || h["RateLimit-Remaining"] != "0" {
		t.Errorf("two descriptors over the limit: headers %v, want the last's (limit 2)", h)
	}
}

func TestUnlimitedIsNeverReplaced(t *testing.T) {
	f := serveWith(t, Options{})
	r := f.ask(t, 0, desc("free=x"), desc("paid=x"))
	wantStatus(t, "the unlimited rule named free, replaced", r.Statuses[0], ok, math.MaxUint32, -1)
	wantStatus(t, "the replacing rule", r.Statuses[1], ok, 4, 5)
}

func TestOverrideLeavesValuesOut(t *testing.T) {
	m := NewMetrics(0)
	f := serveWith(t, Options{Headers: Headers{Enabled: true}, Metrics: m})
	d := desc("api_key=sk_live_SECRET123")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_MINUTE}
	r := f.ask(t, 0, d)
	for _, h := range r.ResponseHeadersToAdd {
		if strings.Contains(h.Value, "SECRET") {
			t.Errorf("header %s: %q holds the descriptor's value", h.Key, h.Value)
		}
	}
	if h := headerMap(r); !strings.Contains(h["RateLimit-Policy"], "edge.api_key#override") {
		t.Errorf("RateLimit-Policy %q, want the keys' name", h["RateLimit-Policy"])
	}
	text := gather(t, m)
	if strings.Contains(text, "SECRET") {
		t.Errorf("metrics hold the descriptor's value:\n%s", text)
	}
	if !strings.Contains(text, `key="edge.api_key#override"`) {
		t.Errorf("metrics lack the override's series:\n%s", text)
	}
}

// gather returns m's series in the text format.
func gather(t *testing.T, m *Metrics) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, mt := range mf.Metric {
			b.WriteString(mf.GetName())
			for _, l := range mt.Label {
				b.WriteString(" " + l.GetName() + "=\"" + l.GetValue() + "\"")
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func TestMetricSeriesAreBounded(t *testing.T) {
	m := NewMetrics(0)
	f := serveWith(t, Options{Metrics: m})
	ctx := context.Background()
	// Fresh override keys, each of 200 bytes: bounded by count and by bytes.
	long := strings.Repeat("k", 200)
	var ds []*rlv3.RateLimitDescriptor
	for i := range MaxDescriptors {
		d := desc(long + strings.Repeat("x", i) + "=v")
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_MINUTE}
		ds = append(ds, d)
	}
	for i := range 200 {
		for _, d := range ds {
			d.Entries[0].Key = long + strings.Repeat("x", i%50) + string(rune('a'+i%26)) + strings.Repeat("y", i/26)
		}
		if _, err := f.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds}); err != nil {
			t.Fatal(err)
		}
	}
	// value_to_metric keys of long values fall back to the rule's key.
	for i := range 100 {
		f.ask(t, 0, desc("user="+strings.Repeat("u", MaxMetricKeyBytes)+string(rune('a'+i%26))+strings.Repeat("z", i)))
	}
	m.mu.Lock()
	n, size := m.nseries, m.nbytes
	m.mu.Unlock()
	if n > MaxRuleSeries+2 || size > MaxRuleSeriesBytes+2*MaxMetricKeyBytes {
		t.Errorf("%d series of %d bytes, want at most %d and %d", n, size, MaxRuleSeries, MaxRuleSeriesBytes)
	}
	if got := testutil.CollectAndCount(m.hits); got != n {
		t.Errorf("hits has %d series, the count says %d", got, n)
	}
	if got := testutil.ToFloat64(m.hits.WithLabelValues("edge", "edge.user")); got != 100 {
		t.Errorf("long value_to_metric keys counted under the rule: got %v, want 100", got)
	}
	if got := testutil.ToFloat64(m.hits.WithLabelValues("edge", "edge"+overrideSuffix)); got == 0 {
		t.Error("overrides past the bound are not counted under the domain's override key")
	}
}

func TestImpossibleHitsKeepCountersMeaningful(t *testing.T) {
	m := NewMetrics(0)
	f := serveWith(t, Options{Metrics: m})
	f.ask(t, 0, hitsOf(desc("three=a"), math.MaxUint64))
	f.ask(t, 0, desc("three=a"))
	if got := testutil.ToFloat64(m.hits.WithLabelValues("edge", "edge.three")); got != MaxCountedHits+1 {
		t.Errorf("hits: got %v, want %v (the huge one counted as MaxCountedHits, then 1)", got, float64(MaxCountedHits+1))
	}
	if got := testutil.ToFloat64(m.over.WithLabelValues("edge", "edge.three")); got != MaxCountedHits-3 {
		t.Errorf("over: got %v, want %v: the hits beyond the 3 there", got, float64(MaxCountedHits-3))
	}
	if got := testutil.ToFloat64(m.within.WithLabelValues("edge", "edge.three")); got != 1 {
		t.Errorf("within: got %v, want 1", got)
	}
}

func TestOverLimitCountsHitsBeyondTheLimit(t *testing.T) {
	m := NewMetrics(0)
	f := serveWith(t, Options{Metrics: m})
	f.ask(t, 0, desc("three=a"))
	f.ask(t, 5, desc("three=a")) // 2 there: 3 beyond
	if got := testutil.ToFloat64(m.over.WithLabelValues("edge", "edge.three")); got != 3 {
		t.Errorf("over: got %v, want 3", got)
	}
}

func TestDynamicMetadata(t *testing.T) {
	f := serveWith(t, Options{DynamicMetadata: true})
	r := f.ask(t, 0, desc("two=a"), desc("free=a"), desc("three=a"))
	md := r.DynamicMetadata.AsMap()
	if md["domain"] != "edge" {
		t.Errorf("domain: %v", md["domain"])
	}
	descs, _ := md["descriptors"].([]any)
	if len(descs) != 3 || descs[0].(map[string]any)["entries"].([]any)[0] != "two=a" {
		t.Errorf("descriptors: %v", md["descriptors"])
	}
	meta, _ := md["metadata"].(map[string]any)
	if meta["tier"] != "gold" || meta["team"].(map[string]any)["name"] != "edge" || meta["team"].(map[string]any)["oncall"] != nil {
		t.Errorf("metadata of the passed rules (not the unlimited one): %v", meta)
	}
	f.ask(t, 0, desc("two=b"), desc("two=b"))
	r = f.ask(t, 0, desc("two=b"))
	if _, there := r.DynamicMetadata.AsMap()["metadata"]; there {
		t.Errorf("a denied descriptor's metadata: %v", r.DynamicMetadata.AsMap())
	}
}
