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

func Example() {
	now := func() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }
	lim, err := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(2),
		ratelimit.WithNamespace("api"), ratelimit.WithClock(now))
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(lim,
		httplimit.WithKey(httplimit.Header("X-API-Key")),
		httplimit.WithPolicyName("api"),
		httplimit.WithClock(now))
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
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
