package fallback

import (
	"testing"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/exactlimit/ratelimit/storetest"
)

// TestSuite runs the behaviour suite every store passes over a fallback
// Store with a healthy primary: the wrapper must decide exactly as the store
// it wraps, batches and all-or-nothing checks included, over memstore, one
// Redis and a Redis Cluster.
//
// Each primary lives in a subtest of its own, shared by the runs of both
// outage behaviours (the suite's namespaces are unique), and is stopped when
// that subtest ends; each run has a client of its own, closed when the run
// ends. The Cluster subtest then checks that no go-redis goroutine outlives
// it: nothing of the Cluster (its processes, its gossip, a ClusterClient's
// goroutines) is left when this package's fault tests measure their figures.
func TestSuite(t *testing.T) {
	type newStore func(t *testing.T) ratelimit.Store
	primaries := []struct {
		name  string
		start func(t *testing.T) newStore
	}{
		{"memstore", func(*testing.T) newStore {
			return func(*testing.T) ratelimit.Store { return memstore.New() }
		}},
		{"redis", func(t *testing.T) newStore {
			srv := redistest.StartServer(t)
			return func(t *testing.T) ratelimit.Store { return redisstore.New(newRedisClient(t, srv.Addr())) }
		}},
		{"redis cluster", func(t *testing.T) newStore {
			checkGone(t, "go-redis code", "github.com/redis/go-redis/")
			c := redistest.StartCluster(t, 3, 0)
			return func(t *testing.T) ratelimit.Store { return redisstore.New(redisClusterClient(t, c)) }
		}},
	}
	for _, p := range primaries {
		t.Run(p.name, func(t *testing.T) {
			newStore := p.start(t)
			for _, o := range []Outage{ReturnError, LocalFallback} {
				t.Run(o.String(), func(t *testing.T) {
					store := mustNew(t, newStore(t), WithOutage(o))
					storetest.Run(t, func(*testing.T) ratelimit.Store { return store })
				})
			}
		})
	}
}
