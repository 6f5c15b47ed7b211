package envoyrls

import (
	"context"
	"strconv"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
)

// BenchmarkShouldRateLimit decides the workload in process, without
// gRPC: a 1000/s rule over 10,000 subjects, on the embedded store.
func BenchmarkShouldRateLimit(b *testing.B) {
	benchShouldRateLimit(b, context.Background(), Options{Store: memstore.New()})
}

// BenchmarkShouldRateLimitRedis decides the same workload on Redis as
// 'ratelimit serve --redis' keeps it (redisstore behind package fallback's
// return-error, bounded by --timeout's 500 ms), with the per-rule series
// and an observer, each call with the deadline the gRPC listener gives it.
func BenchmarkShouldRateLimitRedis(b *testing.B) {
	srv := redistest.StartServer(b)
	st, err := fallback.New(redisstore.New(redistest.Client(b, srv.Addr())), fallback.WithTimeout(500*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	obs := ratelimit.ObserverFuncs{
		Decision: func(context.Context, ratelimit.DecisionEvent) {},
		Error:    func(context.Context, ratelimit.ErrorEvent) {},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	benchShouldRateLimit(b, ctx, Options{Store: st, Timeout: 500 * time.Millisecond, Metrics: NewMetrics(0), Observer: obs})
}

func benchShouldRateLimit(b *testing.B, ctx context.Context, o Options) {
	cfg, err := ParseConfig("bench.yaml", []byte("domain: bench\ndescriptors:\n  - key: subject\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"))
	if err != nil {
		b.Fatal(err)
	}
	o.Config = cfg
	svc, err := New(o)
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*rlsv3.RateLimitRequest, 10_000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "subject", Value: "s" + strconv.Itoa(i)}}},
		}}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := svc.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
				b.Fatal(err)
			}
			i += 7
		}
	})
}
