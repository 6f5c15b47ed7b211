// Package redisstore is a ratelimit.Store that keeps token buckets in Redis,
// so that one limit holds across every process that shares the server.
//
// Each check is one script call (tokenbucket.lua, embedded) that reads the
// bucket, refills it, decides and consumes atomically. On Redis 7 and later
// it is a function: FCALL, and when the key's master does not hold the
// function's library, one FUNCTION LOAD there and the FCALL again. Where
// the server has no functions (Redis 6, or an ACL that denies them) it is
// EVALSHA, and when the server does not have the script cached (NOSCRIPT),
// one EVAL of its body on the same key. There is no broadcast to every
// server and no loop. The script
// reads the server's TIME unless the request carries a time (a Limiter built
// with WithClock), so by default every process shares the server's clock.
//
// A subject's whole bucket is one string key holding its time, its level in
// exact integers and the policy that wrote it, so the store works unchanged on
// standalone, Sentinel-managed and Cluster Redis through go-redis's
// UniversalClient. The key expires once its bucket would be full again.
//
// # Client settings
//
// A script call spends tokens, so it must not be retried blindly: a retried
// call that had already run spends twice. Build the client with
// ClientOptions, or set MaxRetries: -1, ContextTimeoutEnabled: true (so a
// hung server costs the caller's deadline, not the 3 s read timeout) and
// DialerRetries: 1 (so a refused connection is an error in milliseconds).
//
// # Coalescing
//
// A Store keeps a queue per master (per server without Cluster), routed by
// the master that owns the key's slot in go-redis's cached layout, with no
// I/O. Each queue keeps up to DefaultLanes (4; WithLanes) script calls or
// pipelines in flight, each on its own connection. A check, or the keys of
// an ApplyAll on one slot, that finds a lane free goes out at once, on its
// own goroutine, as one script call. Those that find every lane busy wait and go
// out together when a lane frees, as one pipeline of up to 256 keys; the
// goroutine that sends them lives only while the queue has work. Within the
// pipeline, checks and ApplyAll groups decided at the same time (by the
// server's TIME, or with an equal Request.Now) share script calls of up to
// 16 keys, a group never split (one of more keys is a call of its own), and
// on Cluster only those of one slot share a call. Each check of such a call
// is decided on its own, and each group all or nothing, in order, exactly as
// a call of its own would decide it: a denial or a malformed bucket is that
// check's or that group's result alone, and a key named twice sees its own
// earlier write.
// Redis runs one call at a time, so a call of 16 keys holds it for 16
// decisions (about 100 µs of its CPU); the per-call cost it spreads over them
// is a third of what a single check costs Redis.
//
// A caller waits on its own context only: one that gives up before its call
// is sent takes nothing, a slow reply holds only its own lane, and a batch
// runs until the latest deadline among its callers, with the context values
// of its first. A panic inside a batch becomes an error for that batch's
// callers. One master that is slow or down delays no check of another.
//
// Turn coalescing off (WithoutCoalescing) when every check must be its own
// round trip on the caller's goroutine: to measure one call's latency, or
// behind a proxy that does not pipeline. It costs throughput under
// concurrency and saves nothing at low load, where checks go out at once
// anyway.
//
// # All or nothing
//
// ApplyAll on one server, and on Cluster when every key hashes to one slot,
// is one script call on all the keys (with other groups, under load):
// atomic. Keys of several Cluster slots
// cannot meet in one script; see Store.ApplyAll for the two steps it takes
// then and the one race they leave.
//
// # Errors
//
// A call's error wraps the client's, with the key's namespace and a hash of
// its subject (never the subject itself). When it says that Redis could not
// be reached or did not answer in time (a refused, reset or lost connection,
// a network timeout, go-redis's pool timeout, or a LOADING, MASTERDOWN,
// CLUSTERDOWN or TRYAGAIN reply), it wraps ratelimit.ErrUnavailable too,
// which package fallback takes for an outage; there is no fallback here. A malformed bucket returns an
// error wrapping tokenbucket.ErrCorruptState and grants nothing; a reply that
// is not the script's wraps ErrUnexpectedReply.
package redisstore

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/exactlimit/ratelimit/internal/storehook"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Store keeps token buckets in Redis. It is safe for simultaneous use by
// multiple goroutines, and does no I/O until a check.
type Store struct {
	client   redis.UniversalClient
	cluster  *redis.ClusterClient // client, when it is one
	coalesce bool
	// noFunctions: the server has refused functions, so the script goes
	// by EVALSHA (see run).
	noFunctions atomic.Bool
	lanes       int            // pipelines in flight per master
	single      coalescer      // the queue of a single server
	enc         script.Encoder // the script's arguments, with this store's policies
	masters     sync.Map       // on Cluster: master address -> *coalescer

	probeMu    sync.Mutex
	probeOpts  *redis.Options // for Ping on a single server, read at New
	probe      *redis.Client  // Ping's own connection to a single server
	pingMaster func(ctx context.Context, addr string) error

	storeHooks // on Cluster, the partitions, for package fallback
}

// storeHooks is what a Store offers package fallback and no user calls (see
// package storehook).
type storeHooks = storehook.Hooks[ratelimit.Request, ratelimit.Decision]

// Option configures a Store.
type Option func(*Store)

// WithoutCoalescing makes every check its own round trip, on the caller's
// goroutine. By default, checks that arrive while every lane of their master
// is in flight are sent together in one pipeline when a lane comes free (see
// "Coalescing" in the package documentation); each is still its own atomic
// script call.
func WithoutCoalescing() Option { return func(s *Store) { s.coalesce = false } }

// DefaultLanes is the number of pipelines a Store keeps in flight per
// master by default.
const DefaultLanes = 4

// WithLanes sets how many checks or pipelines of checks a Store keeps in
// flight at once per master (per server without Cluster), each on a
// connection of its own: n, or DefaultLanes when n is 0 (the type leaves no
// value to refuse). With more than one, Redis has the next pipeline to work
// on while the client reads the last one's reply, and a slow reply holds back
// only its own lane.
func WithLanes(n uint16) Option {
	return func(s *Store) {
		if n > 0 {
			s.lanes = int(n)
		}
	}
}

// New returns a Store over client, which may be a *redis.Client, a
// *redis.ClusterClient, a failover client or a *redis.Ring. See the package
// documentation for the client settings a limiter needs.
func New(client redis.UniversalClient, opts ...Option) *Store {
	s := &Store{client: client, coalesce: true, lanes: DefaultLanes}
	for _, o := range opts {
		o(s)
	}
	s.cluster, _ = client.(*redis.ClusterClient)
	if s.cluster != nil {
		storehook.OfferPartitions(&s.storeHooks, s.partition, s.pingPartition)
	}
	if c, ok := client.(*redis.Client); ok {
		// Read once, now: go-redis may write a client's Options while it
		// opens a connection.
		s.probeOpts = probeOptions(c.Options())
	}
	return s
}

// ClientOptions returns o with the settings a limiter needs: no command
// retries (a retried script call can spend twice), deadlines taken from the
// caller's context, one dial attempt per connection, and no
// maintenance-notification handshake on a new connection. Fields o already
// sets to something else than its zero value are left alone, except
// MaxRetries, which is always -1.
//
// A Cluster client still follows MOVED and ASK (which is safe: the command did
// not run) and, up to MaxRedirects times, retries a command whose connection
// failed. Such a retry can run a check twice and charge the subject twice; it
// never admits more than the policy. Set MaxRedirects to -1 to rule it out,
// at the price of errors while slots move.
func ClientOptions(o *redis.UniversalOptions) *redis.UniversalOptions {
	o.MaxRetries = -1
	o.ContextTimeoutEnabled = true
	if o.DialerRetries == 0 {
		o.DialerRetries = 1
	}
	if o.MaintNotificationsConfig == nil {
		// No CLIENT MAINT_NOTIFICATIONS handshake on each new connection
		// (a round trip, refused by Redis before 8).
		o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	}
	return o
}

// Apply decides r against the bucket at key in one script call. r is
// validated first; an invalid request is an error wrapping
// ratelimit.ErrInvalidArgument and reaches no server.
func (s *Store) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if err := r.Validate(); err != nil {
		return ratelimit.Decision{}, err
	}
	return s.check(ctx, key, r)
}

// check sends a valid check: through the master's lanes, or on its own
// without coalescing.
func (s *Store) check(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if s.coalesce {
		return s.applyCoalesced(ctx, key, r)
	}
	return s.apply(ctx, key, r)
}

// apply sends one check, one script call (see eval).
func (s *Store) apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	d, _, err := s.call(ctx, "check", []string{key}, s.enc.Args(r), r)
	return d, err
}

// call runs the script once on keys, the first of them the bucket of r, and
// reads its reply: the decision, and whether a settle found its record. op
// names the operation in an error.
func (s *Store) call(ctx context.Context, op string, keys []string, args []any, r ratelimit.Request) (d ratelimit.Decision, found bool, err error) {
	res, err := s.eval(ctx, keys, args)
	if err == nil {
		d, found, err = script.ParseSettle(r, res)
	}
	if err != nil {
		return ratelimit.Decision{}, false, wrapErr(op, keys[0], err)
	}
	return d, found, nil
}

// eval runs the script once (see run), and once more when the server did
// not hold it (see rerun).
func (s *Store) eval(ctx context.Context, keys []string, args []any) (any, error) {
	res, err := s.run(ctx, s.client, keys, args, false).Result()
	return s.rerun(ctx, keys, args, res, err)
}

// Ping reports whether Redis answers, for a liveness probe (see package
// fallback). On a single server it pings on a connection of its own, outside
// the client's pool, kept from one ping to the next and replaced after a
// failure: after a run of failed dials go-redis's pool re-dials only about
// once a second, and a probe must see the server back sooner. On Cluster it
// pings every master, which also makes the client reload the cluster's
// layout at once.
func (s *Store) Ping(ctx context.Context) error {
	switch c := s.client.(type) {
	case *redis.Client:
		// The lock guards the client, not the ping: a ping waiting on a
		// hung server must not hold back another ping with a shorter
		// deadline (its wait for the one connection ends with its ctx).
		s.probeMu.Lock()
		if s.probe == nil {
			s.probe = redis.NewClient(s.probeOpts)
		}
		probe := s.probe
		s.probeMu.Unlock()
		err := probe.Ping(ctx).Err()
		if err != nil {
			s.probeMu.Lock()
			if s.probe == probe {
				s.probe = nil
			}
			s.probeMu.Unlock()
			probe.Close()
		}
		return err
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.Ping(ctx).Err()
		})
	}
	return s.client.Ping(ctx).Err()
}

// Close releases Ping's own connection. It does not close the client the
// store was built on, which belongs to the caller.
func (s *Store) Close() error {
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	if s.probe == nil {
		return nil
	}
	err := s.probe.Close()
	s.probe = nil
	return err
}

// partition names the partition of the server that keeps key's bucket: on
// Cluster the address of the master that owns the key's slot in the client's
// cached layout ("" before it has one), read without I/O; on a single server
// "", one partition for every key. On Cluster the store offers it, with
// pingPartition, to package fallback (storehook.OfferPartitions), which keeps
// a liveness flag per partition, so that a master that fails leaves the
// other masters' subjects on the shared buckets.
func (s *Store) partition(ctx context.Context, key string) string {
	if s.cluster == nil {
		return ""
	}
	m, err := s.cluster.MasterForKey(ctx, key)
	if err != nil {
		return ""
	}
	return m.Options().Addr // set when the node client is made, never written after
}

// pingPartition checks one partition, as Ping checks them all: on Cluster a
// PING of that master on a connection of its own (see clusterPartitions), on
// a single server Ping.
func (s *Store) pingPartition(ctx context.Context, partition string) error {
	if s.cluster == nil {
		return s.Ping(ctx)
	}
	s.probeMu.Lock()
	if s.pingMaster == nil {
		_, s.pingMaster = clusterPartitions(s.cluster)
	}
	ping := s.pingMaster
	s.probeMu.Unlock()
	return ping(ctx, partition)
}

// Reset deletes the bucket at key, so that its next check starts full.
func (s *Store) Reset(ctx context.Context, key string) error {
	if err := s.client.Del(ctx, key).Err(); err != nil {
		return wrapErr("reset", key, err)
	}
	return nil
}

// DecisionCmd is a check queued on a pipeline. Its Result is ready once the
// pipeline has been executed.
type DecisionCmd struct {
	s   *Store
	ctx context.Context
	r   ratelimit.Request
	cmd *redis.Cmd
	err error
	key string
}

// Result returns the check's Decision, or the error that kept it from being
// decided. When the server did not hold the script (it did not run: see the
// package documentation), Result makes it hold it and runs the check once
// more, by itself; later pipelines find it there.
func (c *DecisionCmd) Result() (ratelimit.Decision, error) {
	if c.err != nil {
		return ratelimit.Decision{}, c.err
	}
	res, err := c.cmd.Result()
	if err != nil {
		res, err = c.s.rerun(c.ctx, []string{c.key}, c.s.enc.Args(c.r), res, err)
	}
	if err != nil {
		return ratelimit.Decision{}, wrapErr("check", c.key, err)
	}
	d, err := script.ParseReply(c.r, res)
	if err != nil {
		return ratelimit.Decision{}, wrapErr("check", c.key, err)
	}
	return d, nil
}

// Queue puts a check of r on the bucket at key on pipe, beside whatever
// else the pipeline carries, and returns the command whose Result holds the
// Decision after pipe.Exec. pipe must come from the Store's client. The check
// is queued as one script call (FCALL, or EVALSHA on a server without
// functions); see DecisionCmd.Result for a server that lacks
// the script. An invalid request queues nothing; its Result is the
// validation error. Limiter.Request gives the key and request of a subject's
// check.
func (s *Store) Queue(ctx context.Context, pipe redis.Pipeliner, key string, r ratelimit.Request) *DecisionCmd {
	if err := r.Validate(); err != nil {
		return &DecisionCmd{err: err}
	}
	return &DecisionCmd{s: s, ctx: ctx, r: r, key: key, cmd: s.run(ctx, pipe, []string{key}, s.enc.Args(r), false)}
}
