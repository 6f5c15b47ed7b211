package operator

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit/internal/latency"
)

// checkLatency bins the checks' latencies: 4 bins per power of two of
// nanoseconds, from 2^10 ns (about 1 µs) to 2^35 ns (about 34 s). A bin
// spans at most 20% of its upper bound; shorter and longer latencies fall
// in the first and last bins.
var checkLatency = latency.Layout{SubBits: latencySubBits, MinOctave: latencyMinOctave, MaxOctave: latencyMaxOctave}

const (
	latencySubBits   = 2
	latencyMinOctave = 10
	latencyMaxOctave = 34
	latencyBins      = (latencyMaxOctave - latencyMinOctave + 1) << latencySubBits // checkLatency.Len(), as a constant
)

// rateRing counts the acquires of each step (a RateStep of the clock) in a
// ring of slots. A slot is claimed for a step by the first event of the
// step; an event of a step older than its slot's is dropped from the ring
// (it is in the totals).
type rateRing struct {
	mu    sync.Mutex // held only to claim a slot for a new step
	slots [rateSlots]rateSlot
}

type rateSlot struct {
	step            atomic.Int64
	allowed, denied atomic.Uint32 // in one step: 4e9 is far beyond any store's rate
}

func (r *rateRing) add(step int64, allowed bool) {
	sl := &r.slots[uint64(step)%rateSlots]
	if sl.step.Load() != step {
		r.mu.Lock()
		if cur := sl.step.Load(); cur < step {
			sl.allowed.Store(0)
			sl.denied.Store(0)
			sl.step.Store(step)
		} else if cur > step {
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
	if allowed {
		sl.allowed.Add(1)
	} else {
		sl.denied.Add(1)
	}
}

// counts returns the acquires allowed and denied in each of the n steps
// ending with step last, oldest first.
func (r *rateRing) counts(last int64, n int) (allowed, denied []uint64) {
	allowed, denied = make([]uint64, n), make([]uint64, n)
	for i := range n {
		step := last - int64(n-1-i)
		sl := &r.slots[uint64(step)%rateSlots]
		if sl.step.Load() == step {
			allowed[i], denied[i] = uint64(sl.allowed.Load()), uint64(sl.denied.Load())
		}
	}
	return allowed, denied
}

// latencyRing is a latency histogram per step, over the steps of
// LatencyWindow.
type latencyRing struct {
	mu    sync.Mutex
	slots [latencySlots]latencySlot
}

type latencySlot struct {
	step atomic.Int64
	bins [latencyBins]atomic.Uint32
}

func (r *latencyRing) add(step int64, d time.Duration) {
	sl := &r.slots[uint64(step)%uint64(latencySlots)]
	if sl.step.Load() != step {
		r.mu.Lock()
		if cur := sl.step.Load(); cur < step {
			for i := range sl.bins {
				sl.bins[i].Store(0)
			}
			sl.step.Store(step)
		} else if cur > step {
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
	sl.bins[checkLatency.Bin(d)].Add(1)
}

// histogram sums the bins of the steps of LatencyWindow ending with last.
func (r *latencyRing) histogram(last int64) (bins [latencyBins]uint64, total uint64) {
	for i := range int64(latencySlots) {
		step := last - i
		sl := &r.slots[uint64(step)%uint64(latencySlots)]
		if sl.step.Load() != step {
			continue
		}
		for j := range bins {
			n := uint64(sl.bins[j].Load())
			bins[j] += n
			total += n
		}
	}
	return bins, total
}
