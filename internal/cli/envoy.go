package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/envoyrls"
	"github.com/exactlimit/ratelimit/internal/server"
	"github.com/exactlimit/ratelimit/redisstore"
)

// envoyFlags are serve's flags of the Envoy rate limit service.
type envoyFlags struct {
	listen, config, outage string
	headers                bool
	watch                  time.Duration
	grpc                   grpcServerConfig // the listener's TLS and bounds: grpcserver.go
}

// defaultEnvoyWatch is how often --envoy-config is looked at for changes.
const defaultEnvoyWatch = 2 * time.Second

func (f *envoyFlags) register(fs *flagSet) {
	fs.StringVar(&f.listen, "grpc-listen", "", "serve Envoy's rate limit service (envoy.service.ratelimit.v3) over gRPC on `ADDR`")
	fs.StringVar(&f.config, "envoy-config", "", "with --grpc-listen, envoyproxy/ratelimit's config: a YAML `PATH`, or a directory of them (one domain each); reloaded when it changes and on SIGHUP")
	fs.DurationVar(&f.watch, "envoy-config-watch", defaultEnvoyWatch, "with --envoy-config, how often to look for changes; a change is loaded once it holds still that long (0: only on SIGHUP)")
	fs.StringVar(&f.outage, "envoy-outage", "return-error", "with --grpc-listen and --redis, what ShouldRateLimit does while Redis is unreachable: return-error (gRPC UNAVAILABLE: Envoy's failure_mode_deny decides), fail-open, fail-closed or local-fallback")
	f.grpc.tls.register(fs)
	fs.BoolVar(&f.headers, "envoy-response-headers", false, "with --grpc-listen, ask Envoy to add RateLimit-Limit, -Remaining, -Reset, RateLimit-Policy and RateLimit to responses (or set LIMIT_RESPONSE_HEADERS_ENABLED=true; LIMIT_*_HEADER rename them)")
}

// envoyService is the running Envoy rate limit service.
type envoyService struct {
	// stop stops it gracefully (waiting at most the grace given).
	stop func()
	// mount puts the peer's HTTP endpoints, POST /json and GET
	// /healthcheck, in front of the HTTP API's handler, with POST /json
	// behind guard: the API's own checks (server.Service.Guard).
	mount func(next http.Handler, guard func(string, http.Handler) http.Handler) http.Handler
}

// startEnvoy starts the Envoy rate limit service of --grpc-listen on st's
// Redis or embedded store, with its metrics in metrics; it reloads
// --envoy-config when it changes and on SIGHUP. The listener takes at most
// maxConns connections at once (none: 0). Without --grpc-listen it starts
// nothing, and stop and mount do nothing. A config that does not load is an
// error naming the file: the command does not start.
func startEnvoy(f envoyFlags, env Env, st *stores, timeout, grace time.Duration, maxConns int, log *slog.Logger, metrics *server.Metrics) (*envoyService, error) {
	idle := &envoyService{stop: func() {}, mount: func(h http.Handler, _ func(string, http.Handler) http.Handler) http.Handler { return h }}
	if f.listen == "" {
		if f.config != "" || f.headers {
			return nil, usagef("--envoy-config and --envoy-response-headers need --grpc-listen")
		}
		return idle, nil
	}
	if f.config == "" {
		return nil, usagef("--grpc-listen needs --envoy-config (envoyproxy/ratelimit's YAML)")
	}
	if f.watch < 0 {
		return nil, usagef("--envoy-config-watch must not be negative")
	}
	outage, err := parseOutage(f.outage)
	if err != nil {
		return nil, usagef("--envoy-outage: %v", err)
	}
	pe, err := readPeerEnv(env.Getenv)
	if err != nil {
		return nil, err
	}
	if f.grpc.tls, err = f.grpc.tls.withPeer(pe.tls, log); err != nil {
		return nil, err
	}
	load := envoyrls.LoadOptions{IgnoreDotFiles: pe.ignoreDotFiles, MergeDomains: pe.mergeDomains}
	cfg, err := load.Load(f.config)
	if err != nil {
		return nil, fmt.Errorf("--envoy-config: %w", err)
	}
	headers := envoyrls.HeadersFromEnv(env.Getenv)
	headers.Enabled = headers.Enabled || f.headers
	ratio, _ := strconv.ParseFloat(env.Getenv("NEAR_LIMIT_RATIO"), 64)
	em := envoyrls.NewMetrics(ratio)
	if err := metrics.Register(em.Collectors()...); err != nil {
		return nil, err
	}
	store, fb, err := envoyStore(st, outage, timeout, log)
	if err != nil {
		return nil, err
	}
	svc, err := envoyrls.New(envoyrls.Options{
		Store: store, Config: cfg, Timeout: timeout, Headers: headers, Metrics: em, Logger: log,
		ShadowMode: pe.shadowMode, DynamicMetadata: pe.dynamicMetadata, Load: load,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return nil, fmt.Errorf("--grpc-listen: %w", err)
	}
	f.grpc.callTimeout = timeout
	srv, err := newGRPCServer(ln.Addr(), f.grpc, log)
	if err != nil {
		ln.Close()
		return nil, err
	}
	svc.Register(srv)
	hs := health.NewServer()
	// The peer's service name, as Envoy's and Kubernetes' gRPC health
	// checks ask for it; "" (the whole server) is SERVING too.
	hs.SetServingStatus("ratelimit", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	var httpEnds []*envoyrls.HTTP
	var httpMu sync.Mutex

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-bg.Done():
				return
			case <-hup:
				svc.Reload(f.config) //nolint:errcheck // Reload logs the outcome
			}
		}
	})
	if f.watch > 0 {
		tick := time.NewTicker(f.watch)
		wg.Go(func() { defer tick.Stop(); svc.Watch(bg, f.config, tick.C) })
	}
	if fb != nil {
		pctx, cancel := context.WithTimeout(bg, timeout)
		fb.Probe(pctx)
		cancel()
		wg.Go(func() { fb.ProbeForever(bg, 0, nil) })
	}
	wg.Go(func() {
		if err := srv.Serve(limitConns(ln, maxConns)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			log.Error("grpc serve", "err", err)
		}
	})
	attrs := []any{"grpc", ln.Addr().String(), "envoy_config", f.config, "config", cfg.String(), "response_headers", headers.Enabled}
	if st.redis != nil {
		attrs = append(attrs, "envoy_outage", outage.String())
	}
	if pe.shadowMode {
		attrs = append(attrs, "shadow_mode", true)
	}
	log.Info("serving envoy rate limit service", attrs...)
	return &envoyService{
		stop: func() {
			signal.Stop(hup)
			hs.Shutdown()
			httpMu.Lock()
			for _, h := range httpEnds {
				h.Shutdown()
			}
			httpMu.Unlock()
			done := make(chan struct{})
			go func() { srv.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(grace):
				srv.Stop()
			}
			stopBG()
			wg.Wait()
		},
		mount: func(next http.Handler, guard func(string, http.Handler) http.Handler) http.Handler {
			h := envoyrls.NewHTTP(svc, next, guard)
			httpMu.Lock()
			httpEnds = append(httpEnds, h)
			httpMu.Unlock()
			return h
		},
	}, nil
}

// envoyStore is the store of the Envoy service: the embedded store, or
// Redis with the Envoy service's own outage behaviour (by default
// return-error, so that Envoy's failure_mode_deny decides, as the HTTP
// API's --outage does by default). When that is the HTTP API's
// behaviour too, the two share st's store; otherwise fb is a second
// fallback wrapper over the same Redis client, which the caller probes.
func envoyStore(st *stores, outage fallback.Outage, timeout time.Duration, log *slog.Logger) (store ratelimit.Store, fb *fallback.Store, err error) {
	if st.redis == nil || (st.fb != nil && st.fb.Outage() == outage) {
		return st.store, nil, nil
	}
	var primary ratelimit.Store = redisstore.New(st.redis)
	if st.fb != nil {
		primary = st.fb.Primary()
	}
	opts := []fallback.Option{fallback.WithOutage(outage), fallback.WithTimeout(timeout), fallback.WithObserver(logOutages(log.With("service", "envoy")))}
	fb, err = fallback.New(primary, opts...)
	if err != nil {
		return nil, nil, err
	}
	return fb, fb, nil
}
