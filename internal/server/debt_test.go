package server

import (
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/config"
)

// TestCancelInDebtKeepsTheDebt drives through the API the over-admission a
// refund of a whole capacity once made: on 10 a minute, reserve 10 (A),
// after a token refills reserve 1 (B), settle B with 11 used (10 in debt),
// cancel A (settle with 0 used). A's 10 go back onto the debt: the subject
// holds 0 tokens and is denied, where it was once given a full bucket.
func TestCancelInDebtKeepsTheDebt(t *testing.T) {
	s, c, _ := newService(t, Options{Policies: config.Policies{
		"default": {Requests: ratelimit.PerSecond(10)},
		"api":     {Requests: ratelimit.PerMinute(10)},
	}})
	h := s.Handler()
	reserve := func(cost string) string {
		t.Helper()
		res := call(t, h, "POST", "/v1/reserve", `{"namespace": "api", "subject": "acme", "cost": `+cost+`}`)
		tok, _ := res.json["token"].(string)
		if res.code != 200 || tok == "" {
			t.Fatalf("reserve %s: %d %s", cost, res.code, res.body)
		}
		return tok
	}
	a := reserve("10")
	c.Add(6 * time.Second)
	b := reserve("1")
	if res := call(t, h, "POST", "/v1/settle", `{"namespace": "api", "token": "`+b+`", "used": 11}`); res.code != 200 || res.json["allowed"] != false {
		t.Fatalf("settle B with 11 used: %d %s", res.code, res.body)
	}
	if res := call(t, h, "POST", "/v1/settle", `{"namespace": "api", "token": "`+a+`", "used": 0}`); res.code != 200 || res.json["allowed"] != false {
		t.Fatalf("cancel A: %d %s; want 200, not allowed (0 tokens)", res.code, res.body)
	}
	res := call(t, h, "POST", "/v1/acquire", `{"namespace": "api", "subject": "acme"}`)
	if res.code != 429 || res.header.Get("Retry-After") != "6" {
		t.Fatalf("a check after A's cancel: %d %s %v; want 429, Retry-After 6", res.code, res.body, res.header)
	}
}
