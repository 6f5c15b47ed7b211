package envoyrls

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultNearLimitRatio is the share of a bucket's capacity past which a
// granted hit counts as near the limit, as the peer's NEAR_LIMIT_RATIO.
const DefaultNearLimitRatio = 0.8

// MaxRuleSeries bounds the distinct metric keys the per-rule series take.
// detailed_metric and value_to_metric put request values in keys; past the
// bound, new keys are counted under their rule's own Path.
const MaxRuleSeries = 10_000

// Metrics are the service's Prometheus series, the peer's per-rule
// statistics among them. Label "key" is the peer's statistics key (see
// Rule.Path, detailed_metric and value_to_metric):
//
//	ratelimit_envoy_hits_total{domain,key}         hits (hits_addend) of every matched descriptor
//	ratelimit_envoy_over_limit_total{domain,key}   hits its bucket denied (shadow mode too)
//	ratelimit_envoy_near_limit_total{domain,key}   granted hits past the near-limit ratio of the capacity
//	ratelimit_envoy_within_limit_total{domain,key} granted hits
//	ratelimit_envoy_shadow_mode_total{domain,key}  hits a shadow-mode rule would have denied
//	ratelimit_envoy_requests_total{result}         ShouldRateLimit calls: ok, over_limit, unknown_domain, invalid, error
//	ratelimit_envoy_config_reloads_total{result}   reloads, ok or error
//	ratelimit_envoy_rules                          rate_limit blocks in force
//
// A nil *Metrics counts nothing. Metrics are safe for simultaneous use.
type Metrics struct {
	hits, over, near, within, shadow *prometheus.CounterVec
	requests, reloads                *prometheus.CounterVec
	rules                            prometheus.Gauge
	ratio                            float64
	series                           sync.Map // key -> *ruleCounters
	nseries                          atomic.Int64
	reqOK, reqOver                   prometheus.Counter
}

type ruleCounters struct {
	hits, over, near, within, shadow prometheus.Counter
}

// NewMetrics returns the metrics, at zero, with near-limit ratio ratio
// (DefaultNearLimitRatio when ratio is not between 0 and 1).
func NewMetrics(ratio float64) *Metrics {
	if !(ratio > 0 && ratio < 1) {
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
		ratio:    ratio,
	}
	m.reqOK = m.requests.WithLabelValues("ok")
	m.reqOver = m.requests.WithLabelValues("over_limit")
	return m
}

// Collectors returns the series, for registering in a prometheus.Registerer.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.hits, m.over, m.near, m.within, m.shadow, m.requests, m.reloads, m.rules}
}

func (m *Metrics) request(result string) {
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
	}
}

func (m *Metrics) counters(r *Rule, key string) *ruleCounters {
	if v, ok := m.series.Load(key); ok {
		return v.(*ruleCounters)
	}
	if key != r.Path && m.nseries.Load() >= MaxRuleSeries {
		return m.counters(r, r.Path)
	}
	c := &ruleCounters{
		hits:   m.hits.WithLabelValues(r.Domain, key),
		over:   m.over.WithLabelValues(r.Domain, key),
		near:   m.near.WithLabelValues(r.Domain, key),
		within: m.within.WithLabelValues(r.Domain, key),
		shadow: m.shadow.WithLabelValues(r.Domain, key),
	}
	if v, loaded := m.series.LoadOrStore(key, c); loaded {
		return v.(*ruleCounters)
	}
	m.nseries.Add(1)
	return c
}

// observe counts a decided check.
func (m *Metrics) observe(c *check) {
	if m == nil || c.rule == nil || c.replaced {
		return
	}
	rc := m.counters(c.rule, c.metric)
	hits := float64(c.hits)
	rc.hits.Add(hits)
	b := c.bucket
	if b == nil {
		return // unlimited
	}
	switch {
	case !b.d.Allowed:
		rc.over.Add(hits)
		if b.shadow {
			rc.shadow.Add(hits)
		}
	case b.charged:
		rc.within.Add(hits)
		capacity := b.limit.Capacity
		threshold := int64(math.Floor(float64(capacity) * m.ratio))
		if used := capacity - b.d.Remaining; used > threshold {
			rc.near.Add(float64(min(int64(c.hits), used-threshold)))
		}
	}
}
