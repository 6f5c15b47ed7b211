package main_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/redistest"
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

// credentialsRedis starts a redis-server with two ACL users: svc (password
// "right-pw", every permission) and limited (password "lim-pw", PING
// only).
func credentialsRedis(t *testing.T) *redistest.Server {
	t.Helper()
	return redistest.StartServer(t,
		"--user", "svc", "on", ">right-pw", "~*", "&*", "+@all",
		"--user", "limited", "on", ">lim-pw", "~*", "&*", "-@all", "+ping")
}

func TestServeRedisCredentials(t *testing.T) {
	t.Parallel()
	srv := credentialsRedis(t)
	addr := srv.Addr()
	pwFile := filepath.Join(t.TempDir(), "redis-password")
	os.WriteFile(pwFile, []byte("right-pw\n"), 0o600)

	// Refused credentials are a configuration error: serve exits 1 with the
	// reason, at once, instead of answering 503 forever.
	for _, tt := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"a wrong password", nil, []string{"--redis", "redis://svc:wrong-pw@" + addr}, "WRONGPASS"},
		{"a wrong password from the environment", []string{"RATELIMIT_REDIS_PASSWORD=wrong-pw"}, []string{"--redis", "redis://svc@" + addr}, "WRONGPASS"},
		{"a user without the permissions", []string{"REDISCLI_AUTH=lim-pw"}, []string{"--redis", "redis://limited@" + addr}, "NOPERM"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			_, stderr, code := runEnv(t, tt.env, append([]string{"serve", "--listen", "127.0.0.1:0"}, tt.args...)...)
			if code != 1 || !strings.Contains(stderr, tt.want) || !strings.Contains(stderr, "configuration error") {
				t.Errorf("exit %d, stderr %q; want 1 with %s", code, stderr, tt.want)
			}
			if strings.Contains(stderr, "wrong-pw") || strings.Contains(stderr, "lim-pw") {
				t.Errorf("stderr shows the password: %q", stderr)
			}
			if time.Since(start) > 10*time.Second {
				t.Errorf("took %v to refuse", time.Since(start))
			}
		})
	}

	// The password from a file or the environment, never on the command
	// line: the process's arguments do not hold it.
	for _, tt := range []struct {
		name string
		env  []string
		args []string
	}{
		{"--redis-password-file", nil, []string{"--redis", "redis://svc@" + addr, "--redis-password-file", pwFile}},
		{"RATELIMIT_REDIS_PASSWORD", []string{"RATELIMIT_REDIS_PASSWORD=right-pw"}, []string{"--redis", "redis://svc@" + addr}},
		{"REDISCLI_AUTH and RATELIMIT_REDIS", []string{"REDISCLI_AUTH=right-pw", "RATELIMIT_REDIS=redis://svc@" + addr}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := serve(t, tt.env, tt.args...)
			if r := post(t, p.addr, "/v1/acquire", `{"subject":"pw"}`); r.code != 200 || r.body["source"] != "store" {
				t.Errorf("acquire: %d %s", r.code, r.raw)
			}
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.cmd.Process.Pid))
			if strings.Contains(string(cmdline), "right-pw") || strings.Contains(p.Log(), "right-pw") {
				t.Errorf("the password shows in ps or the log")
			}
			p.stop(t)
		})
	}
	stdout, stderr, code := runEnv(t, []string{"REDISCLI_AUTH=right-pw"}, "peek", "--redis", "redis://svc@"+addr, "pw")
	if code != 0 || !strings.HasPrefix(stdout, "allowed:") {
		t.Errorf("peek with REDISCLI_AUTH: exit %d %q %q", code, stdout, stderr)
	}
	// A URL without a scheme does not echo its password back.
	if _, stderr, code := run(t, "serve", "--listen", "127.0.0.1:0", "--redis", "svc:s3cret-pw@"+addr); code != 2 || strings.Contains(stderr, "s3cret-pw") {
		t.Errorf("a URL without a scheme: exit %d, stderr %q", code, stderr)
	}
	if _, stderr, code := runEnv(t, []string{"RATELIMIT_REDIS_PASSWORD=x"}, "serve", "--listen", "127.0.0.1:0", "--redis", "redis://svc:y@"+addr); code != 2 || !strings.Contains(stderr, "give it once") {
		t.Errorf("two passwords: exit %d, stderr %q", code, stderr)
	}
}

func TestServeRedisLogsNoSubjects(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	// return-error hands the store's error (which quotes the bucket key)
	// to the service, which logs it.
	p := serve(t, nil, "--redis", "redis://"+srv.Addr(), "--timeout", "300ms", "--upstream", up.URL,
		"--admin-listen", "127.0.0.1:0", "--key", "header:X-API-Key", "--outage", "return-error")
	secret := "sk_live_" + strings.Repeat("7", 32)
	srv.Kill()
	for range 3 {
		req, _ := http.NewRequest("GET", "http://"+p.addr+"/x", nil)
		req.Header.Set("X-API-Key", secret)
		if r := do(t, req); r.code != 503 {
			t.Errorf("with Redis down: %d %q", r.code, r.raw)
		}
	}
	p.waitLog(t, "redis unreachable")
	p.waitLog(t, "check failed")
	p.stop(t)
	if strings.Contains(p.Log(), secret) || strings.Contains(p.Log(), "7777777777") {
		t.Errorf("the log shows the API key:\n%s", p.Log())
	}
}

// upstreamEcho is an upstream that answers with the forwarding headers it
// received.
func upstreamEcho(t *testing.T) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "xff=%q fwd=%q", r.Header.Get("X-Forwarded-For"), r.Header.Get("Forwarded"))
	}))
	t.Cleanup(up.Close)
	return up
}

func proxyGet(t *testing.T, addr string, hdr ...string) result {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/x", nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return do(t, req)
}

func TestServeUpstreamHardening(t *testing.T) {
	t.Parallel()
	up := upstreamEcho(t)

	t.Run("a header key longer than 1024 bytes is refused with 431", func(t *testing.T) {
		p := serve(t, nil, "--upstream", up.URL, "--admin-listen", "127.0.0.1:0", "--key", "header:X-API-Key")
		if r := proxyGet(t, p.addr, "X-API-Key", strings.Repeat("k", 900<<10)); r.code != 431 {
			t.Errorf("a 900 KB key: %d %.80q", r.code, r.raw)
		}
		if r := proxyGet(t, p.addr, "X-API-Key", strings.Repeat("k", 1024)); r.code != 200 {
			t.Errorf("a 1024-byte key: %d %.80q", r.code, r.raw)
		}
		p.stop(t)
	})

	t.Run("the upstream gets only the forwarding chain the trusted proxies vouch for", func(t *testing.T) {
		p := serve(t, nil, "--upstream", up.URL, "--admin-listen", "127.0.0.1:0")
		if r := proxyGet(t, p.addr, "X-Forwarded-For", "6.6.6.6"); r.raw != `xff="127.0.0.1" fwd=""` {
			t.Errorf("no trusted proxy, a client's own X-Forwarded-For: upstream saw %s", r.raw)
		}
		p.stop(t)
		p = serve(t, nil, "--upstream", up.URL, "--admin-listen", "127.0.0.1:0", "--trusted-proxies", "127.0.0.1", "--forwarded-header", "Forwarded")
		if r := proxyGet(t, p.addr, "Forwarded", "for=6.6.6.6, for=203.0.113.5"); r.raw != `xff="203.0.113.5, 127.0.0.1" fwd="for=203.0.113.5, for=127.0.0.1"` {
			t.Errorf("Forwarded from a trusted proxy: upstream saw %s", r.raw)
		}
		wantMetric(t, metrics(t, p.admin), `ratelimit_proxy_requests_total{code="200"} 1`)
		p.stop(t)
	})

	t.Run("IPv6 clients are keyed by their /64 unless --ipv6-prefix says otherwise", func(t *testing.T) {
		cfg := perMinute(t, 10)
		for _, tt := range []struct {
			args    []string
			allowed int
		}{
			{nil, 10},
			{[]string{"--ipv6-prefix", "128"}, 12},
		} {
			args := append([]string{"--upstream", up.URL, "--admin-listen", "127.0.0.1:0", "--trusted-proxies", "127.0.0.1", "--config", cfg}, tt.args...)
			p := serve(t, nil, args...)
			allowed := 0
			for i := 1; i <= 12; i++ {
				if r := proxyGet(t, p.addr, "X-Forwarded-For", fmt.Sprintf("2001:db8:1:2::%x", i)); r.code == 200 {
					allowed++
				}
			}
			if allowed != tt.allowed {
				t.Errorf("%v: %d of 12 addresses of one /64 allowed, want %d", tt.args, allowed, tt.allowed)
			}
			p.stop(t)
		}
	})

	t.Run("a slow body is cut off by --read-timeout", func(t *testing.T) {
		p := serve(t, nil, "--upstream", up.URL, "--admin-listen", "127.0.0.1:0", "--read-timeout", "300ms")
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		_, err = io.ReadAll(c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the connection of a stalled body was still open after 5 s")
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("a stalled body held its connection %v", took)
		}
		p.stop(t)
	})

	t.Run("--max-connections bounds the connections served at once", func(t *testing.T) {
		p := serve(t, nil, "--upstream", up.URL, "--admin-listen", "127.0.0.1:0", "--max-connections", "2")
		var idle []net.Conn
		for range 2 {
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				t.Fatal(err)
			}
			idle = append(idle, c)
		}
		fast := &http.Client{Timeout: 300 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
		if res, err := fast.Get("http://" + p.addr + "/x"); err == nil {
			res.Body.Close()
			t.Errorf("a third connection was served beside two open ones: %d", res.StatusCode)
		}
		idle[0].Close()
		defer idle[1].Close()
		slow := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		res, err := slow.Get("http://" + p.addr + "/x")
		if err != nil {
			t.Fatalf("after one closed: %v", err)
		}
		res.Body.Close()
		idle[1].Close()
		p.stop(t)
	})
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

func TestServeReadyz(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	url := "redis://" + srv.Addr()
	closed := serve(t, nil, "--redis", url, "--timeout", "300ms")
	open := serve(t, nil, "--redis", url, "--timeout", "300ms", "--outage", "local-fallback")
	for _, p := range []*proc{closed, open} {
		if r := get(t, "http://"+p.addr+"/readyz"); r.code != 200 {
			t.Errorf("Redis up: /readyz %d %s", r.code, r.raw)
		}
	}
	srv.Kill()
	waitCode := func(p *proc, path string, want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			post(t, p.addr, "/v1/acquire", `{"subject":"r"}`) // lets a check find the outage too
			r := get(t, "http://"+p.addr+path)
			if r.code == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d %s, want %d", path, r.code, r.raw, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Not ready before any check found the outage: /readyz asks Redis.
	if r := get(t, "http://"+closed.addr+"/readyz"); r.code != 503 {
		t.Errorf("Redis down, no check yet: /readyz %d %s", r.code, r.raw)
	}
	waitCode(closed, "/readyz", 503)
	closed.waitLog(t, "redis unreachable")
	waitCode(closed, "/healthz", 200)
	post(t, open.addr, "/v1/acquire", `{"subject":"r"}`)
	open.waitLog(t, "redis unreachable")
	waitCode(open, "/readyz", 200)
	closed.stop(t)
	open.stop(t)
}

// TestHostCheckRefusesRebinding runs serve without a token and checks that
// POST /v1/reset with Host: rebind.attacker.example (a page whose name was
// pointed at 127.0.0.1) is refused with 421 and a JSON error, while the
// listen address, localhost at its port and an --allowed-host name are
// answered; and that with a token the token decides instead.
func TestHostCheckRefusesRebinding(t *testing.T) {
	t.Parallel()
	p := serve(t, nil, "--allowed-host", "ratelimit.internal,rl.example:8443")
	_, port, _ := net.SplitHostPort(p.addr)
	reset := func(host string) result {
		t.Helper()
		req, err := http.NewRequest("POST", "http://"+p.addr+"/v1/reset", strings.NewReader(`{"subject":"alice"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		return do(t, req)
	}
	for _, tc := range []struct {
		host string
		code int
	}{
		{"rebind.attacker.example", 421},
		{"rebind.attacker.example:" + port, 421},
		{p.addr, 200},
		{"localhost:" + port, 200},
		{"ratelimit.internal", 200},
		{"rl.example:8443", 200},
		{"rl.example", 421},
	} {
		r := reset(tc.host)
		if r.code != tc.code || tc.code == 421 && !strings.Contains(fmt.Sprint(r.body["error"]), "--allowed-host") {
			t.Errorf("Host %q: %d %s, want %d", tc.host, r.code, r.raw, tc.code)
		}
	}
	p.stop(t)

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte("h0st-t0ken\n"), 0o600)
	p = serve(t, nil, "--token-file", tokenFile)
	req, _ := http.NewRequest("POST", "http://"+p.addr+"/v1/reset", strings.NewReader(`{"subject":"alice"}`))
	req.Host = "rebind.attacker.example"
	req.Header.Set("Content-Type", "application/json")
	if r := do(t, req); r.code != 401 {
		t.Errorf("with a token set, another Host and no token: %d %s, want 401", r.code, r.raw)
	}
	p.stop(t)
}

// TestMetricsNeedTheToken runs serve with --token-file and
// --metrics-token-file: /metrics answers 401 without a token, the series
// with either, and the metrics token opens nothing else; SIGHUP re-reads
// the metrics token.
func TestMetricsNeedTheToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokenFile, scrapeFile := filepath.Join(dir, "token"), filepath.Join(dir, "scrape")
	os.WriteFile(tokenFile, []byte("api-t0ken\n"), 0o600)
	os.WriteFile(scrapeFile, []byte("scrape-t0ken\n"), 0o600)
	p := serve(t, nil, "--token-file", tokenFile, "--metrics-token-file", scrapeFile)
	status := func(token string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+p.addr+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		r := do(t, req)
		if r.code == 200 && !strings.Contains(r.raw, "ratelimit_build_info") || r.code != 200 && strings.Contains(r.raw, "ratelimit_") {
			t.Errorf("token %q: %d %.200s", token, r.code, r.raw)
		}
		return r.code
	}
	for token, want := range map[string]int{"": 401, "wrong": 401, "api-t0ken": 200, "scrape-t0ken": 200} {
		if got := status(token); got != want {
			t.Errorf("/metrics with token %q: %d, want %d", token, got, want)
		}
	}
	if r := post(t, p.addr, "/v1/acquire", `{"subject":"a"}`, "Authorization", "Bearer scrape-t0ken"); r.code != 401 {
		t.Errorf("the metrics token opens /v1/acquire: %d", r.code)
	}
	os.WriteFile(scrapeFile, []byte("scrape-t0ken-2\n"), 0o600)
	p.cmd.Process.Signal(syscall.SIGHUP)
	p.waitLog(t, "file="+scrapeFile)
	if got, old := status("scrape-t0ken-2"), status("scrape-t0ken"); got != 200 || old != 401 {
		t.Errorf("after SIGHUP: the new metrics token %d, the old %d", got, old)
	}
	p.stop(t)
}
