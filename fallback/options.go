package fallback

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
)

// Option configures a Store.
type Option func(*config)

type config struct {
	outage   Outage
	share    int64
	clock    func() time.Time
	timeout  time.Duration
	classify func(error) bool
	ping     func(ctx context.Context) error
	partOf   func(ctx context.Context, key string) string
	pingPart func(ctx context.Context, partition string) error
	observer Observer
	errs     []error
}

func (c *config) invalid(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("%w: fallback: "+format, append([]any{ratelimit.ErrInvalidArgument}, args...)...))
}

// WithOutage sets what a check does while the primary is down (default
// ReturnError).
func WithOutage(o Outage) Option {
	return func(c *config) {
		if o > LocalFallback {
			c.invalid("unknown outage behaviour %d", o)
			return
		}
		c.outage = o
	}
}

// WithFleetShare tells the Store that n processes share the policy: while
// the primary is down, LocalFallback enforces Share(limit, n) for each limit
// of a request, so that n processes together stay near the policy instead of
// admitting n times it. n must be at least 1 (the default, the whole
// policy). It changes nothing for the other behaviours.
func WithFleetShare(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.invalid("fleet share must be at least 1 (got %d)", n)
			return
		}
		c.share = int64(n)
	}
}

// WithClock sets the clock the Store reads the current time from: for the
// local buckets, the unchecked decisions of FailOpen and FailClosed, and the
// times of its Events. The default is the wall clock read at
// New advanced by the monotonic clock, as memstore's, so that a step of the
// system clock neither credits nor withholds refill. A request that
// carries a time (Request.Now) is decided at that time instead.
func WithClock(clock func() time.Time) Option {
	return func(c *config) {
		if clock == nil {
			c.invalid("clock must not be nil")
			return
		}
		c.clock = clock
	}
}

// WithTimeout bounds each call to the primary, and each ping, to d, or to
// the caller's deadline when that comes first. A call that runs out of time
// marks the primary down and is answered by the outage behaviour within the
// caller's deadline. Zero (the default) leaves only the caller's deadline.
func WithTimeout(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.invalid("timeout must not be negative (got %v)", d)
			return
		}
		c.timeout = d
	}
}

// WithClassifier replaces IsUnreachable as the test of which errors of the
// primary mark it down. An error for which it reports false is returned to
// the caller as it is. A cancelled caller context is never an outage,
// whatever it reports.
func WithClassifier(unreachable func(error) bool) Option {
	return func(c *config) {
		if unreachable == nil {
			c.invalid("classifier must not be nil")
			return
		}
		c.classify = unreachable
	}
}

// WithProbe sets the check that Probe runs against the primary: nil when the
// primary answered. For Redis, a PING on a connection of its own sees the
// server come back sooner than go-redis's pool does, which stops dialling
// for about a second after as many failed dials as it has connections.
// Without WithProbe, Probe uses the primary's Ping method when it has one
// (see ratelimit.Pinger), and otherwise a peek at a key no Limiter uses, which writes
// nothing.
func WithProbe(ping func(ctx context.Context) error) Option {
	return func(c *config) {
		if ping == nil {
			c.invalid("probe must not be nil")
			return
		}
		c.ping = ping
	}
}

// withPartitions keeps one liveness flag per partition of the primary
// instead of one for all of it, with the functions a partitioned primary
// offers (New takes them from a redisstore.Store on Cluster; tests give their
// own). partition names
// the partition that serves key, for example the address of the Redis
// Cluster master that owns the key's slot; ping checks one partition, as
// WithProbe checks the whole primary. A failure then marks down only the partition of the key that
// failed, MarkDown and MarkAlive act on every partition in use, and Probe
// pings every partition in use, at the same time.
//
// partition is called on every check, so it must be cheap and must not
// block; go-redis's ClusterClient.MasterForKey reads its cached topology.
// The probe also calls it, to forget a partition that no key maps to any
// more (see Probe): after a failover, the dead master's. For that, a failed
// ping must let partition see the new layout: with go-redis, call
// ClusterClient.ReloadState (the next probe sees the reloaded layout) or
// ForEachMaster (which reloads it before returning) when the ping fails.
// The breaker keeps checks away from a dead master, so nothing else makes the
// client reload its layout before ClusterStateReloadInterval (60 s).
func withPartitions(partition func(ctx context.Context, key string) string, ping func(ctx context.Context, partition string) error) Option {
	return func(c *config) {
		if partition == nil || ping == nil {
			c.invalid("partition and ping functions must not be nil")
			return
		}
		c.partOf, c.pingPart = partition, ping
	}
}

// WithObserver tells o every change of state: the primary (when it reports
// partitions, a partition) marked down, with the error that did it, or
// alive again. It is called once per change, synchronously, by the goroutine
// that made it (a check, a probe, MarkDown or MarkAlive), with that call's
// context (context.Background() for MarkDown and MarkAlive), so it must be
// quick. promobserver's and otelobserver's observers are Observers.
// A partition that a probe forgets while it is down (see Probe) is reported
// alive: its keys are served by the primary again, through another partition.
func WithObserver(o Observer) Option {
	return func(c *config) {
		if o == nil {
			c.invalid("observer must not be nil")
			return
		}
		c.observer = o
	}
}
