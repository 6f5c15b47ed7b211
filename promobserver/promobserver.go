// Package promobserver exports what a ratelimit.Limiter does as Prometheus
// metrics: it is a ratelimit.Observer (attach it with ratelimit.WithObserver)
// and a prometheus.Collector (register it with a prometheus.Registerer).
//
//	obs := promobserver.New()
//	prometheus.MustRegister(obs)
//	limiter, err := ratelimit.New[string](store, ratelimit.PerSecond(100),
//		ratelimit.WithNamespace("api"), ratelimit.WithObserver(obs))
//
// One Observer may serve every Limiter of a process: series are labelled by
// the limiter's namespace, never by subject. The series, all named
// ratelimit_*:
//
//	ratelimit_decisions_total{namespace, op, result, source}
//	    checks decided; op is "acquire" or "peek", result "allowed" or
//	    "denied", source "store", "local", "fail-open", "fail-closed",
//	    "cache" or "lease" (ratelimit.Source)
//	ratelimit_tokens_total{namespace, result}
//	    tokens asked for by the acquires decided (peeks take none)
//	ratelimit_decision_duration_seconds{namespace, source}
//	    time from the call to the decision (histogram)
//	ratelimit_errors_total{namespace, op, reason}
//	    checks and resets that returned an error; reason is
//	    "invalid_argument", "corrupt_state", "canceled", "deadline" or "store"
//	ratelimit_primary_up{partition}
//	    1 while a fallback store sends checks to its primary, 0 while it is
//	    marked down (partition "" is the whole primary)
//	ratelimit_primary_transitions_total{partition, state}
//	    changes of that state; state is "up" or "down"
//
// The last two are fed by a fallback store given the Observer with
// fallback.WithObserver. NewDenyCacheCollector exports a limiter's
// denial cache (size, capacity, hits, misses, evictions).
//
// An Observer is safe for simultaneous use by multiple goroutines. Recording
// a decision costs a map lookup and two atomic additions, and allocates
// nothing once its namespace has been seen.
package promobserver

import (
	"context"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/obslabel"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultBuckets are the upper bounds, in seconds, of the decision duration
// histogram: from 25 µs (a denial cache hit, memstore) through a Redis round
// trip to 1 s.
var DefaultBuckets = []float64{.000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

// Observer records a Limiter's events as Prometheus metrics. Create it with
// New; the zero Observer is not usable.
type Observer struct {
	decisions   *prometheus.CounterVec
	tokens      *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	errors      *prometheus.CounterVec
	up          *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	converted   *prometheus.CounterVec

	series obslabel.Cache[prometheus.Counter, prometheus.Observer] // each namespace's, resolved once
}

// Option configures an Observer.
type Option func(*config)

type config struct{ buckets []float64 }

// WithBuckets sets the upper bounds, in seconds, of the decision duration
// histogram (default DefaultBuckets).
func WithBuckets(buckets []float64) Option {
	return func(c *config) { c.buckets = append([]float64(nil), buckets...) }
}

// New returns an Observer with no series yet; register it to export them.
func New(opts ...Option) *Observer {
	c := config{buckets: DefaultBuckets}
	for _, opt := range opts {
		opt(&c)
	}
	o := &Observer{
		decisions: counter("ratelimit_decisions_total",
			"Rate limit checks decided, by namespace, operation, result and what decided them.",
			"namespace", "op", "result", "source"),
		tokens: counter("ratelimit_tokens_total",
			"Tokens asked for by the acquires decided, by namespace and result.",
			"namespace", "result"),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_decision_duration_seconds",
			Help:    "Time from a check's call to its decision, by namespace and what decided it.",
			Buckets: c.buckets,
		}, []string{"namespace", "source"}),
		errors: counter("ratelimit_errors_total",
			"Rate limit checks and resets that returned an error, by namespace, operation and reason.",
			"namespace", "op", "reason"),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_primary_up",
			Help: "1 while a fallback store sends checks to its primary store, 0 while the primary is marked down.",
		}, []string{"partition"}),
		transitions: counter("ratelimit_primary_transitions_total",
			"Changes of a fallback store's primary between up and down, by partition and new state.",
			"partition", "state"),
		converted: counter("ratelimit_policy_conversions_total",
			"Checks that met a bucket another policy wrote and converted it, by namespace: a rolling deploy makes one per bucket; a steady rate means two limiters with different policies share the namespace.",
			"namespace"),
	}
	o.series.B = obslabel.Builders[prometheus.Counter, prometheus.Observer]{
		Decision: func(ns, op, result, source string) prometheus.Counter {
			return o.decisions.WithLabelValues(ns, op, result, source)
		},
		Tokens:   func(ns, result string) prometheus.Counter { return o.tokens.WithLabelValues(ns, result) },
		Duration: func(ns, source string) prometheus.Observer { return o.duration.WithLabelValues(ns, source) },
	}
	return o
}

// counter returns a counter vector of the given name, help and labels.
func counter(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// vecs returns the Observer's metric vectors, in the order they are
// described and collected.
func (o *Observer) vecs() []prometheus.Collector {
	return []prometheus.Collector{o.decisions, o.tokens, o.duration, o.errors, o.up, o.transitions, o.converted}
}

// Describe sends the descriptors of every series the Observer exports.
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range o.vecs() {
		v.Describe(ch)
	}
}

// Collect sends the current value of every series.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	for _, v := range o.vecs() {
		v.Collect(ch)
	}
}

// ObserveDecision counts a decision, its tokens and its duration.
func (o *Observer) ObserveDecision(_ context.Context, e ratelimit.DecisionEvent) {
	decision, tokens, acquired, duration := o.series.Observe(e)
	decision.Inc()
	duration.Observe(e.Latency.Seconds())
	if acquired {
		tokens.Add(float64(e.Cost))
	}
	if e.Decision.Converted {
		o.converted.WithLabelValues(e.Namespace).Inc()
	}
}

// ObserveError counts an error by its reason.
func (o *Observer) ObserveError(_ context.Context, e ratelimit.ErrorEvent) {
	o.errors.WithLabelValues(e.Namespace, e.Op, Reason(e.Err)).Inc()
}

// ObserveFallback records a fallback store's change of state.
func (o *Observer) ObserveFallback(_ context.Context, e fallback.Event) {
	up, state := 0.0, "down"
	if e.Alive {
		up, state = 1, "up"
	}
	o.up.WithLabelValues(e.Partition).Set(up)
	o.transitions.WithLabelValues(e.Partition, state).Inc()
}

// Reason returns the reason label of ratelimit_errors_total for err:
// "invalid_argument", "corrupt_state", "canceled", "deadline" or "store".
func Reason(err error) string { return obslabel.Reason(err) }

// NewDenyCacheCollector returns a Collector of the denial cache that stats
// reports on (pass a limiter's DenyCacheStats method), labelled with
// namespace:
//
//	ratelimit_deny_cache_entries{namespace}          subjects held
//	ratelimit_deny_cache_capacity{namespace}         most subjects held
//	ratelimit_deny_cache_hits_total{namespace}       checks denied by the cache
//	ratelimit_deny_cache_misses_total{namespace}     checks passed to the store
//	ratelimit_deny_cache_evictions_total{namespace}  denials pushed out early
//
// The hit rate is rate(hits) / (rate(hits) + rate(misses)).
func NewDenyCacheCollector(namespace string, stats func() ratelimit.CacheStats) prometheus.Collector {
	series := func(name, help string, kind prometheus.ValueType, value func(ratelimit.CacheStats) float64) cacheSeries {
		desc := prometheus.NewDesc(name, help, nil, prometheus.Labels{"namespace": namespace})
		return cacheSeries{desc, kind, value}
	}
	return &cacheCollector{stats: stats, series: []cacheSeries{
		series("ratelimit_deny_cache_entries", "Subjects a limiter's denial cache holds a denial for.",
			prometheus.GaugeValue, func(s ratelimit.CacheStats) float64 { return float64(s.Size) }),
		series("ratelimit_deny_cache_capacity", "Most subjects a limiter's denial cache holds.",
			prometheus.GaugeValue, func(s ratelimit.CacheStats) float64 { return float64(s.Capacity) }),
		series("ratelimit_deny_cache_hits_total", "Checks a limiter's denial cache denied without asking the store.",
			prometheus.CounterValue, func(s ratelimit.CacheStats) float64 { return float64(s.Hits) }),
		series("ratelimit_deny_cache_misses_total", "Checks a limiter's denial cache passed to the store.",
			prometheus.CounterValue, func(s ratelimit.CacheStats) float64 { return float64(s.Misses) }),
		series("ratelimit_deny_cache_evictions_total", "Denials a limiter's denial cache dropped early to make room.",
			prometheus.CounterValue, func(s ratelimit.CacheStats) float64 { return float64(s.Evictions) }),
	}}
}

// cacheSeries is one series of the denial cache collector: its descriptor,
// its kind and how to read its value from the cache's stats.
type cacheSeries struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(ratelimit.CacheStats) float64
}

type cacheCollector struct {
	stats  func() ratelimit.CacheStats
	series []cacheSeries
}

func (c *cacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, s := range c.series {
		ch <- s.desc
	}
}

func (c *cacheCollector) Collect(ch chan<- prometheus.Metric) {
	stats := c.stats()
	for _, s := range c.series {
		ch <- prometheus.MustNewConstMetric(s.desc, s.kind, s.value(stats))
	}
}
