package main

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
	limiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	"golang.org/x/time/rate"
)

// localContender is an in-process limiter.
type localContender struct {
	name  string
	note  string
	build func(p policy) (Checker, error)
}

// frozenClock is a clock that stands still, so that no bucket of memstore
// is full again (and swept) while the live-subject memory is measured.
func frozenClock() time.Time { return frozenAt }

var frozenAt = time.Unix(1_800_000_000, 0)

func localContenders() []localContender {
	lim := func(p policy) ratelimit.Limit { return ratelimit.NewLimit(p.rate, time.Second, p.burst) }
	return []localContender{
		{name: "ours: memstore",
			note: "ratelimit.Limiter[string] over memstore.New(); a bucket is swept once it has been full again (1 ms after one check at 1000/s) for a second",
			build: func(p policy) (Checker, error) {
				return newOursLocal(memstore.New(), env{policy: p})
			}},
		{name: "ours: memstore, all subjects live",
			note: "the same with memstore.WithClock frozen, so none of the 1M buckets is full again or swept: what a live subject costs",
			build: func(p policy) (Checker, error) {
				return newOursLocal(memstore.New(memstore.WithClock(frozenClock)), env{policy: p})
			}},
		{name: "ours: TokenBucket map",
			note: "map[string]*tokenbucket.Bucket behind a mutex, like the x/time/rate map",
			build: func(p policy) (Checker, error) {
				l := lim(p)
				if err := l.Validate(); err != nil {
					return nil, err
				}
				return &bucketMap{limit: l, m: make(map[string]*tokenbucket.Bucket)}, nil
			}},
		{name: "x/time/rate map",
			note: "map[string]*rate.Limiter behind a mutex (golang.org/x/time/rate v0.16.0)",
			build: func(p policy) (Checker, error) {
				return &rateMap{r: rate.Limit(p.rate), b: int(p.burst), m: make(map[string]*rate.Limiter)}, nil
			}},
		{name: "x/time/rate sync.Map",
			note: "*rate.Limiter per subject in a sync.Map (LoadOrStore on a miss), the lock-free read path",
			build: func(p policy) (Checker, error) {
				return &rateSyncMap{r: rate.Limit(p.rate), b: int(p.burst)}, nil
			}},
		{name: "go-limiter memorystore",
			note: "github.com/sethvargo/go-limiter v1.0.0 memorystore (Tokens 1000 per 1s interval)",
			build: func(p policy) (Checker, error) {
				s, err := memorystore.New(&memorystore.Config{Tokens: uint64(p.rate), Interval: time.Second})
				if err != nil {
					return nil, err
				}
				return &goLimiter{s}, nil
			}},
	}
}

type bucketMap struct {
	limit ratelimit.Limit
	mu    sync.Mutex
	m     map[string]*tokenbucket.Bucket
}

func (b *bucketMap) Check(_ context.Context, subject string, cost int64) (bool, error) {
	b.mu.Lock()
	tb := b.m[subject]
	if tb == nil {
		tb, _ = tokenbucket.New(b.limit)
		b.m[subject] = tb
	}
	b.mu.Unlock()
	return tb.AllowN(time.Now(), cost), nil
}
func (b *bucketMap) Close() {}

type rateMap struct {
	r  rate.Limit
	b  int
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (r *rateMap) Check(_ context.Context, subject string, cost int64) (bool, error) {
	r.mu.Lock()
	l := r.m[subject]
	if l == nil {
		l = rate.NewLimiter(r.r, r.b)
		r.m[subject] = l
	}
	r.mu.Unlock()
	return l.AllowN(time.Now(), int(cost)), nil
}
func (r *rateMap) Close() {}

type rateSyncMap struct {
	r rate.Limit
	b int
	m sync.Map // subject -> *rate.Limiter
}

func (r *rateSyncMap) Check(_ context.Context, subject string, cost int64) (bool, error) {
	v, ok := r.m.Load(subject)
	if !ok {
		v, _ = r.m.LoadOrStore(subject, rate.NewLimiter(r.r, r.b))
	}
	return v.(*rate.Limiter).AllowN(time.Now(), int(cost)), nil
}
func (r *rateSyncMap) Close() {}

type goLimiter struct{ s limiter.Store }

func (g *goLimiter) Check(ctx context.Context, subject string, _ int64) (bool, error) {
	_, _, _, ok, err := g.s.Take(ctx, subject)
	return ok, err
}
func (g *goLimiter) Close() { g.s.Close(context.Background()) }

// localResult is what the in-process section reports for one limiter.
type localResult struct {
	name                      string
	hotNs, hotAllocs, hotB    float64
	manyNs, manyAllocs, manyB float64
	bytesPerSubject           float64
	subjects                  int
}

// opStats runs GOMAXPROCS goroutines, each calling op(i) with its own
// counter, for d, and returns ns per op (wall time divided by all ops, as
// b.RunParallel reports it), allocations and bytes allocated per op.
func opStats(d time.Duration, op func(w int, i uint64)) (ns, allocs, bytes float64) {
	procs := runtime.GOMAXPROCS(0)
	var stop atomic.Bool
	var total atomic.Int64
	var wg sync.WaitGroup
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	start := time.Now()
	for w := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n uint64
			for !stop.Load() {
				for range 64 {
					op(w, n)
					n++
				}
			}
			total.Add(int64(n))
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	el := time.Since(start)
	runtime.ReadMemStats(&m1)
	ops := float64(total.Load())
	return float64(el.Nanoseconds()) / ops, float64(m1.Mallocs-m0.Mallocs) / ops, float64(m1.TotalAlloc-m0.TotalAlloc) / ops
}

// heapInUse returns the live heap after two collections.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// measureLocal measures one in-process limiter: ns/op and allocations on a
// hot subject, the heap it keeps per subject after one check on each of n
// subjects (each subject a freshly allocated string, as a server would parse
// it from a request, so a limiter that keeps the key pays for it), and then
// ns/op and allocations of checks spread uniformly over those n subjects.
func measureLocal(lc localContender, p policy, n int, d time.Duration) (localResult, error) {
	res := localResult{name: lc.name, subjects: n}
	ctx := context.Background()

	chk, err := lc.build(p)
	if err != nil {
		return res, err
	}
	hot := "hot-subject"
	res.hotNs, res.hotAllocs, res.hotB = opStats(d, func(int, uint64) { chk.Check(ctx, hot, 1) })
	chk.Close()
	chk = nil

	chk, err = lc.build(p)
	if err != nil {
		return res, err
	}
	before := heapInUse()
	var buf []byte
	for i := range n {
		buf = strconv.AppendInt(append(buf[:0], "user:"...), int64(i), 10)
		chk.Check(ctx, string(buf), 1)
	}
	after := heapInUse()
	res.bytesPerSubject = (float64(after) - float64(before)) / float64(n)

	subjects := make([]string, n)
	for i := range subjects {
		subjects[i] = "user:" + strconv.Itoa(i)
	}
	// One random state per worker, each on its own cache line.
	seeds := make([]struct {
		x uint64
		_ [56]byte
	}, runtime.GOMAXPROCS(0))
	for i := range seeds {
		seeds[i].x = uint64(i)*0x9e3779b97f4a7c15 | 1
	}
	res.manyNs, res.manyAllocs, res.manyB = opStats(d, func(w int, _ uint64) {
		x := seeds[w].x
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		seeds[w].x = x
		chk.Check(ctx, subjects[x%uint64(n)], 1)
	})
	runtime.KeepAlive(subjects)
	chk.Close()
	return res, nil
}
