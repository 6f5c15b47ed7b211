package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/memstore"
	"github.com/sethvargo/go-limiter/memorystore"
)

// The BenchmarkCG benchmarks check 1,000,000 subjects ("user:N", made and
// checked once each first, as the in-process section does) in a random
// order from one goroutine, for an instruction and cache-miss count per
// check that does not depend on the machine's load: callgrind counts the
// loop alone (cgLoop), e.g.
//
//	go test -c -o /tmp/b.test . && GOGC=off GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 \
//	  valgrind --tool=callgrind --cache-sim=yes --LL=16777216,16,64 --toggle-collect='*cgLoop*' \
//	  /tmp/b.test -test.run '^$' -test.bench '^BenchmarkCGOursFrozen$' -test.benchtime 100000x
//
// and callgrind_annotate's totals divided by 100,000. GOGC=off keeps a
// collection (and its write barriers) out of the count; asyncpreemptoff
// keeps callgrind from aborting on a preemption signal.
func cgMany(b *testing.B, build func() Checker) {
	const n = 1_000_000
	ctx := context.Background()
	chk := build()
	subjects := make([]string, n)
	for i := range subjects {
		subjects[i] = "user:" + strconv.Itoa(i)
	}
	var buf []byte
	for i := range n {
		buf = strconv.AppendInt(append(buf[:0], "user:"...), int64(i), 10)
		chk.Check(ctx, string(buf), 1)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cgLoop(ctx, b.N, chk, subjects)
}

//go:noinline
func cgLoop(ctx context.Context, N int, chk Checker, subjects []string) {
	x := uint64(0x9e3779b97f4a7c15)
	n := uint64(len(subjects))
	for range N {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		chk.Check(ctx, subjects[x%n], 1)
	}
}

func BenchmarkCGOurs(b *testing.B) {
	cgMany(b, func() Checker {
		c, _ := newOursLocal(memstore.New(), env{policy: policy{rate: 1000, burst: 1000}})
		return c
	})
}
func BenchmarkCGOursFrozen(b *testing.B) {
	cgMany(b, func() Checker {
		c, _ := newOursLocal(memstore.New(memstore.WithClock(frozenClock)), env{policy: policy{rate: 1000, burst: 1000}})
		return c
	})
}

// stepped is a clock that advances 300 ns a read: the dynamics of a store
// checked about 3M times a second, whatever the machine's load.
func stepped() func() time.Time {
	t := frozenAt
	return func() time.Time { t = t.Add(300 * time.Nanosecond); return t }
}

func BenchmarkCGOursStepped(b *testing.B) {
	cgMany(b, func() Checker {
		c, _ := newOursLocal(memstore.New(memstore.WithClock(stepped())), env{policy: policy{rate: 1000, burst: 1000}})
		return c
	})
}

func BenchmarkCGGoLimiter(b *testing.B) {
	cgMany(b, func() Checker {
		s, _ := memorystore.New(&memorystore.Config{Tokens: 1000, Interval: time.Second})
		return &goLimiter{s}
	})
}
