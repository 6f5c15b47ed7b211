package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/redisstore"
)

// chatPolicies are a namespace of requests and tokens: 60 requests and 90000
// tokens a minute.
var chatPolicies = config.Policies{
	"default": {Requests: ratelimit.PerSecond(10)},
	"chat":    {Requests: ratelimit.PerMinute(60), Tokens: ratelimit.PerMinute(90000)},
}

// TestReserveSettle walks a reservation through the API: reserve an
// estimate of 1 request and 5000 tokens, settle 1 and 1000 (a refund of
// 4000), settle again (409), and reserve more than is left (429).
func TestReserveSettle(t *testing.T) {
	s, c, _ := newService(t, Options{Policies: chatPolicies})
	h := s.Handler()
	res := call(t, h, "POST", "/v1/reserve", `{"namespace": "chat", "subject": "acme", "cost": [1, 5000], "ttl_ms": 60000}`)
	if res.code != 200 || res.json["allowed"] != true || res.json["ttl_ms"] != 60000.0 {
		t.Fatalf("reserve: %d %s", res.code, res.body)
	}
	tok, _ := res.json["token"].(string)
	if tok == "" || res.json["costs"] == nil {
		t.Fatalf("reserve: no token or costs in %s", res.body)
	}
	want := map[string]string{
		"X-Ratelimit-Limit-Requests":     "60",
		"X-Ratelimit-Limit-Tokens":       "90000",
		"X-Ratelimit-Remaining-Requests": "59",
		"X-Ratelimit-Remaining-Tokens":   "85000",
		"X-Ratelimit-Reset-Requests":     "1s",
		"X-Ratelimit-Reset-Tokens":       "3.334s",
	}
	for k, v := range want {
		if got := res.header.Get(k); got != v {
			t.Errorf("reserve: %s = %q, want %q", k, got, v)
		}
	}
	if res.header.Get("RateLimit") == "" {
		t.Errorf("reserve: no RateLimit field beside OpenAI's: %v", res.header)
	}

	res = call(t, h, "POST", "/v1/settle", `{"namespace": "chat", "token": "`+tok+`", "used": [1, 1000]}`)
	if res.code != 200 || res.json["allowed"] != true || res.json["subject"] != nil || res.header.Get("RateLimit") == "" {
		t.Fatalf("settle: %d %s %v", res.code, res.body, res.header)
	}
	res = call(t, h, "POST", "/v1/peek", `{"namespace": "chat", "subject": "acme"}`)
	if got := res.header.Get("X-Ratelimit-Remaining-Tokens"); got != "89000" {
		t.Errorf("after a settle of 1000 of 5000: %s tokens left, want 89000", got)
	}
	res = call(t, h, "POST", "/v1/settle", `{"namespace": "chat", "token": "`+tok+`", "used": [1, 1000]}`)
	if res.code != 409 || !strings.Contains(res.body, "settled or cancelled already") {
		t.Errorf("second settle: %d %s, want 409", res.code, res.body)
	}

	// Overrun: 88000 left after a reserve of 1000, of which 179000 are
	// used: the tokens go into debt, down to the floor of minus the
	// capacity, and every check is denied until it is paid back.
	res = call(t, h, "POST", "/v1/reserve", `{"namespace": "chat", "subject": "acme", "cost": [1, 1000]}`)
	tok, _ = res.json["token"].(string)
	if res.code != 200 || res.json["ttl_ms"] != float64(DefaultReservationTTL.Milliseconds()) {
		t.Fatalf("reserve: %d %s", res.code, res.body)
	}
	res = call(t, h, "POST", "/v1/settle", `{"namespace": "chat", "token": "`+tok+`", "used": [1, 179000]}`)
	if res.code != 200 || res.json["allowed"] != false || res.header.Get("X-Ratelimit-Remaining-Tokens") != "" {
		t.Fatalf("settle of an overrun: %d %s %v", res.code, res.body, res.header)
	}
	res = call(t, h, "POST", "/v1/reserve", `{"namespace": "chat", "subject": "acme", "cost": [1, 10]}`)
	// 90010 tokens at 1500 a second: 60.0067 s.
	if res.code != 429 || res.header.Get("Retry-After") != "61" || res.json["token"] != nil || res.header.Get("X-Ratelimit-Remaining-Tokens") != "0" {
		t.Fatalf("reserve in debt: %d %s %v", res.code, res.body, res.header)
	}
	c.Add(10 * time.Second) // 15000 tokens refilled: still 75000 in debt
	if res = call(t, h, "POST", "/v1/reserve", `{"namespace": "chat", "subject": "acme", "cost": [1, 10]}`); res.code != 429 {
		t.Fatalf("reserve still in debt: %d %s", res.code, res.body)
	}
}

// TestReserveSingleLimit reserves one cost in a namespace of one limit,
// cancels it with a settle of 0, and checks that OpenAI's headers belong to
// namespaces of requests and tokens only.
func TestReserveSingleLimit(t *testing.T) {
	s, _, _ := newService(t, Options{Policies: chatPolicies})
	h := s.Handler()
	res := call(t, h, "POST", "/v1/reserve", `{"subject": "bob", "cost": 4}`)
	if res.code != 200 || res.json["remaining"] != 6.0 || res.header.Get("X-Ratelimit-Limit-Tokens") != "" {
		t.Fatalf("reserve: %d %s %v", res.code, res.body, res.header)
	}
	res = call(t, h, "POST", "/v1/settle", `{"token": "`+res.json["token"].(string)+`", "used": 0}`)
	if res.code != 200 || res.json["remaining"] != 10.0 {
		t.Fatalf("cancel: %d %s", res.code, res.body)
	}
}

func TestReserveSettleBadInput(t *testing.T) {
	s, _, _ := newService(t, Options{Policies: chatPolicies})
	h := s.Handler()
	res := call(t, h, "POST", "/v1/reserve", `{"namespace": "chat", "subject": "acme", "cost": [1, 5]}`)
	tok := res.json["token"].(string)
	for _, tc := range []struct {
		path, body string
		code       int
		want       string
	}{
		{"/v1/reserve", `{"namespace": "chat", "cost": 1}`, 400, "subject is required"},
		{"/v1/reserve", `{"namespace": "chat", "subject": "a", "cost": [1, 100000]}`, 400, "capacity"},
		{"/v1/reserve", `{"namespace": "chat", "subject": "a", "cost": [1, 2, 3]}`, 400, "one cost per limit"},
		{"/v1/reserve", `{"namespace": "chat", "subject": "a", "cost": "5"}`, 400, "a count must be a whole number"},
		{"/v1/reserve", `{"namespace": "chat", "subject": "a", "cost": 0}`, 400, "at least 1"},
		{"/v1/reserve", `{"namespace": "chat", "subject": "a", "ttl_ms": 0}`, 400, "ttl_ms must be between 1 and 3600000"},
		{"/v1/reserve", `{"namespace": "chat", "subject": "a", "ttl_ms": 3600001}`, 400, "ttl_ms must be between"},
		{"/v1/reserve", `{"namespace": "nope", "subject": "a"}`, 404, "unknown namespace"},
		{"/v1/reserve", `{"namespace": "chat", "subject": "a", "ttl": 5}`, 400, "the fields are namespace, subject, cost, ttl_ms and plan"},
		{"/v1/settle", `{"namespace": "chat", "used": 1}`, 400, "token is required"},
		{"/v1/settle", `{"namespace": "chat", "token": "` + tok + `"}`, 400, "used is required"},
		{"/v1/settle", `{"namespace": "chat", "token": "nonsense", "used": 1}`, 400, "not a reservation token"},
		{"/v1/settle", `{"namespace": "chat", "token": "` + strings.Repeat("x", MaxTokenBytes+1) + `", "used": 1}`, 400, "longer than"},
		{"/v1/settle", `{"namespace": "chat", "token": "` + tok + `", "used": -1}`, 400, "between 0 and 2^53"},
		{"/v1/settle", `{"namespace": "chat", "token": "` + tok + `", "used": [1, 2, 3]}`, 400, "one count, or one per limit"},
		{"/v1/settle", `{"namespace": "chat", "token": "` + tok + `", "used": null}`, 400, "null is not a count"},
		{"/v1/settle", `{"namespace": "chat", "token": "` + tok + `", "used": [null, null]}`, 400, "null is not a count"},
		{"/v1/settle", `{"namespace": "chat", "token": "` + tok + `", "used": [1, null]}`, 400, "null is not a count"},
		{"/v1/reserve", `{"namespace": "chat", "subject": "a", "cost": null}`, 400, "null is not a count"},
		{"/v1/settle", `{"token": "` + tok + `", "used": 1}`, 409, "no such reservation in namespace"},
		{"/v1/settle", `{}`, 400, "token is required"},
		{"/v1/settle", ``, 400, "empty body; send a JSON object of namespace, token and used"},
	} {
		res := call(t, h, "POST", tc.path, tc.body)
		if res.code != tc.code || !strings.Contains(res.body, tc.want) {
			t.Errorf("%s %s: %d %s, want %d with %q", tc.path, tc.body, res.code, res.body, tc.code, tc.want)
		}
	}
	// The bad input spent nothing: the reservation still settles.
	if res := call(t, h, "POST", "/v1/settle", `{"namespace": "chat", "token": "`+tok+`", "used": [1, 5]}`); res.code != 200 {
		t.Errorf("settle after the bad input: %d %s", res.code, res.body)
	}
	// The token checks of the rest of the API.
	s.SetToken("secret")
	for _, p := range []string{"/v1/reserve", "/v1/settle"} {
		if res := call(t, h, "POST", p, `{}`); res.code != 401 {
			t.Errorf("%s without the token: %d", p, res.code)
		}
		if res := call(t, h, "GET", p, ``, "Authorization", "Bearer secret"); res.code != 405 {
			t.Errorf("GET %s: %d", p, res.code)
		}
	}
	if res := call(t, h, "POST", "/v1/reserve", `{"subject": "x"}`, "Authorization", "Bearer secret"); res.code != 200 {
		t.Errorf("reserve with the token: %d %s", res.code, res.body)
	}
}

// TestSettleDuringAHungRedis: a settle sent while Redis is hung is 503 when
// the timeout passes, but Redis still runs it when it resumes, so the answer
// must not say it changed nothing: it may have been applied, and the retry's
// 409 says it was.
func TestSettleDuringAHungRedis(t *testing.T) {
	srv := redistest.StartServer(t)
	client := redistest.Client(t, srv.Addr())
	s, _, _ := newService(t, Options{Store: redisstore.New(client), Policies: chatPolicies, Timeout: 300 * time.Millisecond})
	h := s.Handler()
	res := call(t, h, "POST", "/v1/reserve", `{"namespace": "chat", "subject": "acme", "cost": [1, 5000]}`)
	tok, _ := res.json["token"].(string)
	if res.code != 200 || tok == "" {
		t.Fatalf("reserve: %d %s", res.code, res.body)
	}
	settle := `{"namespace": "chat", "token": "` + tok + `", "used": [1, 1000]}`

	srv.Stop()
	res = call(t, h, "POST", "/v1/settle", settle)
	srv.Cont()
	if res.code != 503 || res.header.Get("Retry-After") != "1" {
		t.Fatalf("settle while Redis is hung: %d %s, want 503", res.code, res.body)
	}
	msg, _ := res.json["error"].(string)
	if !strings.Contains(msg, "may have been applied") || strings.Contains(msg, "changes nothing") {
		t.Errorf("settle while Redis is hung: %q, want it to say the settle may have been applied", msg)
	}
	// Redis ran the settle it had read once it resumed, before it answers
	// this ping on another connection.
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	res = call(t, h, "POST", "/v1/settle", settle)
	if res.code != 409 {
		t.Fatalf("the retry: %d %s, want 409: the settle was applied", res.code, res.body)
	}
	res = call(t, h, "POST", "/v1/peek", `{"namespace": "chat", "subject": "acme"}`)
	if got := res.header.Get("X-Ratelimit-Remaining-Tokens"); got != "89000" {
		t.Errorf("after the settle of 1000 of 5000: %s tokens left, want 89000", got)
	}
}
