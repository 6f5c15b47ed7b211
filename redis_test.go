package ratelimit_test

// TryAcquireMany and the denial cache against real Redis: a standalone
// server and a 3-master cluster started on loopback by internal/redistest.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

func redisStandalone(t testing.TB) (*redistest.Server, redis.UniversalClient) {
	t.Helper()
	srv := redistest.StartServer(t)
	return srv, redistest.Client(t, srv.Addr())
}

// pipelines counts the pipelines a client sends, the commands in them, and
// the keys their script calls name (in all, and the most in one call).
type pipelines struct{ pipes, cmds, keys, mostKeys atomic.Int64 }

func (p *pipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (p *pipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (p *pipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() != "hello" && cmds[0].Name() != "client" {
			p.pipes.Add(1)
			p.cmds.Add(int64(len(cmds)))
			for _, c := range cmds {
				if a := c.Args(); len(a) > 2 && (c.Name() == "fcall" || c.Name() == "evalsha" || c.Name() == "eval") {
					n, _ := strconv.ParseInt(fmt.Sprint(a[2]), 10, 64)
					p.keys.Add(n)
					if n > p.mostKeys.Load() {
						p.mostKeys.Store(n)
					}
				}
			}
		}
		return next(ctx, cmds)
	}
}

// manyItems returns n items over subjects s0..s(n/2-1), each twice.
func manyItems(n int) []ratelimit.Item[string] {
	items := make([]ratelimit.Item[string], n)
	for i := range items {
		items[i] = ratelimit.Item[string]{Subject: "s" + strconv.Itoa(i%(n/2)), Cost: 1}
	}
	return items
}

// checkMany checks the results of manyItems on a fresh PerMinute(2) limiter:
// the first use of each subject leaves 1 token, the second 0.
func checkMany(t *testing.T, res []ratelimit.Result) {
	t.Helper()
	for i, r := range res {
		want := int64(1)
		if i >= len(res)/2 {
			want = 0
		}
		if r.Err != nil || !r.Decision.Allowed || r.Decision.Remaining != want {
			t.Fatalf("item %d = %+v, %v; want allowed with %d left", i, r.Decision, r.Err, want)
		}
	}
}

func TestTryAcquireManyOnRedis(t *testing.T) {
	ctx := context.Background()
	at := func() time.Time { return testkit.Start }
	t.Run("standalone: one pipeline for the whole batch", func(t *testing.T) {
		srv, _ := redisStandalone(t)
		client := redistest.NewClient(srv.Addr())
		defer client.Close()
		l, _ := ratelimit.New[string](redisstore.New(client), ratelimit.PerMinute(2), ratelimit.WithClock(at))
		l.TryAcquire(ctx, "warm") // loads the script and opens the connection
		hook := &pipelines{}
		client.AddHook(hook)
		checkMany(t, l.TryAcquireMany(ctx, manyItems(200)))
		// One pipeline of script calls that each decide up to 16 keys on
		// their own: 200 checks in 13 calls.
		if hook.pipes.Load() != 1 || hook.keys.Load() != 200 || hook.cmds.Load() != 13 || hook.mostKeys.Load() > 16 {
			t.Fatalf("the batch took %d pipelines of %d calls naming %d keys (at most %d in one), want 1 of 13 naming 200 (at most 16 in one)",
				hook.pipes.Load(), hook.cmds.Load(), hook.keys.Load(), hook.mostKeys.Load())
		}
	})
	t.Run("cluster: every master decides its subjects", func(t *testing.T) {
		cluster := redistest.StartCluster(t, 3, 0)
		client := redistest.NewClusterClient(cluster.Addrs()...)
		defer client.Close()
		l, _ := ratelimit.New[string](redisstore.New(client), ratelimit.PerMinute(2), ratelimit.WithClock(at))
		items := manyItems(200)
		masters := map[string]bool{}
		for _, it := range items {
			masters[cluster.MasterOf(redistest.SlotOf(l.Key(it.Subject))).Addr()] = true
		}
		if len(masters) != 3 {
			t.Fatalf("the subjects hash to %d masters, want all 3", len(masters))
		}
		checkMany(t, l.TryAcquireMany(ctx, items))
	})
}

func TestTryAcquireManyOnAClusterWithAMasterDown(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	client := redistest.NewClusterClient(cluster.Addrs()...)
	defer client.Close()
	l, _ := ratelimit.New[string](redisstore.New(client), ratelimit.PerMinute(5), ratelimit.WithClock(func() time.Time { return testkit.Start }))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	items := manyItems(120)
	for i, r := range l.TryAcquireMany(ctx, items) {
		if r.Err != nil || !r.Decision.Allowed {
			t.Fatalf("item %d with every master up: %+v %v", i, r.Decision, r.Err)
		}
	}
	dead := cluster.Masters()[1]
	onDead := make([]bool, len(items))
	for i, it := range items {
		onDead[i] = cluster.MasterOf(redistest.SlotOf(l.Key(it.Subject))).Addr() == dead.Addr()
	}
	dead.Kill()
	// A third of the items are on the dead master; the invalid one at the
	// end never reaches any.
	items = append(items, ratelimit.Item[string]{Subject: "s0", Cost: 6})
	res := l.TryAcquireMany(ctx, items)
	var failed, decided int
	for i, r := range res[:len(res)-1] {
		if onDead[i] {
			if r.Err == nil {
				t.Errorf("item %d on the dead master was decided: %+v", i, r.Decision)
			}
			failed++
			continue
		}
		want := int64(2) // each subject was checked twice in the first batch
		if i >= 60 {
			want = 1
		}
		if r.Err != nil || !r.Decision.Allowed || r.Decision.Remaining != want {
			t.Errorf("item %d on a live master = %+v, %v; want allowed with %d left", i, r.Decision, r.Err, want)
		}
		decided++
	}
	if failed == 0 || decided == 0 {
		t.Fatalf("%d items failed and %d were decided; want some of each", failed, decided)
	}
	if err := res[len(res)-1].Err; err == nil || !strings.Contains(err.Error(), "invalid argument") {
		t.Fatalf("the invalid item: err = %v", err)
	}
}

func TestDenyCacheOnRedis(t *testing.T) {
	_, client := redisStandalone(t)
	ctx := context.Background()
	store := &countingStore{Store: redisstore.New(client)}
	t.Run("on the server's clock", func(t *testing.T) {
		l, _ := ratelimit.New[string](store, ratelimit.PerHour(1), ratelimit.WithNamespace("own-clock"), ratelimit.WithDenyCache(16))
		l.TryAcquire(ctx, "s")
		denied, err := l.TryAcquire(ctx, "s")
		if err != nil || denied.Allowed || denied.Source != ratelimit.SourceStore {
			t.Fatalf("second check = %+v %v, want denied by Redis", denied, err)
		}
		before := store.Applies.Load()
		for range 100 {
			d, err := l.TryAcquire(ctx, "s")
			if err != nil || d.Source != ratelimit.SourceCache || d.RetryAfter > denied.RetryAfter {
				t.Fatalf("check = %+v %v, want denied by the cache within %v", d, err, denied.RetryAfter)
			}
		}
		peek, _ := l.Peek(ctx, "s")
		if d, _ := l.TryAcquire(ctx, "s"); d.RetryAfter > peek.RetryAfter {
			t.Fatalf("the cache says retry after %v, Redis %v", d.RetryAfter, peek.RetryAfter)
		}
		if n := store.Applies.Load() - before; n != 1 {
			t.Fatalf("101 checks and a peek of a denied subject made %d calls to Redis, want the peek's only", n)
		}
		if err := l.Reset(ctx, "s"); err != nil {
			t.Fatal(err)
		}
		if d, _ := l.TryAcquire(ctx, "s"); !d.Allowed {
			t.Fatalf("after Reset: %+v, want allowed", d)
		}
	})
	t.Run("on an injected clock", func(t *testing.T) {
		clock := testkit.NewClock(testkit.Start)
		l, _ := ratelimit.New[string](store, ratelimit.PerHour(2), ratelimit.WithNamespace("injected"),
			ratelimit.WithClock(clock.Now), ratelimit.WithDenyCache(16))
		runCache(t, l, clock, store, []cacheStep{
			{0, "s", 2, true, ratelimit.SourceStore, 0},
			{0, "s", 2, false, ratelimit.SourceStore, time.Hour},
			{10 * time.Minute, "s", 2, false, ratelimit.SourceCache, 50 * time.Minute},
			{0, "s", 1, false, ratelimit.SourceCache, 20 * time.Minute},
			{20 * time.Minute, "s", 1, true, ratelimit.SourceStore, 0},
		})
	})
}

// scriptCalls returns the script calls (FCALL, EVALSHA and EVAL) the server
// has run.
func scriptCalls(tb testing.TB, c redis.UniversalClient) int64 {
	tb.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"fcall", "evalsha", "eval"} {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
				v, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
				n += v
			}
		}
	}
	return n
}

// BenchmarkDenyCacheRedis: one subject keeps checking while over its limit,
// and 1,000 others are within theirs; half of the checks are the hot
// subject's. It reports the script calls Redis ran per check and the
// decisions per second, with and without the cache, from one goroutine
// (serial: each check waits for the last) and from 32 (parallel).
//
//	go test -run '^$' -bench DenyCacheRedis -benchtime 2s -count 3 .
func BenchmarkDenyCacheRedis(b *testing.B) {
	_, client := redisStandalone(b)
	store := redisstore.New(client)
	limit := ratelimit.NewLimit(100, time.Second, 1000) // bursts of 1,000, 100/s
	const others = 1000
	subjects := make([]string, others)
	for i := range subjects {
		subjects[i] = "user:" + strconv.Itoa(i)
	}
	var runs atomic.Int64
	for _, parallel := range []bool{false, true} {
		for _, size := range []int{0, 10_000} {
			name := fmt.Sprintf("serial/cache=%d", size)
			if parallel {
				name = fmt.Sprintf("parallel/cache=%d", size)
			}
			b.Run(name, func(b *testing.B) {
				opts := []ratelimit.Option{ratelimit.WithNamespace(fmt.Sprint("bench-", runs.Add(1)))}
				if size > 0 {
					opts = append(opts, ratelimit.WithDenyCache(size))
				}
				l, err := ratelimit.New[string](store, limit, opts...)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				if d, err := l.TryAcquireN(ctx, "hot", 1000); err != nil || !d.Allowed {
					b.Fatalf("draining the hot subject: %+v %v", d, err)
				}
				var hotDenied, othersDenied, othersSeen, errs atomic.Int64
				seen := make([]atomic.Bool, others)
				var next atomic.Int64
				check := func(i int64) {
					subject, hot := "hot", i%2 == 0
					if !hot {
						j := (i / 2) % others
						subject = subjects[j]
						if !seen[j].Swap(true) {
							othersSeen.Add(1)
						}
					}
					d, err := l.TryAcquire(ctx, subject)
					switch {
					case err != nil:
						errs.Add(1)
					case d.Allowed:
					case hot:
						hotDenied.Add(1)
					default:
						othersDenied.Add(1)
					}
				}
				calls := scriptCalls(b, client)
				b.ReportAllocs()
				b.ResetTimer()
				if parallel {
					b.SetParallelism(16)
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							check(next.Add(1))
						}
					})
				} else {
					for i := range b.N {
						check(int64(i))
					}
				}
				b.StopTimer()
				calls = scriptCalls(b, client) - calls
				if errs.Load() > 0 || othersDenied.Load() > 0 {
					b.Fatalf("%d errors, %d denials of subjects within their limit", errs.Load(), othersDenied.Load())
				}
				if b.N >= 2*others && othersSeen.Load() != others {
					b.Fatalf("only %d of the %d other subjects were checked", othersSeen.Load(), others)
				}
				if hot := int64(b.N+1) / 2; b.N >= 1000 && hotDenied.Load() < hot*9/10 {
					b.Fatalf("the hot subject was denied %d of %d times; it should be over its limit", hotDenied.Load(), hot)
				}
				b.ReportMetric(float64(calls)/float64(b.N), "redis-calls/op")
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
				if st := l.DenyCacheStats(); size > 0 {
					b.ReportMetric(st.HitRate(), "cache-hit-rate")
				}
			})
		}
	}
}

// BenchmarkTryAcquireManyRedis compares a batch of 100 subjects in one
// TryAcquireMany with 100 TryAcquire calls one after the other, on a
// standalone server and on a 3-master cluster.
//
//	go test -run '^$' -bench TryAcquireManyRedis -benchtime 2s -count 3 .
func BenchmarkTryAcquireManyRedis(b *testing.B) {
	_, standalone := redisStandalone(b)
	cluster := redistest.StartCluster(b, 3, 0)
	clusterClient := redistest.NewClusterClient(cluster.Addrs()...)
	b.Cleanup(func() { clusterClient.Close() })
	const batch = 100
	var runs atomic.Int64
	for _, deploy := range []struct {
		name   string
		client redis.UniversalClient
	}{{"standalone", standalone}, {"cluster", clusterClient}} {
		for _, many := range []bool{false, true} {
			name := deploy.name + "/one-by-one"
			if many {
				name = deploy.name + "/TryAcquireMany"
			}
			b.Run(name, func(b *testing.B) {
				l, _ := ratelimit.NewEncoded(redisstore.New(deploy.client), strconv.Itoa, []ratelimit.Limit{ratelimit.PerSecond(1e9)},
					ratelimit.WithNamespace(fmt.Sprint("many-", runs.Add(1))))
				ctx := context.Background()
				items := make([]ratelimit.Item[int], batch)
				for i := range items {
					items[i] = ratelimit.Item[int]{Subject: i, Cost: 1}
				}
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if many {
						for _, r := range l.TryAcquireMany(ctx, items) {
							if r.Err != nil || !r.Decision.Allowed {
								b.Fatal(r)
							}
						}
						continue
					}
					for _, it := range items {
						if d, err := l.TryAcquire(ctx, it.Subject); err != nil || !d.Allowed {
							b.Fatal(d, err)
						}
					}
				}
				b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "decisions/s")
			})
		}
	}
}
