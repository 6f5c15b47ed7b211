package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// plansFile offers testkit.Plans (free, 3 a minute; pro, 50 a minute and
// 1,000 a day) in the namespaces api (free and pro, by assignment), gw (the same,
// trusting the request's plan) and plain (a limit of its own).
const plansFile = testkit.Plans + `namespaces:
  - name: api
    plans: [free, pro]
    default_plan: free
  - name: gw
    plans: [free, pro]
    default_plan: free
    trust_plan: true
  - name: plain
    rate_limit: {unit: second, requests_per_unit: 5}
`

func newPlansService(t *testing.T, o Options) (*Service, http.Handler, func() string) {
	t.Helper()
	p, err := config.Parse([]byte(plansFile))
	if err != nil {
		t.Fatal(err)
	}
	o.Policies = p
	s, _, logs := newService(t, o)
	return s, s.Handler(), logs.String
}

func TestPlansAssignAndCheck(t *testing.T) {
	_, h, logs := newPlansService(t, Options{Token: "s3cret"})
	auth := []string{"Authorization", "Bearer s3cret"}
	for i := range 3 {
		if res := call(t, h, "POST", "/v1/acquire", `{"namespace":"api","subject":"acme"}`, auth...); res.code != 200 || res.json["plan"] != "free" {
			t.Fatalf("free check %d: %d %s", i, res.code, res.body)
		}
	}
	if res := call(t, h, "POST", "/v1/acquire", `{"namespace":"api","subject":"acme"}`, auth...); res.code != 429 || res.json["plan"] != "free" {
		t.Fatalf("4th free check: %d %s, want 429 under free", res.code, res.body)
	}
	res := call(t, h, "POST", "/v1/assign", `{"namespace":"api","subject":"acme","plan":"pro"}`, auth...)
	if want := `{"namespace":"api","subject":"acme","plan":"pro","previous":""}` + "\n"; res.code != 200 || res.body != want {
		t.Fatalf("assign: %d %s, want 200 %s", res.code, res.body, want)
	}
	log := logs()
	if !strings.Contains(log, `level=INFO msg="plan assigned" namespace=api subject=`+keyfmt.Hash("acme")+` plan=pro previous=""`) || !strings.Contains(log, "remote=192.0.2.1:1234") {
		t.Errorf("the assignment is not logged with the subject's hash, the plans and the remote address:\n%s", log)
	}
	if strings.Contains(log, "acme") {
		t.Errorf("the log names the subject:\n%s", log)
	}
	if got := metric(t, h, `ratelimit_plan_assignments_total{namespace="api",plan="pro"}`, auth...); got != "1" {
		t.Errorf("ratelimit_plan_assignments_total{api, pro} = %q, want 1", got)
	}
	// The first check under pro carries the empty bucket over and is
	// denied with a wait of pro's token (see docs/plans.md).
	res = call(t, h, "POST", "/v1/acquire", `{"namespace":"api","subject":"acme"}`, auth...)
	if res.code != 429 || res.json["plan"] != "pro" || res.json["retry_after_ms"] != float64(1200) {
		t.Fatalf("first check under pro: %d %s, want 429 under pro, retry in 1.2 s", res.code, res.body)
	}
	// The usage peeks under pro: free has no quota, so pro's day quota
	// starts from nothing.
	res = call(t, h, "POST", "/v1/usage", `{"namespace":"api","subject":"acme"}`, auth...)
	want := `{"allowed":false,"namespace":"api","subject":"acme","plan":"pro","remaining":0,"limit":50,"retry_after_ms":1200,"reset_after_ms":60000,"source":"store","policy":{"capacity":50,"refill_tokens":50,"refill_period":"1m"},` +
		`"limits":[{"kind":"rate_limit","limit":50,"remaining":0,"reset_after_ms":60000},{"kind":"quota","limit":1000,"remaining":1000,"reset_after_ms":86400000,"period":"day","time_zone":"UTC","counts":"requests"}]}` + "\n"
	if res.code != 200 || res.body != want || res.header.Get("RateLimit") != "" {
		t.Fatalf("usage: %d %s\nwant 200 %s without headers (%v)", res.code, res.body, want, res.header)
	}
	res = call(t, h, "POST", "/v1/assign", `{"namespace":"api","subject":"acme","plan":""}`, auth...)
	if want := `{"namespace":"api","subject":"acme","plan":"","previous":"pro"}` + "\n"; res.code != 200 || res.body != want {
		t.Fatalf("removal: %d %s, want 200 %s", res.code, res.body, want)
	}
	if res := call(t, h, "POST", "/v1/peek", `{"namespace":"api","subject":"acme"}`, auth...); res.json["plan"] != "free" {
		t.Errorf("after the removal: %s, want the default plan", res.body)
	}
	if got := metric(t, h, `ratelimit_plan_assignments_total{namespace="api",plan=""}`, auth...); got != "1" {
		t.Errorf("removals counted %q, want 1", got)
	}
	// A namespace of limits of its own answers no plan.
	if res := call(t, h, "POST", "/v1/usage", `{"namespace":"plain","subject":"acme"}`, auth...); res.code != 200 || res.json["plan"] != nil || len(res.json["limits"].([]any)) != 1 {
		t.Errorf("usage in plain: %d %s", res.code, res.body)
	}
	cfg := call(t, h, "GET", "/v1/config", "", auth...)
	api := cfg.json["namespaces"].(map[string]any)["api"].(map[string]any)
	if api["default_plan"] != "free" || api["capacity"] != float64(3) || len(api["plans"].([]any)) != 2 || api["trust_plan"] != nil {
		t.Errorf("GET /v1/config: api = %v", api)
	}
}

func TestPlansTrustedPlanAndReservations(t *testing.T) {
	_, h, _ := newPlansService(t, Options{})
	res := call(t, h, "POST", "/v1/acquire", `{"namespace":"gw","subject":"acme","plan":"pro","cost":40}`)
	if res.code != 200 || res.json["plan"] != "pro" || res.json["remaining"] != float64(10) {
		t.Fatalf("a check naming pro in gw: %d %s", res.code, res.body)
	}
	res = call(t, h, "POST", "/v1/reserve", `{"namespace":"gw","subject":"acme","plan":"pro","cost":5}`)
	token, _ := res.json["token"].(string)
	if res.code != 200 || res.json["plan"] != "pro" || !strings.HasPrefix(token, "pro:") {
		t.Fatalf("reserve under pro: %d %s", res.code, res.body)
	}
	// The settle finds pro from the token, and the bucket stays pro's.
	res = call(t, h, "POST", "/v1/settle", `{"namespace":"gw","token":"`+token+`","used":1}`)
	if res.code != 200 || res.json["plan"] != "pro" || res.json["remaining"] != float64(9) || res.json["limit"] != float64(50) {
		t.Fatalf("settle: %d %s, want 9 of pro's 50", res.code, res.body)
	}
	if res := call(t, h, "POST", "/v1/settle", `{"namespace":"gw","token":"`+token+`","used":1}`); res.code != 409 {
		t.Errorf("a second settle: %d %s, want 409", res.code, res.body)
	}
}

func TestPlansBadInput(t *testing.T) {
	long := strings.Repeat("x", MaxSubjectBytes+1)
	tests := []struct {
		name, path, body, token string
		code                    int
		want                    string
	}{
		{"an assignment without the token", "/v1/assign", `{"namespace":"api","subject":"acme","plan":"pro"}`, "", 401, "token"},
		{"a usage without the token", "/v1/usage", `{"namespace":"api","subject":"acme"}`, "", 401, "token"},
		{"an unknown plan names the plans on offer", "/v1/assign", `{"namespace":"api","subject":"acme","plan":"gold"}`, "s3cret", 400, `unknown plan "gold": the plans on offer are free, pro`},
		{"a namespace without plans", "/v1/assign", `{"namespace":"plain","subject":"acme","plan":"pro"}`, "s3cret", 400, `namespace "plain" offers no plans`},
		{"an unknown namespace", "/v1/assign", `{"namespace":"nope","subject":"acme","plan":"pro"}`, "s3cret", 404, `unknown namespace "nope"`},
		{"no plan", "/v1/assign", `{"namespace":"api","subject":"acme"}`, "s3cret", 400, "plan is required"},
		{"a plan that is not a string", "/v1/assign", `{"namespace":"api","subject":"acme","plan":3}`, "s3cret", 400, "plan"},
		{"no subject", "/v1/assign", `{"namespace":"api","plan":"pro"}`, "s3cret", 400, "subject is required"},
		{"a subject over the bound", "/v1/assign", `{"namespace":"api","subject":"` + long + `","plan":"pro"}`, "s3cret", 400, "subject is longer than 1024 bytes"},
		{"a usage of a subject over the bound", "/v1/usage", `{"namespace":"api","subject":"` + long + `"}`, "s3cret", 400, "subject is longer than 1024 bytes"},
		{"an unknown field", "/v1/usage", `{"namespace":"api","subject":"acme","plan":"pro"}`, "s3cret", 400, `unknown field "plan"`},
		{"a plan named where it is not trusted", "/v1/acquire", `{"namespace":"api","subject":"acme","plan":"pro"}`, "s3cret", 400, `namespace "api" does not take a plan from the request`},
		{"a plan named outside plans", "/v1/acquire", `{"namespace":"plain","subject":"acme","plan":"pro"}`, "s3cret", 400, `namespace "plain" offers no plans`},
		{"a trusted plan not on offer", "/v1/peek", `{"namespace":"gw","subject":"acme","plan":"gold"}`, "s3cret", 400, `unknown plan "gold": the plans on offer in namespace "gw" are free, pro`},
		{"a cost over the plan's capacity", "/v1/acquire", `{"namespace":"api","subject":"acme","cost":4}`, "s3cret", 400, `cost 4 exceeds the capacity 3`},
		{"a settle without the plan in its token", "/v1/settle", `{"namespace":"api","token":"AAAAAAAAAAAAAAAAAAAAAAAA","used":1}`, "s3cret", 400, "not a reservation token of namespace \"api\""},
		{"a settle of a plan not on offer", "/v1/settle", `{"namespace":"api","token":"gold:AAAAAAAAAAAAAAAAAAAAAAAA","used":1}`, "s3cret", 400, `unknown plan "gold"`},
		{"an assignment by GET", "/v1/assign", ``, "s3cret", 405, "wants POST"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, h, logs := newPlansService(t, Options{Token: "s3cret"})
			method := "POST"
			if tt.code == 405 {
				method = "GET"
			}
			var hdr []string
			if tt.token != "" {
				hdr = []string{"Authorization", "Bearer " + tt.token}
			}
			res := call(t, h, method, tt.path, tt.body, hdr...)
			if msg, _ := res.json["error"].(string); res.code != tt.code || !strings.Contains(msg, tt.want) {
				t.Errorf("%s %s: %d %s, want %d with %q", tt.path, tt.body, res.code, res.body, tt.code, tt.want)
			}
			// Nothing changed: acme is on the default plan, and no
			// assignment is logged or counted.
			if res := call(t, h, "POST", "/v1/usage", `{"namespace":"api","subject":"acme"}`, "Authorization", "Bearer s3cret"); res.json["plan"] != "free" {
				t.Errorf("after the refusal acme's usage is %s", res.body)
			}
			if strings.Contains(logs(), "plan assigned") {
				t.Errorf("a refused assignment is logged: %s", logs())
			}
		})
	}
}

func TestPlansReloadAndClose(t *testing.T) {
	s, h, _ := newPlansService(t, Options{PlanRefresh: time.Millisecond})
	old := s.policies.Load().plans["api"]
	if res := call(t, h, "POST", "/v1/assign", `{"namespace":"api","subject":"acme","plan":"pro"}`); res.code != 200 {
		t.Fatalf("assign: %d %s", res.code, res.body)
	}
	p, err := config.Parse([]byte(strings.Replace(plansFile, "requests_per_unit: 50", "requests_per_unit: 60", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetPolicies(p); err != nil {
		t.Fatal(err)
	}
	if s.policies.Load().plans["api"] == old {
		t.Fatal("the reload kept the old Plans")
	}
	// The new Plans read the store's assignments before it was put in
	// force: acme is on pro, at pro's new limit, at once.
	if res := call(t, h, "POST", "/v1/peek", `{"namespace":"api","subject":"acme"}`); res.json["plan"] != "pro" || res.json["limit"] != float64(60) {
		t.Errorf("after the reload: %s", res.body)
	}
	s.Close()
	if err := s.SetPolicies(p); err == nil {
		t.Error("SetPolicies after Close: no error")
	}
	if res := call(t, h, "POST", "/v1/peek", `{"namespace":"api","subject":"acme"}`); res.json["plan"] != "pro" {
		t.Errorf("after Close the API keeps the assignments last seen: %s", res.body)
	}
}
