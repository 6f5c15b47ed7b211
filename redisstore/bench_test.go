package redisstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/redisstore"
)

// BenchmarkTryAcquire measures a check through a Limiter over redisstore,
// from parallel goroutines over 10,000 subjects (allocations are exact; the
// time per check is only meaningful on a quiet machine: see bench/).
func BenchmarkTryAcquire(b *testing.B) {
	_, client := standalone(b)
	for _, name := range []string{"lanes=1", "lanes=2", "lanes=4", "lanes=8", "WithoutCoalescing"} {
		b.Run(name, func(b *testing.B) {
			var opts []redisstore.Option
			switch name {
			case "WithoutCoalescing":
				opts = append(opts, redisstore.WithoutCoalescing())
			default:
				n, _ := strconv.Atoi(name[len("lanes="):])
				opts = append(opts, redisstore.WithLanes(uint16(n)))
			}
			l, err := ratelimit.New[string](redisstore.New(client, opts...), ratelimit.PerSecond(1000), ratelimit.WithNamespace("bench"))
			if err != nil {
				b.Fatal(err)
			}
			subjects := make([]string, 10_000)
			for i := range subjects {
				subjects[i] = "s" + strconv.Itoa(i)
			}
			var next atomic.Uint64
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := l.TryAcquire(ctx, subjects[next.Add(1)%uint64(len(subjects))]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkLone measures one caller's checks, one after another (a lone
// check takes a free lane and is sent by its own goroutine), beside the
// one-command floor: a GET of a key of the same server through the same
// client. Run it with GOMAXPROCS=1 and -benchmem; the client's own work per
// call is the difference of the two (allocations exactly, instructions with
// callgrind).
func BenchmarkLone(b *testing.B) {
	_, client := standalone(b)
	ctx := context.Background()
	subjects := make([]string, 1000)
	for i := range subjects {
		subjects[i] = "s" + strconv.Itoa(i)
	}
	b.Run("TryAcquire", func(b *testing.B) {
		l, err := ratelimit.New[string](redisstore.New(client), ratelimit.PerSecond(1000), ratelimit.WithNamespace("lone"))
		if err != nil {
			b.Fatal(err)
		}
		l.TryAcquire(ctx, subjects[0]) // the library loaded
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, err := l.TryAcquire(ctx, subjects[i%len(subjects)]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("floor GET", func(b *testing.B) {
		keys := make([]string, len(subjects))
		for i, s := range subjects {
			keys[i] = "floor:" + s
			client.Set(ctx, keys[i], "1", 0)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if err := client.Get(ctx, keys[i%len(keys)]).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
