package service

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/redisstore"
)

// plansConfig offers testkit.Plans (free, 3 a minute; pro, 50 a minute and
// 1,000 a day) in namespace api.
const plansConfig = testkit.Plans + `namespaces:
  - name: api
    plans: [free, pro]
    default_plan: free
`

// postJSON posts body to url with the bearer token and returns the status
// and the decoded JSON answer.
func postJSON(t *testing.T, url, token, body string) (int, map[string]any) {
	t.Helper()
	code, b := fetch(t, http.MethodPost, url, token, body)
	var out map[string]any
	if err := json.Unmarshal([]byte(b), &out); err != nil {
		t.Fatalf("POST %s: %d %q is not JSON: %v", url, code, b, err)
	}
	return code, out
}

// TestPlansAcrossTwoServices: two services, each with its own Redis client,
// on one redis-server. A subject on free is denied by the first after its
// free allowance; the second assigns it pro; the first decides it under pro
// within its refresh interval and a round trip (bounded by the check
// timeout), and admits it at pro's rate.
func TestPlansAcrossTwoServices(t *testing.T) {
	srv := redistest.StartServer(t)
	path := filepath.Join(t.TempDir(), "plans.yaml")
	testkit.WriteFile(t, path, plansConfig)
	const refresh = 100 * time.Millisecond
	const timeout = 500 * time.Millisecond
	svc := func() (*Service, *testkit.Buffer) {
		uo := &redis.UniversalOptions{Addrs: []string{srv.Addr()}}
		redisstore.ClientOptions(uo)
		return start(t, Config{Redis: uo, ConfigFile: path, Token: "s3cret", PlanRefresh: refresh, Timeout: timeout})
	}
	a, _ := svc()
	b, blogs := svc()
	api := func(s *Service, op string) string { return "http://" + s.Addrs().API().String() + "/v1/" + op }
	const acme = `{"namespace": "api", "subject": "acme"}`

	for i := range 3 {
		if code, d := postJSON(t, api(a, "acquire"), "s3cret", acme); code != 200 || d["plan"] != "free" {
			t.Fatalf("free check %d on the first: %d %v", i, code, d)
		}
	}
	if code, d := postJSON(t, api(a, "acquire"), "s3cret", acme); code != 429 || d["plan"] != "free" || d["retry_after_ms"].(float64) < 10_000 {
		t.Fatalf("4th check on the first: %d %v, want 429 under free with a wait of free's token", code, d)
	}

	code, d := postJSON(t, api(b, "assign"), "s3cret", `{"namespace": "api", "subject": "acme", "plan": "pro"}`)
	assigned := time.Now()
	if code != 200 || d["plan"] != "pro" || d["previous"] != "" {
		t.Fatalf("assign on the second: %d %v", code, d)
	}
	log := blogs.String()
	if !strings.Contains(log, `msg="plan assigned" namespace=api subject=`+keyfmt.Hash("acme")+` plan=pro previous="" listener=`+b.Addrs().API().String()+" remote=127.0.0.1:") {
		t.Errorf("the second's log does not say who assigned what:\n%s", log)
	}
	if _, body := fetch(t, http.MethodGet, "http://"+b.Addrs().API().String()+"/metrics", "s3cret", ""); !strings.Contains(body, `ratelimit_plan_assignments_total{namespace="api",plan="pro"} 1`) {
		t.Errorf("the second's /metrics does not count the assignment")
	}

	// The first applies it within the stated bound: its refresh interval
	// and a round trip, which the check timeout bounds.
	bound := refresh + timeout
	for {
		_, d = postJSON(t, api(a, "peek"), "s3cret", acme)
		if d["plan"] == "pro" {
			break
		}
		if time.Since(assigned) > bound {
			t.Fatalf("the first still decides acme under %v %v after the assignment, beyond the bound %v", d["plan"], time.Since(assigned), bound)
		}
		time.Sleep(5 * time.Millisecond) // the poll's pace, not a wait for the outcome
	}
	// Its first check under pro carries the empty bucket over: denied, with
	// a wait of pro's token (1.2 s), not free's (20 s).
	code, d = postJSON(t, api(a, "acquire"), "s3cret", acme)
	if code != 429 || d["plan"] != "pro" || d["limit"] != float64(50) || d["retry_after_ms"].(float64) > 1200 {
		t.Fatalf("the first's first check under pro: %d %v, want 429 with a wait of at most 1.2 s", code, d)
	}
	deadline := time.Now().Add(1200*time.Millisecond + bound)
	for {
		code, d = postJSON(t, api(a, "acquire"), "s3cret", acme)
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first does not admit acme at pro's rate: %d %v", code, d)
		}
		time.Sleep(time.Duration(d["retry_after_ms"].(float64)) * time.Millisecond)
	}
	if d["plan"] != "pro" {
		t.Errorf("admitted under %v, want pro", d["plan"])
	}
	// Both agree on acme's usage.
	for _, s := range []*Service{a, b} {
		if _, d := postJSON(t, api(s, "usage"), "s3cret", acme); d["plan"] != "pro" || len(d["limits"].([]any)) != 2 {
			t.Errorf("usage on %v: %v", s.Addrs().API(), d)
		}
	}
}
