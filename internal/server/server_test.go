package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newService(t *testing.T, o Options) (*Service, *testkit.Clock, *testkit.Buffer) {
	t.Helper()
	c := testkit.NewClock(t0)
	logs := &testkit.Buffer{}
	if o.Store == nil {
		o.Store = memstore.New(memstore.WithClock(c.Now))
	}
	o.Clock = c.Now
	o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, c, logs
}

type response struct {
	code   int
	header http.Header
	body   string
	json   map[string]any
}

func call(t *testing.T, h http.Handler, method, path, body string, hdr ...string) response {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	if method == "POST" {
		r.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	res := response{code: w.Code, header: w.Header(), body: w.Body.String()}
	if strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(w.Body.Bytes(), &res.json); err != nil {
			t.Fatalf("%s %s: body %q is not a JSON object: %v", method, path, w.Body.String(), err)
		}
	}
	return res
}

// decisions names the series of ratelimit_decisions_total of the acquires
// in namespace ns with the given result and source.
func decisions(ns, result, source string) string {
	return fmt.Sprintf(`ratelimit_decisions_total{namespace=%q,op="acquire",result=%q,source=%q}`, ns, result, source)
}

// metric returns the value of series on h's /metrics, or "" when h does not
// export it. hdr are header names and values to send, such as the token.
func metric(t *testing.T, h http.Handler, series string, hdr ...string) string {
	t.Helper()
	res := call(t, h, "GET", "/metrics", "", hdr...)
	if res.code != 200 {
		t.Fatalf("/metrics: %d %s", res.code, res.body)
	}
	for line := range strings.Lines(res.body) {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestAcquireUntilDenied(t *testing.T) {
	s, c, _ := newService(t, Options{})
	h := s.Handler()
	for i := range 10 {
		res := call(t, h, "POST", "/v1/acquire", `{"subject":"alice"}`)
		if res.code != 200 || res.json["allowed"] != true || res.json["remaining"] != float64(9-i) {
			t.Fatalf("call %d: %d %s", i, res.code, res.body)
		}
	}
	res := call(t, h, "POST", "/v1/acquire", `{"subject":"alice"}`)
	want := `{"allowed":false,"namespace":"default","subject":"alice","cost":1,"remaining":0,"limit":10,"retry_after_ms":100,"reset_after_ms":1000,"source":"store","policy":{"capacity":10,"refill_tokens":10,"refill_period":"1s"},"limits":[{"kind":"rate_limit","limit":10,"remaining":0,"reset_after_ms":1000}]}` + "\n"
	if res.code != 429 || res.body != want {
		t.Fatalf("11th call: %d %s\nwant 429 %s", res.code, res.body, want)
	}
	for k, v := range map[string]string{
		"Retry-After": "1", "RateLimit-Policy": `"default";q=10;w=1`, "RateLimit": `"default";r=0;t=1`,
		"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": fmt.Sprint(t0.Unix() + 1),
	} {
		if got := res.header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if res := call(t, h, "POST", "/v1/acquire", `{"subject":"bob"}`); res.code != 200 {
		t.Errorf("another subject: %d", res.code)
	}
	c.Add(100 * time.Millisecond)
	if res := call(t, h, "POST", "/v1/acquire", `{"subject":"alice","cost":1}`); res.code != 200 || res.header.Get("Retry-After") != "" {
		t.Errorf("after the refill of one token: %d %v", res.code, res.header)
	}
	if got := metric(t, h, decisions("default", "allowed", "store")); got != "12" {
		t.Errorf("allowed decisions = %s, want 12", got)
	}
	if got := metric(t, h, decisions("default", "denied", "store")); got != "1" {
		t.Errorf("denied decisions = %s, want 1", got)
	}
}

func TestPeekAndReset(t *testing.T) {
	s, _, _ := newService(t, Options{Policies: config.Policies{"default": {Requests: ratelimit.PerMinute(2)}}})
	h := s.Handler()
	call(t, h, "POST", "/v1/acquire", `{"subject":"a","cost":2}`)
	res := call(t, h, "POST", "/v1/peek", `{"subject":"a"}`)
	if res.code != 200 || res.json["allowed"] != false || res.json["retry_after_ms"] != float64(30000) || res.json["cost"] != nil {
		t.Fatalf("peek of an empty bucket: %d %s", res.code, res.body)
	}
	if res.header.Get("RateLimit") != `"default";r=0;t=60` || res.header.Get("Retry-After") != "" {
		t.Errorf("peek headers: %v", res.header)
	}
	res = call(t, h, "POST", "/v1/reset", `{"subject":"a"}`)
	if res.code != 200 || res.body != `{"namespace":"default","reset":true,"subject":"a"}`+"\n" {
		t.Fatalf("reset: %d %s", res.code, res.body)
	}
	if res := call(t, h, "POST", "/v1/peek", `{"subject":"a"}`); res.json["remaining"] != float64(2) {
		t.Fatalf("peek after reset: %s", res.body)
	}
}

func TestBadInput(t *testing.T) {
	s, _, _ := newService(t, Options{Policies: config.Policies{"default": {Requests: ratelimit.PerSecond(10)}, "login": {Requests: ratelimit.PerMinute(5)}}})
	h := s.Handler()
	huge := `{"subject":"` + strings.Repeat("x", MaxBodyBytes) + `"}`
	tests := []struct {
		name, method, path, body string
		code                     int
		msg                      string
	}{
		{"malformed JSON", "POST", "/v1/acquire", `{"subject":`, 400, "malformed JSON: the body ends in the middle of a value"},
		{"a syntax error", "POST", "/v1/acquire", `{"subject" "a"}`, 400, "malformed JSON at byte 12"},
		{"an empty body", "POST", "/v1/acquire", ``, 400, "empty body"},
		{"a JSON array", "POST", "/v1/acquire", `[1]`, 400, "the body must be a JSON object, not array"},
		{"two JSON values", "POST", "/v1/acquire", `{"subject":"a"} {}`, 400, "one JSON object and nothing after it"},
		{"a huge body is capped", "POST", "/v1/acquire", huge, 413, "request body larger than 65536 bytes"},
		{"a missing subject", "POST", "/v1/acquire", `{"namespace":"login"}`, 400, "subject is required"},
		{"an empty subject", "POST", "/v1/peek", `{"subject":""}`, 400, "subject is required"},
		{"a long subject", "POST", "/v1/acquire", `{"subject":"` + strings.Repeat("y", 1025) + `"}`, 400, "subject is longer than 1024 bytes"},
		{"cost 0", "POST", "/v1/acquire", `{"subject":"a","cost":0}`, 400, "cost must be at least 1 (got 0)"},
		{"a negative cost", "POST", "/v1/acquire", `{"subject":"a","cost":-3}`, 400, "cost must be at least 1 (got -3)"},
		{"a cost above capacity", "POST", "/v1/acquire", `{"subject":"a","cost":6,"namespace":"login"}`, 400, `cost 6 exceeds the capacity 5 of namespace "login"`},
		{"a fractional cost", "POST", "/v1/acquire", `{"subject":"a","cost":1.5}`, 400, `field "cost" must be a whole number, not number 1.5`},
		{"a string cost", "POST", "/v1/acquire", `{"subject":"a","cost":"2"}`, 400, `field "cost" must be a whole number, not string`},
		{"a huge cost", "POST", "/v1/acquire", `{"subject":"a","cost":1e300}`, 400, `field "cost" must be a whole number`},
		{"an unknown field", "POST", "/v1/acquire", `{"subject":"a","weight":2}`, 400, `unknown field "weight"`},
		{"an unknown namespace", "POST", "/v1/acquire", `{"subject":"a","namespace":"nope"}`, 404, `unknown namespace "nope" (known: default, login)`},
		{"GET on the API", "GET", "/v1/acquire", ``, 405, "/v1/acquire wants POST, not GET"},
		{"an unknown path", "POST", "/v2/acquire", `{}`, 404, "no such endpoint /v2/acquire"},
		{"POST on /metrics", "POST", "/metrics", ``, 405, "/metrics wants GET"},
	}
	for _, tt := range tests {
		t.Run(tt.name+" is a clear 4xx", func(t *testing.T) {
			res := call(t, h, tt.method, tt.path, tt.body)
			if res.code != tt.code {
				t.Fatalf("status %d, want %d (body %s)", res.code, tt.code, res.body)
			}
			msg, _ := res.json["error"].(string)
			if !strings.Contains(msg, tt.msg) {
				t.Errorf("error %q, want one containing %q", msg, tt.msg)
			}
		})
	}
	if got := metric(t, h, decisions("default", "allowed", "store")); got != "" {
		t.Errorf("bad requests made %s decisions", got)
	}
}

func TestBearerToken(t *testing.T) {
	s, _, _ := newService(t, Options{Token: "s3cret"})
	h := s.Handler()
	for _, auth := range []string{"", "Bearer wrong", "Basic s3cret", "Bearer s3cret2", "s3cret"} {
		res := call(t, h, "POST", "/v1/acquire", `{"subject":"a"}`, "Authorization", auth)
		if res.code != 401 || res.header.Get("WWW-Authenticate") == "" {
			t.Errorf("Authorization %q: %d, want 401 with WWW-Authenticate", auth, res.code)
		}
	}
	for _, auth := range []string{"Bearer s3cret", "bearer s3cret"} {
		if res := call(t, h, "POST", "/v1/acquire", `{"subject":"a"}`, "Authorization", auth); res.code != 200 {
			t.Errorf("Authorization %q: %d, want 200", auth, res.code)
		}
	}
	if res := call(t, h, "GET", "/healthz", ""); res.code != 200 {
		t.Errorf("/healthz needs no token: %d", res.code)
	}
}

func TestReload(t *testing.T) {
	s, _, logs := newService(t, Options{})
	dir := t.TempDir()
	path := filepath.Join(dir, "rl.yaml")
	write := func(s string) { testkit.WriteFile(t, path, s) }
	write("namespaces:\n  - name: login\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	if err := s.Reload(path); err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	call(t, h, "POST", "/v1/acquire", `{"subject":"a","namespace":"login"}`)
	if res := call(t, h, "POST", "/v1/acquire", `{"subject":"a","namespace":"login"}`); res.code != 429 {
		t.Fatalf("login after reload: %d %s", res.code, res.body)
	}

	write("namespaces:\n  - name: login\n    rate_limit: {unit: minute, requests_per_unit: 0}\n")
	err := s.Reload(path)
	if err == nil || !strings.Contains(err.Error(), "requests_per_unit must be at least 1") {
		t.Fatalf("bad reload: %v", err)
	}
	if got := s.Policies()["login"].Requests; got != ratelimit.PerMinute(1) {
		t.Errorf("after a bad reload login = %v, want the old PerMinute(1)", got)
	}
	if !strings.Contains(logs.String(), "config reload refused; keeping the previous policies") ||
		!strings.Contains(logs.String(), "login: capacity 1, refill 1 per 1m") {
		t.Errorf("log does not say the old policies stay:\n%s", logs.String())
	}
	if res := call(t, h, "POST", "/v1/acquire", `{"subject":"a","namespace":"login"}`); res.code != 429 {
		t.Errorf("the bucket did not survive a refused reload: %d", res.code)
	}

	// A policy change carries the bucket over: the subject keeps the lesser
	// of its tokens and the new capacity.
	write("namespaces:\n  - name: login\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	if err := s.Reload(path); err != nil {
		t.Fatal(err)
	}
	if res := call(t, h, "POST", "/v1/acquire", `{"subject":"a","namespace":"login"}`); res.code != 429 {
		t.Errorf("a reload handed out a fresh bucket: %d %s", res.code, res.body)
	}
	ok, bad := metric(t, h, `ratelimit_config_reloads_total{result="ok"}`), metric(t, h, `ratelimit_config_reloads_total{result="error"}`)
	if ok != "2" || bad != "1" {
		t.Errorf("reload counts ok=%s error=%s", ok, bad)
	}
	os.Remove(path)
	if err := s.Reload(path); err == nil {
		t.Errorf("reload of a missing file succeeded")
	}
}

// downStore fails every call as an unreachable Redis would, or returns a
// fixed unenforced decision.
type downStore struct {
	d   ratelimit.Decision
	err error
}

func (s downStore) Apply(context.Context, string, ratelimit.Request) (ratelimit.Decision, error) {
	return s.d, s.err
}
func (s downStore) Reset(context.Context, string) error { return s.err }

func TestOutageResponses(t *testing.T) {
	refused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	t.Run("a store error is 503 and counted", func(t *testing.T) {
		s, _, logs := newService(t, Options{Store: downStore{err: refused}})
		h := s.Handler()
		for _, op := range []string{"acquire", "peek", "reset"} {
			res := call(t, h, "POST", "/v1/"+op, `{"subject":"a"}`)
			if res.code != 503 || res.json["error"] != "rate limit store unavailable" || res.header.Get("Retry-After") != "1" {
				t.Errorf("%s: %d %s", op, res.code, res.body)
			}
			if got := metric(t, h, `ratelimit_errors_total{namespace="default",op="`+op+`",reason="store"}`); got != "1" {
				t.Errorf("%s: %s store errors counted, want 1", op, got)
			}
		}
		if !strings.Contains(logs.String(), "connection refused") {
			t.Errorf("the error was not logged:\n%s", logs.String())
		}
	})
	t.Run("a fail-closed decision is 503 with the decision", func(t *testing.T) {
		s, _, _ := newService(t, Options{Store: downStore{d: ratelimit.Decision{Source: ratelimit.SourceFailClosed}},
			Outage: fallback.FailClosed, Degraded: func() bool { return true }})
		res := call(t, s.Handler(), "POST", "/v1/acquire", `{"subject":"a"}`)
		if res.code != 503 || res.json["source"] != "fail-closed" || res.json["allowed"] != false || res.header.Get("RateLimit") != "" {
			t.Errorf("%d %s %v", res.code, res.body, res.header)
		}
		res = call(t, s.Handler(), "GET", "/healthz", "")
		if res.code != 200 || res.json["serving"] != "outage: fail-closed" {
			t.Errorf("healthz: %s", res.body)
		}
		if body := call(t, s.Handler(), "GET", "/metrics", "").body; !strings.Contains(body, "ratelimit_fallback_active 1\n") ||
			!strings.Contains(body, `ratelimit_outage_behaviour{behaviour="fail-closed"} 1`) {
			t.Errorf("metrics:\n%s", body)
		}
	})
	t.Run("a fail-open decision is 200 without rate-limit headers", func(t *testing.T) {
		s, _, _ := newService(t, Options{Store: downStore{d: ratelimit.Decision{Allowed: true, Source: ratelimit.SourceFailOpen}}})
		res := call(t, s.Handler(), "POST", "/v1/acquire", `{"subject":"a"}`)
		if res.code != 200 || res.json["source"] != "fail-open" || res.header.Get("RateLimit") != "" {
			t.Errorf("%d %s", res.code, res.body)
		}
		if got := metric(t, s.Handler(), decisions("default", "allowed", "fail-open")); got != "1" {
			t.Errorf("fail-open decisions = %s", got)
		}
	})
}

func TestMetricsExposition(t *testing.T) {
	s, _, _ := newService(t, Options{})
	h := s.Handler()
	for range 11 {
		call(t, h, "POST", "/v1/acquire", `{"subject":"m"}`)
	}
	call(t, h, "POST", "/v1/peek", `{"subject":"m"}`)
	call(t, h, "POST", "/v1/acquire", `{"subject":"m","cost":0}`) // refused before the limiter
	res := call(t, h, "GET", "/metrics", "")
	if res.code != 200 || !strings.HasPrefix(res.header.Get("Content-Type"), "text/plain; version=0.0.4; charset=utf-8") {
		t.Fatalf("%d %v", res.code, res.header)
	}
	for _, want := range []string{
		decisions("default", "allowed", "store") + " 10",
		decisions("default", "denied", "store") + " 1",
		`ratelimit_decisions_total{namespace="default",op="peek",result="denied",source="store"} 1`,
		`ratelimit_tokens_total{namespace="default",result="allowed"} 10`,
		`ratelimit_decision_duration_seconds_count{namespace="default",source="store"} 12`,
		`ratelimit_decision_duration_seconds_bucket{namespace="default",source="store",le="+Inf"} 12`,
		"ratelimit_fallback_active 0",
		"ratelimit_namespaces 1",
		`ratelimit_http_requests_total{code="429",path="/v1/acquire"} 1`,
		`ratelimit_http_requests_total{code="400",path="/v1/acquire"} 1`,
	} {
		if !strings.Contains(res.body, want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, res.body)
		}
	}
	if strings.Contains(res.body, "subject") || strings.Contains(res.body, `"m"`) {
		t.Errorf("a series is labelled by subject:\n%s", res.body)
	}
}

func TestProxy(t *testing.T) {
	var mu sync.Mutex
	var seenXFF []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seenXFF = append(seenXFF, r.Header.Get("X-Forwarded-For"))
		mu.Unlock()
		fmt.Fprintf(w, "upstream %s", r.URL.Path)
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	s, _, _ := newService(t, Options{Policies: config.Policies{"default": {Requests: ratelimit.PerSecond(10)}, "web": {Requests: ratelimit.PerMinute(2)}}})
	p, err := s.Proxy(ProxyOptions{Upstream: u, Namespace: "web", Middleware: []httplimit.Option{httplimit.WithJSON()}})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{200, 200, 429} {
		res := call(t, p, "GET", "/hello", "", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i))
		if res.code != want {
			t.Fatalf("request %d: %d %s", i, res.code, res.body)
		}
		if want == 200 && (res.body != "upstream /hello" || res.header.Get("RateLimit-Policy") != `"web";q=2;w=60`) {
			t.Errorf("request %d: %q %v", i, res.body, res.header)
		}
		if want == 429 && (res.json["retry_after"] != float64(30) || res.header.Get("Retry-After") != "30") {
			t.Errorf("denial: %s %v", res.body, res.header)
		}
	}
	mu.Lock()
	// No proxy is trusted: the client's own X-Forwarded-For is not passed
	// on, only the peer's address.
	if len(seenXFF) != 2 || seenXFF[0] != "192.0.2.1" {
		t.Errorf("upstream saw X-Forwarded-For %q", seenXFF)
	}
	mu.Unlock()
	if got := metric(t, s.Handler(), decisions("web", "denied", "store")); got != "1" {
		t.Errorf("proxy denials counted %s, want 1", got)
	}
	if err := s.SetPolicies(config.Policies{"default": {Requests: ratelimit.PerSecond(1)}}); err == nil || !strings.Contains(err.Error(), `"web" limits the proxied requests`) {
		t.Errorf("removing the proxy's namespace: %v", err)
	}
	if _, err := s.Proxy(ProxyOptions{Upstream: u, Namespace: "nope"}); err == nil || !strings.Contains(err.Error(), `unknown namespace "nope"`) {
		t.Errorf("proxy of an unknown namespace: %v", err)
	}
	for _, bad := range []string{"127.0.0.1:80", "ftp://x/", "/path"} {
		u, _ := url.Parse(bad)
		if _, err := s.Proxy(ProxyOptions{Upstream: u}); err == nil {
			t.Errorf("upstream %q accepted", bad)
		}
	}
	up.Close()
	res := call(t, p, "GET", "/x", "", "X-Forwarded-For", "203.0.113.9")
	if res.code != 429 {
		// 192.0.2.1 (httptest's peer) is still the key: spent.
		t.Errorf("after the upstream closed: %d", res.code)
	}
	p2, _ := s.Proxy(ProxyOptions{Upstream: u})
	if res := call(t, p2, "GET", "/x", ""); res.code != 502 || !strings.Contains(res.body, "upstream unreachable") {
		t.Errorf("unreachable upstream: %d %q", res.code, res.body)
	}
}
