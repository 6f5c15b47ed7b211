package server

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

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
