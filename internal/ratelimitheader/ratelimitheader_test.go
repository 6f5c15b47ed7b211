package ratelimitheader

import (
	"net/http"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
)

var t0 = time.Unix(1_700_000_000, 0)

// TestOf holds the fields of a decision to what the middleware, the
// interceptors, the service and Envoy's service send.
func TestOf(t *testing.T) {
	requests := ratelimit.PerMinute(60)
	tokens := ratelimit.Limit{Capacity: 90000, RefillTokens: 90000, RefillPeriod: time.Minute}
	for _, tc := range []struct {
		name   string
		policy string
		limits []ratelimit.Limit
		d      ratelimit.Decision
		want   map[string]string
	}{
		{"one limit", "api", []ratelimit.Limit{ratelimit.PerSecond(10)},
			ratelimit.Decision{Allowed: true, Remaining: 9, ResetAfter: 100 * time.Millisecond, Limit: ratelimit.PerSecond(10)},
			map[string]string{
				"RateLimit-Policy": `"api";q=10;w=1`, "RateLimit": `"api";r=9;t=1`,
				"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "9", "X-RateLimit-Reset": "1700000001",
			}},
		{"two limits, the tokens bound: t is the tokens' own", "chat", []ratelimit.Limit{requests, tokens},
			ratelimit.Decision{Remaining: 4096, ResetAfter: time.Minute, RetryAfter: time.Second, Limit: tokens},
			map[string]string{
				"RateLimit-Policy": `"chat-1";q=60;w=60, "chat-2";q=90000;w=60`, "RateLimit": `"chat-2";r=4096;t=58`,
				"X-RateLimit-Limit": "90000", "X-RateLimit-Remaining": "4096", "X-RateLimit-Reset": "1700000058",
			}},
		{"a fallback's share: its capacity, the policy's name", "api", []ratelimit.Limit{ratelimit.PerSecond(8)},
			ratelimit.Decision{Allowed: true, Remaining: 1, ResetAfter: 250 * time.Millisecond, Limit: ratelimit.PerSecond(2)},
			map[string]string{
				"RateLimit-Policy": `"api";q=8;w=1`, "RateLimit": `"api";r=1;t=1`, "X-RateLimit-Limit": "2",
			}},
		{"no limits: the decision's", `a"b\c` + "\x7f", nil,
			ratelimit.Decision{Remaining: -3, ResetAfter: 2 * time.Second, Limit: ratelimit.PerMinute(5)},
			map[string]string{
				"RateLimit-Policy": `"a\"b\\c?";q=5;w=60`, "RateLimit": `"a\"b\\c?";r=0;t=2`, "X-RateLimit-Remaining": "0",
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, ok := Of(tc.policy, tc.limits, tc.d)
			if !ok {
				t.Fatal("no fields")
			}
			h := http.Header{}
			f.Set(h, t0)
			if len(h) != 5 {
				t.Errorf("%d fields, want 5: %v", len(h), h)
			}
			for k, v := range tc.want {
				if got := h.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
		})
	}
	if _, ok := Of("api", nil, ratelimit.Decision{Allowed: true, Source: ratelimit.SourceFailOpen}); ok {
		t.Error("fields for a decision without a limit")
	}
}

func TestRetryAfter(t *testing.T) {
	for d, want := range map[time.Duration]int64{-time.Second: 1, 0: 1, time.Nanosecond: 1, time.Second: 1, time.Second + 1: 2, 437 * time.Millisecond: 1} {
		if got := RetryAfter(d); got != want {
			t.Errorf("RetryAfter(%v) = %d, want %d", d, got, want)
		}
	}
}

func TestSetOpenAI(t *testing.T) {
	h := http.Header{}
	SetOpenAI(h, Standing{Limit: 60, Remaining: 59, ResetAfter: time.Second}, Standing{Limit: 90000, Remaining: -5, ResetAfter: 15 * time.Second})
	for k, v := range map[string]string{
		"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59", "x-ratelimit-reset-requests": "1s",
		"x-ratelimit-limit-tokens": "90000", "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "15s",
	} {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	for d, want := range map[time.Duration]string{0: "0s", time.Microsecond: "1ms", 12 * time.Millisecond: "12ms", 6 * time.Minute: "6m0s", 17*time.Second + 280*time.Millisecond + 1: "17.281s"} {
		if got := openAIDuration(d); got != want {
			t.Errorf("openAIDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestHeadersOfTheLargestPoliciesDoNotOverflow(t *testing.T) {
	// Valid in lowest terms (1 token per µs), 2^106 µs as given.
	l := ratelimit.Limit{Capacity: 1 << 53, RefillTokens: 1 << 53, RefillPeriod: (1 << 53) * time.Microsecond}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := window(l); got != (1<<53+999_999)/1_000_000 {
		t.Fatalf("window = %d s, want 2^53 µs in seconds", got)
	}
	if got := fullAfter(l, 0); got != (1<<53)*time.Microsecond {
		t.Fatalf("fullAfter = %v", got)
	}
}
