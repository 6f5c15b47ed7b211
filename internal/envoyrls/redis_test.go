package envoyrls

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/redisstore"
)

// prefixed is a Store whose keys get a prefix, so that subtests sharing one
// Redis do not share buckets. It is atomic when the store under it is.
type prefixed struct {
	ratelimit.Store
	prefix string
}

func (p prefixed) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	return p.Store.Apply(ctx, p.prefix+key, r)
}

func (p prefixed) Reset(ctx context.Context, key string) error {
	return p.Store.Reset(ctx, p.prefix+key)
}

func (p prefixed) ApplyAll(ctx context.Context, items []ratelimit.BatchItem) error {
	as, ok := p.Store.(ratelimit.AtomicStore)
	if !ok {
		return applySequential(ctx, p, items)
	}
	keyed := make([]ratelimit.BatchItem, len(items))
	for i, it := range items {
		keyed[i] = ratelimit.BatchItem{Key: p.prefix + it.Key, Request: it.Request}
	}
	err := as.ApplyAll(ctx, keyed)
	for i := range items {
		items[i].Decision = keyed[i].Decision
	}
	return err
}

var testPrefix atomic.Int64

func prefixedStores(store ratelimit.Store) func(*testing.T) ratelimit.Store {
	return func(*testing.T) ratelimit.Store {
		return prefixed{store, fmt.Sprintf("t%d/", testPrefix.Add(1))}
	}
}

func TestShouldRateLimitRedis(t *testing.T) {
	srv := redistest.StartServer(t)
	client := redistest.NewClient(srv.Addr())
	t.Cleanup(func() { client.Close() })
	endToEnd(t, prefixedStores(redisstore.New(client)))
}

func TestShouldRateLimitCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	client := redistest.NewClusterClient(cluster.Addrs()...)
	t.Cleanup(func() { client.Close() })
	endToEnd(t, prefixedStores(redisstore.New(client)))
}

// TestTwoServicesShareBuckets runs two services, each with its own gRPC
// listener and Redis client, on one Redis: together they admit one bucket's
// capacity, whichever of them is asked.
func TestTwoServicesShareBuckets(t *testing.T) {
	srv := redistest.StartServer(t)
	var fs []*fixture
	for range 2 {
		client := redistest.NewClient(srv.Addr())
		t.Cleanup(func() { client.Close() })
		fs = append(fs, serve(t, redisstore.New(client), e2eConfig, Headers{}))
	}
	allowed := 0
	for i := range 30 {
		r := fs[i%2].ask(t, 0, desc("remote_address=shared"), desc("to_number=shared"))
		if r.OverallCode == rlsv3.RateLimitResponse_OK {
			allowed++
		}
	}
	if allowed != 10 {
		t.Errorf("two services, one 10/s bucket: %d allowed, want 10", allowed)
	}
	// All or nothing across both: the 20 denials charged to_number nothing.
	wantStatus(t, "to_number", fs[1].ask(t, 0, desc("to_number=shared")).Statuses[0], ok, 89, 100)
}
