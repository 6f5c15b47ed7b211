package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/server"
)

const serveAbout = `
Serve runs the HTTP decision service. With no flags it keeps the buckets in
this process and listens on 127.0.0.1:8080, with one namespace, "default":
10 requests per second per subject, bursting to 10.

  POST /v1/acquire  {"namespace": "default", "subject": "alice", "cost": 1}
                    200 with the decision when allowed, 429 when denied
  POST /v1/peek     the same decision without taking anything (always 200)
  POST /v1/reset    delete the subject's bucket
  GET  /v1/config   the namespaces and limits in force
  GET  /healthz     liveness, the store and whether it is in an outage
  GET  /readyz      readiness: 503 while the store is unreachable and the
                    outage behaviour refuses checks, and while shutting down
  GET  /metrics     Prometheus text format, series ratelimit_*, go_*, process_*
                    (with --token-file or --metrics-token-file, behind a token)
  GET  /v1/stats    the operator page's figures as JSON (with --token-file, behind the token)
  GET  /            the operator page: a live view of /v1/stats for a browser

POSTs need Content-Type: application/json. Decisions made against a bucket
(200 and 429) carry RateLimit-Policy, RateLimit, X-RateLimit-Limit,
-Remaining, -Reset, and Retry-After on a denial; errors and outage answers
carry none. --config names a YAML file of namespaces
(see the README); SIGHUP reloads it (and re-reads --token-file), and a bad or empty file is
refused with a log line while the old policies stay. --redis shares the buckets with every process
pointed at the same Redis. SIGINT and SIGTERM shut down gracefully.

With --upstream URL the service is a reverse proxy instead: every request is
limited by the namespace --namespace, keyed by --key, and passed to URL when
allowed; the API, /healthz and /metrics move to --admin-listen.`

// defaultGCPercent is serve's garbage collector target (--gc-percent). The
// service's live heap is a few megabytes (more only while local-fallback
// holds buckets during an outage), and most of what it allocates lives for
// one request: at 400 the collector runs a quarter as often as at Go's
// default 100, and a check costs the service about a tenth less CPU (the
// Envoy service at concurrency 64, docs/performance.md), for a heap that may
// grow to five times the live one instead of twice.
const defaultGCPercent = 400

type serveFlags struct {
	listen, admin, config, outage, tokenFile, upstream, namespace, key, forwarded, body string
	metricsTokenFile                                                                    string
	trusted, allowedHosts                                                               stringList
	timeout, shutdown                                                                   time.Duration
	fleet, gcPercent                                                                    int
	topDenied                                                                           bool
	redis                                                                               redisFlags
	logFormat, logLevel                                                                 string
	ipv6Bits, maxConns                                                                  int
	readTimeout                                                                         time.Duration
}

func runServe(ctx context.Context, env Env, args []string) error {
	var f serveFlags
	fs := newFlagSet(env, "serve", "[flags]", serveAbout)
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "listen on `ADDR` (host:port; port 0 picks a free one)")
	fs.StringVar(&f.config, "config", "", "YAML `FILE` of namespaces and their limits, reloaded on SIGHUP")
	f.redis.register(fs)
	fs.StringVar(&f.outage, "outage", "return-error", "what a check does while Redis is unreachable: return-error (503, the default everywhere), fail-closed (503), fail-open or local-fallback")
	fs.IntVar(&f.fleet, "fleet-size", 1, "with --outage local-fallback, the number `N` of replicas sharing the policy: each admits 1/N of it during an outage")
	fs.DurationVar(&f.timeout, "timeout", 500*time.Millisecond, "bound on each check against the store")
	fs.StringVar(&f.tokenFile, "token-file", "", "require the bearer token in `FILE` on /v1/ and /metrics (or set RATELIMIT_TOKEN)")
	fs.StringVar(&f.metricsTokenFile, "metrics-token-file", "", "also accept the bearer token in `FILE` on /metrics, for a scraper that should not hold the API's token")
	fs.StringVar(&f.upstream, "upstream", "", "reverse-proxy mode: limit requests and pass the allowed ones to `URL`")
	fs.StringVar(&f.admin, "admin-listen", "127.0.0.1:9090", "with --upstream, serve the API, /healthz and /metrics on `ADDR`")
	fs.StringVar(&f.namespace, "namespace", config.DefaultNamespace, "with --upstream, the namespace whose limit applies to proxied requests")
	fs.StringVar(&f.key, "key", "ip", "with --upstream, what keys a request: ip, or header:NAME (such as header:X-API-Key)")
	fs.Var(&f.allowedHosts, "allowed-host", "without a token, a `NAME` (or NAME:PORT) the API answers to besides its listen address; repeat it or separate with commas (other Host headers get 421, against DNS rebinding)")
	fs.Var(&f.trusted, "trusted-proxies", "with --key ip, the `CIDRs` of proxies whose forwarding header is believed (none by default)")
	fs.StringVar(&f.forwarded, "forwarded-header", "X-Forwarded-For", "with --trusted-proxies, the header they write: X-Forwarded-For or Forwarded")
	fs.StringVar(&f.body, "body", "text", "with --upstream, the body of 429 and other limiter responses: text or json")
	fs.BoolVar(&f.topDenied, "show-top-denied", false, "list the most denied subjects of the last minutes on the operator page and /v1/stats (subjects can be personal data)")
	fs.DurationVar(&f.shutdown, "shutdown-timeout", 10*time.Second, "on SIGINT or SIGTERM, how long in-flight requests may take to finish")
	fs.IntVar(&f.ipv6Bits, "ipv6-prefix", 64, "with --key ip, key IPv6 clients by their prefix of `BITS` (128: the whole address)")
	fs.DurationVar(&f.readTimeout, "read-timeout", 30*time.Second, "bound on reading each request, headers and body (0: none, for long uploads through --upstream)")
	fs.IntVar(&f.maxConns, "max-connections", 1024, "at most `N` connections open at once on each listener; more wait (0: no limit)")
	fs.IntVar(&f.gcPercent, "gc-percent", defaultGCPercent, "the garbage collector's target `PERCENT`, as GOGC (which, when set, wins): the service's heap is small, and the default collects it a quarter as often as Go's 100")
	fs.StringVar(&f.logFormat, "log-format", "text", "log lines as text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log debug, info, warn or error lines and above")
	var envoy envoyFlags // the Envoy rate limit service: envoy.go
	envoy.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if f.ipv6Bits < 1 || f.ipv6Bits > 128 {
		return usagef("--ipv6-prefix must be 1 to 128 (got %d)", f.ipv6Bits)
	}
	if f.readTimeout < 0 || f.maxConns < 0 {
		return usagef("--read-timeout and --max-connections must not be negative")
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q (serve takes only flags; see 'ratelimit serve --help')", pos[0])
	}
	outage, err := parseOutage(f.outage)
	if err != nil {
		return err
	}
	if f.timeout <= 0 {
		return usagef("--timeout must be positive (got %v)", f.timeout)
	}
	if f.gcPercent < 1 {
		return usagef("--gc-percent must be at least 1 (got %d)", f.gcPercent)
	}
	if env.Getenv == nil || env.Getenv("GOGC") == "" {
		debug.SetGCPercent(f.gcPercent)
	}
	if f.fleet < 1 {
		return usagef("--fleet-size must be at least 1 (got %d)", f.fleet)
	}
	if f.fleet > 1 && outage != fallback.LocalFallback {
		return usagef("--fleet-size applies only to --outage local-fallback")
	}
	if f.body != "text" && f.body != "json" {
		return usagef("--body %q: want text or json", f.body)
	}
	if err := checkApplicable(setFlags(fs), &f); err != nil {
		return err
	}
	policies := config.Default()
	if f.config != "" {
		if policies, err = config.Load(f.config); err != nil {
			return fmt.Errorf("config: %w", err)
		}
	}
	token, err := readToken(f.tokenFile, env.Getenv)
	if err != nil {
		return err
	}
	var metricsToken string
	if f.metricsTokenFile != "" {
		if metricsToken, err = readTokenFile("--metrics-token-file", f.metricsTokenFile); err != nil {
			return err
		}
	}

	log, err := newLogger(env.Stderr, f.logFormat, f.logLevel)
	if err != nil {
		return err
	}
	metrics := server.NewMetrics()
	stats := server.NewStats(server.StatsOptions{TopDenied: f.topDenied})
	st, err := openStore(storeOptions{
		redis: f.redis, outage: outage, useOutage: true, fleetShare: f.fleet, timeout: f.timeout,
		observer: fallback.ObserverFunc(func(ctx context.Context, e fallback.Event) {
			metrics.Observer().ObserveFallback(ctx, e)
			stats.ObserveFallback(ctx, e)
			logOutages(log)(ctx, e)
		}),
	})
	if err != nil {
		return err
	}
	defer st.close()
	if err := st.checkCredentials(ctx, f.timeout); err != nil {
		return err
	}
	var degraded func() bool
	if st.fb != nil {
		degraded = st.degraded
	}
	var ping func(context.Context) error
	if st.redis != nil {
		ping = func(ctx context.Context) error { return st.redis.Ping(ctx).Err() }
	}
	svc, err := server.New(server.Options{
		Store: st.store, StoreName: st.name, Policies: policies, Token: token, MetricsToken: metricsToken, Timeout: f.timeout,
		Outage: outage, Degraded: degraded, Ping: ping, Metrics: metrics, Logger: log, Version: Version(),
		Stats: stats, StoreKind: st.kind(), Masters: st.masters(),
	})
	if err != nil {
		return err
	}

	mainHandler := svc.Handler()
	var adminHandler http.Handler
	if f.upstream != "" {
		proxy, err := proxyHandler(svc, f)
		if err != nil {
			return err
		}
		mainHandler, adminHandler = proxy, svc.Handler()
	}

	envoy.grpc.readTimeout = f.readTimeout
	envoySvc, err := startEnvoy(envoy, env, st, f.timeout, f.shutdown, f.maxConns, log, metrics)
	if err != nil {
		return err
	}
	defer envoySvc.stop()
	if adminHandler != nil { // the peer's /json and /healthcheck, beside the API
		adminHandler = envoySvc.mount(adminHandler, svc.Guard)
	} else {
		mainHandler = envoySvc.mount(mainHandler, svc.Guard)
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	servers := []*http.Server{newHTTPServer(mainHandler, log, f.upstream != "", f.readTimeout)}
	listeners := []net.Listener{limitConns(ln, f.maxConns)}
	apiAddr := ln.Addr()
	if adminHandler != nil {
		aln, err := net.Listen("tcp", f.admin)
		if err != nil {
			ln.Close()
			return fmt.Errorf("--admin-listen: %w", err)
		}
		servers = append(servers, newHTTPServer(adminHandler, log, false, f.readTimeout))
		listeners = append(listeners, limitConns(aln, f.maxConns))
		apiAddr = aln.Addr()
	}
	if err := svc.AllowHosts(apiAddr, f.allowedHosts); err != nil {
		for _, l := range listeners {
			l.Close()
		}
		return usagef("--allowed-host: %v", err)
	}
	trustedPrefixes, _ := httplimit.ParsePrefixes(f.trusted...) // checked by proxyHandler
	warnExposure(log, apiAddr, token, trustedPrefixes)

	if st.fb != nil {
		// One probe before serving, so that a Redis down at startup is
		// marked down (and logged) before a check waits for it; then one
		// every fallback.DefaultProbeInterval, through the graceful
		// shutdown. On Cluster the masters are known from the first
		// checks on, and probed from then on.
		pctx, cancel := context.WithTimeout(ctx, f.timeout)
		st.fb.Probe(pctx)
		cancel()
		probeCtx, stopProbe := context.WithCancel(context.WithoutCancel(ctx))
		var probeDone sync.WaitGroup
		probeDone.Go(func() { st.fb.ProbeForever(probeCtx, 0, nil) })
		defer func() { stopProbe(); probeDone.Wait() }()
	}

	hupCtx, stopHup := context.WithCancel(context.Background())
	defer stopHup()
	go func() {
		for {
			select {
			case <-hupCtx.Done():
				return
			case <-hup:
			}
			reloadToken(log, "--token-file", f.tokenFile, svc.SetToken)
			reloadToken(log, "--metrics-token-file", f.metricsTokenFile, svc.SetMetricsToken)
			if f.config == "" {
				if envoy.config == "" { // the Envoy config reloads on its own signal
					log.Warn("SIGHUP: no --config file to reload; the policies stay", "policies", svc.Policies().String())
				}
				continue
			}
			svc.Reload(f.config) //nolint:errcheck // Reload logs the outcome
		}
	}()

	errc := make(chan error, len(servers))
	for i, srv := range servers {
		go func() { errc <- srv.Serve(listeners[i]) }()
	}
	attrs := []any{"addr", ln.Addr().String(), "store", st.name, "policies", svc.Policies().String()}
	if f.upstream != "" {
		u, _ := url.Parse(f.upstream)
		attrs = append(attrs, "upstream", u.Redacted(), "admin", listeners[1].Addr().String())
	}
	if st.redis != nil {
		attrs = append(attrs, "outage", outage.String())
	}
	if token != "" {
		attrs = append(attrs, "auth", "bearer token")
	}
	log.Info("serving", attrs...)

	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	stop() // a second signal kills at once
	svc.Drain()
	log.Info("shutting down", "grace", f.shutdown.String())
	sctx, cancel := context.WithTimeout(context.Background(), f.shutdown)
	defer cancel()
	var shutdownErr error
	for _, srv := range servers {
		if err := srv.Shutdown(sctx); err != nil {
			shutdownErr = errors.Join(shutdownErr, err)
		}
	}
	if shutdownErr != nil {
		return fmt.Errorf("shutdown: %w", shutdownErr)
	}
	log.Info("stopped")
	return nil
}

// logOutages returns an observer that logs each change of Redis's state (on
// Cluster, of one master's) that package fallback reports, whether a check
// or the probe found it.
func logOutages(log *slog.Logger) fallback.ObserverFunc {
	return func(ctx context.Context, e fallback.Event) {
		var attrs []any
		if e.Partition != "" {
			attrs = append(attrs, "master", e.Partition)
		}
		if e.Alive {
			log.InfoContext(ctx, "redis answers again; decisions are back on the shared buckets", attrs...)
			return
		}
		attrs = append(attrs, "outage", e.Outage.String())
		if e.Cause != nil {
			// Errors may quote a bucket key, whose subject may be an API
			// key: the log gets the namespace and a hash instead.
			attrs = append(attrs, "err", server.RedactKeys(e.Cause.Error()))
		}
		if isAuthError(e.Cause) {
			log.ErrorContext(ctx, "redis refuses this service's credentials or permissions: a configuration error, not an outage; fix the user, password or ACL", attrs...)
			return
		}
		log.WarnContext(ctx, "redis unreachable; serving with the outage behaviour until it answers", attrs...)
	}
}

// newHTTPServer returns a server with timeouts against slow clients:
// readTimeout bounds reading a request, headers and body (0: no bound, for
// a proxy that streams long uploads).
func newHTTPServer(h http.Handler, log *slog.Logger, proxy bool, readTimeout time.Duration) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       readTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if proxy {
		srv.MaxHeaderBytes = 1 << 20
	}
	return srv
}

// proxyHandler builds the reverse proxy of --upstream.
func proxyHandler(svc *server.Service, f serveFlags) (http.Handler, error) {
	u, err := url.Parse(f.upstream)
	if err != nil {
		return nil, usagef("--upstream %q: %v", f.upstream, err)
	}
	var key httplimit.KeyFunc
	var trusted httplimit.TrustedProxies
	switch {
	case f.key == "ip":
		prefixes, err := httplimit.ParsePrefixes(f.trusted...)
		if err != nil {
			return nil, usagef("--trusted-proxies: %v", err)
		}
		if !strings.EqualFold(f.forwarded, "X-Forwarded-For") && !strings.EqualFold(f.forwarded, "Forwarded") {
			return nil, usagef("--forwarded-header %q: want X-Forwarded-For or Forwarded", f.forwarded)
		}
		trusted = httplimit.TrustedProxies{Prefixes: prefixes, Header: f.forwarded, IPv6Bits: f.ipv6Bits}
		key = trusted.ClientIP
	case strings.HasPrefix(f.key, "header:") && len(f.key) > len("header:"):
		if len(f.trusted) > 0 {
			return nil, usagef("--trusted-proxies applies only to --key ip")
		}
		key = httplimit.Header(strings.TrimPrefix(f.key, "header:"))
	default:
		return nil, usagef("--key %q: want ip or header:NAME", f.key)
	}
	opts := []httplimit.Option{httplimit.WithKey(key)}
	if f.body == "json" {
		opts = append(opts, httplimit.WithJSON())
	}
	h, err := svc.Proxy(server.ProxyOptions{Upstream: u, Namespace: f.namespace, Middleware: opts, Trusted: trusted})
	if err != nil {
		return nil, usagef("--upstream: %v", err)
	}
	return h, nil
}

// readToken returns the bearer token of --token-file, or of
// RATELIMIT_TOKEN, or "".
func readToken(path string, getenv func(string) string) (string, error) {
	if path == "" {
		return strings.TrimSpace(getenv("RATELIMIT_TOKEN")), nil
	}
	return readTokenFile("--token-file", path)
}

// readTokenFile returns the token in the file at path, one word; flag names
// the file in the errors.
func readTokenFile(flag, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("%s %s is empty", flag, path)
	}
	if strings.ContainsAny(t, " \t\r\n") {
		return "", fmt.Errorf("%s %s: the token must be one word", flag, path)
	}
	return t, nil
}

// reloadToken re-reads the token file of flag at path (none: "") on SIGHUP
// and puts the token in force with set; a file that cannot be read or
// holds no token is logged and the old token stays.
func reloadToken(log *slog.Logger, flag, path string, set func(string)) {
	if path == "" {
		return
	}
	token, err := readTokenFile(flag, path)
	if err != nil {
		log.Error("token reload refused; keeping the previous token", "err", err)
		return
	}
	set(token)
	log.Info("token reloaded", "file", path)
}
