package envoyrls

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultNearLimitRatio is the share of a bucket's capacity past which a
// granted hit counts as near the limit, as the peer's NEAR_LIMIT_RATIO.
const DefaultNearLimitRatio = 0.8

// Bounds on the per-rule series. detailed_metric and value_to_metric put
// request values in keys (the configuration asks for them), and a
// descriptor's own limit puts its entries' keys in one; such a key longer
// than MaxMetricKeyBytes, or one past MaxRuleSeries keys or MaxRuleSeriesBytes
// bytes of keys in all, is counted under its rule's own Path (a descriptor's
// own limit: under the domain's "<domain>#override"), which holds no request
// value. The series are never freed, so these bound them for the process's
// life.
const (
	MaxRuleSeries      = 10_000
	MaxRuleSeriesBytes = 1 << 20
	MaxMetricKeyBytes  = 256
)

// MaxCountedHits bounds the hits one descriptor of one request adds to a
// counter: a hits_addend above it (it can never be granted on any bucket
// below it) counts as MaxCountedHits, so that no request moves a counter out
// of the range where adding 1 still counts.
const MaxCountedHits = math.MaxUint32

// Metrics are the service's Prometheus series, the peer's per-rule
// statistics among them. Label "key" is the peer's statistics key (see
// Rule.Path, detailed_metric and value_to_metric):
//
//	ratelimit_envoy_hits_total{domain,key}         hits (hits_addend) of every matched descriptor
//	ratelimit_envoy_over_limit_total{domain,key}   hits beyond what its bucket held (shadow mode too)
//	ratelimit_envoy_near_limit_total{domain,key}   hits within the limit past the near-limit ratio of the capacity
//	ratelimit_envoy_within_limit_total{domain,key} hits of descriptors answered within the limit
//	ratelimit_envoy_shadow_mode_total{domain,key}  hits beyond the limit that a shadow-mode rule let pass
//	ratelimit_envoy_global_shadow_mode_total       requests over a limit answered OK by SHADOW_MODE
//	ratelimit_envoy_requests_total{result}         ShouldRateLimit calls: ok, over_limit, unknown_domain, invalid, error
//
// Descriptors are counted in turn, as the statuses are (see settle): of 5
// hits on a bucket holding 3, 2 are over the limit and 3 near it. Each
// descriptor's hits are counted up to MaxCountedHits.
//
//	ratelimit_envoy_config_reloads_total{result}   reloads, ok or error
//	ratelimit_envoy_rules                          rate_limit blocks in force
//
// A nil *Metrics counts nothing. Metrics are safe for simultaneous use.
type Metrics struct {
	hits, over, near, within, shadow *prometheus.CounterVec
	requests, reloads                *prometheus.CounterVec
	rules                            prometheus.Gauge
	ratio                            float64
	globalShadowN                    prometheus.Counter
	mu                               sync.Mutex // guards the growth of series
	series                           sync.Map   // key -> *ruleCounters
	nseries, nbytes                  int
	reqOK, reqOver                   prometheus.Counter
	peer                             PeerStats        // nil: no peer statistics (see SetPeerStats)
	peerSvc                          *peerService     // nil without peer
	respTime                         PeerTimer        // the peer's response_time, nil: none (see SetPeerTimer)
	now                              func() time.Time // respTime's clock
}

type ruleCounters struct {
	hits, over, near, within, shadow prometheus.Counter
	peer                             *peerCounters // nil without Metrics.peer
}

// NewMetrics returns the metrics, at zero, with near-limit ratio ratio
// (DefaultNearLimitRatio when ratio is not above 0 and at most 1).
func NewMetrics(ratio float64) *Metrics {
	if !(ratio > 0 && ratio <= 1) {
		ratio = DefaultNearLimitRatio
	}
	vec := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &Metrics{
		hits:     vec("ratelimit_envoy_hits_total", "Hits (hits_addend) of descriptors that matched a rule, by domain and statistics key.", "domain", "key"),
		over:     vec("ratelimit_envoy_over_limit_total", "Hits a rule's bucket denied, shadow mode included.", "domain", "key"),
		near:     vec("ratelimit_envoy_near_limit_total", "Granted hits past the near-limit ratio of the bucket's capacity.", "domain", "key"),
		within:   vec("ratelimit_envoy_within_limit_total", "Granted hits.", "domain", "key"),
		shadow:   vec("ratelimit_envoy_shadow_mode_total", "Hits a shadow_mode rule would have denied.", "domain", "key"),
		requests: vec("ratelimit_envoy_requests_total", "ShouldRateLimit calls, by result (ok, over_limit, unknown_domain, invalid, error).", "result"),
		reloads:  vec("ratelimit_envoy_config_reloads_total", "Envoy config reloads, by result (ok, error).", "result"),
		rules:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "ratelimit_envoy_rules", Help: "rate_limit blocks in force."}),
		globalShadowN: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_envoy_global_shadow_mode_total",
			Help: "Requests over a limit that SHADOW_MODE answered OK."}),
		ratio: ratio,
	}
	m.reqOK = m.requests.WithLabelValues("ok")
	m.reqOver = m.requests.WithLabelValues("over_limit")
	return m
}

// Collectors returns the series, for registering in a prometheus.Registerer.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.hits, m.over, m.near, m.within, m.shadow, m.globalShadowN, m.requests, m.reloads, m.rules}
}

func (m *Metrics) globalShadow() {
	if m != nil {
		m.globalShadowN.Inc()
		if m.peerSvc != nil {
			m.peerSvc.globalShadow.Add(1)
		}
	}
}

func (m *Metrics) request(result string) {
	if m != nil && m.peerSvc != nil {
		m.peerSvc.requests.Add(1)
		switch result {
		case "error":
			m.peerSvc.redisError.Add(1)
		case "invalid":
			m.peerSvc.serviceError.Add(1)
		}
	}
	switch {
	case m == nil:
	case result == "ok":
		m.reqOK.Inc()
	case result == "over_limit":
		m.reqOver.Inc()
	default:
		m.requests.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) reloaded(result string) {
	if m != nil {
		m.reloads.WithLabelValues(result).Inc()
		m.loaded(result == "ok")
	}
}

// loaded counts a load of the configuration, the first one included, in the
// peer's config_load_success or config_load_error.
func (m *Metrics) loaded(ok bool) {
	switch {
	case m == nil || m.peerSvc == nil:
	case ok:
		m.peerSvc.loadOK.Add(1)
	default:
		m.peerSvc.loadError.Add(1)
	}
}

// counters returns the series of key, or of the rule's fallback key (see
// MaxRuleSeries) when key is too long or the bounds are reached.
func (m *Metrics) counters(r *Rule, key string) *ruleCounters {
	if v, ok := m.series.Load(key); ok {
		return v.(*ruleCounters)
	}
	fallback := r.Path
	if r.override {
		fallback = r.Domain + overrideSuffix
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.series.Load(key); ok {
		return v.(*ruleCounters)
	}
	if key != fallback && (len(key) > MaxMetricKeyBytes || m.nseries >= MaxRuleSeries || m.nbytes+len(key) > MaxRuleSeriesBytes) {
		if v, ok := m.series.Load(fallback); ok {
			return v.(*ruleCounters)
		}
		key = fallback // a rule's own key is bounded by the configuration
	}
	c := &ruleCounters{
		hits:   m.hits.WithLabelValues(r.Domain, key),
		over:   m.over.WithLabelValues(r.Domain, key),
		near:   m.near.WithLabelValues(r.Domain, key),
		within: m.within.WithLabelValues(r.Domain, key),
		shadow: m.shadow.WithLabelValues(r.Domain, key),
	}
	if m.peer != nil && !r.Unlimited { // the peer counts no unlimited rule
		c.peer = m.peerRule(key)
	}
	m.series.Store(key, c)
	m.nseries++
	m.nbytes += len(key)
	return c
}

// observe counts a decided check, in turn (see settle): the hits beyond
// the balance it saw are over the limit, and those within it past the
// near-limit ratio near it.
func (m *Metrics) observe(c *check) {
	if m == nil || c.rule == nil || c.replaced || c.refund {
		return // a refund is not a hit
	}
	rc := m.counters(c.rule, c.metric)
	hits := min(c.hits, MaxCountedHits)
	rc.hits.Add(float64(hits))
	b := c.bucket
	if b == nil {
		return // unlimited: the peer counts nothing
	}
	var over, near, within uint64
	capacity := b.limit.Capacity // 0 for rpu 0
	threshold := nearThreshold(capacity, m.ratio)
	usedBefore := capacity - c.seen
	if !c.fits {
		over = hits - min(hits, uint64(c.seen))
		if c.seen > 0 {
			near = uint64(capacity - max(threshold, usedBefore))
		}
	} else {
		within = hits
		if usedAfter := usedBefore + int64(hits); usedAfter > threshold {
			near = uint64(min(int64(hits), usedAfter-threshold))
		}
	}
	rc.count(hits, over, near, within, b.shadow)
}

// nearThreshold is the tokens used past which hits are near the limit, as
// the peer computes it: in float32, so that a ratio such as 0.57 of 100 is
// 57, where float64 would make it 56. It is never above capacity (float32
// rounds a capacity above 2^24 to its nearest, which may be above).
func nearThreshold(capacity int64, ratio float64) int64 {
	return min(capacity, int64(math.Floor(float64(float32(capacity)*float32(ratio)))))
}

// count adds one descriptor's counts to the rule's series, and to the
// peer's statistics of the rule when it has them; zeros are not added.
func (rc *ruleCounters) count(hits, over, near, within uint64, shadow bool) {
	if over > 0 {
		rc.over.Add(float64(over))
		if shadow {
			rc.shadow.Add(float64(over))
		}
	}
	if near > 0 {
		rc.near.Add(float64(near))
	}
	if within > 0 {
		rc.within.Add(float64(within))
	}
	p := rc.peer
	if p == nil {
		return
	}
	p.hits.Add(hits)
	if over > 0 {
		p.over.Add(over)
		if shadow {
			p.shadow.Add(over)
		}
	}
	if near > 0 {
		p.near.Add(near)
	}
	if within > 0 {
		p.within.Add(within)
	}
}
