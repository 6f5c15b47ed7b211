// Package latency bins durations for percentiles, the one binning of the
// operator page's figures and the bench commands: log-linear bins,
// 2^SubBits of them per power of two of nanoseconds, so that a bin spans at
// most 1/(2^SubBits+1) of its upper bound and a percentile read as a bin's
// upper bound is that close to the true value. Layout maps a duration to
// its bin and a bin to its bound; Histogram counts durations in a Layout
// for one writer.
package latency

import (
	"math/bits"
	"time"
)

// Layout is a binning of durations: 2^SubBits bins per power of two of
// nanoseconds, from 2^MinOctave ns to 2^(MaxOctave+1) ns; shorter
// durations fall in the first bin, longer ones in the last. SubBits must
// be at most MinOctave, and MaxOctave at most 61.
type Layout struct {
	SubBits, MinOctave, MaxOctave int
}

// Len returns the number of bins.
func (l Layout) Len() int { return (l.MaxOctave - l.MinOctave + 1) << l.SubBits }

// Bin returns the bin of d.
func (l Layout) Bin(d time.Duration) int {
	ns := uint64(max(d, 0))
	octave := bits.Len64(ns) - 1 // ns in [2^octave, 2^(octave+1))
	if octave < l.MinOctave {
		return 0
	}
	if octave > l.MaxOctave {
		return l.Len() - 1
	}
	sub := int(ns>>(octave-l.SubBits)) & (1<<l.SubBits - 1)
	return (octave-l.MinOctave)<<l.SubBits + sub
}

// Upper returns the upper bound of bin i.
func (l Layout) Upper(i int) time.Duration {
	octave := l.MinOctave + i>>l.SubBits
	sub := i & (1<<l.SubBits - 1)
	return time.Duration(uint64(1<<l.SubBits+sub+1) << (octave - l.SubBits))
}

// Quantile returns the upper bound of the bin that holds quantile q (0 to
// 1) of counts, a count per bin of l whose sum is total; 0 when total is 0.
func (l Layout) Quantile(counts []uint64, total uint64, q float64) time.Duration {
	if total == 0 {
		return 0
	}
	rank := uint64(q*float64(total) + 0.999999)
	rank = min(max(rank, 1), total)
	var seen uint64
	for i, n := range counts {
		seen += n
		if seen >= rank {
			return l.Upper(i)
		}
	}
	return l.Upper(len(counts) - 1)
}

// Histogram counts durations in the bins of a Layout. It is for one writer
// (or its caller locks); merge the histograms of several writers with
// Merge once they are done.
type Histogram struct {
	layout Layout
	counts []uint64
	total  uint64
}

// NewHistogram returns an empty Histogram of l.
func NewHistogram(l Layout) *Histogram {
	return &Histogram{layout: l, counts: make([]uint64, l.Len())}
}

// Record counts d.
func (h *Histogram) Record(d time.Duration) {
	h.counts[h.layout.Bin(d)]++
	h.total++
}

// Merge adds o's counts, of the same Layout, to h's.
func (h *Histogram) Merge(o *Histogram) {
	for i, n := range o.counts {
		h.counts[i] += n
	}
	h.total += o.total
}

// Count returns the number of durations recorded.
func (h *Histogram) Count() uint64 { return h.total }

// Quantile returns the upper bound of the bin that holds quantile q.
func (h *Histogram) Quantile(q float64) time.Duration {
	return h.layout.Quantile(h.counts, h.total, q)
}

// Max returns the upper bound of the highest bin that holds a duration, 0
// when none.
func (h *Histogram) Max() time.Duration {
	for i := len(h.counts) - 1; i >= 0; i-- {
		if h.counts[i] > 0 {
			return h.layout.Upper(i)
		}
	}
	return 0
}
