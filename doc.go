// Package ratelimit is an exact token-bucket rate limiter whose state can live
// in Redis, so that one limit holds across every process that checks it, or in
// this process for a single instance and for tests.
//
// A limiter of 100 checks a second per subject, on Redis, deciding from a
// bucket in this process while Redis cannot be reached, holding this
// process's share of the policy (one of 4 replicas: without the share the
// fleet would admit 4 times the policy):
//
//	client := redis.NewUniversalClient(redisstore.ClientOptions(&redis.UniversalOptions{
//		Addrs: []string{"127.0.0.1:6379"},
//	}))
//	store, err := fallback.New(redisstore.New(client),
//		fallback.WithOutage(fallback.LocalFallback), fallback.WithFleetShare(4))
//	if err != nil {
//		log.Fatal(err)
//	}
//	go store.ProbeForever(ctx, fallback.DefaultProbeInterval, nil)
//	limiter, err := ratelimit.New[string](store, ratelimit.PerSecond(100))
//	if err != nil {
//		log.Fatal(err) // an invalid policy
//	}
//	d, err := limiter.TryAcquire(ctx, "user:42")
//	switch {
//	case err != nil: // not decided
//	case !d.Allowed: // denied: retry after d.RetryAfter
//	}
//
// The package example does the same on the in-process store. Where to start:
//
//   - [New] binds a policy to a [Store] and returns a [Limiter] on subjects
//     of a string type; [NewMulti] checks several limits as one ("5 a minute
//     and 100 a day"); [NewEncoded] takes subjects of any type.
//   - A policy is a [Limit]: [PerSecond], [PerMinute], [PerHour], [PerDay],
//     or any capacity and refill rate.
//   - [Limiter.TryAcquire] returns a [Decision]; [Limiter.Wait] waits for a
//     token instead, for outbound calls; [Limiter.Reserve] takes an estimate
//     for work whose cost is known only after it (a language model's tokens),
//     and the [Reservation] settles the real cost.
//   - [NewPlans] offers named plans ("free", "pro") and keeps each subject's
//     assignment in the store, so that every process gives a subject the
//     same policy; [Plans.For] returns the subject's Limiter.
//   - Stores: memstore.New (in this process), redisstore.New(client) (Redis,
//     Sentinel or Cluster), and fallback.New(store, ...) for the behaviour
//     while Redis is down.
//   - Middleware: httplimit.New (net/http) and grpclimit.New (gRPC server
//     interceptors).
//
// # The algorithm
//
// Each subject (a user, an API key, a tenant) has a bucket that holds up to
// Capacity tokens and refills continuously at RefillTokens per RefillPeriod. A
// check takes cost tokens when the bucket holds them and is denied otherwise; a
// denial consumes nothing. Capacity is the burst: a subject that has been idle
// can spend a full bucket at once, and is then paced by the refill rate.
//
// Refill is smooth and exact. Time is counted in whole microseconds and a
// bucket's level in units of 1/RefillPeriod of a token, so refill over any
// elapsed time is an integer and the remainder below one token is carried from
// check to check, never rounded away and never counted twice. Only whole tokens
// are spent or reported. Every quantity stays below 2^53, the range in which
// Redis's Lua numbers are exact; Limit.Validate rejects policies that could
// leave it.
//
// # Decisions and errors
//
// A check returns a Decision, an ordinary value for both outcomes: Allowed,
// Remaining (the balance after the check), RetryAfter (the wait until cost
// tokens are there) and ResetAfter (the wait until the bucket is full). An error
// means the check could not be decided: invalid input (wrapping
// ErrInvalidArgument, reported before any store is called), a malformed stored
// bucket (tokenbucket.ErrCorruptState), or a store that could not be reached. The library
// applies no fallback of its own; package fallback offers the outage behaviours
// as explicit choices.
//
// Checks never wait. Limiter.Wait and WaitN are for callers that throttle
// their own outbound calls: they check, sleep for RetryAfter, and check again
// until admitted or the context ends; a wait that would outlast the context's
// deadline is answered at once. A waiter polls the shared bucket; it is not a
// queue.
//
// # Stores and keys
//
// A Limiter binds a policy and a namespace to a Store. Package memstore keeps
// buckets in this process; package redisstore keeps them in Redis, where each
// check is one script call that decides and consumes atomically. A subject's
// whole bucket is one key, "<len(namespace)>:<namespace>:<subject>", so it
// hashes to one slot on Redis Cluster and namespaces never collide. A key
// expires once its bucket would be full again, so live keys track the subjects
// seen within one refill window.
//
// # Time
//
// By default a store uses its own clock (Redis uses the server's TIME, so every
// process shares one clock). WithClock injects a clock whose time is passed to
// the store instead; tests use it to control time on every store without
// sleeping. Key expiry stays on
// the store's own clock: see WithClock. A clock that moves backwards credits
// nothing; the wait it causes is folded into RetryAfter and the key's expiry.
//
// # Policy changes
//
// A bucket records the policy that wrote it. When a check with another policy
// meets it, as during a rolling deploy, the time since the bucket's last check
// is credited at the rate of the policy that wrote it, and the subject keeps
// the lesser of those tokens and the new capacity (with the part of a token it
// had, rounded down): each interval is credited once, at one policy's rate, so
// old and new instances taking turns can never mint tokens, and a subject is
// not starved while they alternate. Decision.Converted tells such a check.
// Policies of the same capacity and the same rate in lowest terms are one
// policy (Limit.Same).
//
// Limiter, tokenbucket.Bucket and the stores in this module are safe for simultaneous
// use by multiple goroutines. This package starts one goroutine, NewPlans's
// watcher of the assignments, which Plans.Close stops: a check, a Wait and
// the denial cache run on the caller's. The goroutines a store
// starts are in its own documentation (redisstore's sender while checks are
// queued, fallback's bounded probes). The arithmetic itself, for store
// authors and single-process use, is package tokenbucket.
package ratelimit
