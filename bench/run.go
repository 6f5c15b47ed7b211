package main

import (
	"context"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit/internal/latency"
)

// runLatency bins the checks' latencies: 32 bins per power of two of
// nanoseconds, so that a quantile, the upper bound of its bin, is within
// about 3% of the true value; from 64 ns to about 18 minutes.
var runLatency = latency.Layout{SubBits: 5, MinOctave: 6, MaxOctave: 40}

// result is one timed run of one contender at one concurrency and one
// number of subjects.
type result struct {
	ops, allowed, errors int64
	elapsed              time.Duration
	p50, p99             time.Duration
	firstErr             string
	// cpu is this process's CPU time (user and system) over the run: the
	// client's, and the driver's own timing of each check, which every
	// contender pays alike. 0 when it cannot be read.
	cpu time.Duration
	// redisCPU is the redis-server's CPU time over the run, to the tick
	// (10 ms), when the run started it; 0 otherwise.
	redisCPU time.Duration
}

// cpuPerOp is the client's CPU per check.
func (r result) cpuPerOp() time.Duration {
	if r.ops == 0 {
		return 0
	}
	return r.cpu / time.Duration(r.ops)
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
		h                    *latency.Histogram
		ops, allowed, errors int64
		firstErr             string
	}
	locals := make([]*local, conc)
	cpu0 := processCPU()
	start := time.Now()
	for w := range conc {
		l := &local{h: latency.NewHistogram(runLatency)}
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
				l.h.Record(time.Since(t0))
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
	if cpu0 > 0 {
		r.cpu = processCPU() - cpu0
	}
	h := latency.NewHistogram(runLatency)
	for _, l := range locals {
		h.Merge(l.h)
		r.ops += l.ops
		r.allowed += l.allowed
		r.errors += l.errors
		if r.firstErr == "" {
			r.firstErr = l.firstErr
		}
	}
	r.elapsed = elapsed
	r.p50, r.p99 = h.Quantile(0.50), h.Quantile(0.99)
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
