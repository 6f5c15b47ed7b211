package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/clientkey"
	"github.com/exactlimit/ratelimit/internal/ratelimitheader"
)

// Limiter is what the middleware checks requests with.
// *ratelimit.Limiter[string] implements it; a caller may wrap one to observe
// every check, or to look up a policy that can change at run time.
type Limiter interface {
	// TryAcquireN takes cost tokens for subject if its bucket holds them.
	TryAcquireN(ctx context.Context, subject string, cost int64) (ratelimit.Decision, error)
	// Limits returns the policy, for the RateLimit-Policy header (which
	// lists its quotas too when the Limiter has a Quotas method, as
	// *ratelimit.Limiter has).
	Limits() []ratelimit.Limit
}

// KeyFunc returns the subject a request is limited by. An error, or an empty
// subject, means the request has no key; its message says why, and is sent
// to the client in the 400 response.
type KeyFunc func(r *http.Request) (string, error)

// CostFunc returns the number of tokens a request costs. An error is answered
// 400 Bad Request with its message. A cost outside 1..capacity is answered
// 400 too.
type CostFunc func(r *http.Request) (int64, error)

// ErrNoKey is wrapped by the errors of the key functions of this package
// when a request carries no key. It is grpclimit's ErrNoKey too.
var ErrNoKey = clientkey.ErrNoKey

// ErrKeyTooLong is wrapped by the error of a request whose key is longer
// than MaxKeyBytes. Such a request is answered 431 Request Header Fields Too
// Large, even with PassMissingKey: it is never passed on unlimited, and its
// key never reaches the store. It is grpclimit's ErrKeyTooLong too.
var ErrKeyTooLong = clientkey.ErrKeyTooLong

// MaxKeyBytes bounds a request's key to 1,024 bytes, as the ratelimit
// service bounds a subject, and as grpclimit bounds a call's: a longer key (from RawHeader,
// Join or any KeyFunc) is refused with ErrKeyTooLong rather than stored, and
// so is a Header value longer than this before it is hashed.
const MaxKeyBytes = 1024

// DefaultTimeout bounds each check when WithTimeout does not set another,
// as the ratelimit service's --timeout does: a store that hangs costs a
// request at most this long before it is answered 503.
const DefaultTimeout = 500 * time.Millisecond

// DefaultPolicyName is the name the headers give the policy unless
// WithPolicyName sets another.
const DefaultPolicyName = "default"

// Middleware limits the requests of the handlers it wraps. Build it with
// New; it is safe for simultaneous use by multiple goroutines.
type Middleware struct {
	lim       Limiter
	key       KeyFunc
	cost      CostFunc
	name      string
	passNoKey bool
	json      bool
	clock     func() time.Time
	onError   func(http.ResponseWriter, *http.Request, error)
	timeout   time.Duration
	skip      func(*http.Request) bool
	mux       *http.ServeMux
	muxSet    bool // WithServeMux was given
	opts      clientkey.Options
}

// Option configures a Middleware.
type Option func(*Middleware)

// WithKey sets the function that keys requests (default ClientIP).
func WithKey(key KeyFunc) Option { return func(m *Middleware) { m.key = key } }

// WithCost sets the function that prices requests (default: one token each).
func WithCost(cost CostFunc) Option { return func(m *Middleware) { m.cost = cost } }

// WithPolicyName sets the name of the policy in the RateLimit-Policy and
// RateLimit headers (default "default"). It must be 1 to 64 printable ASCII
// characters.
func WithPolicyName(name string) Option {
	return func(m *Middleware) { m.opts.PolicyName(name); m.name = name }
}

// WithErrorHandler sets the function that answers a request whose check
// failed (the Limiter's store returned an error). It must write the
// response. Without one, such a request gets 503 Service Unavailable.
func WithErrorHandler(h func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(m *Middleware) { m.onError = h }
}

// PassMissingKey makes a request without a key pass to the handler
// unlimited, instead of being answered 400 Bad Request.
func PassMissingKey() Option { return func(m *Middleware) { m.passNoKey = true } }

// WithJSON makes the middleware's own responses (429, 400, 431, 503) JSON
// objects instead of plain text: {"error": "...", "retry_after": seconds}.
func WithJSON() Option { return func(m *Middleware) { m.json = true } }

// WithClock sets the clock X-RateLimit-Reset is computed from (default
// time.Now). The decisions themselves take their time from the Limiter.
func WithClock(clock func() time.Time) Option { return func(m *Middleware) { m.clock = clock } }

// WithTimeout bounds each check of the Limiter to d (default
// DefaultTimeout), or to the request's deadline when that comes first. A
// check that runs out of time fails with context.DeadlineExceeded and is
// answered as any store error is. d = 0 sets no bound of the middleware's
// own: the request's deadline only. d must not be negative.
func WithTimeout(d time.Duration) Option {
	return func(m *Middleware) { m.timeout = m.opts.Timeout(d) }
}

// WithSkip sets a function that exempts requests from the limit: a request
// for which skip returns true is passed to the handler without a check and
// without rate-limit headers (health checks, CORS preflight OPTIONS).
func WithSkip(skip func(r *http.Request) bool) Option { return func(m *Middleware) { m.skip = skip } }

// WithServeMux names the http.ServeMux the middleware's requests are
// routed by, for Route and PerRoute when the middleware is placed around
// it with other handlers in between: a request with no pattern yet gets
// the one mux would route it by. Handler finds a mux it wraps directly by
// itself.
func WithServeMux(mux *http.ServeMux) Option {
	return func(m *Middleware) { m.mux, m.muxSet = mux, true }
}

// New returns a Middleware that limits requests with lim. The error wraps
// ratelimit.ErrInvalidArgument and reports a nil Limiter or a nil function
// given to an option, a negative timeout, or a policy name that cannot be
// sent in a header.
func New(lim Limiter, opts ...Option) (*Middleware, error) {
	m := &Middleware{
		lim:     lim,
		key:     ClientIP,
		cost:    func(*http.Request) (int64, error) { return 1, nil },
		name:    DefaultPolicyName,
		clock:   time.Now,
		timeout: DefaultTimeout,
		skip:    func(*http.Request) bool { return false },
		opts:    clientkey.NewOptions("httplimit"),
	}
	m.onError = func(w http.ResponseWriter, _ *http.Request, _ error) { m.unavailable(w) }
	for _, o := range opts {
		o(m)
	}
	m.opts.Require("limiter, key function, cost function, error handler, clock, skip function, mux",
		lim != nil, m.key != nil, m.cost != nil, m.onError != nil, m.clock != nil, m.skip != nil, m.mux != nil || !m.muxSet)
	if err := m.opts.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

// Handler returns next wrapped by the middleware. Its type fits routers that
// take func(http.Handler) http.Handler. When next is an *http.ServeMux,
// Route and PerRoute find the pattern it routes each request by, as
// WithServeMux does.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	mux := m.mux
	if nm, ok := next.(*http.ServeMux); ok && mux == nil {
		mux = nm
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mux != nil && r.Pattern == "" {
			if _, pattern := mux.Handler(r); pattern != "" {
				r = r.WithContext(r.Context()) // a copy: the caller's request is not changed
				r.Pattern = pattern
			}
		}
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if m.skip(r) {
		next.ServeHTTP(w, r)
		return
	}
	key, err := clientkey.Key(m.key(r))
	if errors.Is(err, ErrKeyTooLong) {
		m.reply(w, http.StatusRequestHeaderFieldsTooLarge, "rate limit: "+err.Error(), 0)
		return
	}
	if err != nil {
		if m.passNoKey {
			next.ServeHTTP(w, r)
			return
		}
		m.reply(w, http.StatusBadRequest, "rate limit: "+err.Error(), 0)
		return
	}
	cost, err := m.cost(r)
	if err != nil {
		m.reply(w, http.StatusBadRequest, "rate limit: request cost: "+err.Error(), 0)
		return
	}
	ctx, cancel := clientkey.WithTimeout(r.Context(), m.timeout)
	d, err := m.lim.TryAcquireN(ctx, key, cost)
	cancel()
	if err != nil {
		switch f, msg := clientkey.Classify(r.Context(), err); {
		case f == clientkey.Invalid:
			m.reply(w, http.StatusBadRequest, "rate limit: "+msg, 0)
		case f == clientkey.Gone:
			// The client is gone or its deadline passed: nobody to answer.
		default:
			m.onError(w, r, err)
		}
		return
	}
	if !d.Enforced() {
		if d.Allowed {
			next.ServeHTTP(w, r)
		} else {
			m.unavailable(w)
		}
		return
	}
	now := m.clock()
	if f, ok := ratelimitheader.OfPolicy(m.name, m.lim.Limits(), ratelimitheader.QuotasOf(m.lim), d, now); ok {
		f.Set(w.Header(), now)
	}
	if !d.Allowed {
		secs := ratelimitheader.RetryAfter(d.RetryAfter)
		w.Header().Set(ratelimitheader.RetryAfterHeader, strconv.FormatInt(secs, 10))
		m.reply(w, http.StatusTooManyRequests, fmt.Sprintf("rate limit exceeded: retry in %d s", secs), secs)
		return
	}
	next.ServeHTTP(w, r)
}

func (m *Middleware) unavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	m.reply(w, http.StatusServiceUnavailable, "rate limit unavailable: retry in 1 s", 1)
}

// reply writes the middleware's own response: a one-line text body, or a
// JSON object with the message and, when retry > 0, retry_after.
func (m *Middleware) reply(w http.ResponseWriter, code int, msg string, retry int64) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if !m.json {
		h.Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(code)
		fmt.Fprintln(w, msg)
		return
	}
	body := struct {
		Error      string `json:"error"`
		RetryAfter int64  `json:"retry_after,omitempty"`
	}{msg, retry}
	h.Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(body) //nolint:errcheck // the client may be gone
}
