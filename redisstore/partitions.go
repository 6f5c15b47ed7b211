package redisstore

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ClusterPartitions returns the partition and ping functions of
// fallback.WithPartitions for a store on the Redis Cluster behind cc, one partition
// per master:
//
//	fallback.New(redisstore.New(cc), fallback.WithPartitions(redisstore.ClusterPartitions(cc)))
//
// A key's partition is the address of the master that owns its slot in cc's
// cached layout ("" before cc has one), read without I/O. A partition's ping
// is a PING of that master on a connection of its own, dialled for the ping
// and closed after it, because go-redis's pool re-dials only about once a
// second after a run of failed dials. When the ping fails, the layout is
// reloaded before it returns (within its context): the breaker keeps checks
// away from a dead master, so nothing else would make cc learn of the replica
// promoted in its place before its next periodic reload. The probe then
// finds the dead master's keys on the promoted replica, forgets the dead
// master's partition and lets those keys go to the shared buckets again.
func ClusterPartitions(cc *redis.ClusterClient) (partition func(ctx context.Context, key string) string, ping func(ctx context.Context, addr string) error) {
	var masters sync.Map // address -> *redis.Options of the master there
	partition = func(ctx context.Context, key string) string {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return ""
		}
		o := m.Options()
		if _, ok := masters.Load(o.Addr); !ok {
			masters.Store(o.Addr, o)
		}
		return o.Addr
	}
	ping = func(ctx context.Context, addr string) error {
		var err error
		if o, ok := masters.Load(addr); ok {
			err = pingAlone(ctx, o.(*redis.Options))
		} else {
			// "": no layout yet when the partition was named.
			err = cc.Ping(ctx).Err()
		}
		if err != nil {
			// ForEachMaster reloads the layout now, where ReloadState
			// would only schedule a reload.
			_ = cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil })
		}
		return err
	}
	return partition, ping
}

// pingAlone sends PING to the server of o on a client of one connection,
// closed after the ping.
func pingAlone(ctx context.Context, o *redis.Options) error {
	po := *o
	po.PoolSize, po.MinIdleConns, po.MaxIdleConns = 1, 0, 0
	po.MaxRetries, po.DialerRetries = -1, 1
	po.ContextTimeoutEnabled = true
	c := redis.NewClient(&po)
	defer c.Close()
	return c.Ping(ctx).Err()
}
