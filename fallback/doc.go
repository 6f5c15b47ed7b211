// Package fallback is a ratelimit.Store that wraps another (the primary,
// usually a redisstore.Store) and decides what a check does while the primary
// cannot be reached.
//
// # Behaviours
//
// While the primary answers, every decision is the primary's. When a call
// fails with an error that says the primary could not be reached (see
// IsUnreachable), the Store marks the primary down at once and answers that
// call, and every following one, with the Outage chosen by
// WithOutage:
//
//   - ReturnError (the default): an error wrapping ratelimit.ErrUnavailable. The caller
//     decides.
//   - FailOpen: admitted without a check, as a full bucket would admit it.
//     The Decision's Source is SourceFailOpen and it is not Enforced.
//   - FailClosed: denied without a check, as an empty bucket would deny it
//     (RetryAfter is the time the policy takes to refill the cost). Source is
//     SourceFailClosed.
//   - LocalFallback: decided against a bucket per key kept in this process,
//     with the same policy (or the fleet share of it, below) and the same
//     exact arithmetic (tokenbucket's State.Step, through a memstore.Store).
//     Source is SourceLocal.
//
// # The breaker
//
// Once a call has marked the primary down, no check touches it: every
// behaviour answers at once, so a dead or hung Redis costs the calls that were
// in flight when it went away, and no more. Only a probe brings the primary
// back: Probe pings it once (through WithProbe, the primary's own Ping method
// when it has one, or a peek at a key that belongs to no Limiter) and marks it
// alive when it answers, or down when it does not (unless checks were
// answered while the ping waited: then only the probe was slow).
// ProbeForever probes every interval (DefaultProbeInterval, 100 ms) until its
// context ends, giving each probe the interval or one second, whichever is
// longer; run it in a goroutine whose lifetime you own. Without it a Store
// that went down stays down until MarkAlive or a kicked probe (below).
//
// The package starts one kind of goroutine of its own: when a caller's
// deadline runs out while the primary is asked, the Store starts one probe
// of that partition in a goroutine bounded by the probe interval, at most
// one per interval per partition, so a hung primary is found even when the
// callers' deadlines are shorter than its round trip. It ends by itself.
//
// WithObserver reports every change of the flag (down with its cause, alive
// again) to an Observer, such as promobserver's, whose ratelimit_primary_up
// gauge follows it. A Limiter never sees these events: they are the store's.
//
// Flag changes are guarded by a generation count: a failure of a check that
// started before the primary went down and came back does not mark it down
// again, and a ping that started before a newer failure does not undo it.
//
// When the primary is back, decisions go to it again and find the shared
// bucket as the fleet left it: the local buckets are not merged into it.
// They are kept (until they would be full again), so a primary that flaps
// does not hand out a fresh local bucket at each flap.
//
// # Which errors mark the primary down
//
// IsUnreachable is the default classification: an error wrapping
// ratelimit.ErrUnavailable, with which a store reports that it could not be
// reached (redisstore wraps it around a connection pool timeout and the
// replies with which Redis says it cannot serve the key right now: LOADING,
// MASTERDOWN, CLUSTERDOWN, TRYAGAIN), and from any store refused, reset and
// aborted connections, EOF, network and I/O timeouts, and WithTimeout's own
// deadline expiring while the primary was being asked. Not an invalid argument, not a corrupt
// bucket (tokenbucket.ErrCorruptState), not a refusal of credentials
// (WRONGPASS, NOAUTH, NOPERM), and never the caller's own deadline or
// cancellation: a check whose context ended is answered by the outage
// behaviour (it does not block) and kicks a probe (above), which marks the
// primary down only if the primary itself does not answer. So a caller with
// a 30 µs deadline on a healthy Redis does not send the fleet to its local
// buckets, and a hung Redis is still found within the deadline plus one
// probe interval. A deadline of WithTimeout's own is the store's, and does
// mark the primary down. WithClassifier replaces the classification.
//
// # Deadlines
//
// A check costs at most the caller's deadline, or WithTimeout's when that is
// shorter: the wrapper adds no wait of its own, and the local bucket never
// blocks. This relies on the primary honouring its context, which a go-redis
// client does only with ContextTimeoutEnabled (see redisstore.ClientOptions);
// without it a hung Redis costs the client's read timeout, 3 s by default. A
// check without any deadline on a hung primary waits for the client's own
// timeouts; give every check a deadline, or set WithTimeout.
//
// # The fleet share
//
// WithFleetShare(n) tells the Store that n processes share the policy. While
// the primary is down, each one then enforces Share(limit, n): capacity and
// refill tokens divided by n, rounded down but at least 1, over the same
// refill period. Over an outage of length T, a token bucket of capacity C'
// and refill R' per period P admits at most C' + R'·T/P tokens, so the n
// processes together admit at most
//
//	n·max(1, ⌊C/n⌋) + n·max(1, ⌊R/n⌋)·T/P
//
// which is at most the policy's own C + R·T/P when C >= n and R >= n.
// Rounding down can leave the fleet up to n-1 tokens under the policy per
// burst and per period; a policy smaller than n (C < n or R < n) gives every
// process one token, so the fleet may admit up to n per burst or per period.
// A check whose cost exceeds the share's capacity can never pass locally, so
// it is denied, with RetryAfter the time the share takes to refill from
// empty. The Decision's Limit is then the share that decided it, so that
// Remaining and RetryAfter read against it.
//
// A quota (see ratelimit.Quota) is shared the same way: each process counts
// the current window against max(1, ⌊A/n⌋) of its allowance A, from
// nothing, since it cannot know what the fleet used before the outage; and
// what it admits locally is never added to the shared count afterwards. So
// in a window that an outage touches, the fleet admits at most the
// allowance in the shared store plus n·max(1, ⌊A/n⌋) locally: up to twice
// the allowance (more when A < n), and exactly the allowance in every window
// the outage does not touch. ReturnError and FailClosed never exceed the
// allowance; FailOpen admits without counting.
//
// # Bounds across an outage
//
// The shared bucket keeps refilling while nobody asks it, so over any window
// the shared decisions stay within the policy and the local ones add to them:
// the fleet admits at most the policy's allowance for the window plus what
// the local buckets admitted during the outage (the sum above). A Redis that
// restarts empty (no persistence) forgets what its buckets had spent, so each
// subject can spend up to one more capacity after each restart, with or
// without this package. A check that timed out on a hung Redis may still run
// once the server resumes: its tokens are then spent both in Redis and, with
// LocalFallback, locally, which errs towards denying.
//
// # Redis Cluster
//
// One master down is not the whole cluster down. A redisstore.Store on a
// ClusterClient reports its partitions to this package, one per master, and
// so gets one liveness flag per partition, each probed by a ping of its
// own: a dead master sends only its own subjects to the outage behaviour,
// and the other masters' subjects keep their shared buckets. Nothing needs
// wiring: fallback.New(redisstore.New(cc)) does it. A single server is one
// partition.
//
// After a failover the dead master's address serves no key: every one of its
// slots belongs to the promoted replica. redisstore's partition ping reloads
// the client's layout when it fails; the probe then sees the dead master's
// keys map to the promoted replica, forgets the dead master's partition (so
// IsAlive is true again and the observer hears it come back) and those
// subjects are back on the shared buckets.
//
// # Time
//
// The local buckets and the unchecked decisions use the request's time when
// it has one (a Limiter built with ratelimit.WithClock), else the Store's
// clock (WithClock; by default the wall clock at New advanced by the
// monotonic clock, so a step of the system clock does not move the local
// buckets). Tests inject both and never sleep to wait for refill.
//
// # Batches
//
// A Store is a ratelimit.BatchStore. ApplyBatch sends the items of live
// partitions to the primary in one ApplyBatch (one Apply each when the
// primary is not a BatchStore) and answers the others with the outage
// behaviour, so Limiter.TryAcquireMany keeps its single round trip through
// the wrapper. ApplyAll needs a primary that is a BatchStore; it is the
// primary's while the items' partitions are alive, and the outage
// behaviour's for all the items together otherwise (all or nothing on the
// local buckets too). A Limiter
// over a wrapped memstore.Store builds no key per check, as over the
// memstore.Store itself.
//
// A Store is safe for simultaneous use by multiple goroutines.
package fallback
