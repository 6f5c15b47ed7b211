package ratelimit

import (
	"context"
	"time"
)

// Observer is told what a Limiter does, for metrics, logs and traces: every
// decision, every check or reset that could not be decided, and, through
// FallbackObserver, every change of a fallback store's state. WithObserver
// attaches one to a Limiter; package promobserver adapts it to Prometheus.
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
	FallbackObserver
}

// FallbackObserver is the part of an Observer that a Store wrapping another,
// such as package fallback, tells about its own state: the primary marked
// down or alive again. It is separate so that such a store can accept it
// without needing the rest.
type FallbackObserver interface {
	// ObserveFallback is called once per change of state, by the goroutine
	// that made the change, with the context of the call or probe that
	// made it (context.Background() when there is none).
	ObserveFallback(context.Context, FallbackEvent)
}

// DecisionEvent describes one decided check.
type DecisionEvent struct {
	// Namespace is the limiter's namespace.
	Namespace string
	// Key is the store key of the subject (see Limiter.Key). It identifies
	// a subject: keep it out of metric labels.
	Key string
	// Cost is the number of tokens the check asked for; 1 for a Peek.
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

// Op names the limiter operation an ErrorEvent reports on.
type Op uint8

const (
	// OpAcquire is a TryAcquire, TryAcquireN or an item of TryAcquireMany.
	OpAcquire Op = iota
	// OpPeek is a Peek.
	OpPeek
	// OpReset is a Reset.
	OpReset
)

// String returns the operation's name: "acquire", "peek" or "reset".
func (o Op) String() string {
	switch o {
	case OpAcquire:
		return "acquire"
	case OpPeek:
		return "peek"
	case OpReset:
		return "reset"
	}
	return "unknown"
}

// ErrorEvent describes a check or reset that returned an error instead of a
// decision.
type ErrorEvent struct {
	// Namespace is the limiter's namespace.
	Namespace string
	// Key is the subject's store key, also when the check was refused for
	// its cost or its time; it is "" only when the subject itself was
	// invalid (it encoded to an empty string).
	Key string
	// Op is the operation that failed.
	Op Op
	// Cost is the number of tokens asked for (1 for a Peek, 0 for a
	// Reset).
	Cost int64
	// Err is the error returned to the caller. errors.Is tells its kind:
	// ErrInvalidArgument (reported before any store is called),
	// ErrCorruptState, context.Canceled, or a store that failed.
	Err error
	// Latency is the time the operation took, as in DecisionEvent.
	Latency time.Duration
}

// FallbackEvent describes a change of state of a store that stands in for
// another while it cannot be reached (package fallback).
type FallbackEvent struct {
	// Partition names the part of the primary that changed state (for
	// example a Redis Cluster master's address), or "" when the store
	// keeps one state for the whole primary.
	Partition string
	// Alive reports the new state: true when checks go to the primary
	// again, false when it was marked down.
	Alive bool
	// Outage is the behaviour that answers checks while the primary is
	// down.
	Outage Outage
	// Cause is the error that marked the primary down; nil when Alive.
	Cause error
	// At is the time of the change on the store's clock.
	At time.Time
}

// ObserverFuncs is an Observer made of functions, for observing only some
// events: a nil field ignores its kind.
type ObserverFuncs struct {
	// Decision receives every DecisionEvent.
	Decision func(context.Context, DecisionEvent)
	// Error receives every ErrorEvent.
	Error func(context.Context, ErrorEvent)
	// Fallback receives every FallbackEvent.
	Fallback func(context.Context, FallbackEvent)
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

// ObserveFallback calls f.Fallback, if set.
func (f ObserverFuncs) ObserveFallback(ctx context.Context, e FallbackEvent) {
	if f.Fallback != nil {
		f.Fallback(ctx, e)
	}
}

// Observers returns an Observer that passes every event to each of obs in
// turn, for example to Prometheus and to a logger. Nil entries are skipped.
func Observers(obs ...Observer) Observer {
	var m multiObserver
	for _, o := range obs {
		if o != nil {
			m = append(m, o)
		}
	}
	return m
}

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

func (m multiObserver) ObserveFallback(ctx context.Context, e FallbackEvent) {
	for _, o := range m {
		o.ObserveFallback(ctx, e)
	}
}
