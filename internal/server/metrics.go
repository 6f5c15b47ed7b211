package server

import (
	"log/slog"
	"net/http"
	"runtime"

	"github.com/exactlimit/ratelimit/promobserver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the service's Prometheus series, in a registry of its own:
// those of package promobserver, fed by the Limiter of every namespace and,
// when the store is package fallback's, by the store's changes of state
// (ratelimit_decisions_total, ratelimit_tokens_total,
// ratelimit_decision_duration_seconds, ratelimit_errors_total,
// ratelimit_primary_up, ratelimit_primary_transitions_total), and the
// service's own:
//
//	ratelimit_fallback_active                1 while the store serves without its primary
//	ratelimit_outage_behaviour{behaviour}    1 for the configured behaviour
//	ratelimit_namespaces                     namespaces in force
//	ratelimit_config_reloads_total{result}   SIGHUP reloads, "ok" or "error"
//	ratelimit_http_requests_total{path,code} API responses
//	ratelimit_proxy_requests_total{code}     responses of the reverse proxy, by status code
//	ratelimit_upstream_errors_total          proxied requests answered 502: the upstream failed
//	ratelimit_plan_assignments_total{namespace,plan}  assignments accepted by POST /v1/assign (plan "": removed)
//	ratelimit_build_info{version,goversion}  1
//
// and the Go runtime's (go_*) and the process's (process_*) collectors. The
// outage behaviour is reported only for a store that has one.
type Metrics struct {
	registry    *prometheus.Registry
	observer    *promobserver.Observer
	namespaces  prometheus.Gauge
	reloads     *prometheus.CounterVec
	requests    *prometheus.CounterVec
	proxied     *prometheus.CounterVec
	upstream    prometheus.Counter
	assignments *prometheus.CounterVec
	bound       bool
}

// NewMetrics returns the service's metrics, all at zero.
func NewMetrics() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		observer: promobserver.New(),
		namespaces: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_namespaces",
			Help: "Namespaces in force.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_config_reloads_total",
			Help: "Config reloads on SIGHUP, by result (ok, error).",
		}, []string{"result"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_http_requests_total",
			Help: "API responses, by path and status code.",
		}, []string{"path", "code"}),
	}
	m.proxied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_proxy_requests_total",
		Help: "Responses of the reverse proxy (--upstream), by status code: the upstream's, or the limiter's own (429, 400, 503), or 502.",
	}, []string{"code"})
	m.upstream = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_upstream_errors_total",
		Help: "Proxied requests answered 502 because the upstream could not be reached or failed.",
	})
	m.assignments = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_plan_assignments_total",
		Help: "Assignments of a subject's plan accepted by POST /v1/assign, by namespace and plan assigned (\"\": the assignment removed).",
	}, []string{"namespace", "plan"})
	m.registry.MustRegister(m.observer, m.namespaces, m.reloads, m.requests, m.proxied, m.upstream, m.assignments,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Observer returns the observer the Service attaches to every namespace's
// Limiter. Give it to the store too when the store is package fallback's
// (fallback.WithObserver), so that ratelimit_primary_up and
// ratelimit_primary_transitions_total follow the primary's outages.
func (m *Metrics) Observer() *promobserver.Observer { return m.observer }

// bindService registers the series that read the Service's state. A
// Metrics serves one Service: a second one is not bound.
func (m *Metrics) bindService(s *Service) {
	if m.bound {
		return
	}
	m.bound = true
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_fallback_active",
		Help: "1 while the store is serving without its primary (the outage behaviour decides), else 0.",
	}, func() float64 {
		if s.degraded() {
			return 1
		}
		return 0
	}))
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "ratelimit_build_info",
		Help:        "1, labelled by the build's version and Go version.",
		ConstLabels: prometheus.Labels{"version": s.version, "goversion": runtime.Version()},
	}, func() float64 { return 1 }))
	if !s.hasOutage {
		return
	}
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "ratelimit_outage_behaviour",
		Help:        "The behaviour applied while the primary store is unreachable: 1 for the configured one.",
		ConstLabels: prometheus.Labels{"behaviour": s.outage.String()},
	}, func() float64 { return 1 }))
}

// handler returns the /metrics handler of the registry, logging the series
// it cannot gather to log.
func (m *Metrics) handler(log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelError),
		ErrorHandling: promhttp.ContinueOnError,
	})
}
