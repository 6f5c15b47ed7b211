package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/exactlimit/ratelimit/internal/envoyrls"
	"github.com/exactlimit/ratelimit/internal/server"
)

// envoyFlags are serve's flags of the Envoy rate limit service.
type envoyFlags struct {
	listen, config string
	headers        bool
	grpc           grpcServerConfig // the listener's TLS and bounds: grpcserver.go
}

func (f *envoyFlags) register(fs *flagSet) {
	fs.StringVar(&f.listen, "grpc-listen", "", "serve Envoy's rate limit service (envoy.service.ratelimit.v3) over gRPC on `ADDR`")
	fs.StringVar(&f.config, "envoy-config", "", "with --grpc-listen, envoyproxy/ratelimit's config: a YAML `PATH`, or a directory of them (one domain each); reloaded on SIGHUP")
	f.grpc.tls.register(fs)
	fs.BoolVar(&f.headers, "envoy-response-headers", false, "with --grpc-listen, ask Envoy to add RateLimit-Limit, -Remaining, -Reset, RateLimit-Policy and RateLimit to responses (or set LIMIT_RESPONSE_HEADERS_ENABLED=true; LIMIT_*_HEADER rename them)")
}

// startEnvoy starts the Envoy rate limit service of --grpc-listen on st's
// store, with its metrics in metrics, and reloads --envoy-config on SIGHUP.
// The listener takes at most maxConns connections at once (none: 0).
// It returns the function that stops it gracefully (waiting at most grace),
// a no-op without --grpc-listen. A config that does not load is an error
// naming the file: the command does not start.
func startEnvoy(f envoyFlags, env Env, st *stores, timeout, grace time.Duration, maxConns int, log *slog.Logger, metrics *server.Metrics) (stop func(), err error) {
	if f.listen == "" {
		if f.config != "" || f.headers {
			return nil, usagef("--envoy-config and --envoy-response-headers need --grpc-listen")
		}
		return func() {}, nil
	}
	if f.config == "" {
		return nil, usagef("--grpc-listen needs --envoy-config (envoyproxy/ratelimit's YAML)")
	}
	cfg, err := envoyrls.LoadConfig(f.config)
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
	svc, err := envoyrls.New(envoyrls.Options{
		Store: st.store, Config: cfg, Timeout: timeout, Headers: headers, Metrics: em, Logger: log,
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
	healthpb.RegisterHealthServer(srv, hs)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	hupCtx, stopHup := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-hupCtx.Done():
				return
			case <-hup:
				svc.Reload(f.config) //nolint:errcheck // Reload logs the outcome
			}
		}
	})
	wg.Go(func() {
		if err := srv.Serve(limitConns(ln, maxConns)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			log.Error("grpc serve", "err", err)
		}
	})
	log.Info("serving envoy rate limit service", "grpc", ln.Addr().String(), "envoy_config", f.config, "config", cfg.String(), "response_headers", headers.Enabled)
	return func() {
		signal.Stop(hup)
		stopHup()
		hs.Shutdown()
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(grace):
			srv.Stop()
		}
		wg.Wait()
	}, nil
}
