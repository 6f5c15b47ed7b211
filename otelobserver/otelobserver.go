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

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/obslabel"
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

	attrs obslabel.Cache[metric.MeasurementOption, metric.MeasurementOption] // each namespace's attribute sets, built once
}

// attrSet is the measurement option of an attribute set built once.
func attrSet(kv ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(kv...))
}

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
	o.attrs.B = obslabel.Builders[metric.MeasurementOption, metric.MeasurementOption]{
		Decision: func(ns, op, result, source string) metric.MeasurementOption {
			return attrSet(attribute.String("namespace", ns), attribute.String("op", op), attribute.String("result", result), attribute.String("source", source))
		},
		Tokens: func(ns, result string) metric.MeasurementOption {
			return attrSet(attribute.String("namespace", ns), attribute.String("result", result))
		},
		Duration: func(ns, source string) metric.MeasurementOption {
			return attrSet(attribute.String("namespace", ns), attribute.String("source", source))
		},
	}
	return o, nil
}

// ObserveDecision counts a decision, its tokens and its duration.
func (o *Observer) ObserveDecision(ctx context.Context, e ratelimit.DecisionEvent) {
	decision, tokens, acquired, duration := o.attrs.Observe(e)
	o.decisions.Add(ctx, 1, decision)
	o.duration.Record(ctx, e.Latency.Seconds(), duration)
	if acquired {
		o.tokens.Add(ctx, e.Cost, tokens)
	}
}

// ObserveError counts an error by its reason: "invalid_argument",
// "corrupt_state", "canceled", "deadline" or "store".
func (o *Observer) ObserveError(ctx context.Context, e ratelimit.ErrorEvent) {
	o.errors.Add(ctx, 1, metric.WithAttributes(attribute.String("namespace", e.Namespace),
		attribute.String("op", e.Op), attribute.String("reason", obslabel.Reason(e.Err))))
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
