package metrics

import (
	"strings"
	"sync"
	"testing"
)

func TestExposition(t *testing.T) {
	var r Registry
	c := r.NewCounter("x_total", "Things.\nCounted.", "ns", "outcome")
	g := r.NewGauge("x_state", "State.")
	r.NewGaugeFunc("x_up", "Up.", func() float64 { return 1 })
	h := r.NewHistogram("x_seconds", "Latency.", []float64{0.5, 0.1}, "op")
	c.Inc("b", "allowed")
	c.Add(2, "a\"\\\n", "denied")
	g.Set(0.25)
	h.Observe(0.05, "get")
	h.Observe(0.3, "get")
	h.Observe(7, "get")
	var b strings.Builder
	if _, err := r.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	want := `# HELP x_total Things.\nCounted.
# TYPE x_total counter
x_total{ns="a\"\\\n",outcome="denied"} 2
x_total{ns="b",outcome="allowed"} 1
# HELP x_state State.
# TYPE x_state gauge
x_state 0.25
# HELP x_up Up.
# TYPE x_up gauge
x_up 1
# HELP x_seconds Latency.
# TYPE x_seconds histogram
x_seconds_bucket{op="get",le="0.1"} 1
x_seconds_bucket{op="get",le="0.5"} 2
x_seconds_bucket{op="get",le="+Inf"} 3
x_seconds_sum{op="get"} 7.35
x_seconds_count{op="get"} 3
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestConcurrentUpdates(t *testing.T) {
	var r Registry
	c := r.NewCounter("c_total", "c", "k")
	h := r.NewHistogram("h", "h", []float64{1})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				c.Inc([]string{"a", "b"}[i%2])
				h.Observe(0.5)
			}
		}()
	}
	var b strings.Builder
	r.WriteTo(&b)
	wg.Wait()
	if got := c.Value("a") + c.Value("b"); got != 8000 {
		t.Errorf("count = %d, want 8000", got)
	}
	if got := h.Count(); got != 8000 {
		t.Errorf("histogram count = %d, want 8000", got)
	}
}
