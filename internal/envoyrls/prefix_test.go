package envoyrls

import (
	"context"
	"strings"
	"sync"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// keyStore records the key of every Apply of the store it wraps (which then
// takes the sequential path: a keyStore is no BatchStore).
type keyStore struct {
	ratelimit.Store
	mu   sync.Mutex
	keys []string
}

func (s *keyStore) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	s.mu.Lock()
	s.keys = append(s.keys, key)
	s.mu.Unlock()
	return s.Store.Apply(ctx, key, r)
}

// TestKeyPrefix: Options.KeyPrefix begins the namespace of every bucket, a
// rule's and a descriptor's own limit's, so that services of different
// prefixes over one store share no bucket and services of one prefix do.
func TestKeyPrefix(t *testing.T) {
	cfg, err := ParseConfig("e2e.yaml", []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	own := desc("user=alice")
	own.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	for _, tc := range []struct {
		name     string
		a, b     string
		admitted int // of 8 requests of each descriptor, 4 to each service
	}{
		{"no prefix, shared", "", "", 2},
		{"the same prefix, shared", "blue:", "blue:", 2},
		{"different prefixes, apart", "blue:", "green:", 4},
		{"a prefix beside none, apart", "blue:", "", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &keyStore{Store: memstore.New()}
			var svcs []*Service
			for _, prefix := range []string{tc.a, tc.b} {
				svc, err := New(Options{Store: store, Config: cfg, KeyPrefix: prefix})
				if err != nil {
					t.Fatal(err)
				}
				svcs = append(svcs, svc)
			}
			for _, d := range []*rlv3.RateLimitDescriptor{desc("remote_address=10.0.0.1"), own} {
				n := 0
				for i := range 8 {
					r, err := svcs[i%2].ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{d}})
					if err != nil {
						t.Fatal(err)
					}
					if r.OverallCode == ok {
						n++
					}
				}
				if n != tc.admitted {
					t.Errorf("%v: admitted %d across both, want %d", d.Entries, n, tc.admitted)
				}
			}
			for _, k := range store.keys {
				if !strings.Contains(k, ":"+tc.a+"envoy") && !strings.Contains(k, ":"+tc.b+"envoy") {
					t.Errorf("key %q is under neither prefix %q nor %q", k, tc.a, tc.b)
				}
			}
		})
	}
}
