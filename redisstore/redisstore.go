// Package redisstore is a ratelimit.Store that keeps token buckets in Redis,
// so that one limit holds across every process that shares the server.
//
// Each check is one script call (tokenbucket.lua, embedded) that reads the
// bucket, refills it, decides and consumes atomically: EVALSHA, and when the
// server does not have the script cached (NOSCRIPT), one EVAL of its body on
// the same key. There is no SCRIPT LOAD broadcast and no loop. The script
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
// EVALSHA that had already run spends twice. Build the client with
// ClientOptions, or set MaxRetries: -1, ContextTimeoutEnabled: true (so a
// hung server costs the caller's deadline, not the 3 s read timeout) and
// DialerRetries: 1 (so a refused connection is an error in milliseconds).
//
// # Errors
//
// A store that cannot be reached returns the client's error, wrapped with the
// key; there is no fallback here (see package fallback). A malformed bucket
// returns an error wrapping ratelimit.ErrCorruptState and grants nothing.
package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"

	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Script is the body of tokenbucket.lua, the Redis twin of ratelimit's Step.
// It is exported so that a caller can load it ahead of time or run it
// directly; its header comment documents KEYS, ARGV, the reply and the
// stored value.
//
//go:embed tokenbucket.lua
var Script string

// ScriptSHA is the SHA-1 digest of Script, the name EVALSHA runs it by.
var ScriptSHA = func() string {
	sum := sha1.Sum([]byte(Script))
	return hex.EncodeToString(sum[:])
}()

// Store keeps token buckets in Redis. It is safe for simultaneous use by
// multiple goroutines, and does no I/O until a check.
type Store struct {
	client   redis.UniversalClient
	coalesce bool
	batch    coalescer

	probeMu   sync.Mutex
	probeOpts *redis.Options // for Ping on a single server, read at New
	probe     *redis.Client  // Ping's own connection to a single server
}

// Option configures a Store.
type Option func(*Store)

// WithoutCoalescing makes every check its own round trip. By default, checks
// that arrive while another is in flight are sent together in one pipeline
// when it returns (see ApplyBatch); each is still its own atomic script call.
func WithoutCoalescing() Option { return func(s *Store) { s.coalesce = false } }

// New returns a Store over client, which may be a *redis.Client, a
// *redis.ClusterClient, a failover client or a *redis.Ring. See the package
// documentation for the client settings a limiter needs.
func New(client redis.UniversalClient, opts ...Option) *Store {
	s := &Store{client: client, coalesce: true}
	for _, o := range opts {
		o(s)
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
	if s.coalesce {
		return s.applyCoalesced(ctx, key, r)
	}
	return s.apply(ctx, key, r)
}

// apply sends one check: EVALSHA, and EVAL when the script is not cached.
func (s *Store) apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	args := Args(r)
	keys := []string{key}
	res, err := s.client.EvalSha(ctx, ScriptSHA, keys, args...).Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		res, err = s.client.Eval(ctx, Script, keys, args...).Result()
	}
	if err != nil {
		return ratelimit.Decision{}, wrapErr("check", key, err)
	}
	d, err := ParseReply(r, res)
	if err != nil {
		return ratelimit.Decision{}, wrapErr("check", key, err)
	}
	return d, nil
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
		s.probeMu.Lock()
		defer s.probeMu.Unlock()
		if s.probe == nil {
			s.probe = redis.NewClient(s.probeOpts)
		}
		err := s.probe.Ping(ctx).Err()
		if err != nil {
			s.probe.Close()
			s.probe = nil
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
	r   ratelimit.Request
	cmd *redis.Cmd
	err error
	key string
}

// Result returns the check's Decision, or the error that kept it from being
// decided.
func (c *DecisionCmd) Result() (ratelimit.Decision, error) {
	if c.err != nil {
		return ratelimit.Decision{}, c.err
	}
	res, err := c.cmd.Result()
	if err != nil {
		return ratelimit.Decision{}, wrapErr("check", c.key, err)
	}
	d, err := ParseReply(c.r, res)
	if err != nil {
		return ratelimit.Decision{}, wrapErr("check", c.key, err)
	}
	return d, nil
}

// Queue puts a check of r on the bucket at key on pipe, beside whatever
// else the pipeline carries, and returns the command whose Result holds the
// Decision after pipe.Exec. A pipeline cannot react to NOSCRIPT, so the check
// is queued as an EVAL of the script's body. An invalid request queues
// nothing; its Result is the validation error. Limiter.Request gives the key
// and request of a subject's check.
func Queue(ctx context.Context, pipe redis.Pipeliner, key string, r ratelimit.Request) *DecisionCmd {
	if err := r.Validate(); err != nil {
		return &DecisionCmd{err: err}
	}
	return &DecisionCmd{r: r, key: key, cmd: pipe.Eval(ctx, Script, []string{key}, Args(r)...)}
}

// Args returns the script's ARGV for r, which must be valid.
func Args(r ratelimit.Request) []any {
	args := make([]any, 3, 3+3*len(r.Limits))
	args[0] = ""
	if !r.Now.IsZero() {
		args[0] = r.Now.UnixMicro()
	}
	args[1] = r.Cost
	args[2] = "0"
	if r.Peek {
		args[1], args[2] = 1, "1"
	}
	for _, l := range r.Limits {
		args = append(args, l.Capacity, l.RefillTokens, l.RefillPeriod.Microseconds())
	}
	return args
}

// ParseReply turns the script's reply to r into a Decision.
func ParseReply(r ratelimit.Request, reply any) (ratelimit.Decision, error) {
	v, ok := reply.([]any)
	if !ok || len(v) != 5 {
		return ratelimit.Decision{}, fmt.Errorf("unexpected script reply %v", reply)
	}
	var n [5]int64
	for i, x := range v {
		if n[i], ok = x.(int64); !ok {
			return ratelimit.Decision{}, fmt.Errorf("unexpected script reply %v", reply)
		}
	}
	if n[4] < 0 || n[4] >= int64(len(r.Limits)) {
		return ratelimit.Decision{}, fmt.Errorf("unexpected script reply %v", reply)
	}
	return ratelimit.Decision{
		Allowed:    n[0] == 1,
		Remaining:  n[1],
		RetryAfter: micros(n[2]),
		ResetAfter: micros(n[3]),
		Limit:      r.Limits[n[4]],
	}, nil
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// wrapErr adds the operation and key to err, and makes the script's own
// errors match the sentinels they stand for.
func wrapErr(op, key string, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "ratelimit: invalid argument: "):
		return fmt.Errorf("%w: redis %s of %s: %s", ratelimit.ErrInvalidArgument, op, strconv.Quote(key), after(msg, "ratelimit: invalid argument: "))
	case strings.Contains(msg, "ratelimit: malformed bucket state: "):
		return fmt.Errorf("%w: redis %s of %s: %s", ratelimit.ErrCorruptState, op, strconv.Quote(key), after(msg, "ratelimit: malformed bucket state: "))
	}
	return fmt.Errorf("ratelimit: redis %s of %s: %w", op, strconv.Quote(key), err)
}

// after returns the part of a script error after sep, without the " script:
// <sha>, on @user_script:N." suffix Redis appends.
func after(s, sep string) string {
	_, rest, _ := strings.Cut(s, sep)
	rest, _, _ = strings.Cut(rest, " script: ")
	return rest
}
