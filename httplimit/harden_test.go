package httplimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// countingStore is a memstore that records the keys it was asked about. It
// has only Store's methods, so that every check goes through Apply.
type countingStore struct {
	st   *memstore.Store
	keys map[string]bool
}

func (s *countingStore) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	s.keys[key] = true
	return s.st.Apply(ctx, key, r)
}

func (s *countingStore) Reset(ctx context.Context, key string) error { return s.st.Reset(ctx, key) }

// send sends a request of method to url with the given headers and
// returns the response and its body.
func send(t *testing.T, method, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	return testkit.Do(t, testkit.Request(t, method, url, nil, hdr...))
}

func TestLongKeysAreRefused(t *testing.T) {
	c := testkit.NewClock(t0)
	st := &countingStore{st: memstore.New(memstore.WithClock(c.Now)), keys: map[string]bool{}}
	lim, err := ratelimit.New[string](st, ratelimit.PerSecond(10), ratelimit.WithClock(c.Now))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		key  KeyFunc
		opts []Option
	}{
		{"a header key", Header("X-API-Key"), nil},
		{"a raw header key", RawHeader("X-API-Key"), nil},
		{"a header key with PassMissingKey", Header("X-API-Key"), []Option{PassMissingKey()}},
		{"a joined key", Join(Header("X-API-Key"), Header("X-Tenant")), nil},
		{"a key function of the caller's", func(r *http.Request) (string, error) { return r.Header.Get("X-API-Key"), nil }, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url := testkit.Serve(t, newMiddleware(t, lim, c, append([]Option{WithKey(tt.key)}, tt.opts...)...))
			long := strings.Repeat("k", MaxKeyBytes+1)
			res, body := send(t, "GET", url, "X-API-Key", long, "X-Tenant", "t")
			if res.StatusCode != http.StatusRequestHeaderFieldsTooLarge || res.Header.Get("X-Handler") != "" {
				t.Errorf("a %d-byte key: %d %q, want 431 without the handler", len(long), res.StatusCode, body)
			}
			for k := range st.keys {
				if len(k) > MaxKeyBytes {
					t.Errorf("a %d-byte key reached the store", len(k))
				}
			}
			if res, body := send(t, "GET", url, "X-API-Key", strings.Repeat("k", 100), "X-Tenant", "t"); res.StatusCode != 200 {
				t.Errorf("a 100-byte key: %d %q", res.StatusCode, body)
			}
			if len(st.keys) == 0 {
				t.Error("the store saw no key at all: the check above looked at nothing")
			}
		})
	}
}

// hanging is a Limiter whose store never answers: each check waits for its
// context, and records that context's deadline (zero: none).
type hanging struct {
	limits    []ratelimit.Limit
	deadlines chan time.Time
}

func (h hanging) TryAcquireN(ctx context.Context, subject string, cost int64) (ratelimit.Decision, error) {
	dl, _ := ctx.Deadline()
	if h.deadlines != nil {
		h.deadlines <- dl
	}
	<-ctx.Done()
	return ratelimit.Decision{}, ctx.Err()
}
func (h hanging) Limits() []ratelimit.Limit { return h.limits }

func TestChecksAreBounded(t *testing.T) {
	lim := hanging{limits: []ratelimit.Limit{ratelimit.PerSecond(1)}}
	onError := WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
		if errors.Is(err, context.DeadlineExceeded) {
			w.WriteHeader(http.StatusGatewayTimeout)
		}
	})
	for _, tt := range []struct {
		name string
		opts []Option
		max  time.Duration
		code int
	}{
		{"by default, a hanging store costs at most DefaultTimeout", nil, DefaultTimeout + 2*time.Second, 503},
		{"WithTimeout sets the bound, and the error handler gets the deadline", []Option{WithTimeout(20 * time.Millisecond), onError}, 2 * time.Second, 504},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := testkit.NewClock(t0)
			url := testkit.Serve(t, newMiddleware(t, lim, c, tt.opts...))
			start := time.Now()
			res, body := send(t, "GET", url)
			if took := time.Since(start); took > tt.max || res.StatusCode != tt.code {
				t.Errorf("%d %q after %v; want %d within %v", res.StatusCode, body, took, tt.code, tt.max)
			}
		})
	}
	t.Run("WithTimeout(0) leaves the request's deadline as the only bound", func(t *testing.T) {
		for _, tt := range []struct {
			timeout  time.Duration
			deadline bool
		}{{0, false}, {time.Hour, true}} {
			lim := hanging{limits: lim.limits, deadlines: make(chan time.Time, 1)}
			h := newMiddleware(t, lim, testkit.NewClock(t0), WithTimeout(tt.timeout))
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // the check ends at once; only its deadline is looked at
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(ctx))
			if dl := <-lim.deadlines; dl.IsZero() == tt.deadline {
				t.Errorf("WithTimeout(%v): the check's deadline is %v", tt.timeout, dl)
			}
		}
	})
}

func TestSkip(t *testing.T) {
	c := testkit.NewClock(t0)
	lim := newLimiter(t, c, ratelimit.PerMinute(1))
	skip := func(r *http.Request) bool { return r.Method == http.MethodOptions || r.URL.Path == "/healthz" }
	url := testkit.Serve(t, newMiddleware(t, lim, c, WithSkip(skip)))
	for i := range 3 {
		for _, req := range [][2]string{{"OPTIONS", "/items"}, {"GET", "/healthz"}} {
			res, _ := send(t, req[0], url+req[1])
			if res.StatusCode != 200 || res.Header.Get("RateLimit") != "" || res.Header.Get("X-Handler") != "called" {
				t.Errorf("skipped %s %s #%d: %d %v", req[0], req[1], i, res.StatusCode, res.Header)
			}
		}
	}
	if res, _ := send(t, "GET", url+"/items"); res.StatusCode != 200 || res.Header.Get("RateLimit") == "" {
		t.Errorf("the first limited request: %d %v (skipped ones spent its token?)", res.StatusCode, res.Header)
	}
	if res, _ := send(t, "GET", url+"/items"); res.StatusCode != 429 {
		t.Errorf("the second limited request: %d, want 429", res.StatusCode)
	}
}

func TestSeveralLimitsOneCheck(t *testing.T) {
	// One middleware over ratelimit.NewMulti checks a route's limits
	// together: a request denied by one limit spends no token of another,
	// which two stacked middlewares cannot promise.
	c := testkit.NewClock(t0)
	lim := newLimiter(t, c, ratelimit.PerSecond(2), ratelimit.PerMinute(5))
	url := testkit.Serve(t, newMiddleware(t, lim, c))
	allowed := 0
	for range 3 {
		for range 6 {
			if res, _ := send(t, "GET", url); res.StatusCode == 200 {
				allowed++
			}
		}
		c.Add(time.Second)
	}
	// 2 + 2 + 1: the 5 per minute, untouched by the 13 denials.
	if allowed != 5 {
		t.Fatalf("%d allowed over 3 s of 6 requests each, want 5", allowed)
	}
}
