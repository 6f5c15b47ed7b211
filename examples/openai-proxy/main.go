// Command openai-proxy is a small OpenAI-compatible proxy that holds each
// tenant to requests per minute (RPM) and tokens per minute (TPM), as
// OpenAI's API does, with a reservation per request:
//
//  1. The tenant is the API key (the Authorization header, hashed as
//     httplimit.Header hashes it) or, with --tenant-header, that header.
//  2. Before forwarding, it reserves 1 request and an estimate of the
//     tokens: the body's max_tokens (or max_completion_tokens, else
//     --default-max-tokens) plus the prompt's length in bytes / 4, a rough
//     count of the prompt's tokens. Both limits decide as one: a request
//     takes from both or from neither.
//  3. A denied request is answered 429 with Retry-After and OpenAI's
//     x-ratelimit-* headers, and goes nowhere.
//  4. The upstream's answer settles the reservation with its
//     usage.total_tokens: tokens not used go back, an overrun is charged and
//     can push the tenant into debt, denied until it is paid back. An
//     upstream that refuses the request (it cannot be reached, or it answers
//     other than 2xx) did no work: the reservation is cancelled. Once the
//     request has been sent, a failure (the tenant hanging up, the
//     upstream's answer breaking off) settles with the estimate: the
//     upstream may have done the work, and a tenant who hangs up is not
//     refunded.
//
// Run it in front of any server of the chat completions API:
//
//	go run ./examples/openai-proxy --upstream https://api.openai.com --rpm 60 --tpm 90000
//	curl localhost:8081/v1/chat/completions -H "Authorization: Bearer $OPENAI_API_KEY" \
//	  -H 'Content-Type: application/json' \
//	  -d '{"model": "gpt-4o-mini", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}'
//
// The buckets live in this process; --redis redis://host:6379 shares them
// among every proxy pointed at that Redis. Streamed answers (stream: true)
// are not handled: the usage comes in the last event.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
)

// maxBody bounds a request's body and an answer's.
const maxBody = 4 << 20

func main() {
	listen := flag.String("listen", "127.0.0.1:8081", "`address` to listen on")
	upstream := flag.String("upstream", "", "the OpenAI-compatible server to forward to (`URL`)")
	redisURL := flag.String("redis", "", "share the buckets in this Redis (`URL`); default: in this process")
	rpm := flag.Int64("rpm", 60, "requests per minute per tenant")
	tpm := flag.Int64("tpm", 90_000, "tokens per minute per tenant")
	tenant := flag.String("tenant-header", "", "key tenants by this `header` as it is, instead of the hashed Authorization")
	flag.Parse()
	if *upstream == "" {
		log.Fatal("--upstream is required")
	}
	var store ratelimit.Store = memstore.New()
	if *redisURL != "" {
		opts, err := redis.ParseURL(*redisURL)
		if err != nil {
			log.Fatal(err)
		}
		u := redisstore.ClientOptions(&redis.UniversalOptions{Addrs: []string{opts.Addr}, Username: opts.Username, Password: opts.Password, DB: opts.DB})
		store = redisstore.New(redis.NewUniversalClient(u))
	}
	key := httplimit.Header("Authorization")
	if *tenant != "" {
		key = httplimit.RawHeader(*tenant)
	}
	p, err := newProxy(store, *rpm, *tpm, *upstream, key)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s, forwarding to %s, %d requests and %d tokens a minute per tenant", *listen, *upstream, *rpm, *tpm)
	log.Fatal(http.ListenAndServe(*listen, p))
}

// proxy limits and forwards requests.
type proxy struct {
	lim              *ratelimit.Limiter[string]
	upstream         string
	key              httplimit.KeyFunc
	defaultMaxTokens int64
	client           *http.Client
}

// newProxy returns a proxy to upstream holding each tenant (as key names it)
// to rpm requests and tpm tokens a minute.
func newProxy(store ratelimit.Store, rpm, tpm int64, upstream string, key httplimit.KeyFunc, opts ...ratelimit.Option) (*proxy, error) {
	limits := []ratelimit.Limit{ratelimit.PerMinute(rpm), ratelimit.PerMinute(tpm)}
	lim, err := ratelimit.NewMulti[string](store, limits, append(opts, ratelimit.WithNamespace("openai"))...)
	if err != nil {
		return nil, err
	}
	return &proxy{lim: lim, upstream: upstream, key: key, defaultMaxTokens: 1024, client: &http.Client{Timeout: 5 * time.Minute}}, nil
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant, err := p.key(r)
	if err != nil {
		openAIError(w, http.StatusUnauthorized, "invalid_request_error", err.Error())
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		openAIError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", err.Error())
		return
	}
	estimate := p.estimate(body)
	if tpm := p.lim.Limits()[1].Capacity; estimate > tpm {
		about := strconv.FormatInt(estimate, 10)
		if estimate == math.MaxInt64 {
			about = "more than 2^63"
		}
		openAIError(w, http.StatusBadRequest, "invalid_request_error",
			fmt.Sprintf("request too large: max_tokens (or max_completion_tokens) and the prompt come to about %s tokens, the limit is %d a minute", about, tpm))
		return
	}

	ctx := r.Context()
	rv, err := p.lim.Reserve(ctx, tenant, 5*time.Minute, 1, estimate)
	if err != nil {
		openAIError(w, http.StatusServiceUnavailable, "server_error", "rate limiter unavailable")
		return
	}
	if !rv.Decision.Allowed {
		p.headers(ctx, w, tenant)
		w.Header().Set("Retry-After", strconv.FormatInt(int64((rv.Decision.RetryAfter+time.Second-1)/time.Second), 10))
		openAIError(w, http.StatusTooManyRequests, "rate_limit_exceeded",
			fmt.Sprintf("rate limit reached: %d requests and %d tokens a minute; retry in %v", p.lim.Limits()[0].Capacity, p.lim.Limits()[1].Capacity, rv.Decision.RetryAfter.Round(time.Millisecond)))
		return
	}

	status, header, answer, sent, err := p.forward(ctx, r, body)
	if !sent || (status != 0 && status/100 != 2) {
		// The upstream refused the request: it did no work, so the whole
		// reservation goes back.
		if err := rv.Cancel(context.WithoutCancel(ctx)); err != nil {
			log.Printf("cancel: %v", err) // the reservation stays as taken
		}
	} else {
		// The upstream has the request: charge what it reports, or, when
		// its answer did not come whole (the tenant hung up, say), the
		// estimate.
		var usage struct {
			Usage *struct {
				TotalTokens int64 `json:"total_tokens"`
			} `json:"usage"`
		}
		used := estimate
		if err == nil && json.Unmarshal(answer, &usage) == nil && usage.Usage != nil {
			used = usage.Usage.TotalTokens
		}
		if _, err := rv.Settle(context.WithoutCancel(ctx), 1, used); err != nil {
			log.Printf("settle: %v", err) // the reservation stays as taken
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return // the tenant is gone
		}
		openAIError(w, http.StatusBadGateway, "server_error", "upstream: "+err.Error())
		return
	}
	for k, v := range header {
		w.Header()[k] = v
	}
	p.headers(ctx, w, tenant)
	w.WriteHeader(status)
	w.Write(answer)
}

// estimate is the tokens a chat completion may use: max_tokens (or
// max_completion_tokens, else the default) plus the body's bytes / 4, at
// most math.MaxInt64.
func (p *proxy) estimate(body []byte) int64 {
	var req struct {
		MaxTokens           *int64 `json:"max_tokens"`
		MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	}
	json.Unmarshal(body, &req) // a body that is not JSON is the upstream's to refuse
	out := p.defaultMaxTokens
	switch {
	case req.MaxCompletionTokens != nil:
		out = *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		out = *req.MaxTokens
	}
	prompt := int64(len(body))/4 + 1
	if out = max(out, 0); out > math.MaxInt64-prompt {
		return math.MaxInt64
	}
	return out + prompt
}

// forward sends the request to the upstream and reads its answer. sent
// reports whether the request was written to the upstream whole, even when
// err is not nil: from then on the upstream may be doing the work. status is
// the upstream's answer, or 0 when none came.
func (p *proxy) forward(ctx context.Context, r *http.Request, body []byte) (status int, header http.Header, answer []byte, sent bool, err error) {
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) { wrote.Store(info.Err == nil) },
	})
	req, err := http.NewRequestWithContext(ctx, r.Method, p.upstream+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, false, err
	}
	for _, h := range []string{"Authorization", "Content-Type", "OpenAI-Organization", "OpenAI-Project"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, nil, nil, wrote.Load(), err
	}
	defer resp.Body.Close()
	answer, err = io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return resp.StatusCode, nil, nil, true, err
	}
	resp.Header.Del("Content-Length")
	return resp.StatusCode, resp.Header, answer, true, nil
}

// headers sets OpenAI's x-ratelimit-* headers: the tenant's standing now.
func (p *proxy) headers(ctx context.Context, w http.ResponseWriter, tenant string) {
	if err := httplimit.SetOpenAIHeaders(ctx, w.Header(), p.lim, tenant); err != nil && !errors.Is(err, context.Canceled) {
		log.Printf("rate-limit headers: %v", err)
	}
}

// openAIError answers as OpenAI's API answers an error.
func openAIError(w http.ResponseWriter, code int, kind, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": kind, "code": kind}})
}
