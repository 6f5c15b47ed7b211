package server

import (
	"strings"
	"testing"
)

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
