package latency

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestLayoutBins holds every layout the project uses to its promise: a
// duration falls in the bin whose bounds hold it, a bin spans at most
// 1/(2^SubBits+1) of its upper bound, and the ends take what is outside.
func TestLayoutBins(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, l := range []Layout{{2, 10, 34}, {4, 5, 40}, {5, 6, 40}, {0, 0, 61}} {
		width := 1 / float64(int(1)<<l.SubBits+1)
		for range 20000 {
			d := time.Duration(1<<l.MinOctave + rng.Int64N(1<<(l.MaxOctave+1)-1<<l.MinOctave))
			i := l.Bin(d)
			up := l.Upper(i)
			if up <= d || (i > 0 && l.Upper(i-1) > d) {
				t.Fatalf("%+v: %v in bin %d of bounds [%v, %v)", l, d, i, l.Upper(i-1), up)
			}
			if float64(up-d) > width*float64(up)+1 {
				t.Fatalf("%+v: %v in a bin of upper bound %v: more than %.1f%% below it", l, d, up, 100*width)
			}
		}
		if got := l.Bin(-time.Second); got != 0 {
			t.Errorf("%+v: a negative duration in bin %d", l, got)
		}
		if got := l.Bin(1<<62 + 1); got != l.Len()-1 {
			t.Errorf("%+v: 2^62 ns in bin %d of %d", l, got, l.Len())
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	l := Layout{SubBits: 4, MinOctave: 5, MaxOctave: 40}
	h, o := NewHistogram(l), NewHistogram(l)
	if h.Quantile(0.5) != 0 || h.Max() != 0 {
		t.Errorf("empty: p50 %v max %v, want 0", h.Quantile(0.5), h.Max())
	}
	for i := 1; i <= 50; i++ {
		h.Record(time.Duration(i) * time.Millisecond)
		o.Record(time.Duration(50+i) * time.Millisecond)
	}
	h.Merge(o)
	if h.Count() != 100 {
		t.Fatalf("count %d, want 100", h.Count())
	}
	for q, want := range map[float64]time.Duration{0: time.Millisecond, 0.5: 50 * time.Millisecond, 0.99: 99 * time.Millisecond, 1: 100 * time.Millisecond} {
		if got := h.Quantile(q); got <= want || float64(got) > 1.07*float64(want) {
			t.Errorf("quantile %v = %v, want just above %v", q, got, want)
		}
	}
	if got := h.Max(); got != h.Quantile(1) {
		t.Errorf("max %v, quantile 1 %v", got, h.Quantile(1))
	}
}
