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
}

// close closes the Redis client.
func (s *stores) close() {
	if s.redis != nil {
		s.redis.Close() //nolint:errcheck // closing at exit
	}
}

// storeOptions say how to build the store.
type storeOptions struct {
	redis   redisFlags
	timeout time.Duration
}

// openStore builds the embedded store, or a Redis store from the flags. It
// does no I/O. (serve's store, with its outage behaviour, is package
// service's.)
func openStore(o storeOptions) (*stores, error) {
	uo, desc, err := o.redis.options()
	if err != nil {
		return nil, usageError{err}
	}
	if uo == nil {
		return &stores{store: memstore.New(), name: "memory (embedded, this process only)"}, nil
	}
	client := newClient(uo)
	return &stores{store: redisstore.New(client), name: desc, redis: client}, nil
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
