// Package otelobserver records what a ratelimit.Limiter does with
// OpenTelemetry metric instruments: it is a ratelimit.Observer (attach it
// with ratelimit.WithObserver) built on any metric.Meter.
//
//	obs, err := otelobserver.New(otel.Meter("github.com/exactlimit/ratelimit"))
//	limiter, err := ratelimit.New[string](store, ratelimit.PerSecond(100),
//		ratelimit.WithNamespace("api"), ratelimit.WithObserver(obs))
//
// The instruments, with the same meaning and attributes as package
// promobserver's series (no attribute names a subject):
//
//	ratelimit.decisions          counter    namespace, op, result, source
//	ratelimit.tokens             counter    namespace, result ({token})
//	ratelimit.decision.duration  histogram  namespace, source (s)
//	ratelimit.errors             counter    namespace, op, reason
//	ratelimit.primary.up         gauge      partition
//	ratelimit.primary.transitions counter   partition, state
//
// Measurements carry the check's context, so an SDK can attach exemplars of
// the caller's span. An Observer is safe for simultaneous use by multiple
// goroutines.
package otelobserver

import (
	"context"
	"errors"
	"sync"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/tokenbucket"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Observer records a Limiter's events with OpenTelemetry instruments. Create
// it with New.
type Observer struct {
	decisions   metric.Int64Counter
	tokens      metric.Int64Counter
	duration    metric.Float64Histogram
	errors      metric.Int64Counter
	up          metric.Int64Gauge
	transitions metric.Int64Counter

	namespaces sync.Map // namespace -> *attrs
}

const sources = int(ratelimit.SourceCache) + 1

// attrs holds one namespace's attribute sets, built once.
type attrs struct {
	decisions [2][2][sources]metric.MeasurementOption // [peek][allowed][source]
	tokens    [2]metric.MeasurementOption             // [allowed]
	duration  [sources]metric.MeasurementOption
}

var (
	opNames     = [2]string{"acquire", "peek"}
	resultNames = [2]string{"denied", "allowed"}
)

// New creates the instruments on meter.
func New(meter metric.Meter) (*Observer, error) {
	o := &Observer{}
	var err, e error
	o.decisions, e = meter.Int64Counter("ratelimit.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Rate limit checks decided, by namespace, operation, result and what decided them."))
	err = errors.Join(err, e)
	o.tokens, e = meter.Int64Counter("ratelimit.tokens", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens asked for by the acquires decided, by namespace and result."))
	err = errors.Join(err, e)
	o.duration, e = meter.Float64Histogram("ratelimit.decision.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a check's call to its decision, by namespace and what decided it."),
		metric.WithExplicitBucketBoundaries(.000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1))
	err = errors.Join(err, e)
	o.errors, e = meter.Int64Counter("ratelimit.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Rate limit checks and resets that returned an error, by namespace, operation and reason."))
	err = errors.Join(err, e)
	o.up, e = meter.Int64Gauge("ratelimit.primary.up",
		metric.WithDescription("1 while a fallback store sends checks to its primary store, 0 while the primary is marked down."))
	err = errors.Join(err, e)
	o.transitions, e = meter.Int64Counter("ratelimit.primary.transitions", metric.WithUnit("{transition}"),
		metric.WithDescription("Changes of a fallback store's primary between up and down, by partition and new state."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, err
	}
	return o, nil
}

func index(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (o *Observer) attrs(ns string) *attrs {
	if a, ok := o.namespaces.Load(ns); ok {
		return a.(*attrs)
	}
	a := &attrs{}
	nsAttr := attribute.String("namespace", ns)
	for peek := range 2 {
		for allowed := range 2 {
			for src := range sources {
				a.decisions[peek][allowed][src] = metric.WithAttributeSet(attribute.NewSet(nsAttr,
					attribute.String("op", opNames[peek]), attribute.String("result", resultNames[allowed]),
					attribute.String("source", ratelimit.Source(src).String())))
			}
		}
	}
	for allowed := range 2 {
		a.tokens[allowed] = metric.WithAttributeSet(attribute.NewSet(nsAttr, attribute.String("result", resultNames[allowed])))
	}
	for src := range sources {
		a.duration[src] = metric.WithAttributeSet(attribute.NewSet(nsAttr, attribute.String("source", ratelimit.Source(src).String())))
	}
	actual, _ := o.namespaces.LoadOrStore(ns, a)
	return actual.(*attrs)
}

// ObserveDecision counts a decision, its tokens and its duration.
func (o *Observer) ObserveDecision(ctx context.Context, e ratelimit.DecisionEvent) {
	a := o.attrs(e.Namespace)
	d := e.Decision
	allowed := index(d.Allowed)
	if src := int(d.Source); src < sources {
		o.decisions.Add(ctx, 1, a.decisions[index(e.Peek)][allowed][src])
		o.duration.Record(ctx, e.Latency.Seconds(), a.duration[src])
	} else {
		ns := attribute.String("namespace", e.Namespace)
		o.decisions.Add(ctx, 1, metric.WithAttributes(ns, attribute.String("op", opNames[index(e.Peek)]),
			attribute.String("result", resultNames[allowed]), attribute.String("source", d.Source.String())))
		o.duration.Record(ctx, e.Latency.Seconds(), metric.WithAttributes(ns, attribute.String("source", d.Source.String())))
	}
	if !e.Peek {
		o.tokens.Add(ctx, e.Cost, a.tokens[allowed])
	}
}

// ObserveError counts an error by its reason: "invalid_argument",
// "corrupt_state", "canceled", "deadline" or "store".
func (o *Observer) ObserveError(ctx context.Context, e ratelimit.ErrorEvent) {
	o.errors.Add(ctx, 1, metric.WithAttributes(attribute.String("namespace", e.Namespace),
		attribute.String("op", e.Op), attribute.String("reason", reason(e.Err))))
}

// ObserveFallback records a fallback store's change of state.
func (o *Observer) ObserveFallback(ctx context.Context, e fallback.Event) {
	up, state := int64(0), "down"
	if e.Alive {
		up, state = 1, "up"
	}
	p := attribute.String("partition", e.Partition)
	o.up.Record(ctx, up, metric.WithAttributes(p))
	o.transitions.Add(ctx, 1, metric.WithAttributes(p, attribute.String("state", state)))
}

func reason(err error) string {
	switch {
	case errors.Is(err, ratelimit.ErrInvalidArgument):
		return "invalid_argument"
	case errors.Is(err, tokenbucket.ErrCorruptState):
		return "corrupt_state"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	return "store"
}
