package service

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	gostats "github.com/lyft/gostats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/exactlimit/ratelimit/internal/envoyrls"
)

// PeerStats are envoyproxy/ratelimit's statistics of the Envoy service,
// under its names, as its USE_STATSD and USE_PROMETHEUS settings send
// them: counters kept by github.com/lyft/gostats (the peer's own library)
// and flushed every FlushInterval, and the timer of each ShouldRateLimit
// call, sent as it is told, to a statsd server, or to a Prometheus listener
// of their own under the names and labels of the peer's statsd_exporter
// mapping. They count the same observation of each descriptor as the
// service's own series (envoyrls.Metrics.SetPeerStats and SetPeerTimer).
type PeerStats struct {
	// Statsd is the statsd server's host:port ("" none); StatsdProtocol is
	// "tcp" (the default, as the peer's) or "udp".
	Statsd, StatsdProtocol string
	// Prometheus is the address of the Prometheus listener ("" none), and
	// PrometheusPath its path (default /metrics).
	Prometheus, PrometheusPath string
	// ResponseTimeAsMilliseconds is the peer's
	// PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS: the Prometheus histogram of
	// response_time, ratelimit_service_response_time_seconds, observes
	// milliseconds instead of seconds (its name unchanged, as the peer's).
	ResponseTimeAsMilliseconds bool
	// FlushInterval is how often the counters are sent (default 10s, the
	// peer's).
	FlushInterval time.Duration
	// Tags are the peer's EXTRA_TAGS, added to every statsd name.
	Tags map[string]string
}

// DefaultPeerStatsFlush is PeerStats.FlushInterval's default, the peer's
// STATS_FLUSH_INTERVAL.
const DefaultPeerStatsFlush = 10 * time.Second

// peerStats is the running PeerStats: the gostats store and the listener of
// the Prometheus sink, if any.
type peerStats struct {
	store gostats.Store
	srv   *http.Server
	ln    net.Listener
	stop  context.CancelFunc
	done  chan struct{}
}

// startPeerStats builds the store of p and, with p.Prometheus, listens; it
// flushes nothing until run.
func startPeerStats(p *PeerStats, log *slog.Logger) (*peerStats, error) {
	if p.FlushInterval <= 0 {
		p.FlushInterval = DefaultPeerStatsFlush
	}
	ps := &peerStats{}
	var sink gostats.Sink
	switch {
	case p.Statsd != "":
		host, port, err := net.SplitHostPort(p.Statsd)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil {
			return nil, configErrorf("STATSD_HOST:STATSD_PORT %q: want host:port", p.Statsd)
		}
		proto := p.StatsdProtocol
		if proto == "" {
			proto = "tcp"
		}
		sink = gostats.NewTCPStatsdSink(gostats.WithStatsdHost(host), gostats.WithStatsdPort(n),
			gostats.WithStatsdProtocol(proto), gostats.WithLogger(statsdLogger{log}))
	case p.Prometheus != "":
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		sink = newPromSink(reg, p.ResponseTimeAsMilliseconds)
		path := p.PrometheusPath
		if path == "" {
			path = "/metrics"
		}
		ln, err := net.Listen("tcp", p.Prometheus)
		if err != nil {
			return nil, fmt.Errorf("PROMETHEUS_ADDR: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle(path, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		ps.ln, ps.srv = ln, newHTTPServer(mux, log, false, 30*time.Second)
	default:
		return nil, nil
	}
	ps.store = gostats.NewStore(sink, false)
	return ps, nil
}

// counter is envoyrls.PeerStats over the store: the first component of a
// name is its scope, which carries the tags.
func (ps *peerStats) counter(tags map[string]string) envoyrls.PeerStats {
	return func(name string) envoyrls.PeerCounter {
		scope, rest, _ := strings.Cut(name, ".")
		return ps.store.ScopeWithTags(scope, tags).NewCounter(rest)
	}
}

// timer is the peer's response_time over the store, in milliseconds as the
// peer's (a gostats milli timer), its scope carrying the tags.
func (ps *peerStats) timer(tags map[string]string) envoyrls.PeerTimer {
	scope, rest, _ := strings.Cut(envoyrls.PeerResponseTime, ".")
	return ps.store.ScopeWithTags(scope, tags).NewMilliTimer(rest)
}

// run flushes every interval, and serves the Prometheus listener, until
// close.
func (ps *peerStats) run(interval time.Duration, failed func(error)) {
	ctx, cancel := context.WithCancel(context.Background())
	ps.stop, ps.done = cancel, make(chan struct{})
	go func() {
		defer close(ps.done)
		ps.store.(interface {
			StartContext(context.Context, *time.Ticker)
		}).StartContext(ctx, time.NewTicker(interval))
	}()
	if ps.srv != nil {
		go func() { failed(ps.srv.Serve(ps.ln)) }()
	}
}

// finalFlushBound bounds the wait for close's flush: gostats retries a
// statsd server over TCP that cannot be reached every 3 s.
const finalFlushBound = time.Second

// close stops the flushes, sends what was counted since the last one
// (within finalFlushBound and until ctx is done: a statsd server that cannot
// be reached does not hold the shutdown) and closes the listener.
func (ps *peerStats) close(ctx context.Context) {
	if ps.stop != nil {
		ps.stop()
		<-ps.done
	}
	flushed := make(chan struct{})
	go func() { ps.store.Flush(); close(flushed) }()
	bound := time.NewTimer(finalFlushBound)
	defer bound.Stop()
	select {
	case <-flushed:
	case <-ctx.Done():
	case <-bound.C:
	}
	if ps.srv != nil {
		ps.srv.Shutdown(ctx) //nolint:errcheck // a scrape cut short
	} else if ps.ln != nil {
		ps.ln.Close()
	}
}

// abort closes the listener of a peerStats that never ran; nothing counted
// is sent.
func (ps *peerStats) abort() {
	if ps.ln != nil {
		ps.ln.Close() //nolint:errcheck // nothing served on it
	}
}

// statsdLogger sends gostats' complaints (a statsd server that cannot be
// reached) to the service's log, at debug level: the peer's default sends
// to localhost, where often nothing listens.
type statsdLogger struct{ log *slog.Logger }

func (l statsdLogger) Errorf(msg string, args ...any) {
	l.log.Debug("statsd: " + fmt.Sprintf(msg, args...))
}
func (l statsdLogger) Warnf(msg string, args ...any) {
	l.log.Debug("statsd: " + fmt.Sprintf(msg, args...))
}

// promSink is a Sink of gostats that counts what it is flushed under the names
// and labels the peer's Prometheus sink gives them (its default
// statsd_exporter mapping, src/stats/prom/default_mapper.yaml):
//
//	ratelimit.service.rate_limit.D.K1[.K2...].S  ratelimit_service_rate_limit_S{domain="D",key1="K1",key2="K2"}
//	    for S in total_hits, over_limit, near_limit, within_limit, shadow_mode (key2 "" for a key of one level)
//	ratelimit.service.call.should_rate_limit.E   ratelimit_service_should_rate_limit_error{err_type="E"}
//	ratelimit_server.<method>.total_requests     ratelimit_service_total_requests{grpc_method="<method>"}
//	ratelimit.service.config_load_success        ratelimit_service_config_load_success (and _error)
//	ratelimit_server.<method>.response_time      ratelimit_service_response_time_seconds{grpc_method="<method>"}
//	    a histogram of the milliseconds timed, scaled to seconds (unless asMillis);
//	    prometheus.DefBuckets, and the native buckets of statsd_exporter's defaults
//
// and any other name as statsd_exporter does without a mapping: every
// character other than a letter, digit or '_' as '_'.
type promSink struct {
	reg      *prometheus.Registry
	rule     map[string]*prometheus.CounterVec
	errs     *prometheus.CounterVec
	requests *prometheus.CounterVec
	respTime *prometheus.HistogramVec
	scale    float64             // of a response_time value: 0.001 (to seconds), or 1
	srlTime  prometheus.Observer // respTime of ShouldRateLimit, the one method timed
	mu       sync.Mutex
	other    map[string]prometheus.Counter // nil value: its name could not be registered
}

// peerRuleStats are the statistics of a rule the peer's mapping names.
var peerRuleStats = []string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"}

// newPromSink registers the peer's series in reg; asMillis is the peer's
// PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS, which drops the mapping's scale
// of response_time (0.001) and leaves its name.
func newPromSink(reg *prometheus.Registry, asMillis bool) *promSink {
	s := &promSink{reg: reg, rule: map[string]*prometheus.CounterVec{}, other: map[string]prometheus.Counter{}, scale: 0.001}
	for _, stat := range peerRuleStats {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_rate_limit_" + stat,
			Help: "envoyproxy/ratelimit's " + stat + " of a rule, by domain and the first two levels of its key."}, []string{"domain", "key1", "key2"})
		reg.MustRegister(v)
		s.rule[stat] = v
	}
	s.errs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_should_rate_limit_error",
		Help: "ShouldRateLimit calls that failed, by the peer's err_type (redis_error: the store; service_error: the request)."}, []string{"err_type"})
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_total_requests",
		Help: "Calls, by gRPC method."}, []string{"grpc_method"})
	help := "The duration of ShouldRateLimit calls, by gRPC method, in seconds (envoyproxy/ratelimit's response_time, timed in whole milliseconds)."
	if asMillis {
		s.scale = 1
		help = "The duration of ShouldRateLimit calls, by gRPC method, in milliseconds despite the name (PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS, as envoyproxy/ratelimit's)."
	}
	// The buckets of statsd_exporter's defaults, which the peer's mapping
	// keeps: prometheus.DefBuckets, and native buckets of factor 1.1, at
	// most 256.
	s.respTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ratelimit_service_response_time_seconds", Help: help,
		Buckets: prometheus.DefBuckets, NativeHistogramBucketFactor: 1.1, NativeHistogramMaxBucketNumber: 256}, []string{"grpc_method"})
	s.srlTime = s.respTime.WithLabelValues("ShouldRateLimit")
	reg.MustRegister(s.errs, s.requests, s.respTime)
	return s
}

var unmappedChars = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// FlushCounter adds value, the count since the last flush, to name's series.
func (s *promSink) FlushCounter(name string, value uint64) {
	v := float64(value)
	if rest, ok := strings.CutPrefix(name, "ratelimit.service.rate_limit."); ok {
		parts := strings.Split(rest, ".")
		if stat := parts[len(parts)-1]; len(parts) >= 3 && s.rule[stat] != nil {
			key2 := ""
			if len(parts) >= 4 {
				key2 = parts[2]
			}
			s.rule[stat].WithLabelValues(parts[0], parts[1], key2).Add(v)
			return
		}
	}
	if e, ok := strings.CutPrefix(name, "ratelimit.service.call.should_rate_limit."); ok && !strings.Contains(e, ".") {
		s.errs.WithLabelValues(e).Add(v)
		return
	}
	if m, ok := strings.CutPrefix(name, "ratelimit_server."); ok {
		if method, ok := strings.CutSuffix(m, ".total_requests"); ok && !strings.Contains(method, ".") {
			s.requests.WithLabelValues(method).Add(v)
			return
		}
	}
	s.mu.Lock()
	c, seen := s.other[name]
	if !seen {
		c = prometheus.NewCounter(prometheus.CounterOpts{Name: unmappedChars.ReplaceAllString(name, "_"), Help: "envoyproxy/ratelimit's " + name + "."})
		if s.reg.Register(c) != nil {
			c = nil // a name that clashes is dropped, as statsd_exporter drops it
		}
		s.other[name] = c
	}
	s.mu.Unlock()
	if c != nil {
		c.Add(v)
	}
}

// FlushTimer observes value, milliseconds, in name's histogram: of the
// peer's names only response_time is a timer. It is called for every timed
// call and allocates nothing for ShouldRateLimit's.
func (s *promSink) FlushTimer(name string, value float64) {
	m, ok := strings.CutPrefix(name, "ratelimit_server.")
	if !ok {
		return
	}
	method, ok := strings.CutSuffix(m, ".response_time")
	switch {
	case !ok || strings.Contains(method, "."):
	case method == "ShouldRateLimit":
		s.srlTime.Observe(value * s.scale)
	default:
		s.respTime.WithLabelValues(method).Observe(value * s.scale)
	}
}

// FlushGauge receives nothing: the service sends none of the peer's gauges.
func (s *promSink) FlushGauge(string, uint64) {}
