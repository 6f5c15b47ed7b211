package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
)

func TestParse(t *testing.T) {
	p, err := Parse([]byte(`
namespaces:
  - name: login
    rate_limit:
      unit: minute
      requests_per_unit: 5
      burst: 10
  - name: api.v2
    rate_limit: {unit: Second, requests_per_unit: 100}
  - name: quota
    rate_limit: {unit: year, requests_per_unit: 1000}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Policies{
		"default": {Requests: ratelimit.PerSecond(10)},
		"login":   {Requests: ratelimit.NewLimit(5, time.Minute, 10)},
		"api.v2":  {Requests: ratelimit.PerSecond(100)},
		"quota":   {Requests: ratelimit.NewLimit(1000, 365*24*time.Hour, 1000)},
	}
	if len(p) != len(want) {
		t.Fatalf("got %v, want %v", p, want)
	}
	for k, v := range want {
		if !p[k].Equal(v) {
			t.Errorf("%s = %v, want %v", k, p[k], v)
		}
	}
	if got := p.String(); got != "api.v2: capacity 100, refill 100 per 1s; default: capacity 10, refill 10 per 1s; login: capacity 10, refill 5 per 1m; quota: capacity 1000, refill 1000 per 8760h" {
		t.Errorf("String() = %q", got)
	}
}

// TestParseTokenLimit checks a namespace of requests and tokens: two
// limits, in that order, each with its own unit and burst.
func TestParseTokenLimit(t *testing.T) {
	p, err := Parse([]byte(`
namespaces:
  - name: chat
    rate_limit: {unit: minute, requests_per_unit: 60}
    token_limit: {unit: minute, tokens_per_unit: 90000, burst: 100000}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Policy{Requests: ratelimit.PerMinute(60), Tokens: ratelimit.NewLimit(90000, time.Minute, 100000)}
	got := p["chat"]
	if !got.Equal(want) || !got.HasTokens() || p["default"].HasTokens() {
		t.Fatalf("chat = %v, want %v", got, want)
	}
	if l := got.Limits(); len(l) != 2 || l[0] != want.Requests || l[1] != want.Tokens {
		t.Errorf("Limits() = %v", l)
	}
	if l := p["default"].Limits(); len(l) != 1 || l[0] != DefaultLimit {
		t.Errorf("default Limits() = %v", l)
	}
	if s := got.String(); s != "capacity 60, refill 60 per 1m and tokens: capacity 100000, refill 90000 per 1m" {
		t.Errorf("String() = %q", s)
	}
	for doc, msg := range map[string]string{
		"namespaces:\n  - name: a\n    token_limit: {unit: second, tokens_per_unit: 1}\n":                                                                 `namespace "a": rate_limit is missing`,
		"namespaces:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    token_limit: {unit: second, tokens_per_unit: 0}\n":           "token_limit.tokens_per_unit must be at least 1 (got 0)",
		"namespaces:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    token_limit: {unit: aeon, tokens_per_unit: 5}\n":             `token_limit.unit "aeon"`,
		"namespaces:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    token_limit: {unit: second, requests_per_unit: 5}\n":         "field requests_per_unit not found in a token_limit (unit, tokens_per_unit, burst)",
		"namespaces:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    token_limit: {unit: second, tokens_per_unit: 5, burst: 0}\n": "token_limit.burst must be at least 1 when set (got 0)",
	} {
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", doc, err, msg)
		}
	}
}

func TestParseOverridesDefaultAndRefusesEmpty(t *testing.T) {
	p, err := Parse([]byte("namespaces:\n  - name: default\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"))
	if err != nil || p["default"].Requests != ratelimit.PerHour(3) {
		t.Fatalf("got %v, %v", p, err)
	}
	// A file that defines no namespace is refused: reloaded, it would
	// remove every namespace but default.
	for _, doc := range []string{"", "# just a comment\n", "namespaces:\n", "namespaces: []\n"} {
		if p, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), "defines no namespace") {
			t.Errorf("Parse(%q) = %v, %v; want an error", doc, p, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct{ doc, want string }{
		{"namespaces: [", "line 1"},
		{"namespace: []", "field namespace not found"},
		{"namespaces:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 1, brust: 2}", "field brust not found"},
		{"namespaces:\n  - rate_limit: {unit: second, requests_per_unit: 1}", "namespaces[0]: name is missing"},
		{"namespaces:\n  - name: a b\n    rate_limit: {unit: second, requests_per_unit: 1}", `name "a b": only letters`},
		{"namespaces:\n  - name: a\n", `namespace "a": rate_limit is missing`},
		{"namespaces:\n  - name: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}", `namespace "a": rate_limit.unit "fortnight": want second, minute, hour, day, week, month or year`},
		{"namespaces:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 0}", "burst must be at least 1 when set (got 0)"},
		{"namespaces:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 0}", "requests_per_unit must be at least 1 (got 0)"},
		{"namespaces:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: -1}", "burst must be at least 1"},
		{"namespaces:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: x}", "cannot unmarshal"},
		{"namespaces:\n  - name: a\n    rate_limit: {unit: day, requests_per_unit: 1, burst: 99999999999}", "capacity * refill period"},
		{"namespaces:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 2}", `namespace "a" is defined twice`},
		{"namespaces: []\n---\nnamespaces: []\n", "more than one YAML document"},
		{"namespaces:\n  - name: a\n    rate_limit: 5\n", "into a rate_limit (unit, requests_per_unit, burst)"},
		{"namespaces:\n  - name: a\n    ratelimit: {unit: second}\n", "field ratelimit not found in a namespace"},
		{"namespaces: {a: 1}\n", "into a list of namespaces"},
		{q("{period: month, allowance: 5, time_zone: Mars/Olympus}"), `namespace "a": quotas[0].time_zone "Mars/Olympus": not an IANA time zone`},
		{q("{period: month, allowance: 0}"), `namespace "a": quotas[0].allowance must be at least 1 (got 0)`},
		{q("{period: fortnight, allowance: 5}"), `namespace "a": quotas[0].period "fortnight": want day, week, month or year`},
		{q("{period: month, allowance: 5, start: 'the 15th'}"), `namespace "a": quotas[0].start "the 15th": want a local date and time`},
		{q("{period: month, allowance: 5, counts: tokens}"), `namespace "a": quotas[0].counts: tokens needs the namespace's token_limit`},
		{q("{period: month, allowance: 5, count: tokens}"), "field count not found in a quota (period, allowance, time_zone, start, counts)"},
		{q("{period: day, allowance: 9007199254740993}"), `quotas[0].allowance: quota allowance must be at most 2^53`},
	}
	for _, tt := range tests {
		_, err := Parse([]byte(tt.doc))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) error = %v, want one containing %q", tt.doc, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "config.") {
			t.Errorf("Parse(%q) error = %v names a Go type", tt.doc, err)
		}
	}
}

// TestEnvoyPrefixReserved checks that no namespace may be named like an
// Envoy rule's ("envoy:4:edge:..."), in any case, and that the error is an
// invalid argument; names that only look alike stay allowed.
// q is a document of namespace "a" of 10 a second with the quotas given.
func q(quotas ...string) string {
	return "namespaces:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 10}\n    quotas: [" + strings.Join(quotas, ", ") + "]\n"
}

func TestParseQuotas(t *testing.T) {
	doc := `namespaces:
  - name: chat
    rate_limit: {unit: second, requests_per_unit: 10}
    token_limit: {unit: minute, tokens_per_unit: 90000}
    quotas:
      - {period: month, allowance: 100000, time_zone: Europe/Paris}
      - {period: month, allowance: 5000000, start: "2026-01-15T09:00", time_zone: Europe/Paris, counts: tokens}
      - {period: day, allowance: 3000}
`
	p, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	pol := p["chat"]
	want := []Quota{
		{Quota: ratelimit.CalendarQuota(100000, ratelimit.Month, paris)},
		{Quota: ratelimit.Quota{Allowance: 5000000, Period: ratelimit.Month, Start: time.Date(2026, 1, 15, 9, 0, 0, 0, paris)}, Tokens: true},
		{Quota: ratelimit.CalendarQuota(3000, ratelimit.Day, nil)},
	}
	if len(pol.Quotas) != len(want) {
		t.Fatalf("quotas %+v", pol.Quotas)
	}
	for i := range want {
		if got := pol.Quotas[i]; got.Allowance != want[i].Allowance || got.Period != want[i].Period || !got.Start.Equal(want[i].Start) ||
			got.Start.Location().String() != want[i].Start.Location().String() || got.Tokens != want[i].Tokens {
			t.Errorf("quota %d = %+v, want %+v", i, got, want[i])
		}
	}
	if got := pol.Costs(1, 500); !slices.Equal(got, []int64{1, 500, 1, 500, 1}) {
		t.Errorf("costs of 1 request of 500 tokens = %v", got)
	}
	if got := pol.MaxCost(); got != 10 {
		t.Errorf("MaxCost = %d, want 10", got)
	}
	if s := pol.String(); !strings.Contains(s, "and 100000 a month in Europe/Paris and 5000000 a month from day 15 09:00:00 in Europe/Paris of tokens and 3000 a day in UTC") {
		t.Errorf("String = %q", s)
	}
}

// plansDoc is a file of three plans, and a namespace that offers two of
// them with opts added to it.
func plansDoc(opts string) string {
	return `plans:
  - name: free
    rate_limit: {unit: minute, requests_per_unit: 3}
  - name: pro
    rate_limit: {unit: minute, requests_per_unit: 50}
    quotas: [{period: month, allowance: 100000}]
  - name: unused
    rate_limit: {unit: second, requests_per_unit: 1}
namespaces:
  - name: api
` + opts
}

func TestParsePlans(t *testing.T) {
	p, err := Parse([]byte(plansDoc("    plans: [free, pro]\n    default_plan: free\n    trust_plan: true\n")))
	if err != nil {
		t.Fatal(err)
	}
	pol := p["api"]
	want := Policy{
		Plans: []Plan{
			{Name: "free", Policy: Policy{Requests: ratelimit.PerMinute(3)}},
			{Name: "pro", Policy: Policy{Requests: ratelimit.PerMinute(50), Quotas: []Quota{{Quota: ratelimit.CalendarQuota(100000, ratelimit.Month, nil)}}}},
		},
		DefaultPlan: "free",
		TrustPlan:   true,
	}
	if !pol.Equal(want) {
		t.Fatalf("api = %v, want %v", pol, want)
	}
	if !pol.HasPlans() || pol.PlanNames() != "free, pro" {
		t.Errorf("HasPlans %v, PlanNames %q", pol.HasPlans(), pol.PlanNames())
	}
	if pro, ok := pol.Plan("pro"); !ok || pro.MaxCost() != 50 {
		t.Errorf("Plan(pro) = %v, %v", pro, ok)
	}
	if _, ok := pol.Plan("unused"); ok {
		t.Error("Plan(unused): the namespace does not offer it")
	}
	lib := pol.LibraryPlans()
	if len(lib) != 2 || lib[1].Name != "pro" || lib[1].Limits[0] != ratelimit.PerMinute(50) || len(lib[1].Quotas) != 1 {
		t.Errorf("LibraryPlans = %+v", lib)
	}
	if got := pol.String(); got != "plans free (capacity 3, refill 3 per 1m), pro (capacity 50, refill 50 per 1m and 100000 a month in UTC), default free, trust_plan" {
		t.Errorf("String = %q", got)
	}
	j := pol.JSON()
	if j.Capacity != 3 || j.DefaultPlan != "free" || !j.TrustPlan || len(j.Plans) != 2 || j.Plans[1].Name != "pro" || j.Plans[1].Capacity != 50 || len(j.Plans[1].Quotas) != 1 {
		t.Errorf("JSON = %+v", j)
	}
	other := want
	other.TrustPlan = false
	if pol.Equal(other) {
		t.Error("Equal ignores trust_plan")
	}
}

func TestParsePlanErrors(t *testing.T) {
	tests := []struct{ name, doc, want string }{
		{"an unknown plan names the plans defined", plansDoc("    plans: [free, gold]\n    default_plan: free\n"),
			`namespace "api": plans[1]: unknown plan "gold" (the plans defined: free, pro, unused)`},
		{"a default plan not offered", plansDoc("    plans: [free, pro]\n    default_plan: unused\n"),
			`namespace "api": default_plan "unused" is not one of the namespace's plans (free, pro)`},
		{"plans without a default plan", plansDoc("    plans: [free, pro]\n"),
			`namespace "api": default_plan is missing: name the plan of a subject without an assignment, one of free, pro`},
		{"a plan listed twice", plansDoc("    plans: [free, free]\n    default_plan: free\n"),
			`namespace "api": plans[1]: plan "free" is listed twice`},
		{"limits beside plans", plansDoc("    plans: [free]\n    default_plan: free\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
			`namespace "api": rate_limit: a namespace with plans has no limits of its own`},
		{"quotas beside plans", plansDoc("    plans: [free]\n    default_plan: free\n    quotas: [{period: day, allowance: 5}]\n"),
			`namespace "api": quotas: a namespace with plans has no limits of its own`},
		{"a token limit beside plans", plansDoc("    plans: [free]\n    default_plan: free\n    token_limit: {unit: second, tokens_per_unit: 1}\n"),
			`namespace "api": token_limit: a namespace with plans has no limits of its own`},
		{"an empty list of plans", plansDoc("    plans: []\n    default_plan: free\n"), `namespace "api": plans is empty`},
		{"a default plan without plans", plansDoc("    rate_limit: {unit: second, requests_per_unit: 1}\n    default_plan: free\n"),
			`namespace "api": default_plan needs plans`},
		{"trust_plan without plans", plansDoc("    rate_limit: {unit: second, requests_per_unit: 1}\n    trust_plan: true\n"),
			`namespace "api": trust_plan needs plans`},
		{"a plan defined twice", "plans:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 2}\n" + plansDoc("")[len("plans:\n"):],
			`plans[1]: plan "a" is defined twice`},
		{"a plan without limits", "plans:\n  - name: a\nnamespaces:\n  - name: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			`plans[0] ("a"): rate_limit is missing`},
		{"a plan's bad limit", "plans:\n  - name: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\nnamespaces:\n  - name: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			`plans[0] ("a"): rate_limit.unit "fortnight"`},
		{"a plan's bad name", "plans:\n  - name: a:b\n    rate_limit: {unit: second, requests_per_unit: 1}\nnamespaces:\n  - name: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			`plans[0].name: a plan's name must be letters, digits, '.', '_' and '-' (got "a:b")`},
		{"a plan without a name", "plans:\n  - rate_limit: {unit: second, requests_per_unit: 1}\nnamespaces:\n  - name: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			`plans[0].name: a plan's name must have 1 to 64 characters (got 0)`},
		{"a plan of an unknown field", "plans:\n  - name: a\n    plans: [b]\nnamespaces:\n  - name: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"field plans not found in a plan (name, rate_limit, token_limit, quotas)"},
		{"a namespace of plans when none is defined", "namespaces:\n  - name: x\n    plans: [free]\n    default_plan: free\n",
			`namespace "x": plans[0]: unknown plan "free" (the plans defined: none: define them under plans:)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%q) error = %v, want one containing %q", tt.doc, err, tt.want)
			}
		})
	}
}

func TestEnvoyPrefixReserved(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reserved bool
	}{
		{"envoy:4:edge:14:remote_address:0:", true},
		{"envoy:", true},
		{"ENVOY:4:edge", true},
		{"Envoy:x", true},
		{"envoy", false},
		{"envoy-api", false},
		{"my-envoy:x", false},
		{"envoy.x", false},
	} {
		err := CheckName(tc.name)
		if got := errors.Is(err, ratelimit.ErrInvalidArgument); got != tc.reserved || (tc.reserved && !strings.Contains(err.Error(), "reserved")) {
			t.Errorf("CheckName(%q) = %v, want reserved %v", tc.name, err, tc.reserved)
		}
		doc := "namespaces:\n  - name: \"" + tc.name + "\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
		_, err = Parse([]byte(doc))
		if (err != nil) != tc.reserved || (tc.reserved && !errors.Is(err, ratelimit.ErrInvalidArgument)) {
			t.Errorf("Parse of namespace %q: %v, want reserved %v", tc.name, err, tc.reserved)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rl.yaml")
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("missing file: %v", err)
	}
	os.WriteFile(path, []byte("namespaces:\n  - name: x\n"), 0o644)
	if _, err := Load(path); err == nil || !strings.HasPrefix(err.Error(), path+": ") {
		t.Errorf("bad file: error %v does not start with the path", err)
	}
	os.WriteFile(path, []byte("# just a comment\n"), 0o644)
	if p, err := Load(path); err == nil || !strings.HasPrefix(err.Error(), path+": the file defines no namespace") {
		t.Errorf("comment-only file: %v, %v", p, err)
	}
}
