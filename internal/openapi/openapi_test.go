package openapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/docs"
	"github.com/exactlimit/ratelimit/fallback"
	internalconfig "github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/openapi"
	"github.com/exactlimit/ratelimit/internal/operator"
	"github.com/exactlimit/ratelimit/internal/server"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// policies are the namespaces of the services under test: a default of 3
// an hour per subject, so that the fourth acquire is a 429 however slow the
// machine, and a namespace of requests and tokens, for OpenAI's headers and
// reservations of one cost per limit; and api, a namespace of plans, free
// and pro (testkit.Plans), by assignment, and gw, which takes the
// request's plan.
const policies = testkit.Plans + `
namespaces:
  - name: api
    plans: [free, pro]
    default_plan: free
  - name: gw
    plans: [free, pro]
    default_plan: free
    trust_plan: true
  - name: default
    rate_limit: {unit: hour, requests_per_unit: 3}
  - name: chat
    rate_limit: {unit: minute, requests_per_unit: 60}
    token_limit: {unit: minute, tokens_per_unit: 9000}
`

// newValidator returns a validator of doc, an OpenAPI document, in strict
// mode: a response header or a body field the document does not declare is
// an error, as is a status it does not list. The document itself must be a
// valid OpenAPI 3.1 document.
func newValidator(t *testing.T, doc []byte) validator.Validator {
	t.Helper()
	d, err := libopenapi.NewDocument(doc)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(d, config.WithStrictMode(), config.WithFormatAssertions())
	if len(errs) > 0 {
		t.Fatalf("the document does not build: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		t.Fatalf("the document is not a valid OpenAPI document:\n%s", describe(verrs))
	}
	return v
}

func describe[E error](errs []E) string {
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "  %v\n", e)
	}
	return b.String()
}

// flakyStore is a memstore whose primary can be made to fail: with every
// call an error (as a Redis that does not answer, under --outage
// return-error), or with a fail-closed denial (as package fallback
// answers under --outage fail-closed).
type flakyStore struct {
	*memstore.Store
	mode atomic.Int32 // up, failing or failClosed
}

const (
	up = iota
	failing
	failClosed
)

var errDown = errors.New("dial tcp 127.0.0.1:1: connect: connection refused")

func (s *flakyStore) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	switch s.mode.Load() {
	case failing:
		return ratelimit.Decision{}, errDown
	case failClosed:
		return ratelimit.Decision{Source: ratelimit.SourceFailClosed}, nil
	}
	return s.Store.Apply(ctx, key, r)
}

func (s *flakyStore) Reset(ctx context.Context, key string) error {
	if s.mode.Load() != up {
		return errDown
	}
	return s.Store.Reset(ctx, key)
}

func (s *flakyStore) Reserve(ctx context.Context, key, id string, r ratelimit.Request, ttl time.Duration) (ratelimit.Decision, error) {
	switch s.mode.Load() {
	case failing:
		return ratelimit.Decision{}, errDown
	case failClosed:
		return ratelimit.Decision{Source: ratelimit.SourceFailClosed}, nil
	}
	return s.Store.Reserve(ctx, key, id, r, ttl)
}

func (s *flakyStore) Settle(ctx context.Context, key, id string, r ratelimit.Request, actual []int64) (ratelimit.Decision, error) {
	if s.mode.Load() != up {
		return ratelimit.Decision{}, errDown
	}
	return s.Store.Settle(ctx, key, id, r, actual)
}

func (s *flakyStore) Assign(ctx context.Context, namespace, subject, value string) (string, error) {
	if s.mode.Load() != up {
		return "", errDown
	}
	return s.Store.Assign(ctx, namespace, subject, value)
}

func (s *flakyStore) AssignmentsSince(ctx context.Context, namespace, cursor string) (map[string]string, string, bool, error) {
	if s.mode.Load() != up {
		return nil, "", false, errDown
	}
	return s.Store.AssignmentsSince(ctx, namespace, cursor)
}

func (s *flakyStore) ping(context.Context) error {
	if s.mode.Load() != up {
		return errDown
	}
	return nil
}

// start runs a Service of o with the policies above on a real loopback
// listener, and returns its base URL. With host, it answers only its own
// address while it has no token (Service.AllowHosts).
func start(t *testing.T, o server.Options, host bool) string {
	t.Helper()
	p, err := internalconfig.Parse([]byte(policies))
	if err != nil {
		t.Fatal(err)
	}
	o.Policies = p
	if o.Store == nil {
		o.Store = memstore.New()
	}
	o.Version = "test"
	s, err := server.New(o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	if host {
		if err := s.AllowHosts(srv.Listener.Addr(), nil); err != nil {
			t.Fatal(err)
		}
	}
	return srv.URL
}

// exchange is one request to a running service and what the document must
// say of it.
type exchange struct {
	method, path, body string
	// hdr are header names and values; Content-Type is application/json
	// on a POST unless hdr sets it.
	hdr []string
	// host, when set, is the Host header sent.
	host string
	// status is the status the service must answer.
	status int
	// badRequest says the document must refuse the request: its schema
	// (or its lack of the method) says what the service refuses. A
	// request the service refuses for a reason no schema can hold (a
	// cost above the namespace's capacity, a token that is not one) is
	// one the document accepts.
	badRequest bool
	// documented is the method the document describes the answer under,
	// for a method the endpoint does not take: its 405 is documented on
	// the endpoint's own operations.
	documented string
}

// answer is the response of an exchange, its body read.
type answer struct {
	status int
	header http.Header
	body   []byte
	json   map[string]any
}

// checker holds exchanges to a document, and remembers which of the
// document's answers it has seen.
type checker struct {
	v    validator.Validator
	seen map[string]bool // "METHOD path status", as the document has them
}

func newChecker(t *testing.T, doc []byte) *checker {
	return &checker{v: newValidator(t, doc), seen: map[string]bool{}}
}

// do sends x to the service at base over a real connection, and checks
// the request against the document as x says, and the response in every
// case: its status, its headers and its body. It returns the response.
func (c *checker) do(t *testing.T, base string, x exchange) answer {
	t.Helper()
	a, problems := send(t, c.v, base, x)
	for _, p := range problems {
		t.Error(p)
	}
	method := x.method
	if x.documented != "" {
		method = x.documented
	}
	c.seen[fmt.Sprintf("%s %s %d", method, x.path, a.status)] = true
	return a
}

// unseen returns the answers doc documents that c has not seen.
func (c *checker) unseen(t *testing.T, doc []byte) []string {
	t.Helper()
	var d struct {
		Paths map[string]map[string]struct {
			Responses map[string]any `json:"responses"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	for path, ops := range d.Paths {
		for method, op := range ops {
			for status := range op.Responses {
				if k := strings.ToUpper(method) + " " + path + " " + status; !c.seen[k] {
					out = append(out, k)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// send sends x as checker.do does, and returns the response and what the document
// gets wrong about the exchange.
func send(t *testing.T, v validator.Validator, base string, x exchange) (answer, []string) {
	t.Helper()
	name := x.method + " " + x.path
	req, err := http.NewRequest(x.method, base+x.path, strings.NewReader(x.body))
	if err != nil {
		t.Fatal(err)
	}
	if x.method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(x.hdr); i += 2 {
		req.Header.Set(x.hdr[i], x.hdr[i+1])
	}
	if x.host != "" {
		req.Host = x.host
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.StatusCode != x.status {
		t.Fatalf("%s %.200s: %d %s, want %d", name, x.body, res.StatusCode, body, x.status)
	}
	var problems []string

	// The validator reads the bodies: give it copies.
	vreq := req.Clone(context.Background())
	vreq.Body = io.NopCloser(strings.NewReader(x.body))
	ok, errs := v.ValidateHttpRequestSync(vreq)
	switch {
	case x.badRequest && ok:
		problems = append(problems, fmt.Sprintf("%s %.200s: the document accepts a request the service refuses with %d", name, x.body, x.status))
	case !x.badRequest && !ok:
		problems = append(problems, fmt.Sprintf("%s %.200s: the document refuses the request:\n%s", name, x.body, describe(errs)))
	}

	vreq = req.Clone(context.Background())
	if x.documented != "" {
		vreq.Method = x.documented
	}
	vres := *res
	vres.Body = io.NopCloser(bytes.NewReader(body))
	vres.Request = vreq
	if ok, errs := v.ValidateHttpResponse(vreq, &vres); !ok {
		problems = append(problems, fmt.Sprintf("%s %.200s: the document does not describe the answer %d %v %.300s:\n%s", name, x.body, res.StatusCode, res.Header, body, describe(errs)))
	}

	a := answer{status: res.StatusCode, header: res.Header, body: body}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") && len(body) > 0 {
		if err := json.Unmarshal(body, &a.json); err != nil {
			t.Fatalf("%s: %v: %s", name, err, body)
		}
	}
	return a, problems
}

func post(path, body string, status int) exchange {
	return exchange{method: http.MethodPost, path: path, body: body, status: status}
}

func get(path string, status int) exchange {
	return exchange{method: http.MethodGet, path: path, status: status}
}

func head(path string, status int) exchange {
	return exchange{method: http.MethodHead, path: path, status: status}
}

func bad(x exchange) exchange { x.badRequest = true; return x }

// TestDocumentIsTheServedOne: GET /openapi.json serves docs/openapi.json as
// it is in the repository, to anyone, and it is a valid OpenAPI 3.1
// document.
func TestDocumentIsTheServedOne(t *testing.T) {
	file, err := os.ReadFile("../../docs/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	c := newChecker(t, file)
	var doc struct {
		OpenAPI string `json:"openapi"`
	}
	if err := json.Unmarshal(file, &doc); err != nil || !strings.HasPrefix(doc.OpenAPI, "3.1.") {
		t.Fatalf("openapi = %q (%v), want 3.1.x", doc.OpenAPI, err)
	}
	// With a token set: the document needs none.
	base := start(t, server.Options{Token: "secret"}, false)
	a := c.do(t, base, get(openapi.Path, 200))
	if !bytes.Equal(a.body, file) || a.header.Get("Content-Type") != "application/json" {
		t.Errorf("GET %s: %s, %d bytes; want docs/openapi.json's %d", openapi.Path, a.header.Get("Content-Type"), len(a.body), len(file))
	}
}

// TestAPIAnswersAsDocumented drives every endpoint of running services
// through each status it can be brought to answer, and holds each request
// and each answer to docs/openapi.json: an answer the document does not
// describe (a status, a header, a field) fails the test, and so does an
// answer the document lists that no exchange provoked.
func TestAPIAnswersAsDocumented(t *testing.T) {
	c := newChecker(t, []byte(docs.OpenAPI))

	t.Run("an open service", func(t *testing.T) {
		// An Envoy domain (--grpc-listen) adds its figures to /v1/stats.
		envoy := func() []operator.EnvoyDomain {
			return []operator.EnvoyDomain{{Name: "envoy:api", Domain: "api", Rules: 2}}
		}
		base := start(t, server.Options{StoreName: "memory", StoreKind: operator.StoreEmbedded, Envoy: envoy}, true)
		for i := range 3 {
			a := c.do(t, base, post("/v1/acquire", `{"subject": "alice"}`, 200))
			if a.json["remaining"] != float64(2-i) || a.header.Get("RateLimit") == "" {
				t.Fatalf("acquire %d: %s %v", i, a.body, a.header)
			}
		}
		a := c.do(t, base, post("/v1/acquire", `{"namespace": "default", "subject": "alice", "cost": 1}`, 429))
		if a.header.Get("Retry-After") == "" || a.json["allowed"] != false {
			t.Errorf("the 429: %s %v", a.body, a.header)
		}
		c.do(t, base, post("/v1/reserve", `{"subject": "alice"}`, 429))
		c.do(t, base, post("/v1/peek", `{"subject": "alice"}`, 200))
		c.do(t, base, post("/v1/reset", `{"subject": "alice"}`, 200))

		a = c.do(t, base, post("/v1/acquire", `{"namespace": "chat", "subject": "acme", "cost": 2}`, 200))
		if a.header.Get("X-Ratelimit-Remaining-Tokens") == "" {
			t.Errorf("no OpenAI headers in a namespace of tokens: %v", a.header)
		}
		c.do(t, base, post("/v1/peek", `{"namespace": "chat", "subject": "acme"}`, 200))

		a = c.do(t, base, post("/v1/reserve", `{"namespace": "chat", "subject": "acme", "cost": [1, 500], "ttl_ms": 60000}`, 200))
		token, _ := a.json["token"].(string)
		if token == "" {
			t.Fatalf("reserve: no token in %s", a.body)
		}
		settle := fmt.Sprintf(`{"namespace": "chat", "token": %q, "used": [1, 120]}`, token)
		c.do(t, base, post("/v1/settle", settle, 200))
		c.do(t, base, post("/v1/settle", settle, 409))
		a = c.do(t, base, post("/v1/reserve", `{"subject": "bob", "cost": 2}`, 200))
		c.do(t, base, post("/v1/settle", fmt.Sprintf(`{"token": %q, "used": 0}`, a.json["token"]), 200))
		// The tokens refill at 150 a second: the second whole bucket is a
		// minute away, however slow the machine.
		c.do(t, base, post("/v1/reserve", `{"namespace": "chat", "subject": "carol", "cost": [1, 9000]}`, 200))
		c.do(t, base, post("/v1/reserve", `{"namespace": "chat", "subject": "carol", "cost": [1, 9000]}`, 429))

		// Plans: a subject on free, assigned pro, reads its usage under
		// pro; a namespace that trusts the request's plan takes it.
		a = c.do(t, base, post("/v1/acquire", `{"namespace": "api", "subject": "acme"}`, 200))
		if a.json["plan"] != "free" {
			t.Errorf("acquire in api: %s", a.body)
		}
		a = c.do(t, base, post("/v1/assign", `{"namespace": "api", "subject": "acme", "plan": "pro"}`, 200))
		if a.json["plan"] != "pro" || a.json["previous"] != "" {
			t.Errorf("assign: %s", a.body)
		}
		a = c.do(t, base, post("/v1/usage", `{"namespace": "api", "subject": "acme"}`, 200))
		if a.json["plan"] != "pro" || len(a.json["limits"].([]any)) != 2 {
			t.Errorf("usage: %s", a.body)
		}
		c.do(t, base, post("/v1/usage", `{"subject": "acme"}`, 200))
		c.do(t, base, post("/v1/peek", `{"namespace": "api", "subject": "acme"}`, 200))
		c.do(t, base, post("/v1/acquire", `{"namespace": "gw", "subject": "acme", "plan": "pro", "cost": 2}`, 200))
		a = c.do(t, base, post("/v1/reserve", `{"namespace": "gw", "subject": "acme", "plan": "pro", "cost": [1, 1]}`, 200))
		c.do(t, base, post("/v1/settle", fmt.Sprintf(`{"namespace": "gw", "token": %q, "used": 1}`, a.json["token"]), 200))
		c.do(t, base, post("/v1/assign", `{"namespace": "api", "subject": "acme", "plan": ""}`, 200))

		a = c.do(t, base, get("/v1/stats", 200))
		if ns, _ := a.json["namespaces"].([]any); len(ns) != 5 || !strings.Contains(string(a.body), `"envoy":{"domain":"api","rules":2}`) {
			t.Errorf("/v1/stats without the Envoy domain: %s", a.body)
		}
		for _, x := range []exchange{
			get("/v1/config", 200), head("/v1/config", 200),
			head("/v1/stats", 200),
			get("/healthz", 200), head("/healthz", 200),
			get("/readyz", 200), head("/readyz", 200),
			get("/metrics", 200), head("/metrics", 200),
			get(openapi.Path, 200), head(openapi.Path, 200),

			// 400: bad input the document's schemas refuse too...
			bad(post("/v1/acquire", `{"subject": "a", "cost": 0}`, 400)),
			bad(post("/v1/acquire", `{"namespace": "default"}`, 400)),
			bad(post("/v1/peek", `{"subject": ""}`, 400)),
			bad(post("/v1/acquire", `{"subject": "`+strings.Repeat("s", server.MaxSubjectBytes+1)+`"}`, 400)),
			bad(post("/v1/acquire", `{"subject": "a", "Cost": 1}`, 400)),
			bad(post("/v1/acquire", `{"subject": "a", "cost": "1"}`, 400)),
			bad(post("/v1/acquire", `{"subject": "\ufffd"}`, 400)),
			bad(post("/v1/reset", `{"subject": `, 400)),
			bad(post("/v1/reset", ``, 400)),
			bad(post("/v1/reserve", `{"subject": "a", "ttl_ms": 0}`, 400)),
			bad(post("/v1/reserve", `{"subject": "a", "cost": [1, 2, 3]}`, 400)),
			bad(post("/v1/reserve", `{"subject": "a", "cost": null}`, 400)),
			bad(post("/v1/settle", `{"token": "abc"}`, 400)),
			bad(post("/v1/settle", `{"used": 1}`, 400)),
			bad(post("/v1/settle", `{"token": "abc", "used": -1}`, 400)),
			// ...and bad input only the service can tell.
			post("/v1/acquire", `{"subject": "a", "cost": 4}`, 400),
			post("/v1/peek", `{"namespace": "chat", "subject": "a", "cost": 61}`, 400),
			post("/v1/settle", `{"token": "nonsense", "used": 1}`, 400),
			post("/v1/acquire", `{"namespace": "envoy:x", "subject": "a"}`, 400),
			post("/v1/assign", `{"namespace": "api", "subject": "acme", "plan": "gold"}`, 400),
			post("/v1/assign", `{"namespace": "chat", "subject": "acme", "plan": "pro"}`, 400),
			post("/v1/acquire", `{"namespace": "api", "subject": "acme", "plan": "pro"}`, 400),
			post("/v1/peek", `{"namespace": "chat", "subject": "acme", "plan": "pro"}`, 400),
			bad(post("/v1/assign", `{"namespace": "api", "subject": "acme"}`, 400)),
			bad(post("/v1/assign", `{"namespace": "api", "subject": "", "plan": "pro"}`, 400)),
			bad(post("/v1/usage", `{"namespace": "api", "subject": "acme", "plan": "pro"}`, 400)),
			bad(post("/v1/usage", `{"subject": "`+strings.Repeat("s", server.MaxSubjectBytes+1)+`"}`, 400)),

			// 404: a namespace not in force.
			post("/v1/acquire", `{"namespace": "nope", "subject": "a"}`, 404),
			post("/v1/peek", `{"namespace": "nope", "subject": "a"}`, 404),
			post("/v1/reset", `{"namespace": "nope", "subject": "a"}`, 404),
			post("/v1/reserve", `{"namespace": "nope", "subject": "a"}`, 404),
			post("/v1/settle", `{"namespace": "nope", "token": "abc", "used": 1}`, 404),
			post("/v1/assign", `{"namespace": "nope", "subject": "a", "plan": "pro"}`, 404),
			post("/v1/usage", `{"namespace": "nope", "subject": "a"}`, 404),

			// 405: the document has no such operation; the answer is
			// documented on the endpoint's own.
			{method: http.MethodGet, path: "/v1/acquire", status: 405, badRequest: true, documented: http.MethodPost},
			{method: http.MethodPut, path: "/v1/peek", status: 405, badRequest: true, documented: http.MethodPost},
			{method: http.MethodDelete, path: "/v1/reset", status: 405, badRequest: true, documented: http.MethodPost},
			{method: http.MethodGet, path: "/v1/reserve", status: 405, badRequest: true, documented: http.MethodPost},
			{method: http.MethodGet, path: "/v1/settle", status: 405, badRequest: true, documented: http.MethodPost},
			{method: http.MethodGet, path: "/v1/assign", status: 405, badRequest: true, documented: http.MethodPost},
			{method: http.MethodGet, path: "/v1/usage", status: 405, badRequest: true, documented: http.MethodPost},
			{method: http.MethodPost, path: "/v1/config", status: 405, badRequest: true, documented: http.MethodGet},
			{method: http.MethodPost, path: "/v1/stats", status: 405, badRequest: true, documented: http.MethodGet},
			{method: http.MethodPost, path: "/healthz", status: 405, badRequest: true, documented: http.MethodGet},
			{method: http.MethodDelete, path: "/readyz", status: 405, badRequest: true, documented: http.MethodGet},
			{method: http.MethodPost, path: "/metrics", status: 405, badRequest: true, documented: http.MethodGet},
			{method: http.MethodPut, path: openapi.Path, status: 405, badRequest: true, documented: http.MethodGet},
		} {
			c.do(t, base, x)
		}

		for _, path := range posts {
			// 413: a body over 64 KiB.
			c.do(t, base, bad(post(path, `{"subject": "`+strings.Repeat("s", server.MaxBodyBytes)+`"}`, 413)))
			// 415: a body that does not say it is JSON.
			c.do(t, base, exchange{method: http.MethodPost, path: path, body: `{"subject": "a"}`, hdr: []string{"Content-Type", "text/plain"}, status: 415, badRequest: true})
			// 421: a Host that is not the service's (DNS rebinding).
			body := `{"subject": "a"}`
			switch path {
			case "/v1/settle":
				body = `{"token": "abc", "used": 1}`
			case "/v1/assign":
				body = `{"namespace": "api", "subject": "a", "plan": "pro"}`
			}
			c.do(t, base, exchange{method: http.MethodPost, path: path, body: body, host: "evil.example", status: 421})
		}
		c.do(t, base, exchange{method: http.MethodPost, path: "/v1/acquire", body: `{"subject": "a"}`, hdr: []string{"Content-Type", "application/x-www-form-urlencoded"}, status: 415, badRequest: true})
		for _, path := range gets {
			c.do(t, base, exchange{method: http.MethodGet, path: path, host: "evil.example", status: 421})
			c.do(t, base, exchange{method: http.MethodHead, path: path, host: "evil.example:80", status: 421})
		}
	})

	t.Run("a service with a token", func(t *testing.T) {
		base := start(t, server.Options{Token: "secret"}, true)
		auth := []string{"Authorization", "Bearer secret"}
		for _, x := range []exchange{
			post("/v1/acquire", `{"subject": "a"}`, 401),
			{method: http.MethodPost, path: "/v1/peek", body: `{"subject": "a"}`, hdr: []string{"Authorization", "Bearer wrong"}, status: 401},
			post("/v1/reset", `{"subject": "a"}`, 401),
			post("/v1/reserve", `{"subject": "a"}`, 401),
			post("/v1/settle", `{"token": "abc", "used": 1}`, 401),
			post("/v1/assign", `{"namespace": "api", "subject": "a", "plan": "pro"}`, 401),
			post("/v1/usage", `{"namespace": "api", "subject": "a"}`, 401),
			get("/v1/config", 401), head("/v1/config", 401),
			get("/v1/stats", 401), head("/v1/stats", 401),
			get("/metrics", 401), head("/metrics", 401),
			{method: http.MethodPost, path: "/v1/acquire", body: `{"subject": "a"}`, hdr: auth, status: 200},
			{method: http.MethodGet, path: "/v1/config", hdr: auth, status: 200},
			{method: http.MethodGet, path: "/metrics", hdr: auth, status: 200},
			// With a token, the Host is not checked.
			{method: http.MethodGet, path: "/v1/stats", hdr: auth, host: "elsewhere.example", status: 200},
			// Open to anyone.
			get("/healthz", 200), get("/readyz", 200), get(openapi.Path, 200),
		} {
			c.do(t, base, x)
		}
	})

	t.Run("a service whose store is down", func(t *testing.T) {
		st := &flakyStore{Store: memstore.New()}
		base := start(t, server.Options{
			Store: st, StoreName: "redis 127.0.0.1:1", StoreKind: operator.StoreRedis,
			Outage: fallback.ReturnError, Degraded: func() bool { return st.mode.Load() != up }, Ping: st.ping,
			Timeout: time.Second,
		}, true)
		a := c.do(t, base, post("/v1/reserve", `{"namespace": "chat", "subject": "acme", "cost": [1, 500]}`, 200))
		settle := fmt.Sprintf(`{"namespace": "chat", "token": %q, "used": [1, 120]}`, a.json["token"])

		st.mode.Store(failing)
		for _, x := range []exchange{
			post("/v1/acquire", `{"subject": "a"}`, 503),
			post("/v1/peek", `{"subject": "a"}`, 503),
			post("/v1/reset", `{"subject": "a"}`, 503),
			post("/v1/reserve", `{"subject": "a"}`, 503),
			post("/v1/settle", settle, 503),
			post("/v1/assign", `{"namespace": "api", "subject": "a", "plan": "pro"}`, 503),
			post("/v1/usage", `{"namespace": "api", "subject": "a"}`, 503),
			get("/readyz", 503), head("/readyz", 503),
			get("/healthz", 200), get("/v1/stats", 200), get("/v1/config", 200),
		} {
			a := c.do(t, base, x)
			if x.status == 503 && x.path != "/readyz" && a.header.Get("Retry-After") != "1" {
				t.Errorf("%s: Retry-After %q, want 1", x.path, a.header.Get("Retry-After"))
			}
		}

		st.mode.Store(failClosed)
		a = c.do(t, base, post("/v1/acquire", `{"subject": "a"}`, 503))
		if a.json["source"] != "fail-closed" || a.json["error"] == nil {
			t.Errorf("a fail-closed denial: %s", a.body)
		}
		c.do(t, base, post("/v1/reserve", `{"subject": "a"}`, 503))
	})

	if unseen := c.unseen(t, []byte(docs.OpenAPI)); len(unseen) > 0 {
		t.Errorf("answers the document lists that no exchange provoked:\n  %s", strings.Join(unseen, "\n  "))
	}
}

// The endpoints of the API, by method.
var (
	posts = []string{"/v1/acquire", "/v1/peek", "/v1/reset", "/v1/reserve", "/v1/settle", "/v1/assign", "/v1/usage"}
	gets  = []string{"/v1/config", "/v1/stats", "/healthz", "/readyz", "/metrics", openapi.Path}
)

// TestDriftFails: a document that no longer says what the service does
// (a field, a status, a header or a bound gone) fails the checks of
// TestAPIAnswersAsDocumented.
func TestDriftFails(t *testing.T) {
	base := start(t, server.Options{}, true)
	for _, tc := range []struct {
		name  string
		drift func(doc map[string]any)
		x     exchange
	}{
		{"a field of the decision removed", func(doc map[string]any) {
			decision := dig(doc, "components", "schemas", "Decision")
			delete(dig(decision, "properties"), "reset_after_ms")
			decision["required"] = slices.DeleteFunc(decision["required"].([]any), func(f any) bool { return f == "reset_after_ms" })
		}, post("/v1/peek", `{"subject": "drift"}`, 200)},
		{"a status removed", func(doc map[string]any) {
			delete(dig(doc, "paths", "/v1/reset", "post", "responses"), "404")
		}, post("/v1/reset", `{"namespace": "nope", "subject": "drift"}`, 404)},
		{"a header removed", func(doc map[string]any) {
			delete(dig(doc, "paths", "/v1/acquire", "post", "responses", "200", "headers"), "X-RateLimit-Remaining")
		}, post("/v1/acquire", `{"subject": "drift-1"}`, 200)},
		{"a header's type changed", func(doc map[string]any) {
			dig(doc, "components", "headers", "X-RateLimit-Reset-optional")["schema"] = map[string]any{"type": "string", "format": "date-time"}
		}, post("/v1/acquire", `{"subject": "drift-2"}`, 200)},
		{"a field of an error added", func(doc map[string]any) {
			dig(doc, "components", "schemas", "Error")["required"] = []any{"error", "code"}
		}, bad(post("/v1/acquire", `{"subject": "drift", "cost": 0}`, 400))},
		{"a request bound removed", func(doc map[string]any) {
			delete(dig(doc, "components", "schemas", "APIRequest", "properties", "subject"), "maxLength")
		}, bad(post("/v1/acquire", `{"subject": "`+strings.Repeat("s", server.MaxSubjectBytes+1)+`"}`, 400))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var doc map[string]any
			if err := json.Unmarshal([]byte(docs.OpenAPI), &doc); err != nil {
				t.Fatal(err)
			}
			// The exchange passes with the document as it is...
			if _, problems := send(t, newValidator(t, []byte(docs.OpenAPI)), base, tc.x); len(problems) > 0 {
				t.Fatalf("with the document as it is:\n%s", strings.Join(problems, "\n"))
			}
			// ...and fails with the drift.
			tc.drift(doc)
			drifted, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			if _, problems := send(t, newValidator(t, drifted), base, tc.x); len(problems) == 0 {
				t.Errorf("%s %s: no problem found with the drifted document", tc.x.method, tc.x.path)
			}
		})
	}
}

// dig returns the object at path in a decoded JSON document.
func dig(v map[string]any, path ...string) map[string]any {
	for _, k := range path {
		v = v[k].(map[string]any)
	}
	return v
}
