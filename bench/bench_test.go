package main

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// shared is one redis-server for the tests and benchmarks of this package,
// started on first use and stopped by TestMain.
var shared struct {
	once sync.Once
	srv  *server
	err  error
}

func testServer(tb testing.TB) *server {
	tb.Helper()
	shared.once.Do(func() { shared.srv, shared.err = startServer() })
	if shared.err != nil {
		tb.Fatalf("start redis-server: %v", shared.err)
	}
	return shared.srv
}

func TestMain(m *testing.M) {
	code := m.Run()
	shared.srv.stop()
	os.Exit(code)
}

// TestQuickRun runs the whole program in -quick mode against its own
// redis-server and checks the report's shape, never its speeds.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("the quick run takes about 20 s")
	}
	var out, progress bytes.Buffer
	if err := run(quickConfig(), "go run . -quick", &out, &progress); err != nil {
		t.Fatalf("run: %v\n%s", err, progress.String())
	}
	report := out.String()
	for _, want := range []string{
		"### Decisions per second", "### In Redis: 50 connections × pipelines of 16", "### Server cost per decision",
		"### Redis memory per live subject", "### In-process, GOMAXPROCS=2",
		"### The performance targets", "### Script cost inside Redis", "Load average (1, 5, 15 min) at the start: ",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, c := range contenders() {
		for _, conc := range quickConfig().conc {
			for _, n := range quickConfig().subjects {
				row := "| " + strconv.Itoa(conc) + " | " + strconv.Itoa(n) + " | " + c.name + " | "
				if !strings.Contains(report, row) {
					t.Errorf("report lacks the row %q", row)
				}
			}
		}
	}
	for _, line := range strings.Split(report, "\n") {
		// Our limiters decide every check: an error is a bug, not a speed.
		if strings.Contains(line, "| ours: ") && strings.HasPrefix(line, "| ") && strings.Count(line, "|") == 12 {
			cells := strings.Split(line, "|")
			if errs := strings.TrimSpace(cells[10]); errs != "0" {
				t.Errorf("errors in %q", line)
			}
		}
	}
	// Every target is measured by a -quick run (its configurations include
	// the performance targets), whatever its verdict.
	targets := report[strings.Index(report, "### The performance targets"):]
	for _, want := range []string{"1. conc 64, 10000 subjects", "2. conc 1, 10000 subjects", "3. in Redis", "4. memstore"} {
		if !strings.Contains(targets, "| "+want) {
			t.Errorf("targets table lacks %q", want)
		}
	}
	if n := strings.Count(targets, "| not measured |"); n > 0 {
		t.Errorf("%d targets not measured by the quick run", n)
	}
	for _, s := range []string{scriptOurs, scriptOursQuota, scriptRedisRate, scriptSkeleton, scriptFloor} {
		if !strings.Contains(report, "| "+s+" | 10000 | ") {
			t.Errorf("the in-Redis table lacks %s over 10000 subjects", s)
		}
	}
	if t.Failed() {
		t.Logf("report:\n%s\nprogress:\n%s", report, progress.String())
	}
}

// TestPrototypesAreExact holds the coalescing and rueidis prototypes to the
// shipped semantics under concurrency: with the time fixed, 64 goroutines
// racing for one bucket of 100 get exactly 100 tokens, and another 100
// subjects get one each.
func TestPrototypesAreExact(t *testing.T) {
	srv := testServer(t)
	e := env{addr: srv.addr, policy: policy{rate: 100, burst: 100}}
	now := time.Now()
	for _, name := range oursRedis {
		t.Run(name, func(t *testing.T) {
			var store ratelimit.Store
			var closeFn func()
			switch name {
			case "ours: redisstore", "ours: redisstore WithoutCoalescing":
				build := newOursRedis
				if name != "ours: redisstore" {
					build = newOursRedisSingle
				}
				chk, err := build(e)
				if err != nil {
					t.Fatal(err)
				}
				store, closeFn = chk.(*ours).lim.Store(), chk.Close
			default:
				chk, err := newOursRueidis(e)
				if err != nil {
					t.Fatal(err)
				}
				store, closeFn = chk.(*ours).lim.Store(), chk.Close
			}
			defer closeFn()
			ns := "exact-" + randHex()
			lim, err := ratelimit.New[string](store, ratelimit.PerSecond(100), ratelimit.WithNamespace(ns),
				ratelimit.WithClock(func() time.Time { return now }))
			if err != nil {
				t.Fatal(err)
			}
			var allowed, spread, errs atomic.Int64
			var wg sync.WaitGroup
			for w := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 10 {
						d, err := lim.TryAcquire(context.Background(), "hot")
						if err != nil {
							errs.Add(1)
						} else if d.Allowed {
							allowed.Add(1)
						}
						if i < 2 && w < 50 {
							d, err := lim.TryAcquire(context.Background(), "s"+strconv.Itoa(w*2+i))
							if err != nil || !d.Allowed {
								errs.Add(1)
							} else {
								spread.Add(1)
							}
						}
					}
				}()
			}
			wg.Wait()
			if errs.Load() != 0 || allowed.Load() != 100 || spread.Load() != 100 {
				t.Errorf("errors %d, allowed on the hot subject %d (want 100), allowed on 100 fresh subjects %d (want 100)",
					errs.Load(), allowed.Load(), spread.Load())
			}
		})
	}
}

// Benchmarks for profiling one driver at a time, e.g.
//
//	go test -run '^$' -bench 'Redis/ours:_redisstore' -cpuprofile cpu.out
//
// Each runs 64 goroutines (b.SetParallelism) over 10,000 subjects.
func BenchmarkRedis(b *testing.B) {
	srv := testServer(b)
	e := env{addr: srv.addr, policy: policy{rate: 1000, burst: 1000}}
	subjects := makeSubjects("bench", 10000)
	for _, c := range contenders() {
		if !c.remote {
			continue
		}
		b.Run(c.name, func(b *testing.B) {
			chk, err := c.build(e)
			if err != nil {
				b.Fatal(err)
			}
			defer chk.Close()
			b.ReportAllocs()
			b.SetParallelism(max(1, 64/runtimeProcs()))
			var next atomic.Uint64
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					i := next.Add(7919) % uint64(len(subjects))
					if _, err := chk.Check(ctx, subjects[i], 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkMemstore measures memstore through a Limiter[string]: one hot
// subject, and 1,000,000 subjects (prefilled) checked at random, with the
// store's clock real (buckets swept once full) or frozen (all live).
func BenchmarkMemstore(b *testing.B) {
	const n = 1_000_000
	subjects := make([]string, n)
	for i := range subjects {
		subjects[i] = "user:" + strconv.Itoa(i)
	}
	for _, tc := range []struct {
		name  string
		store func() *memstore.Store
	}{
		{"real clock", func() *memstore.Store { return memstore.New() }},
		{"frozen clock", func() *memstore.Store { return memstore.New(memstore.WithClock(frozenClock)) }},
	} {
		b.Run("hot/"+tc.name, func(b *testing.B) {
			lim, _ := ratelimit.New[string](tc.store(), ratelimit.PerSecond(1000))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					lim.TryAcquire(ctx, "hot")
				}
			})
		})
		b.Run("1M/"+tc.name, func(b *testing.B) {
			s := tc.store()
			lim, _ := ratelimit.New[string](s, ratelimit.PerSecond(1000))
			ctx := context.Background()
			for _, k := range subjects {
				lim.TryAcquire(ctx, k)
			}
			b.ReportAllocs()
			b.ResetTimer()
			var seed atomic.Uint64
			b.RunParallel(func(pb *testing.PB) {
				x := seed.Add(0x9e3779b97f4a7c15) | 1
				for pb.Next() {
					x ^= x << 13
					x ^= x >> 7
					x ^= x << 17
					lim.TryAcquire(ctx, subjects[x%n])
				}
			})
			b.ReportMetric(float64(s.Len()), "buckets")
		})
	}
}
