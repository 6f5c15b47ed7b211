package main

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
)

// fakeUpstream speaks the chat completions API: it answers with usage
// total_tokens of *used, or 500 while *fail is set. While *hang is set it
// starts an answer, sends the request's body to reached, and finishes it only
// once the request is cancelled, as a long completion would.
func fakeUpstream(t *testing.T, used *atomic.Int64, fail, hang *atomic.Bool, reached chan<- string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" || r.Header.Get("Authorization") == "" {
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		if fail.Load() {
			http.Error(w, `{"error": {"message": "overloaded"}}`, http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if hang.Load() {
			body, _ := io.ReadAll(r.Body)
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, `{"id": "chatcmpl-1", "object": "chat.completion", "choices": [`)
			w.(http.Flusher).Flush()
			reached <- string(body)
			<-r.Context().Done()
			return
		}
		json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-1", "object": "chat.completion", "model": "fake",
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}},
			"usage":   map[string]any{"prompt_tokens": 10, "completion_tokens": used.Load() - 10, "total_tokens": used.Load()},
		})
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestProxyMemory(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	proxyEndToEnd(t, memstore.New(memstore.WithClock(clock)), clock)
}

func TestProxyRedis(t *testing.T) {
	srv := redistest.StartServer(t)
	client := redistest.NewClient(srv.Addr())
	t.Cleanup(func() { client.Close() })
	// A frozen clock on Redis is safe here: the test ends long before
	// any bucket's expiry.
	now := time.Unix(1_800_000_000, 0)
	proxyEndToEnd(t, redisstore.New(client), func() time.Time { return now })
}

// proxyEndToEnd drives the proxy over HTTP, at a frozen instant, against
// the fake upstream: 3 requests and 3000 tokens a minute.
func proxyEndToEnd(t *testing.T, store ratelimit.Store, clock func() time.Time) {
	var used atomic.Int64
	var fail, hang atomic.Bool
	reached := make(chan string, 1)
	up := fakeUpstream(t, &used, &fail, &hang, reached)
	p, err := newProxy(store, 3, 3000, up.URL, httplimit.Header("Authorization"), ratelimit.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{}, 1)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.ServeHTTP(w, r)
		served <- struct{}{}
	}))
	t.Cleanup(front.Close)
	ask := func(key string, maxTokens int) *http.Response {
		t.Helper()
		body := chat(maxTokens)
		req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		<-served
		return resp
	}
	check := func(what string, resp *http.Response, code int, requests, tokens string) {
		t.Helper()
		if resp.StatusCode != code || resp.Header.Get("X-Ratelimit-Remaining-Requests") != requests || resp.Header.Get("X-Ratelimit-Remaining-Tokens") != tokens {
			t.Errorf("%s: %d, %s requests and %s tokens left; want %d, %s and %s", what, resp.StatusCode,
				resp.Header.Get("X-Ratelimit-Remaining-Requests"), resp.Header.Get("X-Ratelimit-Remaining-Tokens"), code, requests, tokens)
		}
	}

	// A settle that refunds: 1000 reserved, 100 used.
	used.Store(100)
	resp := ask("k1", 1000)
	check("a request of 100 tokens", resp, 200, "2", "2900")
	if resp.Header.Get("X-Ratelimit-Limit-Tokens") != "3000" || resp.Header.Get("X-Ratelimit-Reset-Tokens") != "2s" {
		t.Errorf("headers: %v", resp.Header)
	}

	// An upstream error: the reservation is cancelled, the request given
	// back too.
	fail.Store(true)
	check("an upstream error", ask("k1", 1000), 500, "2", "2900")
	fail.Store(false)

	// An overrun: 10 reserved, 5000 used: 2900 - 5000, into debt.
	used.Store(5000)
	check("an overrun", ask("k1", 10), 200, "1", "0")
	resp = ask("k1", 10)
	check("in debt", resp, 429, "1", "0")
	// 2100 in debt and the estimate wanted, at 50 a second.
	est := p.estimate([]byte(chat(10)))
	if want := strconv.FormatInt((2100+est+49)/50, 10); resp.Header.Get("Retry-After") != want {
		t.Errorf("in debt: Retry-After %q, want %s", resp.Header.Get("Retry-After"), want)
	}

	// Another tenant has its own buckets; the requests limit denies the
	// fourth request whatever its tokens.
	used.Store(20)
	for i := range 3 {
		check("tenant k2", ask("k2", 10), 200, itoa(2-i), itoa(3000-20*(i+1)))
	}
	check("tenant k2's fourth request", ask("k2", 10), 429, "0", "2940")

	// A client that hangs up once the upstream is at work is charged the
	// estimate, not refunded: the upstream did the work, or some of it.
	hang.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", front.URL+"/v1/chat/completions", strings.NewReader(chat(500)))
	req.Header.Set("Authorization", "Bearer k3")
	req.Header.Set("Content-Type", "application/json")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	body := <-reached
	cancel()
	if err := <-errc; err == nil {
		t.Error("the cancelled request got an answer")
	}
	<-served
	hang.Store(false)
	tenant, _ := p.key(req)
	left := http.Header{}
	if err := httplimit.SetOpenAIHeaders(context.Background(), left, p.lim, tenant); err != nil {
		t.Fatal(err)
	}
	requests, tokens := left.Get("X-Ratelimit-Remaining-Requests"), left.Get("X-Ratelimit-Remaining-Tokens")
	if want := strconv.FormatInt(3000-p.estimate([]byte(body)), 10); requests != "2" || tokens != want {
		t.Errorf("a client that hung up: %s requests and %s tokens left, want 2 and %s: charged the estimate", requests, tokens, want)
	}
}

// chat is the body of a chat completion of at most maxTokens.
func chat(maxTokens int) string {
	return `{"model": "fake", "max_tokens": ` + itoa(maxTokens) + `, "messages": [{"role": "user", "content": "Hi"}]}`
}

var itoa = strconv.Itoa

func TestEstimate(t *testing.T) {
	p := &proxy{defaultMaxTokens: 1024}
	for body, want := range map[string]int64{
		`{"max_tokens": 100}`:                              100 + 19/4 + 1,
		`{"max_completion_tokens": 50, "max_tokens": 100}`: 50 + 48/4 + 1,
		`{"messages": []}`:                                 1024 + 16/4 + 1,
		`not json`:                                         1024 + 8/4 + 1,
		`{"max_tokens": -5, "messages": [{"content": "xy"}]}`: 0 + 51/4 + 1,
		`{"max_tokens": 9223372036854775807}`:                 math.MaxInt64,
		`{"max_completion_tokens": 9223372036854775800}`:      math.MaxInt64,
	} {
		if got := p.estimate([]byte(body)); got != want {
			t.Errorf("estimate(%s) = %d, want %d", body, got, want)
		}
	}
}

// TestProxyRefusesAHugeMaxTokens: a max_tokens near 2^63 is a request too
// large (400), not an estimate that wraps around to a negative cost (503).
func TestProxyRefusesAHugeMaxTokens(t *testing.T) {
	var used atomic.Int64
	var fail, hang atomic.Bool
	up := fakeUpstream(t, &used, &fail, &hang, nil)
	p, err := newProxy(memstore.New(), 3, 3000, up.URL, httplimit.Header("Authorization"))
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	for _, maxTokens := range []string{"9223372036854775807", "9223372036854775000", "3001"} {
		body := `{"model": "fake", "max_tokens": ` + maxTokens + `, "messages": [{"role": "user", "content": "Hi"}]}`
		req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer k1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(answer), "request too large") || !strings.Contains(string(answer), "max_tokens") {
			t.Errorf("max_tokens %s: %d %s, want 400 naming max_tokens", maxTokens, resp.StatusCode, answer)
		}
	}
}
