package server

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/operator"
)

func TestPageServed(t *testing.T) {
	s, _, _ := newService(t, Options{Token: "s3cret"})
	h := s.Handler()
	for _, tc := range []struct {
		path, contentType, holds string
	}{
		{"/", "text/html; charset=utf-8", `<script src="page.js" defer></script>`},
		{"/page.css", "text/css; charset=utf-8", ".chart"},
		{"/page.js", "text/javascript; charset=utf-8", `fetch("v1/stats"`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			// Without the token: the page holds no figure.
			res := call(t, h, "GET", tc.path, "")
			if res.code != 200 || res.header.Get("Content-Type") != tc.contentType || !strings.Contains(res.body, tc.holds) {
				t.Fatalf("GET %s: %d %q, body without %q", tc.path, res.code, res.header.Get("Content-Type"), tc.holds)
			}
			if csp := res.header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
				t.Errorf("Content-Security-Policy %q", csp)
			}
			if res.header.Get("X-Content-Type-Options") != "nosniff" || res.header.Get("Referrer-Policy") != "no-referrer" {
				t.Errorf("headers %v", res.header)
			}
			if res := call(t, h, "HEAD", tc.path, ""); res.code != 200 || res.body != "" {
				t.Errorf("HEAD %s: %d %q", tc.path, res.code, res.body)
			}
			if res := call(t, h, "POST", tc.path, ""); res.code != 405 || res.header.Get("Allow") != "GET, HEAD" {
				t.Errorf("POST %s: %d %v", tc.path, res.code, res.header)
			}
		})
	}
	if res := call(t, h, "GET", "/index.html", ""); res.code != 404 || !strings.Contains(res.body, "GET /v1/stats") {
		t.Errorf("GET /index.html: %d %s", res.code, res.body)
	}
}

func TestStatsEndpointAuth(t *testing.T) {
	s, _, _ := newService(t, Options{Token: "s3cret"})
	h := s.Handler()
	if res := call(t, h, "GET", "/v1/stats", ""); res.code != 401 || res.header.Get("WWW-Authenticate") == "" {
		t.Errorf("without the token: %d %v", res.code, res.header)
	}
	if res := call(t, h, "GET", "/v1/stats", "", "Authorization", "Bearer wrong"); res.code != 401 {
		t.Errorf("with a wrong token: %d", res.code)
	}
	res := call(t, h, "GET", "/v1/stats", "", "Authorization", "Bearer s3cret")
	if res.code != 200 || res.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("with the token: %d %s", res.code, res.body)
	}
	if res := call(t, h, "POST", "/v1/stats", "", "Authorization", "Bearer s3cret"); res.code != 405 {
		t.Errorf("POST /v1/stats: %d", res.code)
	}
	if got := metric(t, h, `ratelimit_http_requests_total{code="401",path="/v1/stats"}`, "Authorization", "Bearer s3cret"); got != "2" {
		t.Errorf("401s of /v1/stats counted %q, want 2", got)
	}
}

// TestStatsMatchMetrics checks that /v1/stats counts the acquires that
// /metrics does, through the API.
func TestStatsMatchMetrics(t *testing.T) {
	s, _ := newStatsService(t, Options{}, operator.StatsOptions{TopDenied: true})
	h := s.Handler()
	for range 13 {
		call(t, h, "POST", "/v1/acquire", `{"subject":"alice"}`)
	}
	call(t, h, "POST", "/v1/acquire", `{"subject":"bob","cost":4}`)
	call(t, h, "POST", "/v1/peek", `{"subject":"alice"}`) // a peek is no acquire
	res := call(t, h, "GET", "/v1/stats", "")
	var r operator.Report
	if err := json.Unmarshal([]byte(res.body), &r); err != nil {
		t.Fatalf("%v: %s", err, res.body)
	}
	ns := nsReport(t, r, "default")
	allowed := metric(t, h, decisions("default", "allowed", "store"))
	denied := metric(t, h, decisions("default", "denied", "store"))
	if allowed != "11" || denied != "3" || ns.Allowed != 11 || ns.Denied != 3 {
		t.Errorf("/v1/stats counts %d allowed and %d denied, /metrics %s and %s; want 11 and 3", ns.Allowed, ns.Denied, allowed, denied)
	}
	if ns.Latency.Count != 15 {
		t.Errorf("latency of %d checks, want 15 (the acquires and the peek)", ns.Latency.Count)
	}
	if r.TopDenied == nil || len(r.TopDenied.Subjects) != 1 || r.TopDenied.Subjects[0] != (operator.DeniedSubject{Namespace: "default", Subject: "alice", Denied: 3}) {
		t.Errorf("top denied: %+v", r.TopDenied)
	}
	if !reflect.DeepEqual(ns.Policy, config.PolicyJSON{Capacity: 10, RefillTokens: 10, RefillPeriod: "1s"}) {
		t.Errorf("policy %+v", ns.Policy)
	}
}
