package main

import (
	"context"
	"math/bits"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// hist is a log-linear latency histogram in nanoseconds: 32 buckets per
// power of two, so a quantile is within about 3% of the true value.
type hist [2048]uint32

func histIndex(ns int64) int {
	if ns < 64 {
		return int(max(ns, 0))
	}
	e := bits.Len64(uint64(ns)) - 6
	i := e*32 + int(uint64(ns)>>e)
	return min(i, len(hist{})-1)
}

// histValue is the middle of bucket i.
func histValue(i int) time.Duration {
	if i < 64 {
		return time.Duration(i)
	}
	e := i/32 - 1
	m := int64(i - e*32)
	return time.Duration(m<<e + (int64(1)<<e)/2)
}

func (h *hist) add(o *hist) {
	for i, n := range o {
		h[i] += n
	}
}

// quantile returns the q-quantile (0 < q < 1) of the recorded latencies.
func (h *hist) quantile(q float64) time.Duration {
	var total uint64
	for _, n := range h {
		total += uint64(n)
	}
	if total == 0 {
		return 0
	}
	rank := uint64(q*float64(total-1)) + 1
	var seen uint64
	for i, n := range h {
		seen += uint64(n)
		if seen >= rank {
			return histValue(i)
		}
	}
	return histValue(len(h) - 1)
}

// result is one timed run of one contender at one concurrency and one
// number of subjects.
type result struct {
	ops, allowed, errors int64
	elapsed              time.Duration
	p50, p99             time.Duration
	firstErr             string
}

func (r result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ops) / r.elapsed.Seconds()
}

func (r result) allowedFrac() float64 {
	if r.ops == 0 {
		return 0
	}
	return float64(r.allowed) / float64(r.ops)
}

// runOne drives chk with conc goroutines for d, each check on a subject drawn
// uniformly from subjects, and times every check.
func runOne(chk Checker, conc int, subjects []string, d time.Duration) result {
	// One deadline for the whole run, well past its end: a check that hangs
	// is an error, not a stall of the benchmark.
	ctx, cancel := context.WithTimeout(context.Background(), d+10*time.Second)
	defer cancel()
	var stop atomic.Bool
	var wg sync.WaitGroup
	type local struct {
		h                    hist
		ops, allowed, errors int64
		firstErr             string
	}
	locals := make([]*local, conc)
	start := time.Now()
	for w := range conc {
		l := &local{}
		locals[w] = l
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := uint64(w)*0x9e3779b97f4a7c15 + uint64(start.UnixNano()) | 1
			n := uint64(len(subjects))
			for !stop.Load() {
				s := subjects[0]
				if n > 1 {
					x ^= x << 13
					x ^= x >> 7
					x ^= x << 17
					s = subjects[x%n]
				}
				t0 := time.Now()
				ok, err := chk.Check(ctx, s, 1)
				l.h[histIndex(int64(time.Since(t0)))]++
				l.ops++
				switch {
				case err != nil:
					l.errors++
					if l.firstErr == "" {
						l.firstErr = err.Error()
					}
				case ok:
					l.allowed++
				}
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	var r result
	var h hist
	for _, l := range locals {
		h.add(&l.h)
		r.ops += l.ops
		r.allowed += l.allowed
		r.errors += l.errors
		if r.firstErr == "" {
			r.firstErr = l.firstErr
		}
	}
	r.elapsed = elapsed
	r.p50, r.p99 = h.quantile(0.50), h.quantile(0.99)
	return r
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
