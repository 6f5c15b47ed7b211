package main

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
	redisrate "github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/throttled/throttled/v2"
	goredisstore "github.com/throttled/throttled/v2/store/goredisstore.v9"
	ulule "github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"
	"github.com/zeromicro/go-zero/core/limit"
	"github.com/zeromicro/go-zero/core/logx"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"
)

// Checker is the one small interface every limiter is driven through: one
// check of cost tokens for subject, under the policy the checker was built
// with. A limiter that cannot tell an outage from a denial (go-zero) reports
// a denial.
type Checker interface {
	Check(ctx context.Context, subject string, cost int64) (allowed bool, err error)
	Close()
}

// policy is the benchmark's limit: rate per second, bursting to burst.
type policy struct {
	rate, burst int64
}

// env is what a contender needs to build its checker.
type env struct {
	addr     string
	pool     int // go-redis pool size; 0 keeps go-redis's default
	policy   policy
	redisPID int // the redis-server this run started, whose CPU it reads (0: none)
	// batch settings of the coalescing prototype
}

// contender is one limiter of the comparison.
type contender struct {
	name   string
	remote bool // decides in Redis
	note   string
	build  func(e env) (Checker, error)
}

// goRedisOptions are the client settings every go-redis based contender
// gets, ours and the peers alike: the settings redisstore documents (no
// command retries, deadlines from the context, one dial attempt), which
// change nothing on a healthy loopback server but keep a retried script from
// counting twice.
func goRedisOptions(e env) *redis.Options {
	return &redis.Options{
		Addr:                  e.addr,
		PoolSize:              e.pool,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		DialerRetries:         1,
	}
}

// FloorScript is the trivial script of the floor: one command.
const FloorScript = "return redis.call('HINCRBY', KEYS[1], 'n', 1)"

// FloorSHA is FloorScript's SHA-1.
var FloorSHA = sha1hex(FloorScript)

func sha1hex(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

func contenders() []contender {
	return []contender{
		{name: "floor (go-redis)", remote: true,
			note:  "one-command Lua script (HINCRBY) by EVALSHA through go-redis: no limiter can do less per check",
			build: newFloor},
		{name: "skeleton (go-redis)", remote: true,
			note:  "the skeleton script (TIME, GET, SET PX; decides nothing) by EVALSHA through go-redis: the least a bucket kept in one key on the server's clock does per check",
			build: newSkeleton},
		{name: "floor (rueidis auto-pipelining)", remote: true,
			note:  "the same script through rueidis, which coalesces concurrent commands into pipelines",
			build: newFloorRueidis},
		{name: "ours: redisstore", remote: true,
			note:  "ratelimit.Limiter over redisstore.New and go-redis, as shipped (coalesces concurrent checks into pipelines, one round trip in flight)",
			build: newOursRedis},
		{name: "ours: redisstore, and a monthly quota", remote: true,
			note:  "the same with a quota of a calendar month beside the limit (ratelimit.WithQuotas), which the run never exhausts",
			build: newOursRedisQuota},
		{name: "ours: redisstore, by Plans", remote: true,
			note:  "the same policy as the default plan of a ratelimit.Plans (two plans; no subject assigned): Plans.For, then its Limiter",
			build: newOursPlans},
		{name: "ours: redisstore WithoutCoalescing", remote: true,
			note:  "the same with redisstore.WithoutCoalescing(): one EVALSHA round trip per check",
			build: newOursRedisSingle},
		{name: "ours: rueidis (prototype)", remote: true,
			note:  "bench's RueidisStore: our script through rueidis auto-pipelining",
			build: newOursRueidis},
		{name: "redis_rate v10", remote: true,
			note:  "github.com/go-redis/redis_rate/v10: GCRA in one script",
			build: newRedisRate},
		{name: "go-zero TokenLimiter", remote: true,
			note:  "github.com/zeromicro/go-zero/core/limit: one TokenLimiter per subject, two keys; errors read as denials",
			build: newGoZero},
		{name: "ulule/limiter v3", remote: true,
			note:  "github.com/ulule/limiter/v3 redis store: a fixed window (INCRBY+PEXPIRE script)",
			build: newUlule},
		{name: "throttled v2", remote: true,
			note:  "github.com/throttled/throttled/v2 GCRA over its go-redis v9 store: GET+TIME, then SETNX or a CAS script",
			build: newThrottled},
		{name: "ours: memstore", remote: false,
			note:  "ratelimit.Limiter over memstore (in-process, for reference)",
			build: func(e env) (Checker, error) { return newOursLocal(memstore.New(), e) }},
	}
}

// ---- the floors ----

type floor struct{ c *redis.Client }

func newFloor(e env) (Checker, error) {
	c := redis.NewClient(goRedisOptions(e))
	if err := c.ScriptLoad(context.Background(), FloorScript).Err(); err != nil {
		c.Close()
		return nil, err
	}
	return &floor{c}, nil
}

func (f *floor) Check(ctx context.Context, subject string, _ int64) (bool, error) {
	return true, f.c.EvalSha(ctx, FloorSHA, []string{"floor:" + subject}).Err()
}
func (f *floor) Close() { f.c.Close() }

// skeleton runs SkeletonScript with the expiry our script sets after one
// token of the policy.
type skeleton struct {
	c  *redis.Client
	px int64
}

func newSkeleton(e env) (Checker, error) {
	c := redis.NewClient(goRedisOptions(e))
	if err := c.ScriptLoad(context.Background(), SkeletonScript).Err(); err != nil {
		c.Close()
		return nil, err
	}
	return &skeleton{c, skeletonPX(e.policy)}, nil
}

func (s *skeleton) Check(ctx context.Context, subject string, _ int64) (bool, error) {
	return true, s.c.EvalSha(ctx, skeletonSHA, []string{"skel:" + subject}, s.px).Err()
}
func (s *skeleton) Close() { s.c.Close() }

type floorRueidis struct {
	c rueidis.Client
}

func newRueidis(e env) (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  []string{e.addr},
		DisableCache: true,
		DisableRetry: true,
	})
}

func newFloorRueidis(e env) (Checker, error) {
	c, err := newRueidis(e)
	if err != nil {
		return nil, err
	}
	if err := c.Do(context.Background(), c.B().ScriptLoad().Script(FloorScript).Build()).Error(); err != nil {
		c.Close()
		return nil, err
	}
	return &floorRueidis{c}, nil
}

func (f *floorRueidis) Check(ctx context.Context, subject string, _ int64) (bool, error) {
	return true, f.c.Do(ctx, f.c.B().Evalsha().Sha1(FloorSHA).Numkeys(1).Key("floorrd:"+subject).Build()).Error()
}
func (f *floorRueidis) Close() { f.c.Close() }

// ---- ours ----

type ours struct {
	lim   *ratelimit.Limiter[string]
	close func()
}

func ourLimit(e env) ratelimit.Limit {
	return ratelimit.NewLimit(e.policy.rate, time.Second, e.policy.burst)
}

func newOursLocal(s ratelimit.Store, e env) (Checker, error) {
	lim, err := ratelimit.New[string](s, ourLimit(e))
	if err != nil {
		return nil, err
	}
	return &ours{lim: lim, close: func() {}}, nil
}

func newOursRedis(e env) (Checker, error) {
	c := redis.NewClient(goRedisOptions(e))
	lim, err := ratelimit.New[string](redisstore.New(c), ourLimit(e))
	if err != nil {
		c.Close()
		return nil, err
	}
	return &ours{lim: lim, close: func() { c.Close() }}, nil
}

func newOursRedisQuota(e env) (Checker, error) {
	c := redis.NewClient(goRedisOptions(e))
	lim, err := ratelimit.New[string](redisstore.New(c), ourLimit(e), ratelimit.WithNamespace("rlq"),
		ratelimit.WithQuotas(ratelimit.CalendarQuota(1<<50, ratelimit.Month, nil)))
	if err != nil {
		c.Close()
		return nil, err
	}
	return &ours{lim: lim, close: func() { c.Close() }}, nil
}

// oursPlans checks each subject through its plan's Limiter.
type oursPlans struct {
	plans *ratelimit.Plans[string]
	close func()
}

func newOursPlans(e env) (Checker, error) {
	c := redis.NewClient(goRedisOptions(e))
	free := ourLimit(e)
	pro := ratelimit.NewLimit(10*e.policy.rate, time.Second, 10*e.policy.burst)
	p, err := ratelimit.NewPlans[string](redisstore.New(c), []ratelimit.Plan{
		{Name: "free", Limits: []ratelimit.Limit{free}},
		{Name: "pro", Limits: []ratelimit.Limit{pro}},
	}, "free", ratelimit.WithNamespace("rlp"))
	if err != nil {
		c.Close()
		return nil, err
	}
	return &oursPlans{plans: p, close: func() { p.Close(); c.Close() }}, nil
}

func (o *oursPlans) Check(ctx context.Context, subject string, cost int64) (bool, error) {
	_, lim := o.plans.For(subject)
	d, err := lim.TryAcquireN(ctx, subject, cost)
	return d.Allowed, err
}
func (o *oursPlans) Close() { o.close() }

func newOursRedisSingle(e env) (Checker, error) {
	c := redis.NewClient(goRedisOptions(e))
	lim, err := ratelimit.New[string](redisstore.New(c, redisstore.WithoutCoalescing()), ourLimit(e), ratelimit.WithNamespace("rls"))
	if err != nil {
		c.Close()
		return nil, err
	}
	return &ours{lim: lim, close: func() { c.Close() }}, nil
}

func newOursRueidis(e env) (Checker, error) {
	c, err := newRueidis(e)
	if err != nil {
		return nil, err
	}
	lim, err := ratelimit.New[string](NewRueidisStore(c), ourLimit(e), ratelimit.WithNamespace("rlr"))
	if err != nil {
		c.Close()
		return nil, err
	}
	return &ours{lim: lim, close: c.Close}, nil
}

func (o *ours) Check(ctx context.Context, subject string, cost int64) (bool, error) {
	d, err := o.lim.TryAcquireN(ctx, subject, cost)
	return d.Allowed, err
}
func (o *ours) Close() { o.close() }

// ---- redis_rate ----

type redisRate struct {
	c   *redis.Client
	lim *redisrate.Limiter
	l   redisrate.Limit
}

func newRedisRate(e env) (Checker, error) {
	c := redis.NewClient(goRedisOptions(e))
	return &redisRate{c: c, lim: redisrate.NewLimiter(c),
		l: redisRateLimit(e.policy)}, nil
}

func (r *redisRate) Check(ctx context.Context, subject string, cost int64) (bool, error) {
	res, err := r.lim.AllowN(ctx, subject, r.l, int(cost))
	if err != nil {
		return false, err
	}
	return res.Allowed > 0, nil
}
func (r *redisRate) Close() { r.c.Close() }

// ---- go-zero ----

type goZero struct {
	store       *zredis.Redis
	rate, burst int
	mu          sync.RWMutex
	lims        map[string]*limit.TokenLimiter
}

var logxOnce sync.Once

func newGoZero(e env) (Checker, error) {
	logxOnce.Do(func() { logx.Disable(); logx.DisableStat() })
	store, err := zredis.NewRedis(zredis.RedisConf{Host: e.addr, Type: zredis.NodeType, NonBlock: true})
	if err != nil {
		return nil, err
	}
	return &goZero{store: store, rate: int(e.policy.rate), burst: int(e.policy.burst),
		lims: make(map[string]*limit.TokenLimiter)}, nil
}

// limiter returns subject's TokenLimiter: go-zero binds one key to each.
func (g *goZero) limiter(subject string) *limit.TokenLimiter {
	g.mu.RLock()
	l := g.lims[subject]
	g.mu.RUnlock()
	if l != nil {
		return l
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if l = g.lims[subject]; l == nil {
		l = limit.NewTokenLimiter(g.rate, g.burst, g.store, "gz:"+subject)
		g.lims[subject] = l
	}
	return l
}

func (g *goZero) Check(ctx context.Context, subject string, cost int64) (bool, error) {
	return g.limiter(subject).AllowNCtx(ctx, time.Now(), int(cost)), nil
}
func (g *goZero) Close() {}

// ---- ulule ----

type ululeLim struct {
	c   *redis.Client
	lim *ulule.Limiter
}

func newUlule(e env) (Checker, error) {
	c := redis.NewClient(goRedisOptions(e))
	store, err := ulredis.NewStoreWithOptions(c, ulule.StoreOptions{Prefix: "ul"})
	if err != nil {
		c.Close()
		return nil, err
	}
	// ulule's limit is a count per fixed window; the burst plays no part.
	lim := ulule.New(store, ulule.Rate{Period: time.Second, Limit: e.policy.rate})
	return &ululeLim{c: c, lim: lim}, nil
}

func (u *ululeLim) Check(ctx context.Context, subject string, cost int64) (bool, error) {
	lc, err := u.lim.Increment(ctx, subject, cost)
	if err != nil {
		return false, err
	}
	return !lc.Reached, nil
}
func (u *ululeLim) Close() { u.c.Close() }

// ---- throttled ----

type throttledLim struct {
	c   *redis.Client
	lim *throttled.GCRARateLimiterCtx
}

func newThrottled(e env) (Checker, error) {
	c := redis.NewClient(goRedisOptions(e))
	store, err := goredisstore.NewCtx(c, "th:")
	if err != nil {
		c.Close()
		return nil, err
	}
	// throttled admits MaxBurst+1 at once.
	lim, err := throttled.NewGCRARateLimiterCtx(store, throttled.RateQuota{
		MaxRate: throttled.PerSec(int(e.policy.rate)), MaxBurst: int(e.policy.burst - 1)})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &throttledLim{c: c, lim: lim}, nil
}

func (t *throttledLim) Check(ctx context.Context, subject string, cost int64) (bool, error) {
	limited, _, err := t.lim.RateLimitCtx(ctx, subject, int(cost))
	if err != nil {
		return false, err
	}
	return !limited, nil
}
func (t *throttledLim) Close() { t.c.Close() }

var errUnknown = errors.New("unknown contender")

func findContender(name string) (contender, error) {
	for _, c := range contenders() {
		if c.name == name {
			return c, nil
		}
	}
	return contender{}, fmt.Errorf("%w %q", errUnknown, name)
}
