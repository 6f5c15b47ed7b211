package envoyrls

import (
	"context"
	"strconv"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/exactlimit/ratelimit/memstore"
)

// BenchmarkShouldRateLimit decides the workload in process, without
// gRPC: a 1000/s rule over 10,000 subjects, on the embedded store.
func BenchmarkShouldRateLimit(b *testing.B) {
	cfg, err := ParseConfig("bench.yaml", []byte("domain: bench\ndescriptors:\n  - key: subject\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"))
	if err != nil {
		b.Fatal(err)
	}
	svc, err := New(Options{Store: memstore.New(), Config: cfg})
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
			if _, err := svc.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
				b.Fatal(err)
			}
			i += 7
		}
	})
}
