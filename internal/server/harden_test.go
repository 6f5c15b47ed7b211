package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// post sends body to the real server at base+path with the given
// Content-Type and headers (a "Host" sets the request's Host), and returns
// the status and body.
func post(t *testing.T, base, path, contentType, body string, hdr ...string) (int, string) {
	t.Helper()
	req := testkit.Request(t, "POST", base+path, strings.NewReader(body), hdr...)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, b := testkit.Do(t, req)
	return res.StatusCode, b
}

func TestInvalidUTF8SubjectsDoNotShareABucket(t *testing.T) {
	s, _, _ := newService(t, Options{Policies: config.Policies{"default": {Requests: ratelimit.PerMinute(1)}}})
	base := testkit.Serve(t, s.Handler())
	for _, body := range []string{
		"{\"subject\":\"\xff\"}", "{\"subject\":\"\xfe\"}",
		`{"subject":"\ud800"}`, `{"subject":"\udbff"}`,
		"{\"subject\":\"a\",\"namespace\":\"\xff\"}",
	} {
		if code, msg := post(t, base, "/v1/acquire", "application/json", body); code != 400 {
			t.Errorf("body %q: %d %s, want 400", body, code, msg)
		}
	}
	// Valid UTF-8 subjects that differ keep their own buckets.
	for _, subj := range []string{"é", "è"} {
		if code, msg := post(t, base, "/v1/acquire", "application/json", `{"subject":"`+subj+`"}`); code != 200 {
			t.Errorf("subject %q: %d %s", subj, code, msg)
		}
	}
}

func TestPostNeedsJSONContentType(t *testing.T) {
	s, _, _ := newService(t, Options{})
	base := testkit.Serve(t, s.Handler())
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx"} {
		for _, path := range []string{"/v1/reset", "/v1/acquire", "/v1/peek"} {
			if code, msg := post(t, base, path, ct, `{"subject":"a"}`); code != 415 {
				t.Errorf("%s with Content-Type %q: %d %s, want 415", path, ct, code, msg)
			}
		}
	}
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON"} {
		if code, msg := post(t, base, "/v1/reset", ct, `{"subject":"a"}`); code != 200 {
			t.Errorf("Content-Type %q: %d %s", ct, code, msg)
		}
	}
}

func TestStrictJSONFields(t *testing.T) {
	s, _, _ := newService(t, Options{Policies: config.Policies{"default": {Requests: ratelimit.PerSecond(10)}, "login": {Requests: ratelimit.PerMinute(5)}}})
	base := testkit.Serve(t, s.Handler())
	for _, tt := range []struct{ path, body, msg string }{
		{"/v1/acquire", `{"Subject":"a"}`, `unknown field "Subject"`},
		{"/v1/acquire", `{"SUBJECT":"a"}`, `unknown field "SUBJECT"`},
		{"/v1/acquire", `{"subject":"a","subject":"b"}`, `field "subject" appears twice`},
		{"/v1/acquire", `{"subject":"a","cost":1,"cost":2}`, `field "cost" appears twice`},
		// One rule for cost: 1 up to the capacity, whatever the operation.
		{"/v1/peek", `{"subject":"a","cost":0}`, "cost must be at least 1"},
		{"/v1/peek", `{"subject":"a","cost":6,"namespace":"login"}`, "exceeds the capacity 5"},
		{"/v1/reset", `{"subject":"a","cost":6,"namespace":"login"}`, "exceeds the capacity 5"},
	} {
		if code, msg := post(t, base, tt.path, "application/json", tt.body); code != 400 || !strings.Contains(msg, strings.ReplaceAll(tt.msg, `"`, `\"`)) {
			t.Errorf("%s %s: %d %s, want 400 with %q", tt.path, tt.body, code, msg, tt.msg)
		}
	}
}

func TestSubjectsStayOutOfTheLog(t *testing.T) {
	secret := "sk_live_" + strings.Repeat("9", 40)
	key := "7:default:" + secret
	store := downStore{err: fmt.Errorf("redis check of %q: %w", key, errors.New("EOF"))}
	s, _, logs := newService(t, Options{Store: store})
	base := testkit.Serve(t, s.Handler())
	if code, _ := post(t, base, "/v1/acquire", "application/json", `{"subject":"`+secret+`"}`); code != 503 {
		t.Fatalf("status %d, want 503", code)
	}
	if strings.Contains(logs.String(), secret) || !strings.Contains(logs.String(), keyfmt.Hash(secret)) {
		t.Errorf("the log shows the subject, or not its hash:\n%s", logs.String())
	}
	long := strings.Repeat("x", 1<<20)
	msg := RedactKeys(fmt.Sprintf("redis check of %q: EOF", "9:namespace:"+long))
	if len(msg) > 400 || strings.Contains(msg, "xxxxxxxx") || !strings.Contains(msg, `"namespace:#`) {
		t.Errorf("a 1 MiB key in an error: %d bytes, %.120q", len(msg), msg)
	}
}

func TestEmptyConfigReloadIsRefused(t *testing.T) {
	s, _, logs := newService(t, Options{})
	path := filepath.Join(t.TempDir(), "rl.yaml")
	write := func(doc string) { testkit.WriteFile(t, path, doc) }
	write("namespaces:\n  - name: login\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - name: api\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	if err := s.Reload(path); err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{"", "\n# nothing\n", "namespaces: []\n", "namespaces:\n"} {
		write(doc)
		if err := s.Reload(path); err == nil || !strings.Contains(err.Error(), "defines no namespace") {
			t.Errorf("reload of %q: %v, want a refusal", doc, err)
		}
		if got := s.Policies().Names(); strings.Join(got, ",") != "api,default,login" {
			t.Errorf("after reloading %q the namespaces are %v", doc, got)
		}
	}
	write("namespaces:\n  - name: api\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	if err := s.Reload(path); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "removed=login") {
		t.Errorf("the log does not say the reload removed login:\n%s", logs.String())
	}
}

func TestReadyz(t *testing.T) {
	down := false
	var mu sync.Mutex
	degraded := func() bool { mu.Lock(); defer mu.Unlock(); return down }
	setDown := func(v bool) { mu.Lock(); down = v; mu.Unlock() }
	for _, tt := range []struct {
		outage    fallback.Outage
		readyDown bool
	}{
		{fallback.FailClosed, false}, {fallback.ReturnError, false},
		{fallback.FailOpen, true}, {fallback.LocalFallback, true},
	} {
		t.Run(tt.outage.String(), func(t *testing.T) {
			setDown(false)
			s, _, _ := newService(t, Options{Outage: tt.outage, Degraded: degraded})
			h := s.Handler()
			if res := call(t, h, "GET", "/readyz", ""); res.code != 200 {
				t.Errorf("store up: /readyz %d", res.code)
			}
			setDown(true)
			if res := call(t, h, "GET", "/readyz", ""); (res.code == 200) != tt.readyDown {
				t.Errorf("store down: /readyz %d %s", res.code, res.body)
			}
			if res := call(t, h, "GET", "/healthz", ""); res.code != 200 {
				t.Errorf("store down: /healthz (liveness) %d", res.code)
			}
			setDown(false)
			s.Drain()
			if res := call(t, h, "GET", "/readyz", ""); res.code != 503 || !strings.Contains(res.body, "shutting down") {
				t.Errorf("draining: /readyz %d %s", res.code, res.body)
			}
			if res := call(t, h, "GET", "/healthz", ""); res.code != 200 {
				t.Errorf("draining: /healthz (liveness) %d", res.code)
			}
		})
	}
	// With Ping, readiness asks the store, whether a check has found it
	// down or not.
	var pingErr error
	s, _, _ := newService(t, Options{Outage: fallback.FailClosed, Degraded: func() bool { return false },
		Ping: func(context.Context) error { mu.Lock(); defer mu.Unlock(); return pingErr }})
	if res := call(t, s.Handler(), "GET", "/readyz", ""); res.code != 200 {
		t.Errorf("ping answers: /readyz %d", res.code)
	}
	mu.Lock()
	pingErr = errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	mu.Unlock()
	if res := call(t, s.Handler(), "GET", "/readyz", ""); res.code != 503 || !strings.Contains(res.body, "connection refused") {
		t.Errorf("ping fails: /readyz %d %s", res.code, res.body)
	}
}

// TestMetricsBehindTheToken checks that with a token /metrics answers 401
// without it (its series name namespaces and descriptors) and the series
// with it, and that without a token it is open.
func TestMetricsBehindTheToken(t *testing.T) {
	s, _, _ := newService(t, Options{Token: "m3trics"})
	h := s.Handler()
	for _, tc := range []struct {
		name, auth string
		code       int
	}{
		{"no token", "", 401},
		{"wrong token", "Bearer wrong", 401},
		{"not a bearer", "Basic bTN0cmljcw==", 401},
		{"the token", "Bearer m3trics", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.auth != "" {
				hdr = []string{"Authorization", tc.auth}
			}
			res := call(t, h, "GET", "/metrics", "", hdr...)
			if res.code != tc.code {
				t.Fatalf("/metrics: %d %s", res.code, res.body)
			}
			if tc.code == 401 && (res.header.Get("WWW-Authenticate") == "" || strings.Contains(res.body, "ratelimit_")) {
				t.Errorf("refused, yet %v %s", res.header, res.body)
			}
			if tc.code == 200 && !strings.Contains(res.body, "ratelimit_build_info") {
				t.Errorf("with the token: no series:\n%s", res.body)
			}
		})
	}
	open, _, _ := newService(t, Options{})
	if res := call(t, open.Handler(), "GET", "/metrics", ""); res.code != 200 {
		t.Errorf("without a token set: /metrics %d", res.code)
	}

	// Its own token: a scraper without the API's.
	for _, tc := range []struct {
		name, api, metrics string
		codes              map[string]int // by Authorization
	}{
		{"beside the API's", "api-t0ken", "scrape-t0ken", map[string]int{"": 401, "Bearer scrape-t0ken": 200, "Bearer api-t0ken": 200, "Bearer other": 401}},
		{"alone", "", "scrape-t0ken", map[string]int{"": 401, "Bearer scrape-t0ken": 200, "Bearer other": 401}},
	} {
		s, _, _ := newService(t, Options{Token: tc.api, MetricsToken: tc.metrics})
		for auth, code := range tc.codes {
			var hdr []string
			if auth != "" {
				hdr = []string{"Authorization", auth}
			}
			if res := call(t, s.Handler(), "GET", "/metrics", "", hdr...); res.code != code {
				t.Errorf("metrics token %s, Authorization %q: %d, want %d", tc.name, auth, res.code, code)
			}
		}
		if res := call(t, s.Handler(), "GET", "/v1/config", "", "Authorization", "Bearer scrape-t0ken"); tc.api != "" && res.code != 401 {
			t.Errorf("metrics token %s: it opens /v1/config: %d", tc.name, res.code)
		}
	}
}

func TestConfigEndpointAndToken(t *testing.T) {
	s, _, logs := newService(t, Options{Token: "one", Version: "v1.2.3",
		Policies: config.Policies{"default": {Requests: ratelimit.PerSecond(10)}, "login": {Requests: ratelimit.PerMinute(5)}}})
	h := s.Handler()
	if res := call(t, h, "GET", "/v1/config", ""); res.code != 401 {
		t.Errorf("/v1/config without the token: %d", res.code)
	}
	res := call(t, h, "GET", "/v1/config", "", "Authorization", "Bearer one")
	login, _ := res.json["namespaces"].(map[string]any)["login"].(map[string]any)
	if res.code != 200 || login["capacity"] != 5.0 || login["refill_period"] != "1m" || res.json["version"] != "v1.2.3" {
		t.Errorf("/v1/config: %d %s", res.code, res.body)
	}
	if _, ok := res.json["outage"]; ok {
		t.Errorf("/v1/config names an outage behaviour for a store without one: %s", res.body)
	}
	s.SetToken("two")
	if res := call(t, h, "POST", "/v1/acquire", `{"subject":"a"}`, "Authorization", "Bearer one"); res.code != 401 {
		t.Errorf("the old token after SetToken: %d", res.code)
	}
	if res := call(t, h, "POST", "/v1/acquire", `{"subject":"a"}`, "Authorization", "Bearer two"); res.code != 200 {
		t.Errorf("the new token: %d", res.code)
	}
	for range 20 {
		call(t, h, "POST", "/v1/acquire", `{"subject":"a"}`, "Authorization", "Bearer wrong-token")
	}
	if n := strings.Count(logs.String(), "refused a request to the API"); n < 1 || n > 2 {
		t.Errorf("%d log lines for 21 refused requests, want 1 or 2 (rate-limited):\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "wrong-token") || strings.Contains(logs.String(), "Bearer one") {
		t.Errorf("the log shows a token:\n%s", logs.String())
	}
	body := call(t, h, "GET", "/metrics", "", "Authorization", "Bearer two").body
	for _, want := range []string{`ratelimit_build_info{goversion="go`, `version="v1.2.3"} 1`, "go_goroutines ", "process_start_time_seconds "} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "ratelimit_outage_behaviour") {
		t.Errorf("/metrics shows an outage behaviour for the embedded store")
	}
}

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

// TestEnvoyNamespaceReserved checks that a namespace named like an Envoy
// rule's cannot be put in force, at start or by a reload, and that the API
// refuses to reset or acquire in one: it would act on the rule's buckets.
func TestEnvoyNamespaceReserved(t *testing.T) {
	const envoyNS = "envoy:4:edge:14:remote_address:0:"
	bad := config.Policies{"default": {Requests: ratelimit.PerSecond(10)}, envoyNS: {Requests: ratelimit.PerSecond(1)}}
	if _, err := New(Options{Store: memstore.New(), Policies: bad}); !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), "reserved") {
		t.Errorf("New with namespace %q: %v, want a reserved-name invalid argument", envoyNS, err)
	}
	s, _, _ := newService(t, Options{})
	if err := s.SetPolicies(bad); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Errorf("SetPolicies with namespace %q: %v", envoyNS, err)
	}
	if _, ok := s.Policies()[envoyNS]; ok {
		t.Errorf("namespace %q is in force", envoyNS)
	}
	for _, path := range []string{"/v1/reset", "/v1/acquire", "/v1/peek"} {
		res := call(t, s.Handler(), "POST", path, `{"namespace":"`+envoyNS+`","subject":"10.0.0.1"}`)
		if msg, _ := res.json["error"].(string); res.code != 400 || !strings.Contains(msg, "reserved") {
			t.Errorf("%s in namespace %q: %d %s", path, envoyNS, res.code, res.body)
		}
	}
}
