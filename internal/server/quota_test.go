package server

import (
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/config"
)

// TestQuotaNamespace: a namespace with a quota answers as the library
// decides, all or nothing, with the standing of each limit and quota in
// limits and every one of them in RateLimit-Policy; a denial by the quota
// is a 429 whose Retry-After and RateLimit name the quota's window end.
func TestQuotaNamespace(t *testing.T) {
	s, _, _ := newService(t, Options{})
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	pols := config.Default()
	pols["api"] = config.Policy{Requests: ratelimit.PerSecond(100), Quotas: []config.Quota{{Quota: ratelimit.CalendarQuota(3, ratelimit.Day, paris)}}}
	pols["chat"] = config.Policy{Requests: ratelimit.PerMinute(60), Tokens: ratelimit.PerMinute(9000),
		Quotas: []config.Quota{{Quota: ratelimit.CalendarQuota(1000, ratelimit.Month, nil), Tokens: true}}}
	if err := s.SetPolicies(pols); err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	// t0 is midnight UTC, 01:00 in Paris: the day ends in 23 hours.
	const untilMidnight = 23 * time.Hour
	for i := range 3 {
		r := call(t, h, "POST", "/v1/acquire", `{"namespace": "api", "subject": "acme"}`)
		if r.code != http.StatusOK {
			t.Fatalf("acquire %d: %d %s", i+1, r.code, r.body)
		}
		limits := r.json["limits"].([]any)
		if q := limits[1].(map[string]any); q["remaining"] != float64(2-i) || q["kind"] != "quota" || q["period"] != "day" || q["time_zone"] != "Europe/Paris" || q["counts"] != "requests" {
			t.Fatalf("acquire %d: the quota's standing %v", i+1, q)
		}
	}
	r := call(t, h, "POST", "/v1/acquire", `{"namespace": "api", "subject": "acme"}`)
	if r.code != http.StatusTooManyRequests {
		t.Fatalf("the fourth acquire: %d %s", r.code, r.body)
	}
	wantHeaders := map[string]string{
		"Retry-After":           "82800",
		"Ratelimit-Policy":      `"api-1";q=100;w=1, "api-2";q=3;w=86400`,
		"Ratelimit":             `"api-2";r=0;t=82800`,
		"X-Ratelimit-Limit":     "3",
		"X-Ratelimit-Remaining": "0",
	}
	for k, v := range wantHeaders {
		if got := r.header.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	wantLimits := []any{
		map[string]any{"kind": "rate_limit", "limit": float64(100), "remaining": float64(97), "reset_after_ms": float64(30)},
		map[string]any{"kind": "quota", "limit": float64(3), "remaining": float64(0), "reset_after_ms": float64(untilMidnight.Milliseconds()), "period": "day", "time_zone": "Europe/Paris", "counts": "requests"},
	}
	if !reflect.DeepEqual(r.json["limits"], wantLimits) || r.json["limit"] != float64(3) || r.json["retry_after_ms"] != float64(untilMidnight.Milliseconds()) {
		t.Fatalf("the denial's body %s", r.body)
	}
	// The denial took nothing: the bucket still holds 97.
	if p := call(t, h, "POST", "/v1/peek", `{"namespace": "api", "subject": "acme"}`); !reflect.DeepEqual(p.json["limits"], wantLimits) {
		t.Fatalf("peek %s", p.body)
	}

	// A reserve of [1 request, 500 tokens] takes the tokens from the
	// monthly quota of tokens too; its settle of [1, 120] gives 380 back.
	rv := call(t, h, "POST", "/v1/reserve", `{"namespace": "chat", "subject": "acme", "cost": [1, 500]}`)
	if rv.code != http.StatusOK {
		t.Fatalf("reserve %d %s", rv.code, rv.body)
	}
	if q := rv.json["limits"].([]any)[2].(map[string]any); q["remaining"] != float64(500) || q["counts"] != "tokens" {
		t.Fatalf("reserve: the token quota %v", q)
	}
	st := call(t, h, "POST", "/v1/settle", `{"namespace": "chat", "token": "`+rv.json["token"].(string)+`", "used": [1, 120]}`)
	if st.code != http.StatusOK {
		t.Fatalf("settle %d %s", st.code, st.body)
	}
	if q := st.json["limits"].([]any)[2].(map[string]any); q["remaining"] != float64(880) {
		t.Fatalf("settle: the token quota %v, want 880 left", q)
	}
	c := call(t, h, "GET", "/v1/config", "")
	api := c.json["namespaces"].(map[string]any)["api"].(map[string]any)
	if want := []any{map[string]any{"period": "day", "allowance": float64(3), "time_zone": "Europe/Paris", "counts": "requests"}}; !reflect.DeepEqual(api["quotas"], want) {
		t.Fatalf("GET /v1/config: api is %v", api)
	}
}
