package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/service"
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
pointed at the same Redis; without it, envoyproxy/ratelimit's REDIS_SOCKET_TYPE, REDIS_URL, REDIS_TYPE
and the other REDIS_* settings choose the Redis as that service reads them, and a value serve cannot
honour stops it (docs/envoy.md lists them all). With envoyproxy/ratelimit's GRPC_HOST, GRPC_PORT,
RUNTIME_ROOT, RUNTIME_SUBDIRECTORY or RUNTIME_APPDIRECTORY set, serve runs as that service's container:
Envoy's rate limit service on GRPC_HOST:GRPC_PORT (0.0.0.0:8081) with the config directory
RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, HTTP on HOST:PORT (0.0.0.0:8080); a flag wins
over such a setting, with a warning. SIGINT and SIGTERM shut down gracefully.

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
	readTimeout, watch                                                                  time.Duration
	debugListen, addrFile                                                               string
}

func runServe(ctx context.Context, env Env, args []string) error {
	var f serveFlags
	fs := newFlagSet(env, "serve", "[flags]", serveAbout)
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "listen on `ADDR` (host:port; port 0 picks a free one)")
	fs.StringVar(&f.debugListen, "debug-listen", "", "serve the debug endpoints (/rlconfig, /stats, /debug/pprof/) on `ADDR`, without a token, as envoyproxy/ratelimit's DEBUG_HOST:DEBUG_PORT (default: none)")
	fs.StringVar(&f.addrFile, "addr-file", "", "once every listener listens, write their addresses to `FILE` as JSON (for a supervisor or script that starts serve on port 0); removed at shutdown")
	fs.StringVar(&f.config, "config", "", "YAML `FILE` of namespaces and their limits, reloaded on SIGHUP")
	fs.DurationVar(&f.watch, "config-watch", 0, "with --config, --token-file or --metrics-token-file, how often to look for changes; a change is loaded once it holds still that long (0: only on SIGHUP)")
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
	if f.readTimeout < 0 || f.maxConns < 0 || f.watch < 0 {
		return usagef("--read-timeout, --max-connections and --config-watch must not be negative")
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
	peer, err := readPeerRedis(env.Getenv, len(f.redis.urls) > 0)
	if err != nil {
		return err
	}
	if err := checkPeerSettings(env.Getenv); err != nil {
		return err
	}
	listen, err := readPeerListen(env.Getenv, setFlags(fs))
	if err != nil {
		return err
	}
	listen.apply(&f, &envoy)
	if err := checkApplicable(setFlags(fs), &f, peer.opts != nil, envoy.listen != ""); err != nil {
		return err
	}
	var token string // RATELIMIT_TOKEN, when there is no --token-file
	if f.tokenFile == "" {
		token, _ = readToken("", env.Getenv)
	}

	logAs, err := peerLogging(env.Getenv, setFlags(fs), &f)
	if err != nil {
		return err
	}
	log, err := newLogger(env.Stderr, f.logFormat, f.logLevel)
	if err != nil {
		return err
	}
	for _, o := range logAs {
		log.Warn("logging: a flag wins over the peer's setting", "flag", o[0], "overrides", o[1])
	}
	for _, o := range listen.won {
		log.Warn("a flag wins over the peer's setting", "flag", o[0], "overrides", o[1])
	}
	if listen.envoy {
		log.Info("the Envoy service from the peer's settings", "grpc", envoy.listen, "envoy_config", envoy.config, "http", f.listen, "debug", f.debugListen)
	}
	c := service.Config{
		Listen: f.listen, AdminListen: f.admin, MaxConns: f.maxConns, ReadTimeout: f.readTimeout, Timeout: f.timeout,
		Outage: outage, FleetSize: f.fleet, ConfigFile: f.config, Token: token, TokenFile: f.tokenFile,
		MetricsTokenFile: f.metricsTokenFile, Watch: f.watch, AllowedHosts: f.allowedHosts, TopDenied: f.topDenied,
		Debug: f.debugListen, Logger: log, Version: Version(),
	}
	if c.Redis, _, err = f.redis.options(); err != nil {
		return usageError{err}
	}
	switch {
	case len(peer.set) == 0:
	case c.Redis != nil:
		log.Warn("Redis: --redis wins over the peer's settings", "flag", "--redis", "env", envName("redis"), "overrides", strings.Join(peer.set, ","))
	default:
		c.Redis = peer.opts
		log.Info("Redis from the peer's settings", "redis", service.DescribeRedis(peer.opts), "settings", strings.Join(peer.set, ","))
		for _, w := range peer.warnings {
			log.Warn("ignored, as the peer ignores it: " + w)
		}
	}
	if f.upstream != "" {
		if c.Proxy, err = proxyConfig(f); err != nil {
			return err
		}
	}
	if c.Envoy, err = envoy.service(env, log, listen.envoy); err != nil {
		return err
	}
	if c.Envoy != nil && c.Redis == nil {
		log.Warn("the Envoy service keeps its buckets in this process: replicas do not share them, so N replicas admit N times a limit; set REDIS_URL (with REDIS_SOCKET_TYPE) or --redis to share them")
	}
	return serve(ctx, env, c, f.shutdown, f.addrFile)
}

// serve starts the service of c and waits for SIGINT or SIGTERM (or ctx's
// end), reloading it on SIGHUP; then it shuts it down, giving the requests
// in flight grace to finish. With addrFile, it writes the service's
// addresses there once it listens and removes the file at the end.
func serve(ctx context.Context, env Env, c service.Config, grace time.Duration, addrFile string) error {
	log := c.Logger
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	svc, err := service.Start(ctx, c)
	if err != nil {
		if ce, ok := errors.AsType[*service.ConfigError](err); ok {
			return usageError{ce}
		}
		return err
	}
	if env.ServeStarted != nil {
		env.ServeStarted(svc)
	}
	if addrFile != "" {
		if err := writeAddrFile(addrFile, svc.Addrs()); err != nil {
			svc.Close(context.Background()) //nolint:errcheck // the file's error is the one to report
			return err
		}
		defer os.Remove(addrFile)
	}
	var failed error
wait:
	for {
		select {
		case <-hup:
			svc.Reload()
		case err := <-svc.Err():
			failed = fmt.Errorf("serve: %w", err)
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	stop() // a second signal kills at once
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if failed != nil {
		svc.Close(sctx) //nolint:errcheck // the listener's error is the one to report
		return failed
	}
	log.Info("shutting down", "grace", grace.String())
	if err := svc.Close(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

// writeAddrFile writes the addresses of a to path as one JSON object, such
// as {"http":"127.0.0.1:8080","grpc":"127.0.0.1:8081"}, with the keys
// http, admin, grpc, debug and prometheus of the listeners the service
// has. It writes a file beside path and renames it into place, so a reader
// that finds path reads all of it.
func writeAddrFile(path string, a service.Addrs) error {
	m := map[string]string{}
	for k, addr := range map[string]net.Addr{"http": a.HTTP, "admin": a.Admin, "grpc": a.GRPC, "debug": a.Debug, "prometheus": a.Prometheus} {
		if addr != nil {
			m[k] = addr.String()
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("--addr-file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("--addr-file: %w", err)
	}
	return nil
}

// proxyConfig reads the reverse proxy of --upstream.
func proxyConfig(f serveFlags) (*service.Proxy, error) {
	u, err := url.Parse(f.upstream)
	if err != nil {
		return nil, usagef("--upstream %q: %v", f.upstream, err)
	}
	p := &service.Proxy{Upstream: u, Namespace: f.namespace, JSON: f.body == "json"}
	switch {
	case f.key == "ip":
		prefixes, err := httplimit.ParsePrefixes(f.trusted...)
		if err != nil {
			return nil, usagef("--trusted-proxies: %v", err)
		}
		if !strings.EqualFold(f.forwarded, "X-Forwarded-For") && !strings.EqualFold(f.forwarded, "Forwarded") {
			return nil, usagef("--forwarded-header %q: want X-Forwarded-For or Forwarded", f.forwarded)
		}
		p.Trusted = httplimit.TrustedProxies{Prefixes: prefixes, Header: f.forwarded, IPv6Bits: f.ipv6Bits}
		p.Key = p.Trusted.ClientIP
	case strings.HasPrefix(f.key, "header:") && len(f.key) > len("header:"):
		if len(f.trusted) > 0 {
			return nil, usagef("--trusted-proxies applies only to --key ip")
		}
		p.Key = httplimit.Header(strings.TrimPrefix(f.key, "header:"))
	default:
		return nil, usagef("--key %q: want ip or header:NAME", f.key)
	}
	return p, nil
}

// readToken returns the bearer token of --token-file, or of
// RATELIMIT_TOKEN, or "".
func readToken(path string, getenv func(string) string) (string, error) {
	if path == "" {
		return strings.TrimSpace(getenv("RATELIMIT_TOKEN")), nil
	}
	return service.ReadTokenFile("--token-file", path)
}

// checkApplicable refuses flags that the other flags make meaningless,
// rather than ignoring them. peerRedis says whether the peer's settings name
// a Redis (readPeerRedis), which --outage and --fleet-size apply to as they
// do to --redis; grpc whether the Envoy service listens, by --grpc-listen or
// the peer's settings (readPeerListen), which the --grpc-tls-* flags need.
func checkApplicable(set map[string]bool, f *serveFlags, peerRedis, grpc bool) error {
	if f.upstream == "" {
		for _, name := range []string{"key", "body", "namespace", "admin-listen", "trusted-proxies", "forwarded-header", "ipv6-prefix"} {
			if set[name] {
				return usagef("--%s applies only with --upstream", name)
			}
		}
	}
	if f.key != "ip" {
		for _, name := range []string{"trusted-proxies", "forwarded-header", "ipv6-prefix"} {
			if set[name] {
				return usagef("--%s applies only to --key ip", name)
			}
		}
	}
	if !grpc {
		for _, name := range []string{"grpc-tls-cert", "grpc-tls-key", "grpc-tls-client-ca"} {
			if set[name] {
				return usagef("--%s applies only with --grpc-listen", name)
			}
		}
	}
	if len(f.redis.urls) == 0 {
		if set["redis-password-file"] {
			return usagef("--redis-password-file applies only with --redis (the peer's REDIS_AUTH holds its password)")
		}
		if !peerRedis {
			for _, name := range []string{"outage", "fleet-size"} {
				if set[name] {
					return usagef("--%s applies only with --redis (or the peer's REDIS_URL)", name)
				}
			}
		}
	}
	return nil
}
