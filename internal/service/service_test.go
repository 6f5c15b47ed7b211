package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/exactlimit/ratelimit/internal/operator"
	"github.com/exactlimit/ratelimit/internal/rlstest"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// edgeConfig is an Envoy config of domain edge: rpu requests a minute per
// remote_address.
func edgeConfig(rpu int) string {
	return fmt.Sprintf("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", rpu)
}

// start starts the service of c on loopback ports and closes it when the
// test ends; its log goes to the returned buffer.
func start(t *testing.T, c Config) (*Service, *testkit.Buffer) {
	t.Helper()
	logs := &testkit.Buffer{}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	s, err := Start(context.Background(), c)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, logs
}

// withEnvoy returns an Envoy service of edgeConfig(rpu) on a loopback port.
func withEnvoy(t *testing.T, rpu int) *Envoy {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	testkit.WriteFile(t, path, edgeConfig(rpu))
	return &Envoy{Listen: "127.0.0.1:0", ConfigPath: path}
}

// get returns the status and body of GET url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	return fetch(t, http.MethodGet, url, "", "")
}

// fetch sends a request of method to url, with the bearer token and body
// when they are not empty (a body as JSON), and returns the status and the
// body of the answer.
func fetch(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

func TestStartReportsItsAddresses(t *testing.T) {
	upstream := testkit.Listen(t)
	go http.Serve(upstream, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "upstream") }))
	for _, tc := range []struct {
		name             string
		c                Config
		admin, grpc, api bool
	}{
		{"the API alone", Config{}, false, false, true},
		{"the proxy and the API on the admin listener", Config{AdminListen: "127.0.0.1:0", Proxy: &Proxy{Upstream: mustURL(t, "http://"+upstream.Addr().String())}}, true, false, true},
		{"the API and Envoy's service", Config{Envoy: withEnvoy(t, 5)}, false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := start(t, tc.c)
			a := s.Addrs()
			if a.HTTP == nil || (a.Admin != nil) != tc.admin || (a.GRPC != nil) != tc.grpc {
				t.Fatalf("Addrs %+v, want admin %v grpc %v", a, tc.admin, tc.grpc)
			}
			if code, body := get(t, "http://"+a.API().String()+"/healthz"); code != http.StatusOK || !strings.Contains(body, `"status":"ok"`) {
				t.Errorf("GET /healthz of the API: %d %s", code, body)
			}
			if tc.admin {
				if code, body := get(t, "http://"+a.HTTP.String()+"/anything"); code != http.StatusOK || body != "upstream" {
					t.Errorf("through the proxy: %d %q", code, body)
				}
			}
		})
	}
}

// TestEnvoyDecisionsAreObserved drives Envoy's gRPC API with a real client
// over a real listener, and finds its decisions in /metrics and /v1/stats
// under the namespace envoy:edge, once each.
func TestEnvoyDecisionsAreObserved(t *testing.T) {
	s, _ := start(t, Config{Envoy: withEnvoy(t, 2)})
	conn := rlstest.Dial(t, s.Addrs().GRPC.String(), insecure.NewCredentials())
	ctx := testContext(t)
	for range 3 {
		if _, err := rlstest.AskEdge(ctx, conn, "10.0.0.1"); err != nil {
			t.Fatal(err)
		}
	}
	// Two descriptors on two buckets: decided all or nothing, one event
	// each.
	two := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.2"}}},
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.3"}}},
	}}
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, two); err != nil {
		t.Fatal(err)
	}

	api := "http://" + s.Addrs().API().String()
	_, metrics := get(t, api+"/metrics")
	for _, want := range []string{
		`ratelimit_decisions_total{namespace="envoy:edge",op="acquire",result="allowed",source="store"} 4`,
		`ratelimit_decisions_total{namespace="envoy:edge",op="acquire",result="denied",source="store"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	code, body := get(t, api+"/v1/stats")
	if code != http.StatusOK {
		t.Fatalf("GET /v1/stats: %d %s", code, body)
	}
	var r operator.Report
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, ns := range r.Namespaces {
		if ns.Name != "envoy:edge" {
			continue
		}
		found = true
		if ns.Allowed != 4 || ns.Denied != 1 || ns.Envoy == nil || ns.Envoy.Domain != "edge" || ns.Envoy.Rules != 1 {
			t.Errorf("/v1/stats of envoy:edge: allowed %d denied %d envoy %+v, want 4, 1 and domain edge with 1 rule", ns.Allowed, ns.Denied, ns.Envoy)
		}
	}
	if !found || r.Namespaces[0].Name != "default" {
		t.Errorf("/v1/stats namespaces %+v, want default, then envoy:edge", r.Namespaces)
	}
}

// TestReloadReadsEveryFile: one Reload puts in force the namespaces, the
// token and the Envoy config, and a file that does not load keeps what is in
// force.
func TestReloadReadsEveryFile(t *testing.T) {
	dir := t.TempDir()
	cfg, tok := filepath.Join(dir, "ns.yaml"), filepath.Join(dir, "token")
	testkit.WriteFile(t, cfg, "namespaces:\n  - name: default\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	testkit.WriteFile(t, tok, "first")
	envoy := withEnvoy(t, 2)
	s, logs := start(t, Config{ConfigFile: cfg, TokenFile: tok, Envoy: envoy})

	testkit.WriteFile(t, cfg, "namespaces:\n  - name: default\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - name: extra\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	testkit.WriteFile(t, tok, "second")
	testkit.WriteFile(t, envoy.ConfigPath, edgeConfig(7))
	s.Reload()
	if _, ok := s.API().Policies()["extra"]; !ok {
		t.Errorf("after Reload, the namespaces %v lack extra", s.API().Policies().Names())
	}
	req, _ := http.NewRequest("GET", "http://"+s.Addrs().API().String()+"/v1/config", nil)
	req.Header.Set("Authorization", "Bearer second")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("the reloaded token: %d, want 200", res.StatusCode)
	}
	resp, err := rlstest.AskEdge(testContext(t), rlstest.Dial(t, s.Addrs().GRPC.String(), insecure.NewCredentials()), "10.0.0.9")
	if err != nil || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 7 {
		t.Errorf("after Reload, Envoy's limit: %v %v, want 7 a minute", resp, err)
	}

	testkit.WriteFile(t, cfg, "namespaces: [")
	s.Reload()
	if _, ok := s.API().Policies()["extra"]; !ok || !strings.Contains(logs.String(), "config reload refused") {
		t.Errorf("a bad file: namespaces %v, log %s", s.API().Policies().Names(), logs.String())
	}
}

// TestWatchReloadsAChangedFile: with Config.Watch, an edit of the
// namespaces is put in force without Reload.
func TestWatchReloadsAChangedFile(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "ns.yaml")
	testkit.WriteFile(t, cfg, "namespaces:\n  - name: default\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	s, _ := start(t, Config{ConfigFile: cfg, Watch: 10 * time.Millisecond})
	testkit.WriteFile(t, cfg, "namespaces:\n  - name: default\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - name: watched\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok := s.API().Policies()["watched"]; ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the edit was not loaded within 5 s: %v", s.API().Policies().Names())
		}
	}
}

// TestWatchReloadsTheEnvoyConfig: an edit of the Envoy config made right
// after Start is seen, however late the watcher's goroutine starts.
func TestWatchReloadsTheEnvoyConfig(t *testing.T) {
	envoy := withEnvoy(t, 2)
	envoy.Watch = 10 * time.Millisecond
	s, _ := start(t, Config{Envoy: envoy})
	testkit.WriteFile(t, envoy.ConfigPath, edgeConfig(9))
	conn := rlstest.Dial(t, s.Addrs().GRPC.String(), insecure.NewCredentials())
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := rlstest.AskEdge(testContext(t), conn, "10.0.0.7")
		if err != nil {
			t.Fatal(err)
		}
		if resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 9 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the edit was not loaded within 5 s: %v", resp)
		}
	}
}

// TestCloseHonoursItsContext: Close with a context already done closes the
// connections at once instead of waiting for the request in flight (one
// that an upstream of the proxy holds), and says so.
func TestCloseHonoursItsContext(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	upstream := testkit.Listen(t)
	go http.Serve(upstream, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		close(arrived)
		<-release
	}))
	c := Config{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		Proxy: &Proxy{Upstream: mustURL(t, "http://"+upstream.Addr().String())}}
	s, err := Start(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		if res, err := http.Get("http://" + s.Addrs().HTTP.String() + "/slow"); err == nil {
			res.Body.Close()
		}
	}()
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the request did not reach the upstream")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() { done <- s.Close(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Close with a done context and a request in flight: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close with a done context still waits after 5 s")
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
