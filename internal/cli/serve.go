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
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/exactlimit/ratelimit"
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
  GET  /healthz     liveness, the store and whether it is in an outage
  GET  /metrics     Prometheus text format, series ratelimit_*
  GET  /v1/stats    the operator page's figures as JSON (with --token-file, behind the token)
  GET  /            the operator page: a live view of /v1/stats for a browser

Responses carry RateLimit-Policy, RateLimit, X-RateLimit-Limit, -Remaining,
-Reset, and Retry-After on a denial. --config names a YAML file of namespaces
(see the README); SIGHUP reloads it, and a bad file is refused with a log line
while the old policies stay. --redis shares the buckets with every process
pointed at the same Redis. SIGINT and SIGTERM shut down gracefully.

With --upstream URL the service is a reverse proxy instead: every request is
limited by the namespace --namespace, keyed by --key, and passed to URL when
allowed; the API, /healthz and /metrics move to --admin-listen.`

type serveFlags struct {
	listen, admin, config, outage, tokenFile, upstream, namespace, key, forwarded, body string
	trusted                                                                             stringList
	timeout, shutdown                                                                   time.Duration
	fleet                                                                               int
	topDenied                                                                           bool
	redis                                                                               redisFlags
}

func runServe(ctx context.Context, env Env, args []string) error {
	var f serveFlags
	fs := newFlagSet(env, "serve", "[flags]", serveAbout)
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "listen on `ADDR` (host:port; port 0 picks a free one)")
	fs.StringVar(&f.config, "config", "", "YAML `FILE` of namespaces and their limits, reloaded on SIGHUP")
	f.redis.register(fs)
	fs.StringVar(&f.outage, "outage", "fail-closed", "what a check does while Redis is unreachable: fail-closed (503), fail-open, local-fallback or return-error")
	fs.IntVar(&f.fleet, "fleet-size", 1, "with --outage local-fallback, the number `N` of replicas sharing the policy: each admits 1/N of it during an outage")
	fs.DurationVar(&f.timeout, "timeout", 500*time.Millisecond, "bound on each check against the store")
	fs.StringVar(&f.tokenFile, "token-file", "", "require the bearer token in `FILE` on /v1/ (or set RATELIMIT_TOKEN)")
	fs.StringVar(&f.upstream, "upstream", "", "reverse-proxy mode: limit requests and pass the allowed ones to `URL`")
	fs.StringVar(&f.admin, "admin-listen", "127.0.0.1:9090", "with --upstream, serve the API, /healthz and /metrics on `ADDR`")
	fs.StringVar(&f.namespace, "namespace", config.DefaultNamespace, "with --upstream, the namespace whose limit applies to proxied requests")
	fs.StringVar(&f.key, "key", "ip", "with --upstream, what keys a request: ip, or header:NAME (such as header:X-API-Key)")
	fs.Var(&f.trusted, "trusted-proxies", "with --key ip, the `CIDRs` of proxies whose forwarding header is believed (none by default)")
	fs.StringVar(&f.forwarded, "forwarded-header", "X-Forwarded-For", "with --trusted-proxies, the header they write: X-Forwarded-For or Forwarded")
	fs.StringVar(&f.body, "body", "text", "with --upstream, the body of 429 and other limiter responses: text or json")
	fs.BoolVar(&f.topDenied, "show-top-denied", false, "list the most denied subjects of the last minutes on the operator page and /v1/stats (subjects can be personal data)")
	fs.DurationVar(&f.shutdown, "shutdown-timeout", 10*time.Second, "on SIGINT or SIGTERM, how long in-flight requests may take to finish")
	var envoy envoyFlags // the Envoy rate limit service: envoy.go
	envoy.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
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
	if f.fleet < 1 {
		return usagef("--fleet-size must be at least 1 (got %d)", f.fleet)
	}
	if f.fleet > 1 && outage != ratelimit.LocalFallback {
		return usagef("--fleet-size applies only to --outage local-fallback")
	}
	if f.body != "text" && f.body != "json" {
		return usagef("--body %q: want text or json", f.body)
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

	log := slog.New(slog.NewTextHandler(env.Stderr, nil))
	metrics := server.NewMetrics()
	stats := server.NewStats(server.StatsOptions{TopDenied: f.topDenied})
	st, err := openStore(storeOptions{
		redis: f.redis, outage: outage, useOutage: true, fleetShare: f.fleet, timeout: f.timeout,
		observer: ratelimit.Observers(metrics.Observer(), stats, logOutages(log)),
	})
	if err != nil {
		return err
	}
	defer st.close()
	svc, err := server.New(server.Options{
		Store: st.store, StoreName: st.name, Policies: policies, Token: token, Timeout: f.timeout,
		Outage: outage, Degraded: st.degraded, Metrics: metrics, Logger: log,
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

	stopEnvoy, err := startEnvoy(envoy, env, st, f.timeout, f.shutdown, log, metrics)
	if err != nil {
		return err
	}
	defer stopEnvoy()

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	servers := []*http.Server{newHTTPServer(mainHandler, log, f.upstream != "")}
	listeners := []net.Listener{ln}
	if adminHandler != nil {
		aln, err := net.Listen("tcp", f.admin)
		if err != nil {
			ln.Close()
			return fmt.Errorf("--admin-listen: %w", err)
		}
		servers = append(servers, newHTTPServer(adminHandler, log, false))
		listeners = append(listeners, aln)
	}

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
			if f.config == "" {
				log.Warn("SIGHUP: no --config file to reload; the policies stay", "policies", svc.Policies().String())
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
func logOutages(log *slog.Logger) ratelimit.Observer {
	return ratelimit.ObserverFuncs{Fallback: func(ctx context.Context, e ratelimit.FallbackEvent) {
		var attrs []any
		if e.Partition != "" {
			attrs = append(attrs, "master", e.Partition)
		}
		if e.Alive {
			log.InfoContext(ctx, "redis answers again; decisions are back on the shared buckets", attrs...)
			return
		}
		attrs = append(attrs, "outage", e.Outage.String(), "err", e.Cause)
		log.WarnContext(ctx, "redis unreachable; serving with the outage behaviour until it answers", attrs...)
	}}
}

// newHTTPServer returns a server with timeouts against slow clients. A
// proxy streams request bodies of any size to its upstream, so only its
// headers have a deadline.
func newHTTPServer(h http.Handler, log *slog.Logger, proxy bool) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if proxy {
		srv.ReadTimeout = 0
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
	switch {
	case f.key == "ip":
		prefixes, err := httplimit.ParsePrefixes(f.trusted...)
		if err != nil {
			return nil, usagef("--trusted-proxies: %v", err)
		}
		if !strings.EqualFold(f.forwarded, "X-Forwarded-For") && !strings.EqualFold(f.forwarded, "Forwarded") {
			return nil, usagef("--forwarded-header %q: want X-Forwarded-For or Forwarded", f.forwarded)
		}
		key = httplimit.TrustedProxies{Prefixes: prefixes, Header: f.forwarded}.ClientIP
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
	h, err := svc.Proxy(server.ProxyOptions{Upstream: u, Namespace: f.namespace, Middleware: opts})
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
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("--token-file %s is empty", path)
	}
	if strings.ContainsAny(t, " \t\r\n") {
		return "", fmt.Errorf("--token-file %s: the token must be one word", path)
	}
	return t, nil
}
