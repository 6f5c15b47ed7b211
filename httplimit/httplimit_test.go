package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// t0 is the fixed time of every test: decisions and headers never read the
// real clock.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newLimiter(t *testing.T, c *testkit.Clock, limits ...ratelimit.Limit) *ratelimit.Limiter[string] {
	t.Helper()
	lim, err := ratelimit.NewMulti[string](memstore.New(memstore.WithClock(c.Now)), limits,
		ratelimit.WithNamespace("test"), ratelimit.WithClock(c.Now))
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

func newMiddleware(t *testing.T, lim Limiter, c *testkit.Clock, opts ...Option) http.Handler {
	t.Helper()
	m, err := New(lim, append([]Option{WithClock(c.Now)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m.Handler(okHandler())
}

func okHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Handler", "called")
		fmt.Fprint(w, "ok")
	})
}

func get(h http.Handler, remote string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/items/7", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// step is one request of a header table: the time it is sent after the
// previous one, and the response expected.
type step struct {
	after   time.Duration
	code    int
	headers map[string]string // "" means the header must be absent
}

func run(t *testing.T, h http.Handler, c *testkit.Clock, steps []step) {
	t.Helper()
	for i, s := range steps {
		c.Add(s.after)
		w := get(h, "192.0.2.1:4000")
		if w.Code != s.code {
			t.Fatalf("request %d: status %d, want %d (body %q)", i, w.Code, s.code, w.Body.String())
		}
		for k, want := range s.headers {
			if got := w.Header().Get(k); got != want {
				t.Errorf("request %d: %s = %q, want %q", i, k, got, want)
			}
		}
		handled := w.Header().Get("X-Handler") == "called"
		if handled != (s.code == http.StatusOK) {
			t.Errorf("request %d: handler called = %v with status %d", i, handled, s.code)
		}
	}
}

func TestHeaders(t *testing.T) {
	unix := t0.Unix()
	ts := func(d time.Duration) string { return fmt.Sprint(unix + int64(d/time.Second)) }
	tests := []struct {
		name   string
		limits []ratelimit.Limit
		opts   []Option
		steps  []step
	}{
		{
			name:   "allowed and denied responses carry every header, and a denial adds Retry-After",
			limits: []ratelimit.Limit{ratelimit.PerSecond(2)},
			steps: []step{
				{0, 200, map[string]string{
					"RateLimit-Policy": `"default";q=2;w=1`, "RateLimit": `"default";r=1;t=1`,
					"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": ts(time.Second),
					"Retry-After": ""}},
				{0, 200, map[string]string{"RateLimit": `"default";r=0;t=1`, "X-RateLimit-Remaining": "0"}},
				{0, 429, map[string]string{
					"RateLimit-Policy": `"default";q=2;w=1`, "RateLimit": `"default";r=0;t=1`,
					"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": ts(time.Second),
					"Retry-After": "1", "Content-Type": "text/plain; charset=utf-8"}},
				{500 * time.Millisecond, 200, map[string]string{"X-RateLimit-Remaining": "0", "Retry-After": ""}},
			},
		},
		{
			name:   "Retry-After rounds a wait up to whole seconds",
			limits: []ratelimit.Limit{ratelimit.PerMinute(1)},
			steps: []step{
				{0, 200, map[string]string{"RateLimit-Policy": `"default";q=1;w=60`, "X-RateLimit-Reset": ts(60 * time.Second)}},
				{59*time.Second + 1, 429, map[string]string{"Retry-After": "1", "RateLimit": `"default";r=0;t=1`}},
				{time.Second - 1, 200, nil},
			},
		},
		{
			name:   "the window is the time an empty bucket takes to fill, rounded up",
			limits: []ratelimit.Limit{ratelimit.NewLimit(3, time.Second, 10)},
			opts:   []Option{WithPolicyName("api")},
			steps: []step{
				{0, 200, map[string]string{"RateLimit-Policy": `"api";q=10;w=4`, "RateLimit": `"api";r=9;t=1`}},
			},
		},
		{
			name:   "several limits are listed, and RateLimit names the one that bound",
			limits: []ratelimit.Limit{ratelimit.PerSecond(5), ratelimit.PerMinute(3)},
			opts:   []Option{WithPolicyName("api")},
			steps: []step{
				{0, 200, map[string]string{
					"RateLimit-Policy": `"api-1";q=5;w=1, "api-2";q=3;w=60`,
					"RateLimit":        `"api-2";r=2;t=20`, "X-RateLimit-Limit": "3"}},
				{0, 200, nil},
				{0, 200, nil},
				{0, 429, map[string]string{"RateLimit": `"api-2";r=0;t=60`, "Retry-After": "20", "X-RateLimit-Limit": "3"}},
			},
		},
		{
			name:   "with several limits, RateLimit's r and t belong to the limit it names",
			limits: []ratelimit.Limit{ratelimit.PerSecond(2), ratelimit.PerMinute(5)},
			opts:   []Option{WithPolicyName("multi")},
			steps: []step{
				{0, 200, map[string]string{"RateLimit": `"multi-1";r=1;t=1`}},
				{0, 200, map[string]string{"RateLimit": `"multi-1";r=0;t=1`, "X-RateLimit-Reset": ts(time.Second)}},
				{0, 429, map[string]string{
					"RateLimit-Policy": `"multi-1";q=2;w=1, "multi-2";q=5;w=60`,
					"RateLimit":        `"multi-1";r=0;t=1`, "X-RateLimit-Limit": "2", "X-RateLimit-Reset": ts(time.Second)}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testkit.NewClock(t0)
			h := newMiddleware(t, newLimiter(t, c, tt.limits...), c, tt.opts...)
			run(t, h, c, tt.steps)
		})
	}
}

func TestDeniedBody(t *testing.T) {
	c := testkit.NewClock(t0)
	for _, json := range []bool{false, true} {
		var opts []Option
		if json {
			opts = append(opts, WithJSON())
		}
		h := newMiddleware(t, newLimiter(t, c, ratelimit.PerMinute(1)), c, opts...)
		get(h, "192.0.2.1:1")
		w := get(h, "192.0.2.1:1")
		if w.Code != 429 {
			t.Fatalf("json=%v: status %d, want 429", json, w.Code)
		}
		body := w.Body.String()
		if !json {
			if body != "rate limit exceeded: retry in 60 s\n" {
				t.Errorf("text body = %q", body)
			}
			continue
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type = %q, want application/json", ct)
		}
		if body != `{"error":"rate limit exceeded: retry in 60 s","retry_after":60}`+"\n" {
			t.Errorf("JSON body = %q", body)
		}
	}
}

func TestCost(t *testing.T) {
	c := testkit.NewClock(t0)
	cost := func(r *http.Request) (int64, error) {
		switch r.Header.Get("X-Cost") {
		case "":
			return 1, nil
		case "bad":
			return 0, errors.New("X-Cost must be a number")
		default:
			var n int64
			_, err := fmt.Sscan(r.Header.Get("X-Cost"), &n)
			return n, err
		}
	}
	h := newMiddleware(t, newLimiter(t, c, ratelimit.PerSecond(10)), c, WithCost(cost))
	tests := []struct {
		cost      string
		code      int
		remaining string
		body      string
	}{
		{"4", 200, "6", ""},
		{"", 200, "5", ""},
		{"6", 429, "5", ""},
		{"5", 200, "0", ""},
		{"bad", 400, "", "rate limit: request cost: X-Cost must be a number\n"},
		{"0", 400, "", "rate limit: cost must be at least 1 (got 0)\n"},
		{"11", 400, "", "rate limit: cost must not exceed capacity (got 11 > 10)\n"},
	}
	for _, tt := range tests {
		var hdr []string
		if tt.cost != "" {
			hdr = []string{"X-Cost", tt.cost}
		}
		w := get(h, "192.0.2.1:1", hdr...)
		if w.Code != tt.code || w.Header().Get("X-RateLimit-Remaining") != tt.remaining {
			t.Errorf("cost %q: status %d, remaining %q; want %d, %q", tt.cost, w.Code, w.Header().Get("X-RateLimit-Remaining"), tt.code, tt.remaining)
		}
		if tt.body != "" && w.Body.String() != tt.body {
			t.Errorf("cost %q: body %q, want %q", tt.cost, w.Body.String(), tt.body)
		}
	}
}

func TestKeysSeparateBuckets(t *testing.T) {
	c := testkit.NewClock(t0)
	h := newMiddleware(t, newLimiter(t, c, ratelimit.PerMinute(1)), c)
	if w := get(h, "192.0.2.1:1"); w.Code != 200 {
		t.Fatalf("first client: %d", w.Code)
	}
	if w := get(h, "192.0.2.1:2"); w.Code != 429 {
		t.Fatalf("first client on another port: %d, want 429 (the port is not part of the key)", w.Code)
	}
	if w := get(h, "192.0.2.2:1"); w.Code != 200 {
		t.Fatalf("second client: %d, want 200", w.Code)
	}
}

func TestMissingKey(t *testing.T) {
	c := testkit.NewClock(t0)
	lim := newLimiter(t, c, ratelimit.PerMinute(1))
	for _, tt := range []struct {
		name string
		opts []Option
		code int
		body string
	}{
		{"is answered 400 by default", nil, 400, "rate limit: no rate-limit key: missing X-Api-Key header\n"},
		{"is answered 400 in JSON", []Option{WithJSON()}, 400, `{"error":"rate limit: no rate-limit key: missing X-Api-Key header"}` + "\n"},
		{"passes with PassMissingKey", []Option{PassMissingKey()}, 200, "ok"},
	} {
		t.Run("a request without a key "+tt.name, func(t *testing.T) {
			h := newMiddleware(t, lim, c, append(tt.opts, WithKey(Header("x-api-key")))...)
			for range 3 {
				w := get(h, "192.0.2.1:1")
				if w.Code != tt.code || w.Body.String() != tt.body {
					t.Fatalf("status %d body %q, want %d %q", w.Code, w.Body.String(), tt.code, tt.body)
				}
				if w.Header().Get("RateLimit") != "" {
					t.Errorf("RateLimit header set on a request without a key")
				}
			}
		})
	}
	t.Run("an empty key from a custom function counts as missing", func(t *testing.T) {
		h := newMiddleware(t, lim, c, WithKey(func(*http.Request) (string, error) { return "", nil }))
		if w := get(h, "192.0.2.1:1"); w.Code != 400 {
			t.Fatalf("status %d, want 400", w.Code)
		}
	})
	t.Run("an unparsable peer address is a missing key, not a panic", func(t *testing.T) {
		h := newMiddleware(t, lim, c)
		if w := get(h, "@"); w.Code != 400 || !strings.Contains(w.Body.String(), `peer address "@"`) {
			t.Fatalf("status %d body %q", w.Code, w.Body.String())
		}
	})
}

// failing is a Limiter whose store is down, or that returns a fixed
// decision.
type failing struct {
	err    error
	d      ratelimit.Decision
	limits []ratelimit.Limit
	calls  int
}

func (f *failing) TryAcquireN(ctx context.Context, subject string, cost int64) (ratelimit.Decision, error) {
	f.calls++
	return f.d, f.err
}
func (f *failing) Limits() []ratelimit.Limit { return f.limits }

// down is a store that cannot be reached: its error is a refused
// connection, which package fallback takes for an outage.
type down struct{}

var errRefused = fmt.Errorf("dial tcp 127.0.0.1:1: connect: %w", syscall.ECONNREFUSED)

func (down) Apply(context.Context, string, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, errRefused
}
func (down) Reset(context.Context, string) error { return errRefused }

func TestStoreErrors(t *testing.T) {
	policy := []ratelimit.Limit{ratelimit.PerMinute(2)}
	tests := []struct {
		name    string
		lim     *failing
		opts    []Option
		codes   []int
		headers map[string]string
	}{
		{"a store error is 503 with Retry-After and no rate-limit headers", &failing{err: errRefused, limits: policy}, nil,
			[]int{503, 503}, map[string]string{"Retry-After": "1", "RateLimit": "", "RateLimit-Policy": "", "X-RateLimit-Remaining": ""}},
		{"the error handler writes the response", &failing{err: errRefused, limits: policy},
			[]Option{WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
				w.Header().Set("X-Error", err.Error())
				w.WriteHeader(502)
			})}, []int{502}, map[string]string{"X-Error": errRefused.Error(), "RateLimit": ""}},
		{"an unenforced allowed decision passes without headers",
			&failing{d: ratelimit.Decision{Allowed: true, Source: ratelimit.SourceFailOpen}, limits: policy},
			nil, []int{200}, map[string]string{"RateLimit": ""}},
		{"an unenforced denial is 503, not 429",
			&failing{d: ratelimit.Decision{Source: ratelimit.SourceFailClosed}, limits: policy},
			nil, []int{503}, map[string]string{"RateLimit": "", "Retry-After": "1"}},
		{"a decision from a local bucket carries the headers",
			&failing{d: ratelimit.Decision{Allowed: true, Remaining: 1, Limit: policy[0], Source: ratelimit.SourceLocal}, limits: policy},
			nil, []int{200}, map[string]string{"RateLimit": `"default";r=1;t=0`}},
		{"a policy-less limiter and a zero decision do not panic",
			&failing{d: ratelimit.Decision{Allowed: true}}, nil, []int{200}, map[string]string{"RateLimit": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testkit.NewClock(t0)
			h := newMiddleware(t, tt.lim, c, tt.opts...)
			for i, code := range tt.codes {
				w := get(h, "192.0.2.1:1")
				if w.Code != code {
					t.Fatalf("request %d: status %d, want %d (body %q)", i, w.Code, code, w.Body.String())
				}
				for k, want := range tt.headers {
					if got := w.Header().Get(k); got != want {
						t.Errorf("request %d: %s = %q, want %q", i, k, got, want)
					}
				}
			}
			if tt.lim.calls != len(tt.codes) {
				t.Errorf("limiter called %d times, want %d", tt.lim.calls, len(tt.codes))
			}
		})
	}
}

// The outage behaviours are the fallback store's: the middleware serves
// what it decides.
func TestOutageBehavioursOfTheFallbackStore(t *testing.T) {
	tests := []struct {
		outage  fallback.Outage
		codes   []int
		limited bool // the responses carry rate-limit headers
	}{
		{fallback.ReturnError, []int{503, 503, 503}, false},
		{fallback.FailClosed, []int{503, 503, 503}, false},
		{fallback.FailOpen, []int{200, 200, 200}, false},
		{fallback.LocalFallback, []int{200, 200, 429}, true},
	}
	for _, tt := range tests {
		t.Run(tt.outage.String(), func(t *testing.T) {
			c := testkit.NewClock(t0)
			fb, err := fallback.New(down{}, fallback.WithOutage(tt.outage), fallback.WithClock(c.Now))
			if err != nil {
				t.Fatal(err)
			}
			lim, err := ratelimit.New[string](fb, ratelimit.PerMinute(2), ratelimit.WithClock(c.Now))
			if err != nil {
				t.Fatal(err)
			}
			h := newMiddleware(t, lim, c)
			for i, code := range tt.codes {
				w := get(h, "192.0.2.1:1")
				if w.Code != code || (w.Header().Get("RateLimit") != "") != tt.limited {
					t.Fatalf("request %d: %d RateLimit %q; want %d, headers %v", i, w.Code, w.Header().Get("RateLimit"), code, tt.limited)
				}
			}
		})
	}
}

func TestCancelledClientIsNotAnOutage(t *testing.T) {
	c := testkit.NewClock(t0)
	handled := false
	h := newMiddleware(t, &failing{err: context.Canceled}, c,
		WithErrorHandler(func(http.ResponseWriter, *http.Request, error) { handled = true }))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Header().Get("X-Handler") != "" || handled || w.Body.Len() != 0 {
		t.Fatalf("a request whose client went away was answered (handler %q, error handler %v, body %q)",
			w.Header().Get("X-Handler"), handled, w.Body.String())
	}
}

func TestNew(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), "httplimit: limiter must not be nil") {
		t.Errorf("New(nil): %v", err)
	}
	// Each option's error, by the message it gives.
	for want, opt := range map[string]Option{
		"key function must not be nil":  WithKey(nil),
		"cost function must not be nil": WithCost(nil),
		"clock must not be nil":         WithClock(nil),
		"error handler must not be nil": WithErrorHandler(nil),
		"skip function must not be nil": WithSkip(nil),
		"mux must not be nil":           WithServeMux(nil),
		"timeout must not be negative":  WithTimeout(-time.Second),
		`policy name "a\nb" must be`:    WithPolicyName("a\nb"),
		`policy name "" must be`:        WithPolicyName(""),
	} {
		_, err := New(&failing{}, opt)
		if !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), "httplimit: "+want) {
			t.Errorf("New: %v, want ErrInvalidArgument saying %q", err, want)
		}
	}
}

func TestSetHeadersEscapesTheName(t *testing.T) {
	h := http.Header{}
	SetHeaders(h, `a"b\c`+"\x01", []ratelimit.Limit{ratelimit.PerSecond(1)}, ratelimit.Decision{Allowed: true, Limit: ratelimit.PerSecond(1)}, t0)
	if got, want := h.Get("RateLimit-Policy"), `"a\"b\\c?";q=1;w=1`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
	h = http.Header{}
	share := ratelimit.Limit{Capacity: 3, RefillTokens: 3, RefillPeriod: time.Second}
	SetHeaders(h, "x", []ratelimit.Limit{ratelimit.PerSecond(10)}, ratelimit.Decision{Allowed: true, Remaining: 2, Limit: share}, t0)
	if h.Get("X-RateLimit-Limit") != "3" || h.Get("RateLimit-Policy") != `"x";q=10;w=1` {
		t.Errorf("a decision under a fallback share: %v", h)
	}
	h = http.Header{}
	SetHeaders(h, "x", nil, ratelimit.Decision{}, t0)
	if len(h) != 0 {
		t.Errorf("headers set without a policy: %v", h)
	}
}

func TestJSONErrorIsValid(t *testing.T) {
	c := testkit.NewClock(t0)
	h := newMiddleware(t, &failing{err: errors.New("down")}, c, WithJSON())
	w := get(h, "192.0.2.1:1")
	var v map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil || v["error"] == nil || v["retry_after"] != 1.0 {
		t.Fatalf("body %q: %v %v", w.Body.String(), v, err)
	}
}
