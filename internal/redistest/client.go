package redistest

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Client timeouts of NewClient and NewClusterClient: short, so that a test
// against a dead, stopped or blackholed server fails in well under a second
// per attempt instead of hanging on go-redis's 5 s defaults.
const (
	// ClientDialTimeout bounds connecting to a server.
	ClientDialTimeout = 500 * time.Millisecond
	// ClientReadTimeout bounds waiting for a reply when the context has no
	// earlier deadline.
	ClientReadTimeout = 2 * time.Second
	// ClientWriteTimeout bounds sending a command when the context has no
	// earlier deadline.
	ClientWriteTimeout = 2 * time.Second
	// ClientPoolTimeout bounds waiting for a free pooled connection.
	ClientPoolTimeout = time.Second
)

// ClientOptions returns go-redis options for addrs with fast-failure
// settings: context deadlines are honored (ContextTimeoutEnabled), failed
// commands are not retried (MaxRetries -1), a failed dial is not retried
// (DialerRetries 1), and dial, read, write and pool waits are short (see
// ClientDialTimeout and friends). Callers may adjust the result before
// passing it to redis.NewUniversalClient.
func ClientOptions(addrs ...string) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                 addrs,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialerRetries:         1,
		DialTimeout:           ClientDialTimeout,
		ReadTimeout:           ClientReadTimeout,
		WriteTimeout:          ClientWriteTimeout,
		PoolTimeout:           ClientPoolTimeout,
		// No maintenance-notification handshake, which go-redis would
		// otherwise try (and give up, writing its options) per connection.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// NewClient returns a go-redis client with the fast-failure settings of
// [ClientOptions]: a *redis.Client for one address, a *redis.ClusterClient
// for several. For a cluster reached through a single seed address use
// [NewClusterClient]. The caller closes it.
func NewClient(addrs ...string) redis.UniversalClient {
	return redis.NewUniversalClient(ClientOptions(addrs...))
}

// Client returns a client of addrs made by [NewClient], closed when the
// test t ends.
func Client(t testing.TB, addrs ...string) redis.UniversalClient {
	client := NewClient(addrs...)
	t.Cleanup(func() { client.Close() })
	return client
}

// NewClusterClient returns a go-redis cluster client seeded with addrs (one
// is enough) with the fast-failure settings of [ClientOptions]. Redirections
// (MOVED, ASK) are still followed. The caller closes it.
func NewClusterClient(addrs ...string) *redis.ClusterClient {
	return redis.NewClusterClient(ClientOptions(addrs...).Cluster())
}
