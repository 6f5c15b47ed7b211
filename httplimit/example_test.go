package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// An API limited to 2 requests a minute per API key and per route, the
// middleware around the mux. The store holds the key's SHA-256, not the key.
func Example() {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })

	now := func() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }
	lim, err := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(2),
		ratelimit.WithNamespace("api"), ratelimit.WithClock(now))
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(lim,
		httplimit.WithKey(httplimit.PerRoute(httplimit.Header("X-API-Key"))),
		httplimit.WithPolicyName("api"),
		httplimit.WithClock(now))
	if err != nil {
		panic(err)
	}
	h := mw.Handler(mux)

	for range 3 {
		r := httptest.NewRequest("GET", "/hello", nil)
		r.Header.Set("X-API-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d RateLimit: %s Retry-After: %q %s\n", w.Code, w.Header().Get("RateLimit"),
			w.Header().Get("Retry-After"), strings.TrimSpace(w.Body.String()))
	}
	// Output:
	// 200 RateLimit: "api";r=1;t=30 Retry-After: "" hello
	// 200 RateLimit: "api";r=0;t=60 Retry-After: "" hello
	// 429 RateLimit: "api";r=0;t=60 Retry-After: "30" rate limit exceeded: retry in 30 s
}

// Two limits checked together on one route, with health checks and CORS
// preflights exempt.
func ExampleWithSkip() {
	now := func() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }
	lim, err := ratelimit.NewMulti[string](memstore.New(),
		[]ratelimit.Limit{ratelimit.PerSecond(1), ratelimit.PerMinute(30)},
		ratelimit.WithNamespace("api"), ratelimit.WithClock(now))
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(lim,
		httplimit.WithPolicyName("api"),
		httplimit.WithClock(now),
		httplimit.WithTimeout(200*time.Millisecond),
		httplimit.WithSkip(func(r *http.Request) bool {
			return r.URL.Path == "/healthz" || r.Method == http.MethodOptions
		}))
	if err != nil {
		panic(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, req := range [][2]string{{"GET", "/healthz"}, {"OPTIONS", "/items"}, {"GET", "/items"}, {"GET", "/items"}} {
		r := httptest.NewRequest(req[0], req[1], nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%s %s: %d RateLimit: %q\n", req[0], req[1], w.Code, w.Header().Get("RateLimit"))
	}
	// Output:
	// GET /healthz: 200 RateLimit: ""
	// OPTIONS /items: 200 RateLimit: ""
	// GET /items: 200 RateLimit: "\"api-1\";r=0;t=1"
	// GET /items: 429 RateLimit: "\"api-1\";r=0;t=1"
}
