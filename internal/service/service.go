// Package service is the ratelimit decision service as one component: the
// daemon that 'ratelimit serve' runs. Start builds it from one Config: one
// store (Redis behind one fallback breaker, or the embedded store) that the
// HTTP API (package server) and Envoy's rate limit service (package
// envoyrls) share, and whose decisions, Envoy's included, one set of
// metrics and the operator page count; the HTTP listener, the admin
// listener of the reverse proxy and the gRPC listener; the probe of Redis;
// and one reload path, Reload (and the watchers of the files), for every
// file the service reads. Tests start it in process and ask it for its
// addresses.
//
// Envoy's service has a breaker of its own only when Envoy.Outage differs
// from Config.Outage: package fallback applies one outage behaviour per
// breaker.
package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/operator"
	"github.com/exactlimit/ratelimit/internal/server"
)

// Service is a running decision service. Its methods are safe for
// simultaneous use by multiple goroutines.
type Service struct {
	cfg     Config
	api     *server.Service
	store   *store
	envoy   *envoy // nil without Config.Envoy
	servers []*http.Server
	lns     []net.Listener
	addrs   Addrs
	reload  []reloader
	errc    chan error

	bg     context.CancelFunc // stops the probe and the watchers
	bgDone sync.WaitGroup
	serve  sync.WaitGroup // the listeners' Serve calls
	once   sync.Once
	err    error
}

// Addrs are the addresses a Service listens on.
type Addrs struct {
	// HTTP is Config.Listen's: the API, or the proxy.
	HTTP net.Addr
	// Admin is the API's with Config.Proxy (Config.AdminListen), else
	// nil.
	Admin net.Addr
	// GRPC is Envoy's rate limit service's, nil without Config.Envoy.
	GRPC net.Addr
	// Debug is the debug listener's, nil without Config.Debug.
	Debug net.Addr
	// Prometheus is the listener of the peer's statistics in Prometheus
	// form (Envoy.Stats.Prometheus), else nil.
	Prometheus net.Addr
}

// API returns the address of the HTTP API: Admin with a proxy, else HTTP.
func (a Addrs) API() net.Addr {
	if a.Admin != nil {
		return a.Admin
	}
	return a.HTTP
}

// Start builds the service of c and serves it until Close. It checks that
// Redis accepts the service's credentials (an unreachable Redis is not an
// error: the outage behaviour serves), loads every file c names, listens,
// probes Redis once, and logs "serving" with the addresses. The error of a
// Config that cannot be served anywhere is a *ConfigError; a file that
// does not load or an address that cannot be listened on is another.
func Start(ctx context.Context, c Config) (_ *Service, err error) {
	c.defaults()
	log := c.Logger
	s := &Service{cfg: c, errc: make(chan error, 3)}
	defer func() {
		if err != nil {
			s.release()
		}
	}()
	policies := config.Default()
	if c.ConfigFile != "" {
		if policies, err = config.Load(c.ConfigFile); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	token := c.Token
	if c.TokenFile != "" {
		if token, err = ReadTokenFile("--token-file", c.TokenFile); err != nil {
			return nil, err
		}
	}
	var metricsToken string
	if c.MetricsTokenFile != "" {
		if metricsToken, err = ReadTokenFile("--metrics-token-file", c.MetricsTokenFile); err != nil {
			return nil, err
		}
	}

	metrics := server.NewMetrics()
	stats := operator.NewStats(operator.StatsOptions{TopDenied: c.TopDenied})
	s.store, err = openStore(&s.cfg, fallback.ObserverFunc(func(ctx context.Context, e fallback.Event) {
		metrics.Observer().ObserveFallback(ctx, e)
		stats.ObserveFallback(ctx, e)
		logOutages(log)(ctx, e)
	}))
	if err != nil {
		return nil, err
	}
	if err := s.store.checkCredentials(ctx, c.Timeout); err != nil {
		return nil, err
	}
	if c.Envoy != nil {
		// Envoy's decisions are told to the API's metrics and operator
		// page, once each, under the namespace "envoy:" and their domain.
		obs := ratelimit.ObserverFuncs{
			Decision: func(ctx context.Context, e ratelimit.DecisionEvent) {
				metrics.Observer().ObserveDecision(ctx, e)
				stats.ObserveDecision(ctx, e)
			},
			Error: func(ctx context.Context, e ratelimit.ErrorEvent) {
				metrics.Observer().ObserveError(ctx, e)
				stats.ObserveError(ctx, e)
			},
		}
		if s.envoy, err = startEnvoy(&s.cfg, s.store, metrics, obs); err != nil {
			return nil, err
		}
		s.addrs.GRPC = s.envoy.ln.Addr()
		if p := s.envoy.peer; p != nil && p.ln != nil {
			s.addrs.Prometheus = p.ln.Addr()
		}
	}
	o := server.Options{
		Store: s.store.store, StoreName: s.store.name, Policies: policies, Token: token, MetricsToken: metricsToken,
		Timeout: c.Timeout, Outage: c.Outage, Metrics: metrics, Logger: log, Version: c.Version,
		Stats: stats, StoreKind: s.store.kind(), Masters: s.store.masters(), PlanRefresh: c.PlanRefresh,
	}
	if s.store.fb != nil {
		o.Degraded = s.store.degraded
		rc := s.store.redis
		o.Ping = func(ctx context.Context) error { return rc.Ping(ctx).Err() }
	}
	if s.envoy != nil {
		o.Envoy = s.envoy.domains
	}
	if s.api, err = server.New(o); err != nil {
		return nil, err
	}
	if err := s.listen(token); err != nil {
		return nil, err
	}
	s.reload = s.reloaders()
	s.background()
	for i, srv := range s.servers {
		s.serve.Go(func() { s.failed(srv.Serve(s.lns[i])) })
	}
	if s.envoy != nil {
		s.serve.Go(func() { s.failed(s.envoy.serve()) })
	}
	attrs := []any{"addr", s.addrs.HTTP.String(), "store", s.store.name, "policies", s.api.Policies().String()}
	if c.Proxy != nil {
		attrs = append(attrs, "upstream", c.Proxy.Upstream.Redacted(), "admin", s.addrs.Admin.String())
	}
	if s.store.redis != nil {
		attrs = append(attrs, "outage", c.Outage.String())
	}
	if token != "" {
		attrs = append(attrs, "auth", "bearer token")
	}
	log.Info("serving", attrs...)
	return s, nil
}

// listen builds the handlers and opens the HTTP listeners; token is the
// API's at start, for the warning of an API open to all.
func (s *Service) listen(token string) error {
	c := &s.cfg
	main, admin := s.api.Handler(), http.Handler(nil)
	if p := c.Proxy; p != nil {
		var opts []httplimit.Option
		if p.Key != nil {
			opts = append(opts, httplimit.WithKey(p.Key))
		}
		if p.JSON {
			opts = append(opts, httplimit.WithJSON())
		}
		proxy, err := s.api.Proxy(server.ProxyOptions{Upstream: p.Upstream, Namespace: p.Namespace, Middleware: opts, Trusted: p.Trusted})
		if err != nil {
			return configErrorf("--upstream: %v", err)
		}
		main, admin = proxy, main
	}
	if s.envoy != nil { // the peer's /json and /healthcheck, beside the API
		if admin != nil {
			admin = s.envoy.mount(admin, s.api.Guard)
		} else {
			main = s.envoy.mount(main, s.api.Guard)
		}
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	s.lns = append(s.lns, limitConns(ln, c.MaxConns))
	s.servers = append(s.servers, newHTTPServer(main, c.Logger, c.Proxy != nil, c.ReadTimeout))
	s.addrs.HTTP = ln.Addr()
	if admin != nil {
		aln, err := net.Listen("tcp", c.AdminListen)
		if err != nil {
			return fmt.Errorf("--admin-listen: %w", err)
		}
		s.lns = append(s.lns, limitConns(aln, c.MaxConns))
		s.servers = append(s.servers, newHTTPServer(admin, c.Logger, false, c.ReadTimeout))
		s.addrs.Admin = aln.Addr()
	}
	if c.Debug != "" {
		dln, err := net.Listen("tcp", c.Debug)
		if err != nil {
			return fmt.Errorf("--debug-listen: %w", err)
		}
		s.lns = append(s.lns, limitConns(dln, c.MaxConns))
		s.servers = append(s.servers, newHTTPServer(s.debugHandler(), c.Logger, false, c.ReadTimeout))
		s.addrs.Debug = dln.Addr()
		if beyondLoopback(dln.Addr()) {
			c.Logger.Warn("the debug listener (/rlconfig, /stats, /debug/pprof/) listens beyond loopback, without a token, as the peer's does", "addr", dln.Addr().String())
		}
	}
	if err := s.api.AllowHosts(s.addrs.API(), c.AllowedHosts); err != nil {
		return configErrorf("--allowed-host: %v", err)
	}
	var trusted []netip.Prefix
	if c.Proxy != nil {
		trusted = c.Proxy.Trusted.Prefixes
	}
	warnExposure(c.Logger, s.addrs.API(), token, trusted)
	return nil
}

// background starts the probe of Redis (one probe first, so that a Redis
// down at start is marked down, and logged, before a check waits for it;
// then one every fallback.DefaultProbeInterval, through the graceful
// shutdown; on Cluster the masters are known from the first checks on) and
// the watchers of the files.
func (s *Service) background() {
	ctx, cancel := context.WithCancel(context.Background())
	s.bg = cancel
	probe := func(fb *fallback.Store) {
		pctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
		fb.Probe(pctx)
		cancel()
		s.bgDone.Go(func() { fb.ProbeForever(ctx, 0, nil) })
	}
	if s.store.fb != nil {
		probe(s.store.fb)
	}
	if s.envoy != nil && s.envoy.fb != nil {
		probe(s.envoy.fb)
	}
	if s.envoy != nil && s.envoy.peer != nil {
		s.envoy.peer.run(s.cfg.Envoy.Stats.FlushInterval, s.failed)
	}
	s.watch(ctx)
}

// failed reports a listener's failure on Err.
func (s *Service) failed(err error) {
	if err == nil || errors.Is(err, http.ErrServerClosed) {
		return
	}
	select {
	case s.errc <- err:
	default:
	}
}

// Addrs returns the addresses the service listens on.
func (s *Service) Addrs() Addrs { return s.addrs }

// API returns the HTTP API, for its policies and figures.
func (s *Service) API() *server.Service { return s.api }

// Err returns a channel that receives the error of a listener that stopped
// serving before Close: the service no longer serves all it should.
func (s *Service) Err() <-chan error { return s.errc }

// Close shuts the service down gracefully: /readyz answers 503 and Envoy's
// health checks NOT_SERVING, the listeners close, and the requests and
// calls in flight finish, until ctx is done; then the connections left are
// closed at once. It stops the probe and the watchers and closes the Redis
// client, and the watchers of the namespaces of plans. The error reports
// what did not finish in time. Only the first
// call does anything; later ones return its error.
func (s *Service) Close(ctx context.Context) error {
	s.once.Do(func() {
		s.api.Drain()
		if s.envoy != nil {
			s.envoy.draining()
		}
		var wg sync.WaitGroup
		errs := make([]error, len(s.servers))
		for i, srv := range s.servers {
			wg.Go(func() {
				if err := srv.Shutdown(ctx); err != nil {
					errs[i] = err
					srv.Close() //nolint:errcheck // closing what is left
				}
			})
		}
		if s.envoy != nil {
			wg.Go(func() { s.envoy.stop(ctx.Done()) })
		}
		wg.Wait()
		if s.envoy != nil && s.envoy.peer != nil {
			s.envoy.peer.close(ctx) // the counts of the last calls sent
		}
		s.serve.Wait()
		s.release()
		s.err = errors.Join(errs...)
	})
	return s.err
}

// release stops the background work and closes what Start opened.
func (s *Service) release() {
	if s.bg != nil {
		s.bg()
		s.bgDone.Wait()
	}
	if s.api != nil {
		s.api.Close() // the watchers of the assignments, before their store
	}
	for _, ln := range s.lns {
		ln.Close() //nolint:errcheck // closed already when served
	}
	if s.envoy != nil {
		s.envoy.srv.Stop()
		s.envoy.ln.Close() //nolint:errcheck // closed already when served
		if s.envoy.peer != nil && s.envoy.peer.stop == nil {
			s.envoy.peer.abort() // Start failed before run
		}
	}
	if s.store != nil {
		s.store.close()
	}
}
