package server

import (
	"context"
	"errors"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/metrics"
)

const metricsContentType = metrics.ContentType

// LatencyBuckets are the upper bounds, in seconds, of the check latency
// histogram: 50 µs to 2.5 s.
var LatencyBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// Metrics are the service's series, written by hand in the Prometheus text
// format:
//
//	ratelimit_decisions_total{namespace,op,decision,source}  checks decided
//	ratelimit_check_errors_total{op}                         checks not decided (store errors the outage behaviour returned)
//	ratelimit_store_errors_total{op}                         errors of the primary store itself, before any outage behaviour
//	ratelimit_check_duration_seconds{op}                     latency histogram of a check, outage behaviour included
//	ratelimit_fallback_active                                1 while the store serves without its primary
//	ratelimit_outage_behaviour{behaviour}                    1 for the configured behaviour
//	ratelimit_namespaces                                     namespaces in force
//	ratelimit_config_reloads_total{result}                   SIGHUP reloads, "ok" or "error"
//	ratelimit_http_requests_total{path,code}                 API responses
type Metrics struct {
	metrics.Registry
	decisions   *metrics.Counter
	checkErrors *metrics.Counter
	storeErrors *metrics.Counter
	latency     *metrics.Histogram
	namespaces  *metrics.Gauge
	reloads     *metrics.Counter
	requests    *metrics.Counter
	bound       bool
}

// NewMetrics returns the service's metrics, all at zero.
func NewMetrics() *Metrics {
	m := &Metrics{}
	m.decisions = m.NewCounter("ratelimit_decisions_total", "Checks decided, by namespace, operation (acquire, peek), decision (allowed, denied) and source (store, local, fail-open, fail-closed, cache).", "namespace", "op", "decision", "source")
	m.checkErrors = m.NewCounter("ratelimit_check_errors_total", "Checks that could not be decided, by operation.", "op")
	m.storeErrors = m.NewCounter("ratelimit_store_errors_total", "Errors returned by the primary store (Redis) itself, before any outage behaviour, by operation (apply, reset).", "op")
	m.latency = m.NewHistogram("ratelimit_check_duration_seconds", "Latency of a check as the service sees it, outage behaviour included, by operation.", LatencyBuckets, "op")
	m.namespaces = m.NewGauge("ratelimit_namespaces", "Namespaces in force.")
	m.reloads = m.NewCounter("ratelimit_config_reloads_total", "Config reloads on SIGHUP, by result (ok, error).", "result")
	m.requests = m.NewCounter("ratelimit_http_requests_total", "API responses, by path and status code.", "path", "code")
	return m
}

// Decisions returns the count of ratelimit_decisions_total for the labels.
func (m *Metrics) Decisions(namespace, op, decision, source string) uint64 {
	return m.decisions.Value(namespace, op, decision, source)
}

// StoreErrors returns the count of ratelimit_store_errors_total for op.
func (m *Metrics) StoreErrors(op string) uint64 { return m.storeErrors.Value(op) }

func (m *Metrics) bindService(s *Service) {
	if m.bound {
		return
	}
	m.bound = true
	m.NewGaugeFunc("ratelimit_fallback_active", "1 while the store is serving without its primary (the outage behaviour decides), else 0.", func() float64 {
		if s.degraded() {
			return 1
		}
		return 0
	})
	g := m.NewGauge("ratelimit_outage_behaviour", "The behaviour applied while the primary store is unreachable: 1 for the configured one.", "behaviour")
	g.Set(1, s.outage.String())
}

// Instrument returns st counting its errors in ratelimit_store_errors_total.
// Invalid arguments and cancelled contexts are not counted: they are the
// caller's.
func (m *Metrics) Instrument(st ratelimit.Store) ratelimit.Store { return &instrumented{st, m} }

type instrumented struct {
	ratelimit.Store
	m *Metrics
}

func (s *instrumented) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	d, err := s.Store.Apply(ctx, key, r)
	s.count(ctx, "apply", err)
	return d, err
}

func (s *instrumented) Reset(ctx context.Context, key string) error {
	err := s.Store.Reset(ctx, key)
	s.count(ctx, "reset", err)
	return err
}

func (s *instrumented) count(ctx context.Context, op string, err error) {
	if err == nil || errors.Is(err, ratelimit.ErrInvalidArgument) || errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	s.m.storeErrors.Inc(op)
}
