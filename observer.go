package ratelimit

import (
	"context"
	"time"
)

// Observer is told what a Limiter does, for metrics, logs and traces: every
// decision and every check or reset that could not be decided. WithObserver
// attaches one to a Limiter; packages promobserver and otelobserver adapt it
// to Prometheus and OpenTelemetry. (A fallback store's own changes of state
// reach fallback.WithObserver, not the Limiter.)
//
// The Limiter calls it synchronously, on the goroutine of the check, after
// the decision is made and before it is returned, with the check's context
// (a tracer finds the caller's span in it), so an Observer must be quick
// (count, don't log every denial) and safe for simultaneous use by multiple
// goroutines. The context may already be cancelled: it is for reading
// values, not for doing I/O under.
type Observer interface {
	// ObserveDecision is called once per decided check: by the store, by a
	// fallback's outage behaviour, or by the denial cache (see
	// Decision.Source).
	ObserveDecision(context.Context, DecisionEvent)
	// ObserveError is called once per check or reset that returned an
	// error: an invalid argument, an unreachable or failing store, a
	// corrupt bucket, or the caller's cancelled context.
	ObserveError(context.Context, ErrorEvent)
}

// DecisionEvent describes one decided check.
type DecisionEvent struct {
	// Namespace is the limiter's namespace.
	Namespace string
	// Key is the store key of the subject (see Limiter.Key). It identifies
	// a subject: keep it out of metric labels.
	Key string
	// Cost is the number of tokens the check asked for; 1 for a Peek; the
	// largest of a Reserve's costs per limit.
	Cost int64
	// Peek reports whether the check was a Peek, which takes nothing.
	Peek bool
	// Decision is the decision returned to the caller. Its Source tells
	// what decided: the store, an outage behaviour, or the denial cache.
	Decision Decision
	// Latency is the time the limiter spent on the check, from the call to
	// the decision, measured on the monotonic clock (never the injected
	// one). The items of a TryAcquireMany share the batch's latency.
	Latency time.Duration
}

// ErrorEvent describes a check or reset that returned an error instead of a
// decision.
type ErrorEvent struct {
	// Namespace is the limiter's namespace.
	Namespace string
	// Key is the subject's store key, also when the check was refused for
	// its cost or its time; it is "" only when the subject itself was
	// invalid (it encoded to an empty string), or for a settle by token
	// (Limiter.Settle), which does not know the subject.
	Key string
	// Op is the operation that failed: "acquire" (TryAcquire, TryAcquireN,
	// an item of TryAcquireMany, Wait), "peek", "reset", "reserve" or
	// "settle" (a Reservation's Settle or Cancel, or Limiter.Settle).
	Op string
	// Cost is the number of tokens asked for (1 for a Peek, 0 for a
	// Reset, the largest of several costs or used counts of a Reserve or a
	// Settle).
	Cost int64
	// Err is the error returned to the caller. errors.Is tells its kind:
	// ErrInvalidArgument (reported before any store is called),
	// tokenbucket.ErrCorruptState, context.Canceled, or a store that
	// failed.
	Err error
	// Latency is the time the operation took, as in DecisionEvent.
	Latency time.Duration
}

// ObserverFuncs is an Observer made of functions, for observing only some
// events: a nil field ignores its kind.
type ObserverFuncs struct {
	// Decision receives every DecisionEvent.
	Decision func(context.Context, DecisionEvent)
	// Error receives every ErrorEvent.
	Error func(context.Context, ErrorEvent)
}

// ObserveDecision calls f.Decision, if set.
func (f ObserverFuncs) ObserveDecision(ctx context.Context, e DecisionEvent) {
	if f.Decision != nil {
		f.Decision(ctx, e)
	}
}

// ObserveError calls f.Error, if set.
func (f ObserverFuncs) ObserveError(ctx context.Context, e ErrorEvent) {
	if f.Error != nil {
		f.Error(ctx, e)
	}
}

// multiObserver passes every event to each of its observers in turn.
type multiObserver []Observer

func (m multiObserver) ObserveDecision(ctx context.Context, e DecisionEvent) {
	for _, o := range m {
		o.ObserveDecision(ctx, e)
	}
}

func (m multiObserver) ObserveError(ctx context.Context, e ErrorEvent) {
	for _, o := range m {
		o.ObserveError(ctx, e)
	}
}

// The operations an ErrorEvent names.
const (
	opAcquire = "acquire"
	opPeek    = "peek"
	opReserve = "reserve"
	opSettle  = "settle"
	opReset   = "reset"
)
