// Package server is the HTTP decision service of the ratelimit command: the
// JSON API (POST /v1/acquire, /v1/peek, /v1/reset, /v1/reserve, /v1/settle,
// /v1/assign, /v1/usage, GET /v1/config), /healthz (liveness), /readyz (readiness), /metrics, an
// operator page (GET /, reading GET /v1/stats; package operator), and a
// rate-limiting reverse proxy built on package httplimit.
//
// Policies are a set of namespaces, each with its limits (package config),
// swapped atomically by SetPolicies: a check decided during a reload uses
// either the old set or the new one, and buckets carry over by the library's
// policy-change rule. A namespace may offer plans instead (a
// ratelimit.Plans): each subject is decided under its plan, which POST
// /v1/assign sets for every process sharing the store. The Service is safe
// for simultaneous use by multiple goroutines; it starts no goroutine but
// the watcher of each namespace of plans' assignments, which Close stops.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/access"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/openapi"
	"github.com/exactlimit/ratelimit/internal/operator"
	"github.com/exactlimit/ratelimit/internal/ratelimitheader"
)

// DefaultTimeout bounds one check when Options.Timeout is zero.
const DefaultTimeout = time.Second

// Options configure a Service.
type Options struct {
	// Store decides the checks. Wrap it in package fallback for an outage
	// behaviour other than returning the error.
	Store ratelimit.Store
	// StoreName describes the store in /healthz and the log, e.g. "memory"
	// or "redis 127.0.0.1:6379". It must not hold a password.
	StoreName string
	// StoreKind is operator.StoreEmbedded, StoreRedis or StoreCluster, for
	// the operator page ("" when unknown).
	StoreKind string
	// Masters lists a Cluster's masters (host:port), for the operator
	// page, which shows the state of each. It is called with a short
	// deadline on each /v1/stats request; nil means none.
	Masters func(ctx context.Context) ([]string, error)
	// Policies are the namespaces to start with (default config.Default()).
	Policies config.Policies
	// Token, when set, is the bearer token /v1/ and /metrics require.
	Token string
	// MetricsToken, when set, is a bearer token /metrics accepts besides
	// Token (and requires when Token is not set), so that a scraper need
	// not hold the API's token.
	MetricsToken string
	// Timeout bounds each check (default DefaultTimeout).
	Timeout time.Duration
	// Outage names the behaviour the Store applies in an outage, for
	// /healthz and /metrics.
	Outage fallback.Outage
	// Degraded reports whether the Store is serving without its primary
	// (package fallback's !IsAlive), for /healthz, /readyz and the
	// ratelimit_fallback_active gauge. Nil means never, and that the store
	// has no outage behaviour: Outage is then not reported.
	Degraded func() bool
	// Metrics receives the service's metrics (default: a new Metrics).
	// Its Observer is attached to the Limiter of every namespace.
	Metrics *Metrics
	// Stats receives the figures of the operator page (default: new
	// operator.Stats with no most-denied subjects). Like Metrics, it is
	// attached to the Limiter of every namespace; it records the reloads
	// too.
	Stats *operator.Stats
	// Logger receives errors and reloads (default: discard).
	Logger *slog.Logger
	// Version is the build's version, for ratelimit_build_info and
	// GET /v1/config.
	Version string
	// Ping, when set, asks the store's primary whether it answers, for
	// /readyz: each readiness request pings it, bounded by Timeout. Nil
	// leaves /readyz to Degraded.
	Ping func(context.Context) error
	// Envoy, when set, lists the domains of Envoy's rate limit service,
	// whose decisions reach Stats (and Metrics) under their own namespace
	// (EnvoyDomain.Name): the operator page and /v1/stats show them after
	// the namespaces.
	Envoy func() []operator.EnvoyDomain
	// Clock, when set, is the time of every check and of the headers. By
	// default checks use the store's clock (Redis's TIME) and headers
	// time.Now. Tests set it.
	Clock func() time.Time
	// PlanRefresh is how often the Plans of each namespace of plans asks
	// the store for the changes of its assignments (ratelimit.
	// WithPlanRefresh, 1 ms to 1 s; 0: the library's 500 ms).
	PlanRefresh time.Duration
}

// Service answers rate-limit checks over HTTP.
type Service struct {
	store       ratelimit.Store
	name        string
	kind        string
	masters     func(ctx context.Context) ([]string, error)
	envoy       func() []operator.EnvoyDomain
	access      access.Checker // the tokens and AllowHosts
	draining    atomic.Bool
	authLog     rateLimitedLog
	version     string
	timeout     time.Duration
	outage      fallback.Outage
	degraded    func() bool
	hasOutage   bool // the store has an outage behaviour (Options.Degraded set)
	ping        func(context.Context) error
	metrics     *Metrics
	stats       *operator.Stats
	log         *slog.Logger
	clock       func() time.Time
	now         func() time.Time
	policies    atomic.Pointer[policySet]
	setMu       sync.Mutex // SetPolicies's swap, and Close
	closed      bool       // Close was called: guarded by setMu
	planRefresh time.Duration
	pinned      atomic.Pointer[[]string]
	errLog      rateLimitedLog
	decodes     atomic.Uint64 // request bodies decoded (decodeBody)
	exposition  http.Handler  // /metrics
}

// New returns a Service. The error reports a missing store or an invalid
// policy.
func New(o Options) (*Service, error) {
	if o.Store == nil {
		return nil, errors.New("server: store must not be nil")
	}
	s := &Service{
		store:    o.Store,
		name:     o.StoreName,
		kind:     o.StoreKind,
		masters:  o.Masters,
		envoy:    o.Envoy,
		version:  o.Version,
		timeout:  o.Timeout,
		outage:   o.Outage,
		degraded: o.Degraded,
		metrics:  o.Metrics,
		stats:    o.Stats,
		log:      o.Logger,
		clock:    o.Clock,
		now:      o.Clock,

		planRefresh: o.PlanRefresh,
	}
	s.SetToken(o.Token)
	s.SetMetricsToken(o.MetricsToken)
	s.hasOutage = o.Degraded != nil
	s.ping = o.Ping
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.degraded == nil {
		s.degraded = func() bool { return false }
	}
	if s.metrics == nil {
		s.metrics = NewMetrics()
	}
	if s.stats == nil {
		s.stats = operator.NewStats(operator.StatsOptions{Clock: o.Clock})
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.name == "" {
		s.name = "store"
	}
	s.metrics.bindService(s)
	s.exposition = s.metrics.handler(s.log)
	p := o.Policies
	if p == nil {
		p = config.Default()
	}
	if err := s.SetPolicies(p); err != nil {
		return nil, err
	}
	return s, nil
}

// errUnknownNamespace is the proxy's error for a namespace not in force,
// which Pin keeps from happening.
var errUnknownNamespace = errors.New("unknown namespace")

type op string

const (
	opAcquire op = "acquire"
	opPeek    op = "peek"
	opReset   op = "reset"
)

// check runs one operation on subject's bucket under lim, a namespace's
// Limiter, bounded by the service's timeout. The Limiter tells the metrics'
// observer about it.
func (s *Service) check(ctx context.Context, o op, lim *ratelimit.Limiter[string], subject string, cost int64) (ratelimit.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var d ratelimit.Decision
	var err error
	switch o {
	case opAcquire:
		d, err = lim.TryAcquireN(ctx, subject, cost)
	case opPeek:
		d, err = lim.Peek(ctx, subject)
	case opReset:
		err = lim.Reset(ctx, subject)
	}
	if err != nil {
		s.logFailure(string(o), lim, subject, err)
	}
	return d, err
}

// Handler returns the service's HTTP API: POST /v1/acquire, /v1/peek,
// /v1/reset, /v1/reserve, /v1/settle, /v1/assign and /v1/usage (with Content-Type
// application/json, else 415), GET /v1/config,
// GET /v1/stats, /healthz (liveness), /readyz (readiness) and /metrics, and
// the operator page, GET / with its /page.css and /page.js. /v1/ and
// /metrics need the token when there is one; the page holds no figure and is served to anyone,
// and its script asks for the token when /v1/stats wants it. Every other
// path is 404. A body must be valid UTF-8 with each field spelled exactly
// once, in lower case; a subject is at most MaxSubjectBytes and is never
// logged (keyfmt.Hash stands for it: the service never logs a subject,
// which behind --key header:X-API-Key is a customer's API key). After
// AllowHosts, while there is no token, a request for another Host is
// refused with 421.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/acquire", s.api(opAcquire))
	mux.Handle("/v1/peek", s.api(opPeek))
	mux.Handle("/v1/reset", s.api(opReset))
	mux.HandleFunc("/v1/reserve", s.reserve)
	mux.HandleFunc("/v1/settle", s.settle)
	mux.HandleFunc("/v1/assign", s.assign)
	mux.HandleFunc("/v1/usage", s.usage)
	mux.HandleFunc("/v1/stats", s.serveStats)
	mux.HandleFunc("/healthz", s.healthz)
	mux.HandleFunc("/readyz", s.readyz)
	mux.HandleFunc("/v1/config", s.serveConfig)
	mux.HandleFunc("/metrics", s.serveMetrics)
	mux.Handle(openapi.Path, openapi.Handler())
	mux.HandleFunc("/", s.servePage)
	return s.checkHost(mux)
}

// api returns the handler of one /v1/ operation.
func (s *Service) api(o op) http.Handler {
	path := "/v1/" + string(o)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.begin(w, r, path) {
			return
		}
		req, code, msg := s.decode(w, r)
		if code != 0 {
			s.fail(w, path, code, msg)
			return
		}
		t, ok := s.target(w, path, req.Namespace, req.Subject, req.Plan)
		if !ok {
			return
		}
		ns, pol, lim := t.ns, t.pol, t.lim
		cost := int64(1)
		if req.Cost != nil {
			cost = *req.Cost
			capacity := pol.MaxCost()
			switch {
			case cost < 1:
				s.fail(w, path, http.StatusBadRequest, fmt.Sprintf("cost must be at least 1 (got %d)", cost))
				return
			case cost > capacity:
				s.fail(w, path, http.StatusBadRequest, fmt.Sprintf("cost %d exceeds the capacity %d of namespace %q: it could never be allowed", cost, capacity, ns))
				return
			}
		}
		d, err := s.check(r.Context(), o, lim, req.Subject, cost)
		if s.failed(w, r, path, ns, err) {
			return
		}
		if o == opReset {
			s.reply(w, path, http.StatusOK, map[string]any{"namespace": ns, "subject": req.Subject, "reset": true})
			return
		}
		if o == opPeek {
			cost = 0
		}
		out := NewDecision(ns, req.Subject, cost, d, pol)
		out.Plan = t.plan
		s.answer(r.Context(), w, path, lim, req.Subject, &out, d, o == opAcquire)
	})
}

// failed answers err, an operation's error, and returns true; it returns
// false when err is nil. An invalid argument is a 400, a store that cannot
// answer a 503 with Retry-After: 1; a client that is gone gets nothing.
func (s *Service) failed(w http.ResponseWriter, r *http.Request, path, ns string, err error) bool {
	return s.failedSaying(w, r, path, ns, err, "rate limit store unavailable")
}

// failedSaying is failed with unavailable as the message of the 503.
func (s *Service) failedSaying(w http.ResponseWriter, r *http.Request, path, ns string, err error, unavailable string) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, ratelimit.ErrInvalidArgument):
		s.fail(w, path, http.StatusBadRequest, strings.TrimPrefix(err.Error(), ratelimit.ErrInvalidArgument.Error()+": "))
	case r.Context().Err() != nil:
		// the client is gone
	default:
		w.Header().Set("Retry-After", "1")
		s.fail(w, path, http.StatusServiceUnavailable, unavailable)
	}
	return true
}

// answer writes out, the JSON form of d, a decision for subject ("" when
// unknown) under lim, a namespace's limiter, with the rate-limit headers of
// an enforced decision (and OpenAI's, for a namespace of requests and
// tokens, when the subject is known): 200, or 429 with Retry-After when
// deny says a denial is answered so. A decision not enforced carries no
// header; denied, it is a 503.
func (s *Service) answer(ctx context.Context, w http.ResponseWriter, path string, lim *ratelimit.Limiter[string], subject string, out *Decision, d ratelimit.Decision, deny bool) {
	code := http.StatusOK
	switch {
	case !d.Enforced() && !d.Allowed:
		code = http.StatusServiceUnavailable
		out.Error = "rate limit store unavailable; failing closed"
		w.Header().Set("Retry-After", "1")
	case !d.Enforced():
	default:
		now := s.now()
		if f, ok := ratelimitheader.OfPolicy(lim.Namespace(), lim.Limits(), lim.Quotas(), d, now); ok {
			f.Set(w.Header(), now)
		}
		if limits := lim.Limits(); len(limits) == 2 && subject != "" {
			// (A settle's answer, which knows no subject, has none.)
			if len(d.Standings) >= 2 {
				// The decision's own standing of requests and tokens.
				st := [2]ratelimitheader.Standing{}
				for i := range st {
					st[i] = ratelimitheader.Standing{Limit: limits[i].Capacity, Remaining: d.Standings[i].Remaining, ResetAfter: d.Standings[i].ResetAfter}
				}
				ratelimitheader.SetOpenAI(w.Header(), st[0], st[1])
			} else {
				s.openAIHeaders(ctx, w.Header(), lim, subject)
			}
		}
		if !d.Allowed && deny {
			code = http.StatusTooManyRequests
			w.Header().Set(ratelimitheader.RetryAfterHeader, strconv.FormatInt(ratelimitheader.RetryAfter(d.RetryAfter), 10))
		}
	}
	s.reply(w, path, code, out)
}

// begin checks what every POST of the API needs: the method, the token and
// the Content-Type. When one is wrong it answers and returns false.
func (s *Service) begin(w http.ResponseWriter, r *http.Request, path string) bool {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.fail(w, path, http.StatusMethodNotAllowed, fmt.Sprintf("%s wants POST, not %s", path, r.Method))
		return false
	}
	if !s.authorized(r) {
		s.unauthorized(w, r, path)
		return false
	}
	if !isJSON(r) {
		w.Header().Set("Accept", "application/json")
		s.fail(w, path, http.StatusUnsupportedMediaType, "Content-Type must be application/json")
		return false
	}
	return true
}

// target is what a request is decided under: its namespace, its plan in
// a namespace of plans ("" elsewhere, and for a subject with a policy of
// its own), that plan's policy (the namespace's own outside plans) and
// its Limiter.
type target struct {
	ns    string
	plans bool // ns is a namespace of plans
	plan  string
	pol   config.Policy
	lim   *ratelimit.Limiter[string]
}

// lookup finds namespace name ("" for config.DefaultNamespace) among the
// policies in force, and returns its full name and its entry in one
// snapshot of the set: a reload during the request does not split it.
// When there is none it answers (400 for a reserved name, 404 for an
// unknown one) and returns false.
func (s *Service) lookup(w http.ResponseWriter, path, name string) (string, *policySet, bool) {
	if name == "" {
		name = config.DefaultNamespace
	}
	if err := reservedName(name); err != nil {
		s.fail(w, path, http.StatusBadRequest, err.Error())
		return name, nil, false
	}
	set := s.policies.Load()
	if !set.has(name) {
		s.fail(w, path, http.StatusNotFound, fmt.Sprintf("unknown namespace %q (known: %s)", name, knownNames(set)))
		return name, nil, false
	}
	return name, set, true
}

// target returns what subject is decided under in namespace name (see
// lookup): in a namespace of plans, the plan the request names (plan) when
// the namespace trusts it (trust_plan), else the subject's assignment as
// this process last saw it (ratelimit.Plans.For). A plan named where it is
// not taken, or not on offer, is answered 400, and target returns false.
func (s *Service) target(w http.ResponseWriter, path, name, subject, plan string) (target, bool) {
	ns, set, ok := s.lookup(w, path, name)
	if !ok {
		return target{}, false
	}
	pol := set.limits[ns]
	plans := set.plans[ns]
	switch {
	case plans == nil && plan != "":
		s.fail(w, path, http.StatusBadRequest, fmt.Sprintf("namespace %q offers no plans: send no plan", ns))
		return target{}, false
	case plans == nil:
		return target{ns: ns, pol: pol, lim: set.limiters[ns]}, true
	case plan != "" && !pol.TrustPlan:
		s.fail(w, path, http.StatusBadRequest, fmt.Sprintf("namespace %q does not take a plan from the request (its trust_plan is off): send no plan, and the subject's assignment chooses", ns))
		return target{}, false
	case plan != "":
		return s.planTarget(w, path, ns, set, plan)
	}
	plan, lim := plans.For(subject)
	if plan == "" {
		return target{ns: ns, plans: true, pol: config.OwnPolicy(lim.Limits(), lim.Quotas()), lim: lim}, true
	}
	t, _ := s.planTarget(w, path, ns, set, plan)
	return t, true
}

// planTarget returns the target of plan in ns, a namespace of plans of
// set; a plan not on offer is answered 400, and planTarget returns false.
func (s *Service) planTarget(w http.ResponseWriter, path, ns string, set *policySet, plan string) (target, bool) {
	pol, ok := set.limits[ns].Plan(plan)
	if !ok {
		s.fail(w, path, http.StatusBadRequest, fmt.Sprintf("unknown plan %q: the plans on offer in namespace %q are %s", plan, ns, set.limits[ns].PlanNames()))
		return target{}, false
	}
	return target{ns: ns, plans: true, plan: plan, pol: pol, lim: set.plans[ns].Plan(plan)}, true
}

func (s *Service) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		s.fail(w, "/metrics", http.StatusMethodNotAllowed, "/metrics wants GET")
		return
	}
	if !s.metricsAuthorized(r) {
		// The series name namespaces, Envoy descriptors and override
		// keys: behind the token as /v1/stats is.
		s.unauthorized(w, r, "/metrics")
		return
	}
	s.metrics.requests.WithLabelValues("/metrics", "200").Inc()
	s.exposition.ServeHTTP(w, r)
}

func (s *Service) fail(w http.ResponseWriter, path string, code int, msg string) {
	s.reply(w, path, code, map[string]string{"error": msg})
}

func (s *Service) reply(w http.ResponseWriter, path string, code int, v any) {
	s.metrics.requests.WithLabelValues(path, strconv.Itoa(code)).Inc()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client may be gone
}
