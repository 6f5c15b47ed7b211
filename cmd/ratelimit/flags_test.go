package main_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/version"
)

// runEnv runs the binary to completion with env added to the environment,
// and returns its stdout, stderr and exit status.
func runEnv(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

func TestServeFlagsAndEnvironment(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		msg  string
	}{
		{[]string{"serve", "--key", "header:X-API-Key"}, "--key applies only with --upstream"},
		{[]string{"serve", "--body", "json"}, "--body applies only with --upstream"},
		{[]string{"serve", "--namespace", "login"}, "--namespace applies only with --upstream"},
		{[]string{"serve", "--admin-listen", "127.0.0.1:0"}, "--admin-listen applies only with --upstream"},
		{[]string{"serve", "--trusted-proxies", "10.0.0.0/8"}, "--trusted-proxies applies only with --upstream"},
		{[]string{"serve", "--outage", "fail-open"}, "--outage applies only with --redis"},
		{[]string{"serve", "--upstream", "http://127.0.0.1:1", "--key", "header:X", "--ipv6-prefix", "48"}, "--ipv6-prefix applies only to --key ip"},
		{[]string{"serve", "--log-format", "xml"}, `--log-format "xml"`},
		{[]string{"serve", "--log-level", "loud"}, `--log-level "loud"`},
	} {
		// --listen 127.0.0.1:0: a flag wrongly accepted must not hold a
		// fixed port while the test waits.
		_, stderr, code := run(t, append(tt.args, "--listen", "127.0.0.1:0")...)
		if code != 2 || !strings.Contains(stderr, tt.msg) {
			t.Errorf("%q: exit %d, stderr %q; want 2 with %q", tt.args, code, stderr, tt.msg)
		}
	}
	if _, stderr, code := runEnv(t, []string{"RATELIMIT_TIMEOUT=soon"}, "serve", "--listen", "127.0.0.1:0"); code != 2 || !strings.Contains(stderr, "RATELIMIT_TIMEOUT: invalid value for --timeout") {
		t.Errorf("a bad value from the environment: exit %d %q", code, stderr)
	}
	if stdout, _, code := run(t, "--version"); code != 0 || !strings.HasPrefix(stdout, "ratelimit "+version.Version+" ") || !strings.Contains(stdout, " go1.") {
		t.Errorf("--version: exit %d %q", code, stdout)
	}

	// Flags from the environment, the command line winning; the token file
	// re-read on SIGHUP; an empty config refused.
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte("first\n"), 0o600)
	cfg := filepath.Join(dir, "ratelimit.yaml")
	os.WriteFile(cfg, []byte("namespaces:\n  - name: login\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"), 0o644)
	p := serve(t, []string{"RATELIMIT_LISTEN=127.0.0.1:1", "RATELIMIT_TOKEN_FILE=" + tokenFile, "RATELIMIT_CONFIG=" + cfg, "RATELIMIT_TRUSTED_PROXIES=0.0.0.0/0"}, "--upstream", upstreamEcho(t).URL, "--admin-listen", "127.0.0.1:0")
	if !strings.Contains(p.Log(), "trusts every address") {
		t.Errorf("no warning for --trusted-proxies 0.0.0.0/0:\n%s", p.Log())
	}
	auth := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	r := get(t, "http://"+p.admin+"/v1/config")
	if r.code != 401 {
		t.Errorf("/v1/config without the token: %d", r.code)
	}
	req, _ := http.NewRequest("GET", "http://"+p.admin+"/v1/config", nil)
	req.Header.Set("Authorization", "Bearer first")
	if r := do(t, req); r.code != 200 || !strings.Contains(r.raw, `"login":{"capacity":3`) {
		t.Errorf("/v1/config: %d %s", r.code, r.raw)
	}
	os.WriteFile(tokenFile, []byte("second\n"), 0o600)
	os.WriteFile(cfg, nil, 0o644)
	p.cmd.Process.Signal(syscall.SIGHUP)
	p.waitLog(t, "token reloaded")
	p.waitLog(t, "config reload refused")
	if r := post(t, p.admin, "/v1/acquire", `{"subject":"a","namespace":"login"}`, auth("first")...); r.code != 401 {
		t.Errorf("the old token after SIGHUP: %d", r.code)
	}
	if r := post(t, p.admin, "/v1/acquire", `{"subject":"a","namespace":"login"}`, auth("second")...); r.code != 200 {
		t.Errorf("the new token, and login after an empty file was refused: %d %s", r.code, r.raw)
	}
	if r := post(t, p.admin, "/v1/reset", `{"subject":"a"}`, "Content-Type", "text/plain", "Authorization", "Bearer second"); r.code != 415 {
		t.Errorf("a text/plain reset: %d", r.code)
	}
	p.waitLog(t, "refused a request to the API")
	if r := get(t, "http://"+p.admin+"/readyz"); r.code != 200 {
		t.Errorf("/readyz: %d %s", r.code, r.raw)
	}
	m := metrics(t, p.admin, auth("second")...)
	wantMetric(t, m, `ratelimit_build_info{goversion="go`, `version="`+version.Version+`"} 1`, "go_goroutines ", "process_resident_memory_bytes ")
	if strings.Contains(m, "ratelimit_outage_behaviour") {
		t.Errorf("/metrics shows an outage behaviour for the embedded store")
	}
	p.stop(t)
}

// TestServeJSONLogs reads serve's log as JSON lines.
func TestServeJSONLogs(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(binary, "serve", "--listen", "127.0.0.1:0", "--log-format", "json")
	cmd.Env = append(os.Environ(), "RATELIMIT_LOG_LEVEL=debug")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	defer once.Do(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		if sc.Scan() {
			line <- sc.Text()
		}
		io.Copy(io.Discard, stderr)
	}()
	select {
	case l := <-line:
		if !strings.HasPrefix(l, `{"time":`) || !strings.Contains(l, `"msg":"serving"`) {
			t.Errorf("first log line %q is not JSON", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no log line within 10 s")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	once.Do(func() { cmd.Wait() })
}
