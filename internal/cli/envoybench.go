package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/exactlimit/ratelimit/internal/envoyrls"
)

const envoyBenchAbout = `
Envoy-bench is a gRPC load generator for Envoy's rate limit service: it sends
ShouldRateLimit calls from --concurrency goroutines over --conns connections,
each for --descriptors descriptors (--key, "s<i>"), each i drawn at random
among --subjects, in domain --domain, for --duration, each with the deadline
--call-timeout (20ms, as Envoy's rate limit filter gives it by default), and
prints the calls per second, the p50, p99 and maximum latency of a call, and
the fraction OK.
A call of several descriptors is decided all or nothing over their buckets.

With --target it drives a service already running there (this one, started
with 'ratelimit serve --grpc-listen', or envoyproxy/ratelimit) whose config
has the rule; give the load generator and the service their own cores to
compare them. Without --target it starts this service in the same process on
127.0.0.1, with a config of one rule of --rate per second per subject, on the
embedded store or the --redis one. SIGINT ends the run early and still prints
the report.`

type envoyBenchFlags struct {
	redis               redisFlags
	load                loadFlags
	target, domain, key string
	conns, descriptors  int
	rate                int64
	callTimeout         time.Duration
}

func runEnvoyBench(ctx context.Context, env Env, args []string) error {
	var f envoyBenchFlags
	fs := newFlagSet(env, "envoy-bench", "[flags]", envoyBenchAbout)
	fs.StringVar(&f.target, "target", "", "drive the rate limit service at `ADDR` (default: start one in this process)")
	f.redis.register(fs)
	f.load.register(fs, 64, 10_000, "calls in flight at the same time", "distinct descriptor values, drawn uniformly")
	fs.IntVar(&f.conns, "conns", 4, "gRPC connections the calls are spread over")
	fs.IntVar(&f.descriptors, "descriptors", 1, "descriptors per call, their values drawn independently")
	fs.Int64Var(&f.rate, "rate", 1000, "without --target, the rule's requests_per_unit (unit second)")
	fs.StringVar(&f.domain, "domain", "bench", "the request's domain")
	fs.StringVar(&f.key, "key", "subject", "the descriptor's key")
	fs.DurationVar(&f.callTimeout, "call-timeout", 20*time.Millisecond, "each call's `deadline` (20ms: Envoy's rate limit filter's default timeout)")
	if err := f.load.parse(fs, args); err != nil {
		return err
	}
	switch {
	case f.conns < 1:
		return usagef("--conns must be at least 1 (got %d)", f.conns)
	case f.descriptors < 1 || f.descriptors > 64:
		return usagef("--descriptors must be between 1 and 64 (got %d)", f.descriptors)
	case f.target != "" && len(f.redis.urls) > 0:
		return usagef("--redis applies only without --target (the target has its store)")
	case f.rate < 1 || f.rate > 1<<32-1:
		return usagef("--rate must be between 1 and 2^32-1 (got %d)", f.rate)
	case f.callTimeout <= 0:
		return usagef("--call-timeout must be above 0 (got %v)", f.callTimeout)
	}
	target := f.target
	where := target
	if target == "" {
		addr, desc, stop, err := startBenchRLS(f)
		if err != nil {
			return err
		}
		defer stop()
		target, where = addr, "in process, "+desc
	}
	conns := make([]*grpc.ClientConn, f.conns)
	for i := range conns {
		c, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("--target: %w", err)
		}
		defer c.Close()
		conns[i] = c
	}
	ctx, cancel := f.load.run(ctx)
	defer cancel()
	fmt.Fprintf(env.Stdout, "target      %s\nworkload    domain %s, key %s over %d values, %d per call, concurrency %d, %d connections, %v\n",
		where, f.domain, f.key, f.load.subjects, f.descriptors, f.load.concurrency, f.conns, f.load.duration)
	res := envoyBench(ctx, f, conns)
	reportCalls(env.Stdout, res)
	return nil
}

// startBenchRLS starts the service on 127.0.0.1 with the bench's rule.
func startBenchRLS(f envoyBenchFlags) (addr, desc string, stop func(), err error) {
	cfg, err := envoyrls.ParseConfig("bench.yaml", fmt.Appendf(nil,
		"domain: %q\ndescriptors:\n  - key: %q\n    rate_limit: {unit: second, requests_per_unit: %d}\n", f.domain, f.key, f.rate))
	if err != nil {
		return "", "", nil, err
	}
	st, err := openStore(storeOptions{redis: f.redis, timeout: time.Second})
	if err != nil {
		return "", "", nil, err
	}
	svc, err := envoyrls.New(envoyrls.Options{Store: st.store, Config: cfg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		st.close()
		return "", "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		st.close()
		return "", "", nil, err
	}
	srv := grpc.NewServer(envoyrls.ServerOptions()...)
	svc.Register(srv)
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
	return ln.Addr().String(), st.name, func() { srv.Stop(); st.close() }, nil
}

func envoyBench(ctx context.Context, f envoyBenchFlags, conns []*grpc.ClientConn) loadResult {
	descs := make([]*rlv3.RateLimitDescriptor, f.load.subjects)
	for i := range descs {
		descs[i] = &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: f.key, Value: "s" + strconv.Itoa(i)}}}
	}
	workers := newWorkers(f.load.concurrency)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		client := rlsv3.NewRateLimitServiceClient(conns[w%len(conns)])
		wg.Go(func() {
			me := &workers[w]
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			// The worker's request, its descriptors drawn anew for each
			// call (a call is done with it when it returns).
			req := &rlsv3.RateLimitRequest{Domain: f.domain, Descriptors: make([]*rlv3.RateLimitDescriptor, f.descriptors)}
			for ctx.Err() == nil {
				for i := range req.Descriptors {
					req.Descriptors[i] = descs[rng.IntN(len(descs))]
				}
				// Each call has a deadline of its own, as Envoy gives
				// it, not the run's: a deadline that reaches the
				// server bounds its store calls, and the outage
				// behaviour would answer the calls in flight at the
				// end of the run.
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.callTimeout)
				t := time.Now()
				resp, err := client.ShouldRateLimit(cctx, req)
				lat := time.Since(t)
				cancel()
				switch {
				case err != nil && ctx.Err() != nil:
					return // the run is over
				case err != nil:
					me.failed(err)
					continue
				}
				me.decided(resp.OverallCode == rlsv3.RateLimitResponse_OK, lat)
			}
		})
	}
	wg.Wait()
	return sum(workers, time.Since(start))
}

// reportCalls prints r as envoy-bench's report.
func reportCalls(w io.Writer, r loadResult) {
	n := r.passed + r.refused
	fmt.Fprintf(w, "calls       %d in %v = %.0f calls/s\n", n, r.elapsed.Round(time.Millisecond), float64(n)/r.elapsed.Seconds())
	fmt.Fprintf(w, "ok          %.1f%% (%d OK, %d OVER_LIMIT)\n", pct(r.passed, n), r.passed, r.refused)
	writeLatency(w, r.hist)
	if r.errors > 0 {
		fmt.Fprintf(w, "errors      %d (first: %v)\n", r.errors, r.firstErr)
	}
}
