package server

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"

	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

func TestProxyForwardsOnlyTheTrustedChain(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		if r.URL.Path == "/boom" {
			panic(http.ErrAbortHandler)
		}
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	last := func() http.Header { mu.Lock(); defer mu.Unlock(); return seen[len(seen)-1] }
	lo, _ := httplimit.ParsePrefixes("127.0.0.1")
	for _, tt := range []struct {
		name       string
		trusted    httplimit.TrustedProxies
		hdr        []string
		xff, fwded string
	}{
		{"no trusted proxy: the client's X-Forwarded-For is dropped", httplimit.TrustedProxies{},
			[]string{"X-Forwarded-For", "6.6.6.6", "Forwarded", "for=6.6.6.6"}, "127.0.0.1", ""},
		{"a trusted proxy: what it vouches for, not what the client wrote before", httplimit.TrustedProxies{Prefixes: lo},
			[]string{"X-Forwarded-For", "6.6.6.6, 203.0.113.7"}, "203.0.113.7, 127.0.0.1", ""},
		{"Forwarded: the upstream still learns the client", httplimit.TrustedProxies{Prefixes: lo, Header: "Forwarded"},
			[]string{"Forwarded", `for=6.6.6.6, for="[2001:db8::1]:443"`}, "2001:db8::1, 127.0.0.1", `for="[2001:db8::1]", for=127.0.0.1`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := newService(t, Options{})
			p, err := s.Proxy(ProxyOptions{Upstream: u, Trusted: tt.trusted, Middleware: []httplimit.Option{httplimit.WithKey(tt.trusted.ClientIP)}})
			if err != nil {
				t.Fatal(err)
			}
			base := testkit.Serve(t, p)
			req, _ := http.NewRequest("GET", base+"/x", nil)
			for i := 0; i+1 < len(tt.hdr); i += 2 {
				req.Header.Set(tt.hdr[i], tt.hdr[i+1])
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if got := last(); got.Get("X-Forwarded-For") != tt.xff || got.Get("Forwarded") != tt.fwded {
				t.Errorf("upstream saw X-Forwarded-For %q Forwarded %q; want %q and %q", got.Get("X-Forwarded-For"), got.Get("Forwarded"), tt.xff, tt.fwded)
			}
			if res, err := http.Get(base + "/boom"); err == nil {
				res.Body.Close()
			}
			m := s.Handler()
			if got := metric(t, m, `ratelimit_proxy_requests_total{code="200"}`); got != "1" {
				t.Errorf("proxied 200s counted %q", got)
			}
			if got := metric(t, m, `ratelimit_proxy_requests_total{code="502"}`); got != "1" {
				t.Errorf("proxied 502s counted %q", got)
			}
			if got := metric(t, m, `ratelimit_upstream_errors_total`); got != "1" {
				t.Errorf("upstream errors counted %q", got)
			}
		})
	}
}
