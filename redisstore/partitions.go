package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// clusterPartitions returns the partition and ping functions a Store on
// the Redis Cluster behind cc reports to package fallback (see
// Store.partition), one partition per master. A key's partition is the address of the master that owns its slot in cc's
// cached layout ("" before cc has one), read without I/O. A partition's ping
// is a PING of that master on a connection of its own, dialled for the ping
// and closed after it, because go-redis's pool re-dials only about once a
// second after a run of failed dials. When the ping fails, the layout is
// reloaded before it returns (within its context): the breaker keeps checks
// away from a dead master, so nothing else would make cc learn of the replica
// promoted in its place before its next periodic reload. The probe then
// finds the dead master's keys on the promoted replica, forgets the dead
// master's partition and lets those keys go to the shared buckets again.
func clusterPartitions(cc *redis.ClusterClient) (partition func(ctx context.Context, key string) string, ping func(ctx context.Context, addr string) error) {
	// The probe's options come from the cluster's, read once here: a node
	// client's own Options may be written while it connects.
	co := cc.Options()
	base := redis.Options{
		Username:              co.Username,
		Password:              co.Password,
		CredentialsProvider:   co.CredentialsProvider,
		TLSConfig:             co.TLSConfig,
		Dialer:                co.Dialer,
		Protocol:              co.Protocol,
		DialTimeout:           co.DialTimeout,
		ReadTimeout:           co.ReadTimeout,
		WriteTimeout:          co.WriteTimeout,
		ContextTimeoutEnabled: true,
	}
	partition = func(ctx context.Context, key string) string {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return ""
		}
		return m.Options().Addr // set when the node client is made, never written after
	}
	ping = func(ctx context.Context, addr string) error {
		var err error
		if addr != "" {
			o := base
			o.Addr = addr
			err = pingAlone(ctx, &o)
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
	c := redis.NewClient(probeOptions(o))
	defer c.Close()
	return c.Ping(ctx).Err()
}

// probeOptions returns a copy of o for a probe: one connection, no retries,
// one dial attempt, no maintenance-notification handshake.
func probeOptions(o *redis.Options) *redis.Options {
	po := *o
	po.PoolSize, po.MinIdleConns, po.MaxIdleConns = 1, 0, 1
	po.MaxRetries, po.DialerRetries = -1, 1
	po.ContextTimeoutEnabled = true
	po.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return &po
}
