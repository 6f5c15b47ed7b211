package service

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/operator"
	"github.com/exactlimit/ratelimit/internal/server"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
)

// store is the service's one store: the embedded one, or Redis behind one
// fallback breaker, which the HTTP API and the Envoy service share.
type store struct {
	store ratelimit.Store // what the limiters use
	name  string          // for the log, without credentials
	// redis is the client, nil for the embedded store.
	redis redis.UniversalClient
	// fb is the breaker around Redis, nil for the embedded store.
	fb *fallback.Store
}

// openStore builds the store of c, telling obs every change of Redis's
// state. It does no I/O.
func openStore(c *Config, obs fallback.Observer) (*store, error) {
	if c.Redis == nil {
		return &store{store: memstore.New(), name: "memory (embedded, this process only)"}, nil
	}
	client := redis.NewUniversalClient(c.Redis)
	s := &store{name: DescribeRedis(c.Redis), redis: client}
	opts := []fallback.Option{fallback.WithOutage(c.Outage), fallback.WithTimeout(c.Timeout), fallback.WithObserver(obs)}
	if c.FleetSize > 1 {
		opts = append(opts, fallback.WithFleetShare(c.FleetSize))
	}
	// fallback probes with the primary's own Ping (a PING on a connection
	// of its own, which sees Redis back before the client's pool would dial
	// again) and, on Cluster, keeps one liveness flag per master, which the
	// primary reports: one master down is not the whole cluster down.
	fb, err := fallback.New(redisstore.New(client), opts...)
	if err != nil {
		client.Close() //nolint:errcheck // the error is the option's
		return nil, err
	}
	s.fb, s.store = fb, fb
	return s, nil
}

// close closes the Redis client.
func (s *store) close() {
	if s.redis != nil {
		s.redis.Close() //nolint:errcheck // closing at exit
	}
}

// degraded reports whether the store is serving without Redis.
func (s *store) degraded() bool { return s.fb != nil && !s.fb.IsAlive() }

// kind names the store for the operator page.
func (s *store) kind() string {
	switch s.redis.(type) {
	case nil:
		return operator.StoreEmbedded
	case *redis.ClusterClient:
		return operator.StoreCluster
	}
	return operator.StoreRedis
}

// masters returns the function that lists a Cluster's masters for the
// operator page, or nil for another store. It reads the client's layout,
// loading it when the client has none yet.
func (s *store) masters() func(ctx context.Context) ([]string, error) {
	cc, ok := s.redis.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	return func(ctx context.Context) ([]string, error) {
		var mu sync.Mutex
		var addrs []string
		err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
			mu.Lock()
			addrs = append(addrs, c.Options().Addr) // set when the node client is made, never written after
			mu.Unlock()
			return nil
		})
		slices.Sort(addrs)
		return addrs, err
	}
}

// envoyStore is the store of the Envoy service with the outage behaviour
// o: the service's store when that is its behaviour too (the default,
// return-error for both), and the embedded store. Otherwise it is a second
// outage behaviour over the same Redis client, with a breaker of its own
// that logs to log: package fallback applies one behaviour per breaker.
func (s *store) envoyStore(o fallback.Outage, timeout time.Duration, log *slog.Logger) (*fallback.Store, ratelimit.Store, error) {
	if s.fb == nil || s.fb.Outage() == o {
		return nil, s.store, nil
	}
	fb, err := fallback.New(s.fb.Primary(), fallback.WithOutage(o), fallback.WithTimeout(timeout), fallback.WithObserver(logOutages(log)))
	if err != nil {
		return nil, nil, err
	}
	return fb, fb, nil
}

// checkCredentials pings Redis and peeks at a bucket that does not exist (a
// read the service's ACL must allow), and returns an error when Redis
// refuses the credentials or the permissions. An unreachable Redis is not
// an error here: the outage behaviour serves until it answers.
func (s *store) checkCredentials(ctx context.Context, timeout time.Duration) error {
	if s.redis == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, max(timeout, time.Second))
	defer cancel()
	err := s.redis.Ping(ctx).Err()
	if err == nil {
		lim, lerr := ratelimit.New[string](redisstore.New(s.redis), ratelimit.PerSecond(1))
		if lerr == nil {
			_, err = lim.Peek(ctx, "ratelimit-startup-check")
		}
	}
	if isAuthError(err) {
		return fmt.Errorf("%s refuses this service: %v (a configuration error: check the user, the password and the ACL)", s.name, err)
	}
	return nil
}

// authErrorPrefixes begin the Redis errors that mean the credentials or
// the ACL are wrong: a configuration error, which waiting will not mend.
var authErrorPrefixes = []string{"WRONGPASS", "NOAUTH", "NOPERM"}

// isAuthError reports whether err is a Redis authentication or permission
// error.
func isAuthError(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	for _, p := range authErrorPrefixes {
		if strings.HasPrefix(msg, p) || strings.Contains(msg, ": "+p) {
			return true
		}
	}
	return false
}

// logOutages returns an observer that logs each change of Redis's state (on
// Cluster, of one master's) that package fallback reports, whether a check
// or the probe found it.
func logOutages(log *slog.Logger) fallback.ObserverFunc {
	return func(ctx context.Context, e fallback.Event) {
		var attrs []any
		if e.Partition != "" {
			attrs = append(attrs, "master", e.Partition)
		}
		if e.Alive {
			log.InfoContext(ctx, "redis answers again; decisions are back on the shared buckets", attrs...)
			return
		}
		attrs = append(attrs, "outage", e.Outage.String())
		if e.Cause != nil {
			// Errors may quote a bucket key, whose subject may be an API
			// key: the log gets the namespace and a hash instead.
			attrs = append(attrs, "err", server.RedactKeys(e.Cause.Error()))
		}
		if isAuthError(e.Cause) {
			log.ErrorContext(ctx, "redis refuses this service's credentials or permissions: a configuration error, not an outage; fix the user, password or ACL", attrs...)
			return
		}
		log.WarnContext(ctx, "redis unreachable; serving with the outage behaviour until it answers", attrs...)
	}
}

// DescribeRedis names the deployment of o for the log, without
// credentials.
func DescribeRedis(o *redis.UniversalOptions) string {
	kind := "redis"
	switch {
	case o.MasterName != "":
		kind = "redis sentinel master " + o.MasterName + " via"
	case o.IsClusterMode || len(o.Addrs) > 1:
		kind = "redis cluster"
	}
	if o.TLSConfig != nil {
		kind += " (TLS)"
	}
	s := kind + " " + strings.Join(o.Addrs, ",")
	if o.DB != 0 {
		s += fmt.Sprintf(" db %d", o.DB)
	}
	return s
}
