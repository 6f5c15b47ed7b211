package service

import (
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/envoyrls"
	"github.com/exactlimit/ratelimit/internal/operator"
	"github.com/exactlimit/ratelimit/internal/server"
)

// envoy is the running Envoy rate limit service: its gRPC listener, and the
// HTTP endpoints mounted beside the API.
type envoy struct {
	svc    *envoyrls.Service
	ln     net.Listener
	srv    *grpc.Server
	health *health.Server
	fb     *fallback.Store // its own outage behaviour's breaker, or nil (see store.envoyStore)
	http   []*envoyrls.HTTP
	stats  *prometheus.Registry // its series alone, for the debug listener's /stats
	peer   *peerStats           // the peer's statistics, nil without Envoy.Stats
}

// startEnvoy builds the Envoy service of c over st, with its series in
// metrics and its decisions told to obs, and listens on c.Listen. It serves
// nothing yet: see serve.
func startEnvoy(c *Config, st *store, metrics *server.Metrics, obs ratelimit.Observer) (*envoy, error) {
	ec, log := c.Envoy, c.Logger
	cfg, err := ec.Load.Load(ec.ConfigPath)
	if err != nil {
		return nil, fmt.Errorf("--envoy-config: %w", err)
	}
	em := envoyrls.NewMetrics(ec.NearLimitRatio)
	if err := metrics.Register(em.Collectors()...); err != nil {
		return nil, err
	}
	stats := prometheus.NewRegistry()
	for _, c := range em.Collectors() {
		if err := stats.Register(c); err != nil {
			return nil, err
		}
	}
	var peer *peerStats
	if ec.Stats != nil {
		if peer, err = startPeerStats(ec.Stats, log); err != nil {
			return nil, err
		}
		em.SetPeerStats(peer.counter(ec.Stats.Tags))
		em.SetPeerTimer(peer.timer(ec.Stats.Tags), nil)
	}
	fb, rs, err := st.envoyStore(ec.Outage, c.Timeout, log.With("service", "envoy"))
	if err != nil {
		return nil, err
	}
	closePeer := func() {
		if peer != nil {
			peer.abort()
		}
	}
	svc, err := envoyrls.New(envoyrls.Options{
		Store: rs, Config: cfg, Timeout: c.Timeout, Headers: ec.Headers, Metrics: em, Logger: log,
		ShadowMode: ec.ShadowMode, DynamicMetadata: ec.DynamicMetadata, Load: ec.Load,
		KeyPrefix: ec.KeyPrefix, Observer: obs,
	})
	if err != nil {
		closePeer()
		return nil, err
	}
	ln, err := net.Listen("tcp", ec.Listen)
	if err != nil {
		closePeer()
		return nil, fmt.Errorf("--grpc-listen: %w", err)
	}
	srv, err := newGRPCServer(ln.Addr(), grpcServerConfig{tls: ec.TLS, callTimeout: c.Timeout, readTimeout: c.ReadTimeout}, log)
	if err != nil {
		ln.Close()
		closePeer()
		return nil, err
	}
	svc.Register(srv)
	hs := health.NewServer()
	// The peer's service name, as Envoy's and Kubernetes' gRPC health
	// checks ask for it; "" (the whole server) is SERVING too.
	hs.SetServingStatus("ratelimit", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	attrs := []any{"grpc", ln.Addr().String(), "envoy_config", ec.ConfigPath, "config", cfg.String(), "response_headers", ec.Headers.Enabled}
	if st.redis != nil {
		attrs = append(attrs, "envoy_outage", ec.Outage.String())
	}
	if ec.ShadowMode {
		attrs = append(attrs, "shadow_mode", true)
	}
	if ec.KeyPrefix != "" {
		attrs = append(attrs, "key_prefix", ec.KeyPrefix)
	}
	if p := ec.Stats; p != nil && p.Statsd != "" {
		attrs = append(attrs, "statsd", p.StatsdProtocol+"://"+p.Statsd, "stats_flush", p.FlushInterval.String())
	}
	if peer != nil && peer.ln != nil {
		attrs = append(attrs, "prometheus", peer.ln.Addr().String()+ec.Stats.PrometheusPath)
	}
	log.Info("serving envoy rate limit service", attrs...)
	return &envoy{svc: svc, ln: limitConns(ln, c.MaxConns), srv: srv, health: hs, fb: fb, stats: stats, peer: peer}, nil
}

// serve serves gRPC until stop; it logs a failure to log.
func (e *envoy) serve() error {
	if err := e.srv.Serve(e.ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("grpc serve: %w", err)
	}
	return nil
}

// mount puts the peer's HTTP endpoints, POST /json and GET /healthcheck, in
// front of next, with POST /json behind guard: the API's own checks
// (server.Service.Guard). Call it before serving.
func (e *envoy) mount(next http.Handler, guard func(string, http.Handler) http.Handler) http.Handler {
	h := envoyrls.NewHTTP(e.svc, next, guard)
	e.http = append(e.http, h)
	return h
}

// draining answers health checks NOT_SERVING and /healthcheck 500, so that
// Envoy stops sending calls before the listener closes.
func (e *envoy) draining() {
	e.health.Shutdown()
	for _, h := range e.http {
		h.Shutdown()
	}
}

// stop stops the gRPC server gracefully, and at once when done is closed
// first.
func (e *envoy) stop(done <-chan struct{}) {
	stopped := make(chan struct{})
	go func() { e.srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-done:
		e.srv.Stop()
		<-stopped
	}
}

// domains lists the domains of the configuration in force with their
// rules, for the operator page.
func (e *envoy) domains() []operator.EnvoyDomain {
	cfg := e.svc.Config()
	var out []operator.EnvoyDomain
	for _, d := range cfg.Domains() {
		out = append(out, operator.EnvoyDomain{Name: envoyrls.ObservedNamespace(d), Domain: d, Rules: cfg.RulesOf(d)})
	}
	return out
}
