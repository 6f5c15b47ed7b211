package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/internal/clock"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/units"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// Bounds on a request. A request beyond them is INVALID_ARGUMENT. Keys and
// values have no bound of their own (a long :path reaches the service from
// Envoy): the message size bounds them, and a long subject is kept in the
// store as its hash.
const (
	// MaxDescriptors bounds the descriptors of one request.
	MaxDescriptors = 64
	// MaxEntries bounds the entries of one descriptor.
	MaxEntries = maxDepth
	// MaxRecvMsgSize is the largest request the gRPC server of
	// ServerOptions accepts, and MaxSendMsgSize the largest response.
	MaxRecvMsgSize = 1 << 20
	MaxSendMsgSize = 4 << 20
)

// DefaultTimeout bounds one ShouldRateLimit's store calls when
// Options.Timeout is zero.
const DefaultTimeout = time.Second

// Headers say which response headers ShouldRateLimit asks Envoy to add, as
// the peer's LIMIT_RESPONSE_HEADERS_ENABLED and LIMIT_*_HEADER settings do.
type Headers struct {
	// Enabled turns the headers on.
	Enabled bool
	// Limit, Remaining and Reset name the headers with the binding rule's
	// requests_per_unit, its remaining tokens and the seconds until its
	// bucket is full (default RateLimit-Limit, RateLimit-Remaining,
	// RateLimit-Reset). RateLimit-Policy and RateLimit (the IETF httpapi
	// fields, as package httplimit writes them) come with them, and
	// Retry-After when the request is over a limit.
	Limit, Remaining, Reset string
}

// HeadersFromEnv reads the peer's variables through getenv:
// LIMIT_RESPONSE_HEADERS_ENABLED (true or 1 turns the headers on),
// LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER.
func HeadersFromEnv(getenv func(string) string) Headers {
	on, _ := strconv.ParseBool(strings.TrimSpace(getenv("LIMIT_RESPONSE_HEADERS_ENABLED")))
	return Headers{
		Enabled:   on,
		Limit:     getenv("LIMIT_LIMIT_HEADER"),
		Remaining: getenv("LIMIT_REMAINING_HEADER"),
		Reset:     getenv("LIMIT_RESET_HEADER"),
	}
}

func (h *Headers) defaults() {
	if h.Limit == "" {
		h.Limit = "RateLimit-Limit"
	}
	if h.Remaining == "" {
		h.Remaining = "RateLimit-Remaining"
	}
	if h.Reset == "" {
		h.Reset = "RateLimit-Reset"
	}
}

// Options configure a Service.
type Options struct {
	// Store keeps the buckets. A ratelimit.BatchStore decides the
	// descriptors of a request all or nothing (see applyAll for others).
	Store ratelimit.Store
	// Config is the configuration to start with; nil means none (every
	// request is OK with no limit until SetConfig).
	Config *Config
	// Clock, when set, is the time of every check; by default the store's
	// own clock (Redis's TIME). Tests set it.
	Clock func() time.Time
	// Timeout bounds the store calls of one request (default
	// DefaultTimeout).
	Timeout time.Duration
	// Headers are the response headers to ask Envoy to add.
	Headers Headers
	// Metrics receives the per-rule counters; nil means none.
	Metrics *Metrics
	// Logger receives reloads and store errors (default: discard).
	Logger *slog.Logger
	// ShadowMode is the peer's global SHADOW_MODE: every request is
	// decided and charged as usual, and the overall answer is OK even when
	// a descriptor is over its limit (the statuses say which); such
	// answers are counted in ratelimit_envoy_global_shadow_mode_total.
	ShadowMode bool
	// DynamicMetadata is the peer's RESPONSE_DYNAMIC_METADATA: every
	// response carries dynamic_metadata with the domain, the descriptors,
	// the request's hits_addend and the merged metadata of the rules whose
	// descriptors passed.
	DynamicMetadata bool
	// Load says how Reload reads a directory.
	Load LoadOptions
	// Observer, when set, is told every bucket decision once, as a
	// Limiter tells its observer: each bucket a request checks or looks at
	// (a refund is not a check, and a requests_per_unit 0 rule decides
	// without a bucket), with the request's store latency, or the error of
	// a store that could not decide. The namespace of its events is the
	// request's domain, as ObservedNamespace names it; the key is the
	// bucket's store key. An acquire is allowed only when the request
	// charged it: all or nothing, a bucket a request did not charge because
	// another one was over its limit is a denial.
	Observer ratelimit.Observer
}

// ObservedNamespace is the namespace of Options.Observer's events for a
// request of domain: "envoy:" and the domain, which no namespace of the
// HTTP API can be (config.ReservedPrefix). The domain, not the rule: the
// domains are those of the configuration (a request of another decides
// nothing), while a descriptor's own limit would add a namespace per limit
// a client sends.
func ObservedNamespace(domain string) string { return config.ReservedPrefix + domain }

// maxOverrides bounds the Limiters of descriptors' own limits that a
// Service keeps for reuse; past it, a new limit gets a Limiter per request.
const maxOverrides = 1024

// Service answers envoy.service.ratelimit.v3.RateLimitService with token
// buckets. It is safe for simultaneous use by multiple goroutines.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	store   ratelimit.Store
	clock   func() time.Time
	timeout time.Duration
	headers Headers
	metrics *Metrics
	log     *slog.Logger
	shadow  bool
	dynamic bool
	load    LoadOptions
	state   atomic.Pointer[state]
	// watched, when set (by tests), is told each tick Watch has handled.
	watched chan struct{}
	// lastErrLog is when a store error was last logged (Unix ns).
	lastErrLog atomic.Int64
	observer   ratelimit.Observer
	// overrides holds the Limiters of descriptors' own limits by their
	// namespace (which names the domain and the limit), at most
	// maxOverrides of them, counted by nOverrides.
	overrides  sync.Map // string -> *ratelimit.Limiter[string]
	nOverrides atomic.Int64
}

// state is a configuration with what each of its rules decides and answers
// with.
type state struct {
	cfg   *Config
	rules map[*Rule]ruleState
}

// ruleState is a rule's part of a state: the Limiter of its bucket (nil for
// an unlimited rule and for requests_per_unit 0), and the current_limit of
// its statuses, which every response naming the rule shares and none
// changes.
type ruleState struct {
	lim     *ratelimit.Limiter[string]
	current *rlsv3.RateLimitResponse_RateLimit
}

// New returns a Service. It does no I/O.
func New(o Options) (*Service, error) {
	if o.Store == nil {
		return nil, errors.New("envoyrls: store must not be nil")
	}
	s := &Service{store: o.Store, clock: o.Clock, timeout: o.Timeout, headers: o.Headers, metrics: o.Metrics, log: o.Logger,
		shadow: o.ShadowMode, dynamic: o.DynamicMetadata, load: o.Load, observer: o.Observer}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.headers.defaults()
	cfg := o.Config
	if cfg == nil {
		cfg = &Config{domains: map[string]*node{}}
	}
	if err := s.SetConfig(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// SetConfig puts cfg in force. A request decided during the swap uses
// either the old configuration or cfg, never a mix. Each rule whose refill
// rate was rounded down (Rule.Rounded) is logged.
func (s *Service) SetConfig(cfg *Config) error {
	st := &state{cfg: cfg, rules: map[*Rule]ruleState{}}
	var opts []ratelimit.Option
	if s.clock != nil {
		opts = append(opts, ratelimit.WithClock(s.clock))
	}
	var err error
	cfg.eachRule(func(r *Rule) {
		if err != nil {
			return
		}
		rs := ruleState{current: &rlsv3.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: unitEnum[r.Unit]}}
		if r.limit != (ratelimit.Limit{}) {
			rs.lim, err = ratelimit.New[string](s.store, r.limit, append(opts, ratelimit.WithNamespace(r.namespace))...)
		}
		st.rules[r] = rs
	})
	if err != nil {
		return fmt.Errorf("envoyrls: %w", err)
	}
	cfg.eachRule(func(r *Rule) {
		if r.Rounded {
			s.log.Warn("envoy rule: the exact refill rate is beyond the 2^53 bound; rounded down by less than one part in 10^9",
				"rule", r.Path, "requests_per_unit", r.RequestsPerUnit, "unit", r.Unit, "capacity", r.Capacity,
				"kept", fmt.Sprintf("%d per %v", r.limit.RefillTokens, r.limit.RefillPeriod))
		}
	})
	s.state.Store(st)
	if s.metrics != nil {
		s.metrics.rules.Set(float64(cfg.rules))
	}
	return nil
}

// Config returns the configuration in force.
func (s *Service) Config() *Config { return s.state.Load().cfg }

// Reload loads the configuration at path (with Options.Load) and puts it in
// force. On an error the configuration in force stays; the error is logged
// with the file and counted in ratelimit_envoy_config_reloads_total.
func (s *Service) Reload(path string) error {
	cfg, err := s.load.Load(path)
	if err == nil {
		err = s.SetConfig(cfg)
	}
	if err != nil {
		s.metrics.reloaded("error")
		s.log.Error("envoy config reload refused; keeping the previous config", "file", path, "err", err, "config", s.Config().String())
		return err
	}
	s.metrics.reloaded("ok")
	s.log.Info("envoy config reloaded", "file", path, "config", cfg.String())
	return nil
}

// Register registers the service on srv.
func (s *Service) Register(srv grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(srv, s) }

// ServerOptions are the options of a gRPC server for the service: message
// sizes capped at MaxRecvMsgSize and MaxSendMsgSize, a pool of
// workersPerCPU stream workers per CPU, and write buffers shared by the
// connections.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRecvMsgSize), grpc.MaxSendMsgSize(MaxSendMsgSize),
		grpc.NumStreamWorkers(uint32(workersPerCPU * runtime.GOMAXPROCS(0))), grpc.SharedWriteBuffer(true),
	}
}

// workersPerCPU sizes the gRPC server's pool of stream workers: goroutines
// that serve one call after another, so that a call neither starts a
// goroutine nor grows a new one's stack (through gRPC and the Redis client,
// a call needs several times the initial stack; growing it copies it each
// time). A call spends most of its time waiting for the store, so a CPU has
// tens of calls in flight; a call beyond the pool gets a goroutine of its
// own, as without one. The pool is not larger because the garbage
// collector halves the stack of every idle worker, and an idle worker's
// next call grows it again: workers that are never all busy cost more
// than they save.
const workersPerCPU = 32

// check is one descriptor of a request, resolved.
type check struct {
	rule     *Rule // nil: no limit
	lim      *ratelimit.Limiter[string]
	subject  string
	metric   string
	hits     uint64
	replaced bool
	current  *rlsv3.RateLimitResponse_RateLimit // the rule's, or a descriptor's own limit
	refund   bool                               // is_negative_hits: hits go back (see refund)
	bucket   *bucket
	// seen is the balance of the bucket this check was counted against,
	// after the checks before it in the request took their hits; fits
	// says whether its hits were there (see settle).
	seen int64
	fits bool
}

// bucket is one key of the request, with the checks that share it.
type bucket struct {
	key        string
	limit      ratelimit.Limit
	limits     []ratelimit.Limit // the Limiter's (see limitsOf), nil for rpu 0
	lim        *ratelimit.Limiter[string]
	subject    string
	cost       int64 // 0 peeks
	shadow     bool
	impossible bool // no bucket can ever hold the cost: rpu 0, or above capacity
	peeked     bool // decided by a look, not an acquire
	d          ratelimit.Decision
	charged    bool
	// left is what the checks counted so far left of the balance the
	// bucket had before the request, -1 once one did not fit (see settle).
	left int64
}

// ShouldRateLimit decides a request as envoyproxy/ratelimit answers it, with
// token buckets, and all or nothing: when any descriptor is over its limit
// the response is OVER_LIMIT and no descriptor's bucket is charged. The
// statuses count the descriptors in turn, as the peer does: of two
// descriptors on one bucket with one token left, the first is OK and the
// second OVER_LIMIT. A malformed request is INVALID_ARGUMENT; a store that
// cannot decide (with the outage behaviour return-error) is UNAVAILABLE.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validate(req); err != nil {
		s.metrics.request("invalid")
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	st := s.state.Load()
	root := st.cfg.domains[req.Domain]
	resp, statuses, resets := newResponse(len(req.Descriptors))
	if root == nil {
		if s.dynamic {
			resp.DynamicMetadata = dynamicMetadata(req, nil)
		}
		s.metrics.request("unknown_domain")
		return resp, nil
	}
	checks := make([]check, len(req.Descriptors))
	var replacing map[string]bool
	refunds := false
	for i, d := range req.Descriptors {
		c := &checks[i]
		c.hits = uint64(max(1, req.HitsAddend))
		if d.HitsAddend != nil {
			c.hits = d.HitsAddend.Value
		}
		c.refund = d.IsNegativeHits
		refunds = refunds || c.refund
		if d.Limit != nil {
			if err := s.overrideCheck(c, req.Domain, d); err != nil {
				s.metrics.request("invalid")
				return nil, status.Error(codes.InvalidArgument, fmt.Sprintf("descriptor %d: %v", i, err))
			}
			continue
		}
		m, ok := lookup(root, req.Domain, d.Entries)
		if !ok {
			continue
		}
		rs := st.rules[m.rule]
		c.rule, c.subject, c.metric, c.lim, c.current = m.rule, m.subject, m.metric, rs.lim, rs.current
		for _, name := range m.rule.Replaces {
			if replacing == nil {
				replacing = map[string]bool{}
			}
			replacing[name] = true
		}
	}
	for i := range checks {
		c := &checks[i]
		// An unlimited rule is never replaced: the peer sets it aside
		// before it looks at the names.
		if c.rule != nil && !c.rule.Unlimited && c.rule.Name != "" && replacing[c.rule.Name] {
			c.replaced = true
		}
	}

	buckets := s.buckets(checks)
	if len(buckets) > 0 || refunds {
		// One bound on the request's store calls, decide's and refund's
		// together (none when the call's own deadline comes first).
		var cancel context.CancelFunc
		ctx, cancel = clock.Bound(ctx, s.timeout)
		defer cancel()
	}
	start := time.Now()
	err := s.decide(ctx, buckets)
	s.observe(ctx, req.Domain, buckets, time.Since(start), err)
	if err != nil {
		s.metrics.request("error")
		switch {
		case errors.Is(ctx.Err(), context.Canceled):
			return nil, status.Error(codes.Canceled, "the client cancelled the request")
		case errors.Is(err, ratelimit.ErrInvalidArgument):
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		if now := time.Now().UnixNano(); now-s.lastErrLog.Load() >= int64(time.Second) {
			s.lastErrLog.Store(now) // at most about one line a second
			s.log.Warn("envoy ShouldRateLimit: the store could not decide; answering UNAVAILABLE", "domain", req.Domain, "err", err)
		}
		return nil, status.Error(codes.Unavailable, "rate limit store unavailable")
	}
	settle(checks, buckets)
	if err := s.refund(ctx, checks); err != nil {
		s.metrics.request("error")
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, status.Error(codes.Canceled, "the client cancelled the request")
		}
		if errors.Is(err, errors.ErrUnsupported) {
			return nil, status.Error(codes.Unimplemented, err.Error())
		}
		if now := time.Now().UnixNano(); now-s.lastErrLog.Load() >= int64(time.Second) {
			s.lastErrLog.Store(now)
			s.log.Warn("envoy ShouldRateLimit: the store could not refund; answering UNAVAILABLE", "domain", req.Domain, "err", err)
		}
		return nil, status.Error(codes.Unavailable, "rate limit store unavailable")
	}

	// The headers describe the status closest to its limit, the last one
	// over its limit when there is one, as the peer chooses.
	bind, least := -1, uint32(maxUint32)
	for i := range checks {
		c := &checks[i]
		st := &statuses[i]
		setStatus(st, &resets[i], c)
		s.metrics.observe(c)
		if st.CurrentLimit != nil && st.LimitRemaining < least {
			bind, least = i, st.LimitRemaining
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			bind, least = i, 0
		}
	}
	if s.headers.Enabled && bind >= 0 {
		resp.ResponseHeadersToAdd = s.responseHeaders(&checks[bind], resp.Statuses[bind])
	}
	if s.dynamic {
		resp.DynamicMetadata = dynamicMetadata(req, checks)
	}
	switch {
	case resp.OverallCode == rlsv3.RateLimitResponse_OK:
		s.metrics.request("ok")
	case s.shadow:
		resp.OverallCode = rlsv3.RateLimitResponse_OK
		s.metrics.globalShadow()
		s.metrics.request("ok")
	default:
		s.metrics.request("over_limit")
	}
	return resp, nil
}

// limitsOf returns b's limits, read from its Limiter when first asked for:
// a bucket decided through its Limiter alone never needs them.
func (b *bucket) limitsOf() []ratelimit.Limit {
	if b.limits == nil && b.lim != nil {
		b.limits = b.lim.Limits()
	}
	return b.limits
}

// settle counts each check against its bucket in request order, as the
// peer counts descriptors: a check fits when its hits are within what the
// bucket held before the request less the hits of the checks before it, and
// no check before it on the bucket failed. A look (hits 0) at an empty
// bucket fits. The request as a whole was decided by decide;
// settle only says which descriptors the statuses and metrics name.
func settle(checks []check, buckets []*bucket) {
	for _, b := range buckets {
		before := max(b.d.Remaining, 0)
		switch {
		case b.limit == (ratelimit.Limit{}):
			before = 0 // rpu 0: never a token
		case b.charged:
			before += b.cost
		}
		b.left = before
	}
	for i := range checks {
		c := &checks[i]
		b := c.bucket
		if b == nil {
			continue
		}
		c.seen = max(b.left, 0)
		c.fits = b.left >= 0 && c.hits <= uint64(b.left)
		if c.fits {
			b.left -= int64(c.hits)
		} else {
			b.left = -1 // overdrawn: every later check is over, a look too
		}
	}
}

// validate refuses what cannot be decided: no domain, no descriptors, a
// descriptor without entries, an empty key, and sizes above the bounds.
func validate(req *rlsv3.RateLimitRequest) error {
	switch {
	case req.Domain == "":
		return errors.New("the domain must not be empty")
	case len(req.Descriptors) == 0:
		return errors.New("the descriptor list must not be empty")
	case len(req.Descriptors) > MaxDescriptors:
		return fmt.Errorf("at most %d descriptors per request (got %d)", MaxDescriptors, len(req.Descriptors))
	}
	for i, d := range req.Descriptors {
		switch {
		case d == nil || len(d.Entries) == 0:
			return fmt.Errorf("descriptor %d has no entries", i)
		case len(d.Entries) > MaxEntries:
			return fmt.Errorf("descriptor %d: at most %d entries (got %d)", i, MaxEntries, len(d.Entries))
		}
		for j, e := range d.Entries {
			switch {
			case e == nil || e.Key == "":
				return fmt.Errorf("descriptor %d entry %d: the key must not be empty", i, j)
			}
		}
	}
	return nil
}

// overrideUnits maps a descriptor's limit unit to its length (envoy.type.v3,
// which has no week).
var overrideUnits = map[typev3.RateLimitUnit]string{
	typev3.RateLimitUnit_SECOND: "second",
	typev3.RateLimitUnit_MINUTE: "minute",
	typev3.RateLimitUnit_HOUR:   "hour",
	typev3.RateLimitUnit_DAY:    "day",
	typev3.RateLimitUnit_MONTH:  "month",
	typev3.RateLimitUnit_YEAR:   "year",
}

// overrideCheck resolves a descriptor that carries its own limit: a bucket of
// requests_per_unit per unit (times unit_multiplier), keyed by the domain,
// the entries and the limit, never in shadow mode.
func (s *Service) overrideCheck(c *check, domain string, d *rlv3.RateLimitDescriptor) error {
	o := d.Limit
	name, ok := overrideUnits[o.Unit]
	if !ok {
		return fmt.Errorf("limit override: unknown unit %v", o.Unit)
	}
	mult := uint32(1)
	if o.UnitMultiplier != nil {
		mult = o.UnitMultiplier.Value
		if mult == 0 {
			return errors.New("limit override: unit_multiplier must be at least 1")
		}
	}
	per := units.Durations[name] * time.Duration(mult)
	if per/time.Duration(mult) != units.Durations[name] {
		return errors.New("limit override: the period overflows")
	}
	var b strings.Builder
	b.WriteString("envoy-override")
	frame(&b, domain)
	fmt.Fprintf(&b, ":%d/%s*%d", o.RequestsPerUnit, name, mult)
	// The statistics key and the policy name hold the entries' keys and
	// never their values: a value can be anything a client sends.
	var subj, stat strings.Builder
	stat.WriteString(domain)
	for _, e := range d.Entries {
		frame(&subj, e.Key)
		frame(&subj, e.Value)
		stat.WriteByte('.')
		stat.WriteString(e.Key)
	}
	stat.WriteString(overrideSuffix)
	r := &Rule{Domain: domain, Path: stat.String(), Unit: name, RequestsPerUnit: o.RequestsPerUnit, Capacity: int64(o.RequestsPerUnit), namespace: b.String(), override: true}
	c.rule, c.subject, c.metric = r, shorten(subj.String()), r.Path
	c.current = &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: o.RequestsPerUnit, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(o.Unit), UnitMultiplier: o.UnitMultiplier}
	if o.RequestsPerUnit == 0 {
		return nil
	}
	l, rounded, err := bucketLimit(r.Capacity, int64(o.RequestsPerUnit), per)
	if err != nil {
		return fmt.Errorf("limit override: %v", err)
	}
	r.limit, r.Rounded = l, rounded
	c.lim, err = s.overrideLimiter(r.namespace, l)
	return err
}

// overrideLimiter returns the Limiter of a descriptor's own limit l, whose
// buckets are in namespace ns: the one built for an earlier request of the
// same namespace, or a new one, kept while fewer than maxOverrides are.
func (s *Service) overrideLimiter(ns string, l ratelimit.Limit) (*ratelimit.Limiter[string], error) {
	if v, ok := s.overrides.Load(ns); ok {
		return v.(*ratelimit.Limiter[string]), nil
	}
	opts := []ratelimit.Option{ratelimit.WithNamespace(ns)}
	if s.clock != nil {
		opts = append(opts, ratelimit.WithClock(s.clock))
	}
	lim, err := ratelimit.New[string](s.store, l, opts...)
	if err != nil || s.nOverrides.Load() >= maxOverrides {
		return lim, err
	}
	if v, loaded := s.overrides.LoadOrStore(ns, lim); loaded {
		return v.(*ratelimit.Limiter[string]), nil
	}
	s.nOverrides.Add(1)
	return lim, nil
}

// observe tells the Observer about each bucket of a request of domain that
// decide decided (err nil) or could not decide, in latency.
func (s *Service) observe(ctx context.Context, domain string, buckets []*bucket, latency time.Duration, err error) {
	if s.observer == nil {
		return
	}
	ns := ObservedNamespace(domain)
	for _, b := range buckets {
		if b.lim == nil {
			continue // requests_per_unit 0: no bucket
		}
		key := b.key
		if key == "" {
			key = b.lim.Key(b.subject)
		}
		if err != nil {
			op := "acquire"
			if b.cost == 0 {
				op = "peek"
			}
			s.observer.ObserveError(ctx, ratelimit.ErrorEvent{Namespace: ns, Key: key, Op: op, Cost: max(b.cost, 1), Err: err, Latency: latency})
			continue
		}
		e := ratelimit.DecisionEvent{Namespace: ns, Key: key, Cost: b.cost, Peek: b.peeked, Decision: b.d, Latency: latency}
		if b.peeked {
			e.Cost = 1
		} else {
			e.Decision.Allowed = b.charged
		}
		s.observer.ObserveDecision(ctx, e)
	}
}

// buckets gathers the checks that need a bucket, one per key: descriptors
// that resolve to the same bucket add their hits.
func (s *Service) buckets(checks []check) []*bucket {
	var out []*bucket
	for i := range checks {
		c := &checks[i]
		r := c.rule
		if r == nil || r.Unlimited || c.replaced || c.refund {
			continue
		}
		var key string
		switch {
		case c.lim != nil && len(checks) == 1:
			// One descriptor: decide through its Limiter (decide's
			// fast path), which builds no key on a store that takes
			// split keys.
		case c.lim != nil:
			key = c.lim.Key(c.subject)
		default:
			key = r.namespace + "\x00" + c.subject // rpu 0: never stored
		}
		var b *bucket
		for _, o := range out {
			if o.key == key {
				b = o
				break
			}
		}
		if b == nil {
			b = &bucket{key: key, lim: c.lim, subject: c.subject, limit: r.limit, shadow: r.ShadowMode}
			out = append(out, b)
		}
		c.bucket = b
		if r.RequestsPerUnit == 0 {
			b.impossible = b.impossible || c.hits > 0 // a look at rpu 0 is OK
			continue
		}
		if b.impossible {
			continue
		}
		if c.hits > uint64(r.Capacity) || uint64(b.cost)+c.hits > uint64(r.Capacity) {
			b.impossible = true
			continue
		}
		b.cost += int64(c.hits)
	}
	return out
}

// decide decides the buckets as one. A bucket in shadow mode never denies
// the others: when only shadow buckets lack their cost they are left out
// and the rest decided again. A bucket of cost 0 is only looked at and never
// denies the others. When an enforced bucket can never hold its cost, the
// request is over its limit and every bucket is only peeked, for the
// statuses.
func (s *Service) decide(ctx context.Context, buckets []*bucket) error {
	if len(buckets) == 0 {
		return nil
	}
	var now time.Time
	if s.clock != nil {
		now = s.clock()
	}
	if len(buckets) == 1 && !buckets[0].impossible {
		// One bucket: one Apply, no all-or-nothing to arrange.
		b := buckets[0]
		var err error
		switch {
		case b.lim == nil: // rpu 0, looked at: never a token, no store call
			b.d = ratelimit.Decision{}
		case b.cost == 0:
			b.peeked = true
			b.d, err = b.lim.Peek(ctx, b.subject)
		default:
			b.d, err = b.lim.TryAcquireN(ctx, b.subject, b.cost)
		}
		b.charged = err == nil && b.d.Allowed && b.cost > 0
		return err
	}
	active := make([]*bucket, 0, len(buckets))
	peekOnly := false
	for _, b := range buckets {
		if b.impossible && !b.shadow {
			peekOnly = true
		}
	}
	var peeks []*bucket
	for _, b := range buckets {
		switch {
		case peekOnly || b.impossible || b.cost == 0:
			// A look (hits 0) never denies the others: it is decided
			// apart, and only for its status.
			peeks = append(peeks, b)
		default:
			active = append(active, b)
		}
	}
	if len(peeks) > 0 {
		if err := s.run(ctx, peeks, now, true); err != nil {
			return err
		}
		for _, b := range peeks {
			b.peeked = true
			// A look says whether one token is there; the status says
			// whether the cost was.
			b.d.Allowed = b.d.Allowed && !b.impossible && b.d.Remaining >= max(b.cost, 1)
		}
	}
	for len(active) > 0 {
		if err := s.run(ctx, active, now, false); err != nil {
			return err
		}
		enforcedDenied, shadowDenied := false, false
		for _, b := range active {
			if !b.d.Allowed {
				if b.shadow {
					shadowDenied = true
				} else {
					enforcedDenied = true
				}
			}
		}
		if enforcedDenied || !shadowDenied {
			charged := !enforcedDenied
			for _, b := range active {
				b.charged = charged && b.cost > 0
			}
			return nil
		}
		kept := active[:0]
		for _, b := range active {
			if b.d.Allowed {
				kept = append(kept, b)
			}
		}
		active = kept
	}
	return nil
}

// run applies buckets through the store, all or nothing; peek asks for the
// standing only. A bucket with no limit (rpu 0) is denied without a store
// call.
func (s *Service) run(ctx context.Context, buckets []*bucket, now time.Time, peek bool) error {
	items := make([]ratelimit.BatchItem, 0, len(buckets))
	idx := make([]*bucket, 0, len(buckets))
	for _, b := range buckets {
		if b.limit == (ratelimit.Limit{}) {
			b.d = ratelimit.Decision{}
			continue
		}
		if b.key == "" {
			b.key = b.lim.Key(b.subject) // left for decide's fast path
		}
		r := ratelimit.Request{Limits: b.limitsOf(), Cost: b.cost, Peek: peek || b.cost == 0, Now: now}
		items = append(items, ratelimit.BatchItem{Key: b.key, Request: r})
		idx = append(idx, b)
	}
	if len(items) == 0 {
		return nil
	}
	if err := applyAll(ctx, s.store, items); err != nil {
		return err
	}
	for i, b := range idx {
		b.d = items[i].Decision
	}
	return nil
}

// refund gives back the hits of each descriptor with is_negative_hits to its
// rule's bucket, after the other descriptors were decided (a request's refund
// does not admit its own hits), whatever they were decided: a refund is not
// a check, and its status is OK with the bucket's standing afterwards. The
// refund is capped at the bucket's capacity: never more than full. A refund
// to no bucket (no rule, an unlimited or replaced rule, requests_per_unit 0)
// does nothing, and one of 0 hits looks at the bucket.
func (s *Service) refund(ctx context.Context, checks []check) error {
	for i := range checks {
		c := &checks[i]
		if !c.refund || c.rule == nil || c.rule.Unlimited || c.replaced || c.lim == nil {
			continue
		}
		b := &bucket{key: c.lim.Key(c.subject), lim: c.lim, subject: c.subject, limit: c.rule.limit, shadow: c.rule.ShadowMode}
		c.bucket, c.fits = b, true
		var err error
		if c.hits == 0 {
			b.d, err = c.lim.Peek(ctx, c.subject)
		} else {
			rf, ok := s.store.(tokenbucket.Refunder)
			if !ok {
				return fmt.Errorf("envoyrls: is_negative_hits needs a store that refunds: %w", errors.ErrUnsupported)
			}
			var r ratelimit.Request
			if _, r, err = c.lim.Request(c.subject, 1); err == nil {
				r.Cost = int64(min(c.hits, uint64(c.rule.limit.Capacity)))
				b.d, err = rf.Refund(ctx, b.key, r)
			}
		}
		if err != nil {
			return err
		}
		c.seen = b.d.Remaining
	}
	return nil
}

// reply is a response to one descriptor, the usual request, in one
// allocation: the message, its status and the status's reset.
type reply struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	status   [1]rlsv3.RateLimitResponse_DescriptorStatus
	reset    [1]durationpb.Duration
}

// newResponse returns an OK response of n statuses, each OK, with the
// statuses to fill in and room for their resets (see setStatus).
func newResponse(n int) (*rlsv3.RateLimitResponse, []rlsv3.RateLimitResponse_DescriptorStatus, []durationpb.Duration) {
	var resp *rlsv3.RateLimitResponse
	var statuses []rlsv3.RateLimitResponse_DescriptorStatus
	var resets []durationpb.Duration
	if n == 1 {
		r := new(reply)
		resp, statuses, resets = &r.resp, r.status[:], r.reset[:]
		resp.Statuses = r.statuses[:]
	} else {
		resp = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
		statuses, resets = make([]rlsv3.RateLimitResponse_DescriptorStatus, n), make([]durationpb.Duration, n)
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	for i := range statuses {
		statuses[i].Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = &statuses[i]
	}
	return resp, statuses, resets
}

// setStatus fills in st, an OK status, as c's descriptor status, with its
// duration_until_reset in reset.
func setStatus(st *rlsv3.RateLimitResponse_DescriptorStatus, reset *durationpb.Duration, c *check) {
	r := c.rule
	switch {
	case r == nil || c.replaced:
		return
	case r.Unlimited: // never replaced (see ShouldRateLimit)
		st.LimitRemaining = maxUint32
		return
	case c.refund && c.bucket == nil: // rpu 0: nothing to give back
		return
	}
	b := c.bucket
	st.CurrentLimit, st.DurationUntilReset = c.current, reset
	until := max(b.d.ResetAfter, 0)
	if c.refund {
		st.LimitRemaining = uint32(min(max(b.d.Remaining, 0), maxUint32))
		setDuration(reset, until)
		return
	}
	if c.fits {
		st.LimitRemaining = uint32(min(c.seen-int64(c.hits), maxUint32))
	} else {
		// Over: nothing left for it, as the peer says, and never a reset
		// of 0 (a full bucket that can never hold the hits, or rpu 0,
		// resets in one unit).
		until = max(until, b.d.RetryAfter)
		if until <= 0 || b.limit == (ratelimit.Limit{}) {
			until = units.Durations[r.Unit]
		}
		if !b.shadow {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	if b.limit == (ratelimit.Limit{}) {
		until = units.Durations[r.Unit] // rpu 0 never fills
	}
	setDuration(reset, until)
}

// setDuration sets p to d, as durationpb.New does.
func setDuration(p *durationpb.Duration, d time.Duration) {
	p.Seconds, p.Nanos = int64(d/time.Second), int32(d%time.Second)
}

var unitEnum = map[string]rlsv3.RateLimitResponse_RateLimit_Unit{
	"second": rlsv3.RateLimitResponse_RateLimit_SECOND,
	"minute": rlsv3.RateLimitResponse_RateLimit_MINUTE,
	"hour":   rlsv3.RateLimitResponse_RateLimit_HOUR,
	"day":    rlsv3.RateLimitResponse_RateLimit_DAY,
	"week":   rlsv3.RateLimitResponse_RateLimit_WEEK,
	"month":  rlsv3.RateLimitResponse_RateLimit_MONTH,
	"year":   rlsv3.RateLimitResponse_RateLimit_YEAR,
}

// responseHeaders are the headers of the binding check: the peer's three,
// then RateLimit-Policy and RateLimit as package httplimit writes them, and
// on a denial Retry-After, the whole seconds until the cost is there.
func (s *Service) responseHeaders(c *check, st *rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	reset := int64(0)
	if d := st.DurationUntilReset.AsDuration(); d > 0 {
		reset = int64((d + time.Second - 1) / time.Second)
	}
	out := []*corev3.HeaderValue{
		{Key: s.headers.Limit, Value: strconv.FormatUint(uint64(st.CurrentLimit.RequestsPerUnit), 10)},
		{Key: s.headers.Remaining, Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
		{Key: s.headers.Reset, Value: strconv.FormatInt(reset, 10)},
	}
	b := c.bucket
	if b.limit == (ratelimit.Limit{}) {
		return out
	}
	name := c.rule.Name
	if name == "" {
		name = c.rule.Path
	}
	now := time.Now()
	if s.clock != nil {
		now = s.clock()
	}
	h := http.Header{}
	httplimit.SetHeaders(h, name, b.limitsOf(), b.d, now)
	for _, k := range []string{"RateLimit-Policy", "RateLimit"} {
		if v := h.Get(k); v != "" {
			out = append(out, &corev3.HeaderValue{Key: k, Value: v})
		}
	}
	if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && b.d.RetryAfter > 0 {
		secs := max(1, int64((b.d.RetryAfter+time.Second-1)/time.Second))
		out = append(out, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(secs, 10)})
	}
	return out
}
