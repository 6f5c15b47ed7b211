package cli

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// waitLog waits until re matches stderr, or serve exits, or 5 s pass.
func waitLog(t *testing.T, stderr *testkit.Buffer, done <-chan int, re *regexp.Regexp) []string {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			return m
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited %d: %s", code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line %v: %s", re, stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const envoyTestConfig = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: %d}\n"

// TestServeEnvoy runs serve with --grpc-listen in this process: the RLS
// answers over gRPC, /metrics has its series, SIGHUP reloads the config, and
// a bad file is refused with a log line naming it while the old config stays.
func TestServeEnvoy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	writeEnvoyConfig(t, path, "2")
	e := startServeEnvoy(t, map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true"}, "--envoy-config", path)
	ask := func(ip string) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := e.ask(t, ip)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	codes := func(ip string, n int) string {
		var b strings.Builder
		for range n {
			if ask(ip).OverallCode == rlsv3.RateLimitResponse_OK {
				b.WriteByte('+')
			} else {
				b.WriteByte('-')
			}
		}
		return b.String()
	}
	if got := codes("a", 3); got != "++-" {
		t.Errorf("2 a minute: got %s, want ++-", got)
	}
	if len(ask("h").ResponseHeadersToAdd) == 0 {
		t.Error("LIMIT_RESPONSE_HEADERS_ENABLED=true: no headers")
	}

	testkit.WriteFile(t, path, "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2, typo: 1}\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	line := waitLog(t, e.stderr, e.done, regexp.MustCompile(`envoy config reload refused.*`))[0]
	if !strings.Contains(line, path) || !strings.Contains(line, "typo") {
		t.Errorf("the refusal does not name the file and the field: %s", line)
	}
	if got := codes("b", 3); got != "++-" {
		t.Errorf("after a bad reload, the old 2 a minute: got %s, want ++-", got)
	}

	writeEnvoyConfig(t, path, "4")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog(t, e.stderr, e.done, regexp.MustCompile(`msg="envoy config reloaded"`))
	if got := codes("c", 5); got != "++++-" {
		t.Errorf("after the reload, 4 a minute: got %s, want ++++-", got)
	}

	res, err := http.Get("http://" + e.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`ratelimit_envoy_hits_total{domain="edge",key="edge.remote_address"}`,
		`ratelimit_envoy_over_limit_total{domain="edge",key="edge.remote_address"} 3`,
		`ratelimit_envoy_config_reloads_total{result="error"} 1`,
		`ratelimit_envoy_config_reloads_total{result="ok"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestServeEnvoyRefusesABadConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	testkit.WriteFile(t, path, "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"a bad file", []string{"--grpc-listen", "127.0.0.1:0", "--envoy-config", path}, 1, path},
		{"no config", []string{"--grpc-listen", "127.0.0.1:0"}, 2, "--grpc-listen needs --envoy-config"},
		{"a config without a listener", []string{"--envoy-config", path}, 2, "need --grpc-listen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr testkit.Buffer
			env := Env{Stdout: &stdout, Stderr: &stderr}
			code := Main(context.Background(), append([]string{"serve", "--listen", "127.0.0.1:0"}, tc.args...), env)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("got exit %d and %q, want %d and %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}

// TestEnvoyBench runs the gRPC load generator briefly, on the embedded store
// and on a real redis-server, and checks that it reports calls/s and
// latency and that the rule limited it. It measures nothing.
func TestEnvoyBench(t *testing.T) {
	srv := redistest.StartServer(t)
	for _, tc := range []struct {
		name  string
		args  []string
		store string
	}{
		{"embedded", nil, "memory (embedded"},
		{"redis", []string{"--redis", "redis://" + srv.Addr()}, srv.Addr()},
		{"redis, three descriptors a call", []string{"--redis", "redis://" + srv.Addr(), "--descriptors", "3"}, "3 per call"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			// (A deadline of 5 s a call: Envoy's 20 ms could pass on a
			// machine busy with other tests, and a call would fail.)
			args := append([]string{"envoy-bench", "--concurrency", "2", "--subjects", "3", "--rate", "5", "--duration", "300ms", "--call-timeout", "5s"}, tc.args...)
			if code := Main(context.Background(), args, Env{Stdout: &stdout, Stderr: &stderr}); code != 0 {
				t.Fatalf("exit %d: %s %s", code, stdout.String(), stderr.String())
			}
			out := stdout.String()
			for _, want := range []string{tc.store, "calls/s", "latency     p50 ", " p99 ", "OVER_LIMIT)"} {
				if !strings.Contains(out, want) {
					t.Errorf("report lacks %q:\n%s", want, out)
				}
			}
			if strings.Contains(out, "(0 OVER_LIMIT)") || strings.Contains(out, "errors") {
				t.Errorf("3 subjects at 5/s for 300ms: want denials and no errors:\n%s", out)
			}
		})
	}
}

// TestServeEnvoyJSONIsGuarded: POST /json, which spends and refunds (with
// is_negative_hits) an Envoy rule's buckets, passes the checks every POST of
// the API passes: the Content-Type application/json (a text/plain post needs
// no CORS preflight), the Host check against DNS rebinding while there is no
// token, and the token when there is one.
func TestServeEnvoyJSONIsGuarded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	writeEnvoyConfig(t, path, "100")
	const rls = `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"j"}]}]}`
	const reset = `{"subject":"x"}`
	type call struct {
		name                    string
		path, body, contentType string
		host, token             string
		code                    int
	}
	do := func(t *testing.T, addr string, c call) {
		t.Helper()
		req, err := http.NewRequest("POST", "http://"+addr+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", c.contentType)
		if c.host != "" {
			req.Host = c.host
		}
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != c.code {
			t.Errorf("%s: POST %s: %d %s, want %d", c.name, c.path, res.StatusCode, body, c.code)
		}
	}
	t.Run("without a token", func(t *testing.T) {
		e := startServeEnvoy(t, nil, "--envoy-config", path)
		for _, c := range []call{
			{"a text/plain post", "/json", rls, "text/plain", "", "", http.StatusUnsupportedMediaType},
			{"a form post", "/json", rls, "application/x-www-form-urlencoded", "", "", http.StatusUnsupportedMediaType},
			{"a rebinding page's Host", "/json", rls, "application/json", "attacker.example", "", http.StatusMisdirectedRequest},
			{"a rebinding page's Host", "/v1/reset", reset, "application/json", "attacker.example", "", http.StatusMisdirectedRequest},
			{"the listener's address", "/json", rls, "application/json", "", "", http.StatusOK},
			{"localhost", "/json", rls, "application/json; charset=utf-8", "localhost:" + e.http[strings.LastIndexByte(e.http, ':')+1:], "", http.StatusOK},
		} {
			do(t, e.http, c)
		}
	})
	t.Run("with a token", func(t *testing.T) {
		e := startServeEnvoy(t, map[string]string{"RATELIMIT_TOKEN": "secret"}, "--envoy-config", path)
		for _, c := range []call{
			{"no token", "/json", rls, "application/json", "", "", http.StatusUnauthorized},
			{"no token", "/v1/reset", reset, "application/json", "", "", http.StatusUnauthorized},
			{"a wrong token", "/json", rls, "application/json", "", "guess", http.StatusUnauthorized},
			{"the token, text/plain", "/json", rls, "text/plain", "", "secret", http.StatusUnsupportedMediaType},
			{"the token", "/json", rls, "application/json", "", "secret", http.StatusOK},
		} {
			do(t, e.http, c)
		}
	})
}
