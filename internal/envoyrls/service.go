package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/clock"
	"github.com/exactlimit/ratelimit/internal/config"
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
	// KeyPrefix begins every key the service writes (the peer's
	// CACHE_KEY_PREFIX), so that two deployments sharing one store keep
	// their buckets apart; "" adds nothing.
	KeyPrefix string
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
	prefix  string // Options.KeyPrefix
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
	// domains holds the root of each domain of cfg, with the namespace of
	// its events (ObservedNamespace), made once rather than per request.
	domains map[string]domainState
}

// domainState is a domain's part of a state.
type domainState struct {
	root     *node
	observed string // ObservedNamespace of the domain
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
		shadow: o.ShadowMode, dynamic: o.DynamicMetadata, load: o.Load, prefix: o.KeyPrefix, observer: o.Observer}
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
	s.metrics.loaded(true) // the peer counts its first load too
	return s, nil
}

// SetConfig puts cfg in force. A request decided during the swap uses
// either the old configuration or cfg, never a mix. Each rule whose refill
// rate was rounded down (Rule.Rounded) is logged, and the rules with
// quota_mode (Rule.QuotaMode) are named in a warning.
func (s *Service) SetConfig(cfg *Config) error {
	st := &state{cfg: cfg, rules: map[*Rule]ruleState{}, domains: make(map[string]domainState, len(cfg.domains))}
	for d, root := range cfg.domains {
		st.domains[d] = domainState{root: root, observed: ObservedNamespace(d)}
	}
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
			rs.lim, err = ratelimit.New[string](s.store, r.limit, append(opts, ratelimit.WithNamespace(s.prefix+r.namespace))...)
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
	if q := cfg.QuotaModeRules(); len(q) > 0 {
		s.log.Warn("envoy rules with quota_mode: true are decided as ordinary rules: a request with one over its limit is OVER_LIMIT, where the peer would answer OK while another of its quota_mode descriptors is within its limit",
			"rules", strings.Join(q, ","))
	}
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

// ShouldRateLimit decides a request as envoyproxy/ratelimit answers it, with
// token buckets, and all or nothing: when any descriptor is over its limit
// the response is OVER_LIMIT and no descriptor's bucket is charged. The
// statuses count the descriptors in turn, as the peer does: of two
// descriptors on one bucket with one token left, the first is OK and the
// second OVER_LIMIT. A malformed request is INVALID_ARGUMENT; a store that
// cannot decide (with the outage behaviour return-error) is UNAVAILABLE.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	defer s.metrics.callEnded(s.metrics.callStarted())
	if err := validate(req); err != nil {
		s.metrics.request("invalid")
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	st := s.state.Load()
	dom := st.domains[req.Domain]
	root := dom.root
	resp, statuses, resets := newResponse(len(req.Descriptors))
	if root == nil {
		if s.dynamic {
			resp.DynamicMetadata = dynamicMetadata(req, nil)
		}
		s.metrics.request("unknown_domain")
		return resp, nil
	}
	checks := make([]check, len(req.Descriptors)) // with their buckets (see buckets)
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

	var first [1]*bucket // the usual request's one bucket, on the stack
	buckets := s.buckets(checks, first[:0])
	if len(buckets) > 0 || refunds {
		// One bound on the request's store calls, decide's and refund's
		// together (none when the call's own deadline comes first).
		var cancel context.CancelFunc
		ctx, cancel = clock.Bound(ctx, s.timeout)
		defer cancel()
	}
	start := time.Now()
	err := s.decide(ctx, buckets)
	s.observe(ctx, dom.observed, buckets, time.Since(start), err)
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
