package envoyrls

import (
	"context"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/exactlimit/ratelimit/memstore"
)

// FuzzParseConfig: any file is compiled or refused with ErrConfig, never a
// panic; a compiled one answers a request.
func FuzzParseConfig(f *testing.F) {
	for _, ex := range readmeExamples {
		f.Add([]byte(ex.yaml))
	}
	f.Add([]byte(e2eConfig))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig("fuzz.yaml", data)
		if err != nil {
			return
		}
		svc, err := New(Options{Store: memstore.New(), Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range cfg.Domains() {
			if _, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: d, Descriptors: []*rlv3.RateLimitDescriptor{desc("a=b")}}); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// FuzzShouldRateLimit: any request over the e2e config is answered or
// refused with a gRPC status, never a panic.
func FuzzShouldRateLimit(f *testing.F) {
	cfg, err := ParseConfig("e2e.yaml", []byte(e2eConfig))
	if err != nil {
		f.Fatal(err)
	}
	svc, err := New(Options{Store: memstore.New(), Config: cfg, Headers: Headers{Enabled: true}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("remote_address", "10.0.0.1", "to_number", "1", uint32(1), uint64(0), false, uint32(0))
	f.Add("files", "files/x", "path", "/api/1/action", uint32(0), uint64(5), true, uint32(2))
	f.Add("message_type", "marketing", "to_number", "", uint32(7), uint64(1<<63), false, uint32(1))
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string, hits uint32, dhits uint64, nested bool, override uint32) {
		d1 := desc(k1 + "=" + v1)
		d2 := desc(k2 + "=" + v2)
		if nested {
			d1 = desc(k1+"="+v1, k2+"="+v2)
		}
		if dhits%3 == 0 {
			d2.HitsAddend = wrapperspb.UInt64(dhits)
		}
		if override > 0 {
			d2.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: override % 5, Unit: 2}
		}
		_, _ = svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: hits, Descriptors: []*rlv3.RateLimitDescriptor{d1, d2}})
	})
}
