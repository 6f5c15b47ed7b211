package otelobserver_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/otelobserver"
	"github.com/exactlimit/ratelimit/tokenbucket"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// meter is a metric.Meter that sums what its counters get, counts what its
// histograms get and keeps the last value of its gauges, by instrument and
// attributes.
type meter struct {
	noop.Meter
	mu     sync.Mutex
	values map[string]float64
	ctxs   []context.Context
}

func newMeter() *meter { return &meter{values: map[string]float64{}} }

func (m *meter) record(ctx context.Context, name string, set attribute.Set, f func(old float64) float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := name + "{" + set.Encoded(attribute.DefaultEncoder()) + "}"
	m.values[k] = f(m.values[k])
	m.ctxs = append(m.ctxs, ctx)
}

func (m *meter) dump() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var lines []string
	for k, v := range m.values {
		lines = append(lines, fmt.Sprintf("%s %v", k, v))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

type counter struct {
	noop.Int64Counter
	m    *meter
	name string
}

func (c counter) Add(ctx context.Context, v int64, opts ...metric.AddOption) {
	c.m.record(ctx, c.name, metric.NewAddConfig(opts).Attributes(), func(old float64) float64 { return old + float64(v) })
}

type histogram struct {
	noop.Float64Histogram
	m    *meter
	name string
}

func (h histogram) Record(ctx context.Context, v float64, opts ...metric.RecordOption) {
	h.m.record(ctx, h.name, metric.NewRecordConfig(opts).Attributes(), func(old float64) float64 { return old + 1 })
}

type gauge struct {
	noop.Int64Gauge
	m    *meter
	name string
}

func (g gauge) Record(ctx context.Context, v int64, opts ...metric.RecordOption) {
	g.m.record(ctx, g.name, metric.NewRecordConfig(opts).Attributes(), func(float64) float64 { return float64(v) })
}

func (m *meter) Int64Counter(name string, _ ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return counter{m: m, name: name}, nil
}

func (m *meter) Float64Histogram(name string, _ ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	return histogram{m: m, name: name}, nil
}

func (m *meter) Int64Gauge(name string, _ ...metric.Int64GaugeOption) (metric.Int64Gauge, error) {
	return gauge{m: m, name: name}, nil
}

func TestObserver(t *testing.T) {
	m := newMeter()
	obs, err := otelobserver.New(m)
	if err != nil {
		t.Fatal(err)
	}
	clock := testkit.NewClock(testkit.Start)
	l, _ := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(2), ratelimit.WithNamespace("api"),
		ratelimit.WithClock(clock.Now), ratelimit.WithObserver(obs), ratelimit.WithDenyCache(8))
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "span")
	l.TryAcquireN(ctx, "a", 2)
	l.TryAcquire(ctx, "a")
	l.TryAcquire(ctx, "a")
	l.Peek(ctx, "a")
	l.TryAcquireN(ctx, "a", 3)
	obs.ObserveError(ctx, ratelimit.ErrorEvent{Namespace: "api", Op: "reset", Err: fmt.Errorf("x: %w", context.DeadlineExceeded)})
	obs.ObserveError(ctx, ratelimit.ErrorEvent{Namespace: "api", Op: "acquire", Err: errors.New("refused")})
	obs.ObserveError(ctx, ratelimit.ErrorEvent{Namespace: "api", Op: "acquire", Err: tokenbucket.ErrCorruptState})
	obs.ObserveError(ctx, ratelimit.ErrorEvent{Namespace: "api", Op: "acquire", Err: context.Canceled})
	obs.ObserveFallback(ctx, fallback.Event{Partition: "m1", At: testkit.Start})
	obs.ObserveFallback(ctx, fallback.Event{Partition: "m1", Alive: true, At: testkit.Start.Add(time.Second)})
	obs.ObserveDecision(ctx, ratelimit.DecisionEvent{Namespace: "api", Cost: 1, Decision: ratelimit.Decision{Source: 42}})
	want := `ratelimit.decision.duration{namespace=api,source=cache} 1
ratelimit.decision.duration{namespace=api,source=store} 3
ratelimit.decision.duration{namespace=api,source=unknown} 1
ratelimit.decisions{namespace=api,op=acquire,result=allowed,source=store} 1
ratelimit.decisions{namespace=api,op=acquire,result=denied,source=cache} 1
ratelimit.decisions{namespace=api,op=acquire,result=denied,source=store} 1
ratelimit.decisions{namespace=api,op=acquire,result=denied,source=unknown} 1
ratelimit.decisions{namespace=api,op=peek,result=denied,source=store} 1
ratelimit.errors{namespace=api,op=acquire,reason=canceled} 1
ratelimit.errors{namespace=api,op=acquire,reason=corrupt_state} 1
ratelimit.errors{namespace=api,op=acquire,reason=invalid_argument} 1
ratelimit.errors{namespace=api,op=acquire,reason=store} 1
ratelimit.errors{namespace=api,op=reset,reason=deadline} 1
ratelimit.primary.transitions{partition=m1,state=down} 1
ratelimit.primary.transitions{partition=m1,state=up} 1
ratelimit.primary.up{partition=m1} 1
ratelimit.tokens{namespace=api,result=allowed} 2
ratelimit.tokens{namespace=api,result=denied} 3`
	if got := m.dump(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	for i, c := range m.ctxs {
		if c.Value(key{}) != "span" {
			t.Fatalf("measurement %d was not made with the check's context", i)
		}
	}
}

// failingMeter refuses one instrument.
type failingMeter struct{ noop.Meter }

func (failingMeter) Int64Gauge(string, ...metric.Int64GaugeOption) (metric.Int64Gauge, error) {
	return nil, errors.New("no gauges here")
}

func TestNewReportsInstrumentErrors(t *testing.T) {
	if _, err := otelobserver.New(failingMeter{}); err == nil || !strings.Contains(err.Error(), "no gauges here") {
		t.Fatalf("err = %v", err)
	}
	if _, err := otelobserver.New(noop.NewMeterProvider().Meter("x")); err != nil {
		t.Fatal(err)
	}
}
