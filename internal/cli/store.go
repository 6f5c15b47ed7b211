package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

// stores is the store a command decides with, and what it takes to run it.
type stores struct {
	store ratelimit.Store // what limiters use
	name  string          // for the log, without credentials
	// redis is the client, nil for the embedded store.
	redis redis.UniversalClient
	// fb is the outage wrapper around Redis, nil for the embedded store or
	// when none was asked for.
	fb *fallback.Store
}

// degraded reports whether the store is serving without Redis.
func (s *stores) degraded() bool { return s.fb != nil && !s.fb.IsAlive() }

// close closes the Redis client.
func (s *stores) close() {
	if s.redis != nil {
		s.redis.Close() //nolint:errcheck // closing at exit
	}
}

// storeOptions say how to build the store.
type storeOptions struct {
	redis      redisFlags
	outage     fallback.Outage
	useOutage  bool // wrap Redis in package fallback
	fleetShare int
	timeout    time.Duration
	// observer is told every change of Redis's state, with useOutage.
	observer fallback.Observer
}

// openStore builds the embedded store, or a Redis store from the flags,
// wrapped in fallback with the outage behaviour when useOutage is set.
// It does no I/O.
func openStore(o storeOptions) (*stores, error) {
	uo, desc, err := o.redis.options()
	if err != nil {
		return nil, usageError{err}
	}
	if uo == nil {
		return &stores{store: memstore.New(), name: "memory (embedded, this process only)"}, nil
	}
	client := newClient(uo)
	s := &stores{name: desc, redis: client}
	primary := redisstore.New(client)
	s.store = primary
	if !o.useOutage {
		return s, nil
	}
	opts := []fallback.Option{fallback.WithOutage(o.outage), fallback.WithTimeout(o.timeout)}
	if o.fleetShare > 1 {
		opts = append(opts, fallback.WithFleetShare(o.fleetShare))
	}
	if o.observer != nil {
		opts = append(opts, fallback.WithObserver(o.observer))
	}
	// fallback probes with the primary's own Ping (a PING on a connection
	// of its own, which sees Redis back before the client's pool would dial
	// again) and, on Cluster, keeps one liveness flag per master, which the
	// primary reports: one master down is not the whole cluster down.
	fb, err := fallback.New(primary, opts...)
	if err != nil {
		s.close()
		return nil, err
	}
	s.fb = fb
	s.store = fb
	return s, nil
}

// parseOutage reads an outage behaviour by its name.
func parseOutage(s string) (fallback.Outage, error) {
	for _, o := range []fallback.Outage{fallback.ReturnError, fallback.FailOpen, fallback.FailClosed, fallback.LocalFallback} {
		if strings.EqualFold(s, o.String()) {
			return o, nil
		}
	}
	return 0, usagef("--outage %q: want fail-closed, fail-open, local-fallback or return-error", s)
}

// pingStore checks that Redis answers, for a command that needs it now.
func (s *stores) ping(ctx context.Context, timeout time.Duration) error {
	if s.redis == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := s.redis.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	return nil
}
