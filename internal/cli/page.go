package cli

import (
	"context"
	"slices"
	"sync"

	"github.com/exactlimit/ratelimit/internal/server"
	"github.com/redis/go-redis/v9"
)

// kind names the store for the operator page.
func (s *stores) kind() string {
	switch s.redis.(type) {
	case nil:
		return server.StoreEmbedded
	case *redis.ClusterClient:
		return server.StoreCluster
	}
	return server.StoreRedis
}

// masters returns the function that lists a Cluster's masters for the
// operator page, or nil for another store. It reads the client's layout,
// loading it when the client has none yet.
func (s *stores) masters() func(ctx context.Context) ([]string, error) {
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
