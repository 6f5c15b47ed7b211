package cli

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/rlstest"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// envoyServe is serve with the Envoy service in this process, with a gRPC
// client of it, the HTTP address and the log.
type envoyServe struct {
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
	http   string
	debug  string // the debug listener's address, "" without one
	// prometheus is the address of the peer's statistics in Prometheus
	// form, "" without them.
	prometheus string
	stderr     *testkit.Buffer
	done       chan int
}

func startServeEnvoy(t *testing.T, vars map[string]string, args ...string) *envoyServe {
	t.Helper()
	s := startServe(t, vars, append([]string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"}, args...)...)
	e := &envoyServe{http: s.svc.Addrs().HTTP.String(), stderr: s.stderr, done: s.done}
	conn, err := grpc.NewClient(s.svc.Addrs().GRPC.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.conn, e.client = conn, rlsv3.NewRateLimitServiceClient(conn)
	return e
}

func (e *envoyServe) ask(t *testing.T, ip string) (*rlsv3.RateLimitResponse, error) {
	t.Helper()
	return rlstest.AskEdge(context.Background(), e.conn, ip)
}

// wantRequestsPerUnit asks for ip and checks the rule in force: want
// requests a unit, after what (a reload) says the failure.
func (e *envoyServe) wantRequestsPerUnit(t *testing.T, ip string, want uint32, what string) {
	t.Helper()
	r, err := e.ask(t, ip)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != want {
		t.Errorf("%s: requests_per_unit %d, want %d", what, got, want)
	}
}

// writeEnvoyConfig writes envoyTestConfig with rpu requests a minute to path.
func writeEnvoyConfig(t *testing.T, path string, rpu string) {
	t.Helper()
	testkit.WriteFile(t, path, strings.ReplaceAll(envoyTestConfig, "%d", rpu))
}

// TestServeEnvoyLikeThePeer: the health service "ratelimit", POST /json and
// GET /healthcheck on the HTTP listener, SHADOW_MODE, and a config edit
// reloaded without a signal.
func TestServeEnvoyLikeThePeer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	writeEnvoyConfig(t, path, "1")
	e := startServeEnvoy(t, map[string]string{"SHADOW_MODE": "true"}, "--envoy-config", path, "--envoy-config-watch", "20ms")

	h, err := healthpb.NewHealthClient(e.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health of ratelimit: %v, %v; want SERVING", h, err)
	}

	for i := range 2 {
		r, err := e.ask(t, "a")
		if err != nil {
			t.Fatal(err)
		}
		if r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("request %d with SHADOW_MODE: %v, want OK", i+1, r.OverallCode)
		}
		if i == 1 && r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("the status under SHADOW_MODE: %v, want OVER_LIMIT", r.Statuses[0].Code)
		}
	}

	res, err := http.Post("http://"+e.http+"/json", "application/json", strings.NewReader(`{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"j"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), `"overallCode":"OK"`) {
		t.Errorf("POST /json: %d %s", res.StatusCode, body)
	}
	res, err = http.Get("http://" + e.http + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(body) != "OK" {
		t.Errorf("GET /healthcheck: %d %q", res.StatusCode, body)
	}

	writeEnvoyConfig(t, path, "3")
	waitLog(t, e.stderr, e.done, regexp.MustCompile(`msg="envoy config reloaded"`))
	e.wantRequestsPerUnit(t, "b", 3, "after the edit")
}

// TestServeEnvoyOutageIsUnavailable: with Redis down, ShouldRateLimit is
// gRPC UNAVAILABLE by default (Envoy's failure_mode_deny decides), while the
// HTTP API keeps its own --outage; --envoy-outage chooses another.
func TestServeEnvoyOutageIsUnavailable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	writeEnvoyConfig(t, path, "5")
	for _, tc := range []struct {
		name string
		args []string
		want codes.Code
		code rlsv3.RateLimitResponse_Code
	}{
		{"default", nil, codes.Unavailable, 0},
		{"fail-open", []string{"--envoy-outage", "fail-open"}, codes.OK, rlsv3.RateLimitResponse_OK},
		{"fail-closed", []string{"--envoy-outage", "fail-closed"}, codes.OK, rlsv3.RateLimitResponse_OVER_LIMIT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			e := startServeEnvoy(t, nil, append([]string{"--envoy-config", path, "--redis", "redis://" + srv.Addr(), "--timeout", "200ms"}, tc.args...)...)
			if r, err := e.ask(t, "up"); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("with Redis up: %v, %v", r, err)
			}
			srv.Kill()
			r, err := e.ask(t, "down")
			if status.Code(err) != tc.want {
				t.Fatalf("with Redis down: %v, want %v", err, tc.want)
			}
			if err == nil && r.OverallCode != tc.code {
				t.Errorf("with Redis down: %v, want %v", r.OverallCode, tc.code)
			}
		})
	}
}

func TestServeEnvoyPeerSettings(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"a.yaml":       "domain: edge\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n",
		"b.yaml":       "domain: edge\ndescriptors:\n  - {key: b, rate_limit: {unit: second, requests_per_unit: 1}}\n",
		".hidden.yaml": "not: [yaml",
	} {
		testkit.WriteFile(t, filepath.Join(dir, name), content)
	}
	for _, tc := range []struct {
		name string
		vars map[string]string
		code int
		want string
	}{
		{"one domain in two files without MERGE_DOMAIN_CONFIG", map[string]string{"RUNTIME_IGNOREDOTFILES": "true"}, 1, "MERGE_DOMAIN_CONFIG"},
		{"a dot file read by default", map[string]string{"MERGE_DOMAIN_CONFIG": "true"}, 1, ".hidden.yaml"},
		{"a bad boolean", map[string]string{"SHADOW_MODE": "maybe"}, 2, "SHADOW_MODE"},
		{"QUOTA_MODE", map[string]string{"QUOTA_MODE": "true"}, 2, "QUOTA_MODE=true is not supported"},
		{"TLS without files", map[string]string{"GRPC_SERVER_USE_TLS": "true"}, 2, "needs GRPC_SERVER_TLS_CERT"},
		{"a client SAN", map[string]string{"GRPC_CLIENT_TLS_SAN": "envoy"}, 2, "GRPC_CLIENT_TLS_SAN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr testkit.Buffer
			env := Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return tc.vars[k] }}
			code := Main(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--envoy-config", dir}, env)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("got exit %d and %q, want %d and %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
	t.Run("both settings: served", func(t *testing.T) {
		e := startServeEnvoy(t, map[string]string{"MERGE_DOMAIN_CONFIG": "true", "RUNTIME_IGNOREDOTFILES": "1"}, "--envoy-config", dir)
		if !strings.Contains(e.stderr.String(), "rules=2") {
			t.Errorf("the merged domain: %s", e.stderr.String())
		}
	})
}
