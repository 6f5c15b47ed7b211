package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/script"
	redisrate "github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// SkeletonScript is the least any server-clock bucket kept in one key can
// do: read the server's TIME, GET the key and SET it back with an expiry,
// deciding nothing. ARGV[1] is the expiry in ms. It is the yardstick of
// target 3 (our script at least 0.8× its rate).
const SkeletonScript = `local t = redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], t[1] .. t[2], 'PX', ARGV[1])
return 1`

var skeletonSHA = sha1hex(SkeletonScript)

// skeletonPX is the skeleton's expiry (ms) for a check of p, our key's after
// one token: it lives until the bucket is full again, one token at p.rate
// per second, in ms rounded up, at least 1 ms.
func skeletonPX(p policy) int64 {
	return max(1, (1000+p.rate-1)/p.rate)
}

// serverScript is one script of the in-Redis comparison, with the ARGV of
// one check of the benchmark's policy as its library passes them.
type serverScript struct {
	name string
	tag  string // key prefix of its runs, rb:<tag>:...
	body string
	sha  string
	// fn and lib: a script that ships as a function (ours) runs as one,
	// FCALL of fn after FUNCTION LOAD of lib.
	fn, lib string
	args    []any
	// check tells whether a reply to one check on a fresh key is the one
	// its library expects: redis-benchmark counts error replies as requests
	// like any other.
	check func(reply any) error
}

// Names of the scripts of the in-Redis comparison (the targets use them).
const (
	scriptOurs      = "ours: tokenbucket.lua"
	scriptOursQuota = "ours, and a monthly quota"
	scriptRedisRate = "redis_rate v10: GCRA script"
	scriptSkeleton  = "skeleton: TIME + GET + SET PX"
	scriptFloor     = "floor: HINCRBY script"
)

// serverScripts returns the scripts the ceiling and script sections run:
// our shipped script (as the function it ships as) on a one-limit check of p (ARGV from redisstore's encoder,
// the server's TIME), redis_rate v10's GCRA script with the ARGV its
// AllowN sends for p (both taken from the module, see captureRedisRate),
// the skeleton with our script's expiry for a one-token check of p, and
// the one-command floor.
func serverScripts(p policy) ([]serverScript, error) {
	r := ratelimit.Request{Limits: []ratelimit.Limit{ourLimit(env{policy: p})}, Cost: 1}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	// The same check with a quota of a calendar month that it never
	// exhausts: the cost a quota adds.
	rq := r
	rq.Quotas = []ratelimit.Quota{ratelimit.CalendarQuota(1<<50, ratelimit.Month, nil)}
	rrBody, rrArgs, err := captureRedisRate(p)
	if err != nil {
		return nil, fmt.Errorf("redis_rate's script: %w", err)
	}
	px := skeletonPX(p)
	isInt := func(reply any) error {
		if _, ok := reply.(int64); !ok {
			return errors.New("want an integer")
		}
		return nil
	}
	return []serverScript{
		{name: scriptOurs, tag: "ours", body: script.Source, sha: script.SHA, fn: script.Function, lib: script.Library,
			args: new(script.Encoder).Args(r),
			check: func(reply any) error {
				d, err := script.ParseReply(r, reply)
				if err == nil && !d.Allowed {
					err = errors.New("a first check on a fresh key was denied")
				}
				return err
			}},
		{name: scriptOursQuota, tag: "oursq", body: script.Source, sha: script.SHA, fn: script.Function, lib: script.Library,
			args: new(script.Encoder).Args(rq),
			check: func(reply any) error {
				d, err := script.ParseReply(rq, reply)
				if err == nil && !d.Allowed {
					err = errors.New("a first check on a fresh key was denied")
				}
				return err
			}},
		{name: scriptRedisRate, tag: "rr", body: rrBody, sha: sha1hex(rrBody), args: rrArgs,
			check: func(reply any) error {
				if v, ok := reply.([]any); !ok || len(v) != 4 || v[0] != int64(1) {
					return errors.New("want {1, remaining, retry, reset}: allowed")
				}
				return nil
			}},
		{name: scriptSkeleton, tag: "skel", body: SkeletonScript, sha: skeletonSHA, args: []any{px}, check: isInt},
		{name: scriptFloor, tag: "floor", body: FloorScript, sha: FloorSHA, check: isInt},
	}, nil
}

// errCaptured stops the capture client's EVAL before it leaves the process.
var errCaptured = errors.New("bench: redis_rate's EVAL captured")

// captureHook answers redis_rate's EVALSHA with NOSCRIPT, so that go-redis
// falls back to EVAL with the script's body, and records that EVAL instead
// of sending it. Nothing reaches a server.
type captureHook struct {
	sha  string // the EVALSHA's digest
	body string
	args []any
}

func (h *captureHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *captureHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(context.Context, []redis.Cmder) error { return errCaptured }
}

func (h *captureHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		switch cmd.Name() {
		case "evalsha":
			if len(a) > 1 {
				h.sha, _ = a[1].(string)
			}
			cmd.SetErr(redis.ErrNoScript)
			return redis.ErrNoScript
		case "eval":
			if len(a) >= 3 {
				h.body, _ = a[1].(string)
				if nk, ok := a[2].(int); ok && 3+nk <= len(a) {
					h.args = append([]any(nil), a[3+nk:]...)
				}
			}
		}
		cmd.SetErr(errCaptured)
		return errCaptured
	}
}

// captureRedisRate returns the script redis_rate v10's AllowN runs and the
// ARGV it passes for one token of p: the module's own text and values, read
// off the command it builds (the script is unexported), so that the bench
// measures exactly what redis_rate sends.
func captureRedisRate(p policy) (body string, args []any, err error) {
	h := &captureHook{}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	c.AddHook(h)
	lim := redisrate.NewLimiter(c)
	_, err = lim.AllowN(context.Background(), "capture", redisRateLimit(p), 1)
	if !errors.Is(err, errCaptured) {
		return "", nil, fmt.Errorf("AllowN did not fall back to EVAL: %v", err)
	}
	if h.body == "" || len(h.args) == 0 {
		return "", nil, errors.New("no EVAL body or ARGV captured")
	}
	if h.sha != sha1hex(h.body) {
		return "", nil, fmt.Errorf("EVALSHA %s is not the SHA-1 of the EVAL body", h.sha)
	}
	return h.body, h.args, nil
}

// redisRateLimit is p in redis_rate's terms.
func redisRateLimit(p policy) redisrate.Limit {
	return redisrate.Limit{Rate: int(p.rate), Burst: int(p.burst), Period: time.Second}
}

// argStrings formats script arguments as go-redis writes them on the wire,
// for redis-benchmark's command line.
func argStrings(args []any) []string {
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = v
		case int:
			out[i] = strconv.Itoa(v)
		case int64:
			out[i] = strconv.FormatInt(v, 10)
		case float64:
			out[i] = strconv.FormatFloat(v, 'f', -1, 64)
		default:
			out[i] = fmt.Sprint(v)
		}
	}
	return out
}

// call queues one run of s on key with args through c: FCALL of its
// function, or EVALSHA.
func (s serverScript) call(ctx context.Context, c redis.Cmdable, key string, args []any) *redis.Cmd {
	if s.fn != "" {
		return c.FCall(ctx, s.fn, []string{key}, args...)
	}
	return c.EvalSha(ctx, s.sha, []string{key}, args...)
}
