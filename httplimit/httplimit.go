package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/memstore"
)

// Limiter is what the middleware checks requests with.
// *ratelimit.Limiter[string] implements it; a caller may wrap one to observe
// every check, or to look up a policy that can change at run time.
type Limiter interface {
	// TryAcquireN takes cost tokens for subject if its bucket holds them.
	TryAcquireN(ctx context.Context, subject string, cost int64) (ratelimit.Decision, error)
	// Limits returns the policy, for the RateLimit-Policy header.
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
// when a request carries no key.
var ErrNoKey = errors.New("no rate-limit key")

// ErrKeyTooLong is wrapped by the error of a request whose key is longer
// than MaxKeyBytes. Such a request is answered 431 Request Header Fields Too
// Large, even with PassMissingKey: it is never passed on unlimited, and its
// key never reaches the store.
var ErrKeyTooLong = errors.New("rate-limit key too long")

// MaxKeyBytes bounds a request's key, as the ratelimit service bounds a
// subject: a longer key (from Header, Join or any KeyFunc) is refused with
// ErrKeyTooLong rather than stored.
const MaxKeyBytes = 1024

// DefaultTimeout bounds each check when WithTimeout does not set another,
// as the ratelimit service's --timeout does: a store that hangs costs a
// request at most this long before the outage behaviour answers it.
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
	outage    fallback.Outage
	passNoKey bool
	json      bool
	clock     func() time.Time
	onError   func(http.ResponseWriter, *http.Request, error)
	local     *memstore.Store
	timeout   time.Duration
	skip      func(*http.Request) bool
}

// Option configures a Middleware.
type Option func(*Middleware)

// WithKey sets the function that keys requests (default ClientIP).
func WithKey(key KeyFunc) Option { return func(m *Middleware) { m.key = key } }

// WithCost sets the function that prices requests (default: one token each).
func WithCost(cost CostFunc) Option { return func(m *Middleware) { m.cost = cost } }

// WithPolicyName sets the name of the policy in the RateLimit-Policy and
// RateLimit headers (default "default"). It must be printable ASCII.
func WithPolicyName(name string) Option { return func(m *Middleware) { m.name = name } }

// WithOutage sets what happens when the Limiter cannot decide (default
// fallback.FailClosed); see the package documentation.
func WithOutage(o fallback.Outage) Option { return func(m *Middleware) { m.outage = o } }

// WithErrorHandler sets the function that answers a request whose check
// failed, under fallback.ReturnError. It must write the response. Without
// one, such a request gets 503 as under FailClosed.
func WithErrorHandler(h func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(m *Middleware) { m.onError = h }
}

// PassMissingKey makes a request without a key pass to the handler
// unlimited, instead of being answered 400 Bad Request.
func PassMissingKey() Option { return func(m *Middleware) { m.passNoKey = true } }

// WithJSON makes the middleware's own responses (429, 400, 503) JSON
// objects instead of plain text: {"error": "...", "retry_after": seconds}.
func WithJSON() Option { return func(m *Middleware) { m.json = true } }

// WithClock sets the clock X-RateLimit-Reset is computed from (default
// time.Now). The decisions themselves take their time from the Limiter.
func WithClock(clock func() time.Time) Option { return func(m *Middleware) { m.clock = clock } }

// WithTimeout bounds each check of the Limiter (default DefaultTimeout). A
// check that takes longer fails with context.DeadlineExceeded and is
// answered by the outage behaviour (WithOutage), as any store error is. It
// must be positive.
func WithTimeout(d time.Duration) Option { return func(m *Middleware) { m.timeout = d } }

// WithSkip sets a function that exempts requests from the limit: a request
// for which skip returns true is passed to the handler without a check and
// without rate-limit headers (health checks, CORS preflight OPTIONS).
func WithSkip(skip func(r *http.Request) bool) Option { return func(m *Middleware) { m.skip = skip } }

// New returns a Middleware that limits requests with lim. The error reports
// a nil Limiter or key function, an unknown outage behaviour, or a policy
// name that cannot be sent in a header.
func New(lim Limiter, opts ...Option) (*Middleware, error) {
	if lim == nil {
		return nil, errors.New("httplimit: limiter must not be nil")
	}
	m := &Middleware{
		lim:     lim,
		key:     ClientIP,
		name:    DefaultPolicyName,
		outage:  fallback.FailClosed,
		clock:   time.Now,
		timeout: DefaultTimeout,
	}
	for _, o := range opts {
		o(m)
	}
	switch {
	case m.key == nil:
		return nil, errors.New("httplimit: key function must not be nil")
	case m.clock == nil:
		return nil, errors.New("httplimit: clock must not be nil")
	case m.timeout <= 0:
		return nil, fmt.Errorf("httplimit: timeout must be positive (got %v)", m.timeout)
	case m.outage > fallback.LocalFallback:
		return nil, fmt.Errorf("httplimit: unknown outage behaviour %d", m.outage)
	case !validName(m.name):
		return nil, fmt.Errorf("httplimit: policy name %q must be 1 to 64 printable ASCII characters", m.name)
	}
	if m.outage == fallback.LocalFallback {
		m.local = memstore.New()
	}
	return m, nil
}

// Handler returns next wrapped by the middleware. Its type fits routers that
// take func(http.Handler) http.Handler.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if m.skip != nil && m.skip(r) {
		next.ServeHTTP(w, r)
		return
	}
	key, err := m.key(r)
	switch {
	case err == nil && key == "":
		err = ErrNoKey
	case err == nil && len(key) > MaxKeyBytes:
		err = fmt.Errorf("%w: the key is longer than %d bytes", ErrKeyTooLong, MaxKeyBytes)
	}
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
	cost := int64(1)
	if m.cost != nil {
		if cost, err = m.cost(r); err != nil {
			m.reply(w, http.StatusBadRequest, "rate limit: request cost: "+err.Error(), 0)
			return
		}
	}
	d, err := m.check(r.Context(), key, cost)
	if err != nil {
		switch {
		case errors.Is(err, ratelimit.ErrInvalidArgument):
			msg := strings.TrimPrefix(err.Error(), ratelimit.ErrInvalidArgument.Error()+": ")
			m.reply(w, http.StatusBadRequest, "rate limit: "+msg, 0)
			return
		case r.Context().Err() != nil:
			// The client is gone or its deadline passed: not an outage,
			// and nobody to answer.
			return
		}
		switch m.outage {
		case fallback.FailOpen:
			next.ServeHTTP(w, r)
			return
		case fallback.ReturnError:
			if m.onError != nil {
				m.onError(w, r, err)
				return
			}
			m.unavailable(w)
			return
		case fallback.LocalFallback:
			d, err = m.local.Apply(r.Context(), key, ratelimit.Request{Limits: m.lim.Limits(), Cost: cost})
			if err != nil {
				m.unavailable(w)
				return
			}
			d.Source = ratelimit.SourceLocal
		default:
			m.unavailable(w)
			return
		}
	}
	if !d.Enforced() {
		if d.Allowed {
			next.ServeHTTP(w, r)
		} else {
			m.unavailable(w)
		}
		return
	}
	SetHeaders(w.Header(), m.name, m.lim.Limits(), d, m.clock())
	if !d.Allowed {
		secs := max(1, ceilSeconds(d.RetryAfter))
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		m.reply(w, http.StatusTooManyRequests, fmt.Sprintf("rate limit exceeded: retry in %d s", secs), secs)
		return
	}
	next.ServeHTTP(w, r)
}

// check asks the Limiter, bounded by the middleware's timeout.
func (m *Middleware) check(ctx context.Context, key string, cost int64) (ratelimit.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	return m.lim.TryAcquireN(ctx, key, cost)
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

// validName reports whether s can be a policy name: 1 to 64 printable ASCII
// characters, so that it fits a structured-field string without escaping
// surprises.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
