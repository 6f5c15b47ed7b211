package envoyrls

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
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

func (p prefixed) Refund(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	return p.Store.(ratelimit.Refunder).Refund(ctx, p.prefix+key, r)
}

func (p prefixed) ApplyAll(ctx context.Context, items []ratelimit.BatchItem) error {
	as, ok := p.Store.(ratelimit.BatchStore)
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
	client := redistest.Client(t, srv.Addr())
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
		client := redistest.Client(t, srv.Addr())
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

// TestOutageBehaviours: with Redis dead, the outage behaviour of package
// fallback answers every request: fail-closed is OVER_LIMIT (Envoy would
// admit on an error with its default failure_mode_deny: false), fail-open is
// OK, local-fallback decides on a local bucket, and return-error is
// UNAVAILABLE, for Envoy's failure_mode_deny to decide.
func TestOutageBehaviours(t *testing.T) {
	srv := redistest.StartServer(t)
	client := redistest.Client(t, srv.Addr())
	srv.Kill()
	for _, tc := range []struct {
		outage fallback.Outage
		want   string // the codes of 12 requests; e for an error
	}{
		{fallback.FailClosed, "------------"},
		{fallback.FailOpen, "++++++++++++"},
		{fallback.LocalFallback, "++++++++++--"},
		{fallback.ReturnError, "eeeeeeeeeeee"},
	} {
		t.Run(tc.outage.String(), func(t *testing.T) {
			fb, err := fallback.New(redisstore.New(client), fallback.WithOutage(tc.outage), fallback.WithTimeout(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			f := serve(t, fb, e2eConfig, Headers{})
			var got strings.Builder
			for range 12 {
				resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
					Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address=down"), desc("to_number=down")}})
				switch {
				case status.Code(err) == codes.Unavailable:
					got.WriteByte('e')
				case err != nil:
					t.Fatalf("got %v, want UNAVAILABLE or a response", err)
				case resp.OverallCode == ok:
					got.WriteByte('+')
				default:
					got.WriteByte('-')
				}
			}
			if got.String() != tc.want {
				t.Errorf("got %s, want %s", got.String(), tc.want)
			}
		})
	}
}

// TestRedisConcurrentAllOrNothing: on one Redis, ApplyAll is one script
// call, so even racing requests charge the roomy bucket only when the tight
// one admits.
func TestRedisConcurrentAllOrNothing(t *testing.T) {
	srv := redistest.StartServer(t)
	client := redistest.Client(t, srv.Addr())
	concurrentAllOrNothing(t, redisstore.New(client))
}

// spy records the keys of every ApplyAll call.
type spy struct {
	ratelimit.BatchStore
	mu   sync.Mutex
	keys [][]string
}

func (s *spy) ApplyAll(ctx context.Context, items []ratelimit.BatchItem) error {
	var keys []string
	for _, it := range items {
		keys = append(keys, it.Key)
	}
	s.mu.Lock()
	s.keys = append(s.keys, keys)
	s.mu.Unlock()
	return s.BatchStore.ApplyAll(ctx, items)
}

// TestClusterAllOrNothingAcrossSlots: on Cluster, a request whose
// descriptors' keys live on different slots is still charged nothing when
// one is over its limit (ApplyAll looks at every slot before it takes; only
// a concurrent check between its two steps can leave a charge, see
// redisstore.Store.ApplyAll).
func TestClusterAllOrNothingAcrossSlots(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	client := redistest.NewClusterClient(cluster.Addrs()...)
	t.Cleanup(func() { client.Close() })
	s := &spy{BatchStore: redisstore.New(client)}
	f := serve(t, s, e2eConfig, Headers{})
	for range 5 {
		f.ask(t, 0, desc("message_type=marketing", "to_number=slots"))
	}
	r := f.ask(t, 0, desc("message_type=marketing", "to_number=slots"), desc("to_number=slots"))
	wantOverall(t, "the request", r, over)
	last := s.keys[len(s.keys)-1]
	if len(last) != 2 || redistest.SlotOf(last[0]) == redistest.SlotOf(last[1]) {
		t.Fatalf("the two buckets %q share a slot: the test does not cross slots", last)
	}
	wantStatus(t, "the other slot's bucket, untouched", f.ask(t, 0, desc("to_number=slots")).Statuses[0], ok, 99, 100)
}

// scripts counts the script calls a client sends, alone or in pipelines.
type scripts struct{ n atomic.Int64 }

func (s *scripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *scripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.count(cmd)
		return next(ctx, cmd)
	}
}
func (s *scripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			s.count(c)
		}
		return next(ctx, cmds)
	}
}
func (s *scripts) count(c redis.Cmder) {
	if n := c.Name(); n == "fcall" || n == "evalsha" || n == "eval" {
		s.n.Add(1)
	}
}

// TestOneScriptCallPerRequest: on one Redis, behind package fallback as
// serve builds it, a request of three descriptors is one script call.
func TestOneScriptCallPerRequest(t *testing.T) {
	srv := redistest.StartServer(t)
	client := redistest.Client(t, srv.Addr())
	var sc scripts
	client.AddHook(&sc)
	fb, err := fallback.New(redisstore.New(client), fallback.WithOutage(fallback.FailClosed))
	if err != nil {
		t.Fatal(err)
	}
	f := serve(t, fb, e2eConfig, Headers{})
	f.ask(t, 0, desc("remote_address=warm")) // loads the script
	before := sc.n.Load()
	r := f.ask(t, 0, desc("remote_address=one"), desc("to_number=one"), desc("burst_key=one"))
	wantOverall(t, "the request", r, ok)
	if got := sc.n.Load() - before; got != 1 {
		t.Errorf("three descriptors: %d script calls, want 1", got)
	}
}

// TestHungRedisCostsOneTimeout: with Redis behind a stalled network, the
// first request waits out the store timeout and opens fallback's breaker;
// the next ones are answered by the outage behaviour at once.
func TestHungRedisCostsOneTimeout(t *testing.T) {
	srv := redistest.StartServer(t)
	proxy := redistest.StartProxy(t, srv.Addr())
	client := redistest.Client(t, proxy.Addr())
	const timeout = 200 * time.Millisecond
	fb, err := fallback.New(redisstore.New(client), fallback.WithOutage(fallback.FailClosed), fallback.WithTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	f := serve(t, fb, e2eConfig, Headers{})
	f.ask(t, 0, desc("remote_address=warm"), desc("to_number=warm"))
	proxy.Stall()
	defer proxy.Resume()
	start := time.Now()
	const n = 20
	for range n {
		if r := f.ask(t, 0, desc("remote_address=hung"), desc("to_number=hung")); r.OverallCode != over {
			t.Fatalf("fail-closed with Redis hung: got %v", r.OverallCode)
		}
	}
	if fb.IsAlive() {
		t.Error("the store is alive after a request waited out its timeout on a hung Redis: the breaker did not open")
	}
	// A timeout each would take n * 200ms = 4s.
	if el := time.Since(start); testkit.Timed(t) && el > n*timeout/2 {
		t.Errorf("%d requests with Redis hung took %v: more than one waited for the store", n, el)
	}
}
