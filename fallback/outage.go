package fallback

import (
	"context"
	"time"
)

// Outage names what a check does while the primary store cannot be reached:
// the four behaviours users choose between (see WithOutage). This package is
// the one place that implements them: the middleware of packages httplimit
// and grpclimit and the ratelimit command's service only turn a store's error
// into a response, so the behaviour is chosen once, where the store is built.
type Outage uint8

const (
	// ReturnError returns the store's error: the caller decides whether an
	// outage should admit the request or reject it. It is the default
	// everywhere: in this package, in the middleware (which answers 503 or
	// codes.Unavailable) and in the ratelimit command's service.
	ReturnError Outage = iota
	// FailOpen admits the request without a check (availability first). The
	// Decision's Source is ratelimit.SourceFailOpen, so it is not Enforced.
	FailOpen
	// FailClosed denies the request without a check (protection first). The
	// Decision's Source is ratelimit.SourceFailClosed.
	FailClosed
	// LocalFallback keeps limiting from a process-local bucket per subject,
	// with the same policy and arithmetic, until the store answers again. The
	// Decision's Source is ratelimit.SourceLocal.
	LocalFallback
)

// String returns the behaviour's name: "return-error", "fail-open",
// "fail-closed" or "local-fallback".
func (o Outage) String() string {
	switch o {
	case ReturnError:
		return "return-error"
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	case LocalFallback:
		return "local-fallback"
	}
	return "unknown"
}

// Event describes a change of state of a Store: the primary, or one of its
// partitions, marked down or alive again.
type Event struct {
	// Partition names the part of the primary that changed state (a Redis
	// Cluster master's address), or "" when the store keeps one state for
	// the whole primary.
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

// Observer is told every change of state of a Store (see WithObserver).
// promobserver's and otelobserver's observers are Observers.
type Observer interface {
	// ObserveFallback is called once per change of state, by the goroutine
	// that made the change, with the context of the call or probe that
	// made it (context.Background() when there is none). It must be quick
	// and safe for simultaneous use.
	ObserveFallback(context.Context, Event)
}

// ObserverFunc is a function that is an Observer.
type ObserverFunc func(context.Context, Event)

// ObserveFallback calls f(ctx, e).
func (f ObserverFunc) ObserveFallback(ctx context.Context, e Event) { f(ctx, e) }
