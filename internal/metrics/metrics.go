// Package metrics keeps counters, gauges and histograms in memory and writes
// them in the Prometheus text exposition format (version 0.0.4), with no
// client library. Every metric is safe for simultaneous use by multiple
// goroutines; updates are lock-free once a label set has been seen.
package metrics

import (
	"bufio"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// ContentType is the Content-Type of the text exposition format.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Registry holds metrics in the order they were registered.
type Registry struct {
	mu      sync.Mutex
	metrics []metric
}

type metric interface {
	write(w *bufio.Writer)
}

// WriteTo writes every metric in the text format.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	r.mu.Lock()
	ms := slices.Clone(r.metrics)
	r.mu.Unlock()
	cw := &countWriter{w: w}
	bw := bufio.NewWriter(cw)
	for _, m := range ms {
		m.write(bw)
	}
	err := bw.Flush()
	return cw.n, err
}

func (r *Registry) add(m metric) {
	r.mu.Lock()
	r.metrics = append(r.metrics, m)
	r.mu.Unlock()
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// family is the name, help and label names of a metric, and its series by
// label values.
type family[T any] struct {
	name, help, typ string
	labels          []string
	mu              sync.RWMutex
	series          map[string]*T
	values          map[string][]string
	make            func() *T
}

func newFamily[T any](name, help, typ string, labels []string, mk func() *T) *family[T] {
	return &family[T]{name: name, help: help, typ: typ, labels: labels,
		series: map[string]*T{}, values: map[string][]string{}, make: mk}
}

// with returns the series of the label values, creating it on first use.
// Missing values are empty; extra ones are dropped.
func (f *family[T]) with(values []string) *T {
	vals := make([]string, len(f.labels))
	copy(vals, values)
	key := strings.Join(vals, "\xff")
	f.mu.RLock()
	s := f.series[key]
	f.mu.RUnlock()
	if s != nil {
		return s
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if s = f.series[key]; s == nil {
		s = f.make()
		f.series[key] = s
		f.values[key] = vals
	}
	return s
}

// each calls fn for every series in a stable order (sorted by label values).
func (f *family[T]) each(fn func(labels string, s *T)) {
	f.mu.RLock()
	keys := make([]string, 0, len(f.series))
	for k := range f.series {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	type entry struct {
		labels string
		s      *T
	}
	entries := make([]entry, len(keys))
	for i, k := range keys {
		entries[i] = entry{formatLabels(f.labels, f.values[k]), f.series[k]}
	}
	f.mu.RUnlock()
	for _, e := range entries {
		fn(e.labels, e.s)
	}
}

func (f *family[T]) header(w *bufio.Writer) {
	w.WriteString("# HELP " + f.name + " " + escapeHelp(f.help) + "\n")
	w.WriteString("# TYPE " + f.name + " " + f.typ + "\n")
}

// Counter is a family of monotonically increasing counters.
type Counter struct{ f *family[atomic.Uint64] }

// NewCounter registers a counter family with the given label names.
func (r *Registry) NewCounter(name, help string, labels ...string) *Counter {
	c := &Counter{newFamily(name, help, "counter", labels, func() *atomic.Uint64 { return new(atomic.Uint64) })}
	r.add(c)
	return c
}

// Add adds n to the series of the label values.
func (c *Counter) Add(n uint64, labelValues ...string) { c.f.with(labelValues).Add(n) }

// Inc adds one to the series of the label values.
func (c *Counter) Inc(labelValues ...string) { c.Add(1, labelValues...) }

// Value returns the series' count (0 when it was never touched).
func (c *Counter) Value(labelValues ...string) uint64 { return c.f.with(labelValues).Load() }

func (c *Counter) write(w *bufio.Writer) {
	c.f.header(w)
	c.f.each(func(labels string, s *atomic.Uint64) {
		w.WriteString(c.f.name + labels + " " + strconv.FormatUint(s.Load(), 10) + "\n")
	})
}

// Gauge is a family of values that go up and down.
type Gauge struct{ f *family[atomic.Uint64] } // float64 bits

// NewGauge registers a gauge family with the given label names.
func (r *Registry) NewGauge(name, help string, labels ...string) *Gauge {
	g := &Gauge{newFamily(name, help, "gauge", labels, func() *atomic.Uint64 { return new(atomic.Uint64) })}
	r.add(g)
	return g
}

// Set sets the series of the label values to v.
func (g *Gauge) Set(v float64, labelValues ...string) {
	g.f.with(labelValues).Store(math.Float64bits(v))
}

// Value returns the series' value.
func (g *Gauge) Value(labelValues ...string) float64 {
	return math.Float64frombits(g.f.with(labelValues).Load())
}

func (g *Gauge) write(w *bufio.Writer) {
	g.f.header(w)
	g.f.each(func(labels string, s *atomic.Uint64) {
		w.WriteString(g.f.name + labels + " " + formatFloat(math.Float64frombits(s.Load())) + "\n")
	})
}

// GaugeFunc is a gauge without labels whose value is read at each scrape.
type GaugeFunc struct {
	name, help string
	fn         func() float64
}

// NewGaugeFunc registers a gauge read from fn at each scrape.
func (r *Registry) NewGaugeFunc(name, help string, fn func() float64) *GaugeFunc {
	g := &GaugeFunc{name, help, fn}
	r.add(g)
	return g
}

func (g *GaugeFunc) write(w *bufio.Writer) {
	w.WriteString("# HELP " + g.name + " " + escapeHelp(g.help) + "\n")
	w.WriteString("# TYPE " + g.name + " gauge\n")
	w.WriteString(g.name + " " + formatFloat(g.fn()) + "\n")
}

// Histogram is a family of histograms with fixed bucket upper bounds.
type Histogram struct {
	f      *family[hist]
	bounds []float64
}

type hist struct {
	counts []atomic.Uint64 // one per bound, plus +Inf; not cumulative
	sum    atomic.Uint64   // float64 bits
	count  atomic.Uint64
}

// NewHistogram registers a histogram family with the given bucket upper
// bounds (sorted ascending; +Inf is implied) and label names.
func (r *Registry) NewHistogram(name, help string, bounds []float64, labels ...string) *Histogram {
	bounds = slices.Clone(bounds)
	slices.Sort(bounds)
	h := &Histogram{bounds: bounds}
	h.f = newFamily(name, help, "histogram", labels, func() *hist {
		return &hist{counts: make([]atomic.Uint64, len(bounds)+1)}
	})
	r.add(h)
	return h
}

// Observe records v in the series of the label values.
func (h *Histogram) Observe(v float64, labelValues ...string) {
	s := h.f.with(labelValues)
	i, _ := slices.BinarySearch(h.bounds, v)
	s.counts[i].Add(1)
	for {
		old := s.sum.Load()
		if s.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			break
		}
	}
	s.count.Add(1)
}

// Count returns the number of observations in the series.
func (h *Histogram) Count(labelValues ...string) uint64 { return h.f.with(labelValues).count.Load() }

func (h *Histogram) write(w *bufio.Writer) {
	h.f.header(w)
	h.f.each(func(labels string, s *hist) {
		var cum uint64
		for i := range s.counts {
			cum += s.counts[i].Load()
			le := "+Inf"
			if i < len(h.bounds) {
				le = formatFloat(h.bounds[i])
			}
			w.WriteString(h.f.name + "_bucket" + withLabel(labels, "le", le) + " " + strconv.FormatUint(cum, 10) + "\n")
		}
		w.WriteString(h.f.name + "_sum" + labels + " " + formatFloat(math.Float64frombits(s.sum.Load())) + "\n")
		w.WriteString(h.f.name + "_count" + labels + " " + strconv.FormatUint(cum, 10) + "\n")
	})
}

// formatLabels returns {a="x",b="y"}, or "" without labels.
func formatLabels(names, values []string) string {
	if len(names) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(n)
		b.WriteString(`="`)
		b.WriteString(escapeLabel(values[i]))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// withLabel adds name="value" to a formatted label set.
func withLabel(labels, name, value string) string {
	l := name + `="` + escapeLabel(value) + `"`
	if labels == "" {
		return "{" + l + "}"
	}
	return labels[:len(labels)-1] + "," + l + "}"
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }
func escapeHelp(s string) string  { return helpEscaper.Replace(s) }

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
