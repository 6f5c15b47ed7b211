package service

import (
	"context"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/envoyrls"
	"github.com/exactlimit/ratelimit/memstore"
)

// BenchmarkGRPCShouldRateLimit sends envoy-bench's workload to the Envoy
// service through the gRPC server of the listener (newGRPCServer, with the
// listener's defaults) over loopback: a 1000/s rule over 10,000 subjects,
// one descriptor a call, each call with a deadline of 5 s as envoy-bench
// sets, from 64 goroutines over 4 connections, on the embedded store with
// the per-rule series and an observer. Its allocations are the client's
// and the server's together; the client's are the same from one version of
// the server to the next.
func BenchmarkGRPCShouldRateLimit(b *testing.B) {
	cfg, err := envoyrls.ParseConfig("bench.yaml", []byte("domain: bench\ndescriptors:\n  - key: subject\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"))
	if err != nil {
		b.Fatal(err)
	}
	obs := ratelimit.ObserverFuncs{
		Decision: func(context.Context, ratelimit.DecisionEvent) {},
		Error:    func(context.Context, ratelimit.ErrorEvent) {},
	}
	timeout := 500 * time.Millisecond // serve's --timeout
	svc, err := envoyrls.New(envoyrls.Options{Store: memstore.New(), Config: cfg, Timeout: timeout,
		Metrics: envoyrls.NewMetrics(0), Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	c := grpcServerConfig{callTimeout: timeout, readTimeout: 30 * time.Second} // serve's defaults
	srv, err := newGRPCServer(ln.Addr(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	svc.Register(srv)
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
	defer srv.Stop()

	clients := make([]rlsv3.RateLimitServiceClient, 4)
	for i := range clients {
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		clients[i] = rlsv3.NewRateLimitServiceClient(conn)
	}
	reqs := make([]*rlsv3.RateLimitRequest, 10_000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "subject", Value: "s" + strconv.Itoa(i)}}},
		}}
	}
	for _, client := range clients { // connected before the clock starts
		if _, err := client.ShouldRateLimit(context.Background(), reqs[0]); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		seq := int(next.Add(1))
		client := clients[seq%len(clients)]
		i := seq
		for pb.Next() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := client.ShouldRateLimit(ctx, reqs[i%len(reqs)])
			cancel()
			if err != nil {
				b.Error(err)
				return
			}
			i += 7
		}
	})
}
