package main_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// binary is the ratelimit command, built once for the package's tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ratelimit-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "ratelimit")
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if p, err := exec.LookPath("go"); err == nil {
		gobin = p
	}
	args := append(append([]string{"build"}, buildFlags...), "-o", binary, ".")
	if out, err := exec.Command(gobin, args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running 'ratelimit serve'.
type proc struct {
	cmd      *exec.Cmd
	addr     string // the API's address
	admin    string // with --upstream
	grpc     string // with --grpc-listen
	addrFile string
	mu       sync.Mutex
	log      strings.Builder
	done     chan error
}

func (p *proc) Log() string { p.mu.Lock(); defer p.mu.Unlock(); return p.log.String() }

// serve starts the binary's serve on a free port with --addr-file and
// waits for the file, which holds the listeners' addresses. The process is
// killed at cleanup if still running.
func serve(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addrs.json")
	args = append([]string{"serve", "--listen", "127.0.0.1:0", "--addr-file", addrFile}, args...)
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, addrFile: addrFile, done: make(chan error, 1)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		p.done <- cmd.Wait()
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(addrFile); err == nil {
			var addrs struct{ HTTP, Admin, GRPC string }
			if err := json.Unmarshal(b, &addrs); err != nil || addrs.HTTP == "" {
				t.Fatalf("--addr-file holds %q (%v)", b, err)
			}
			p.addr, p.admin, p.grpc = addrs.HTTP, addrs.Admin, addrs.GRPC
			return p
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("serve exited before listening (%v):\n%s", err, p.Log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not write --addr-file within 10 s:\n%s", p.Log())
		}
	}
}

// waitLog waits until the log holds s.
func (p *proc) waitLog(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(p.Log(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("log lacks %q after 5 s:\n%s", s, p.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop sends SIGTERM and checks that the process exits 0 within 10 s,
// having removed its --addr-file.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Fatalf("serve exited with %v after SIGTERM:\n%s", err, p.Log())
		}
		if _, err := os.Stat(p.addrFile); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("--addr-file %s after shutdown: %v", p.addrFile, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("serve did not exit within 10 s of SIGTERM:\n%s", p.Log())
	}
	if !strings.Contains(p.Log(), "msg=stopped") {
		t.Errorf("no graceful shutdown in the log:\n%s", p.Log())
	}
}

type result struct {
	code   int
	header http.Header
	body   map[string]any
	raw    string
}

var client = &http.Client{Timeout: 5 * time.Second}

func post(t *testing.T, addr, path, body string, hdr ...string) result {
	t.Helper()
	req, err := http.NewRequest("POST", "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return do(t, req)
}

func get(t *testing.T, url string) result {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) result {
	t.Helper()
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	r := result{code: res.StatusCode, header: res.Header, raw: string(b)}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(b, &r.body); err != nil {
			t.Fatalf("%s %s: %d %q is not a JSON object", req.Method, req.URL, res.StatusCode, b)
		}
	}
	return r
}

// acquireUntilDenied acquires for subject until a 429, and returns the
// number allowed before it.
func acquireUntilDenied(t *testing.T, addr, subject string, hdr ...string) (int, result) {
	t.Helper()
	for i := 0; i < 100; i++ {
		r := post(t, addr, "/v1/acquire", fmt.Sprintf(`{"subject":%q}`, subject), hdr...)
		switch r.code {
		case 200:
			if r.header.Get("RateLimit-Policy") == "" || r.body["allowed"] != true {
				t.Fatalf("allowed response without its headers or decision: %v %s", r.header, r.raw)
			}
			continue
		case 429:
			return i, r
		default:
			t.Fatalf("acquire %d: %d %s", i, r.code, r.raw)
		}
	}
	t.Fatalf("no 429 after 100 acquires of %q", subject)
	return 0, result{}
}

func checkDenial(t *testing.T, r result) {
	t.Helper()
	if r.body["allowed"] != false || r.body["source"] != "store" || r.header.Get("Retry-After") == "" ||
		r.header.Get("X-RateLimit-Remaining") != "0" || !strings.Contains(r.header.Get("RateLimit"), ";r=0;") {
		t.Errorf("denial: %v %s", r.header, r.raw)
	}
}

// metrics returns /metrics of the service at addr; hdr are header names and
// values to send, such as the bearer token.
func metrics(t *testing.T, addr string, hdr ...string) string {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	r := do(t, req)
	if r.code != 200 {
		t.Fatalf("/metrics: %d", r.code)
	}
	return r.raw
}

func wantMetric(t *testing.T, body string, series ...string) {
	t.Helper()
	for _, s := range series {
		if !strings.Contains(body, s) {
			t.Errorf("/metrics lacks %q", s)
		}
	}
}

func TestServeEmbedded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ratelimit.yaml")
	os.WriteFile(cfg, []byte("namespaces:\n  - name: login\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"), 0o644)
	p := serve(t, nil, "--config", cfg)
	if !strings.Contains(p.Log(), `store="memory (embedded`) {
		t.Errorf("the embedded store is not the default:\n%s", p.Log())
	}

	n, denial := acquireUntilDenied(t, p.addr, "alice")
	// 10 per second, bursting to 10: at least the burst, and more only by
	// what refilled while the requests ran (the exact count is tested
	// with an injected clock in internal/server).
	if n < 10 {
		t.Errorf("%d acquires allowed before the 429, want at least the burst of 10", n)
	}
	checkDenial(t, denial)
	if denial.header.Get("RateLimit-Policy") != `"default";q=10;w=1` {
		t.Errorf("RateLimit-Policy = %q", denial.header.Get("RateLimit-Policy"))
	}

	// Bad input over HTTP: a clear 4xx, never a 500.
	for _, tt := range []struct {
		body string
		code int
		msg  string
	}{
		{`{"subject":`, 400, "malformed JSON"},
		{`{"subject":"` + strings.Repeat("x", 1<<20) + `"}`, 413, "request body larger than"},
		{`{"namespace":"login"}`, 400, "subject is required"},
		{`{"subject":"a","cost":0}`, 400, "cost must be at least 1"},
		{`{"subject":"a","cost":4,"namespace":"login"}`, 400, "exceeds the capacity 3"},
		{`{"subject":"a","namespace":"nope"}`, 404, `unknown namespace "nope"`},
	} {
		r := post(t, p.addr, "/v1/acquire", tt.body)
		if msg, _ := r.body["error"].(string); r.code != tt.code || !strings.Contains(msg, tt.msg) {
			t.Errorf("body %.40q: %d %q, want %d with %q", tt.body, r.code, msg, tt.code, tt.msg)
		}
	}

	// SIGHUP with a bad file keeps the old policies.
	os.WriteFile(cfg, []byte("namespaces:\n  - name: login\n    rate_limit: {unit: fortnight, requests_per_unit: 3}\n"), 0o644)
	p.cmd.Process.Signal(syscall.SIGHUP)
	p.waitLog(t, "config reload refused; keeping the previous policies")
	if !strings.Contains(p.Log(), `rate_limit.unit \"fortnight\"`) {
		t.Errorf("the refusal does not say why:\n%s", p.Log())
	}
	for i := range 3 {
		if r := post(t, p.addr, "/v1/acquire", `{"subject":"bob","namespace":"login"}`); r.code != 200 {
			t.Fatalf("login %d after a refused reload: %d %s", i, r.code, r.raw)
		}
	}
	if r := post(t, p.addr, "/v1/acquire", `{"subject":"bob","namespace":"login"}`); r.code != 429 {
		t.Fatalf("login after 3: %d", r.code)
	}
	// A good file is put in force; the bucket carries over.
	os.WriteFile(cfg, []byte("namespaces:\n  - name: login\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - name: search\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644)
	p.cmd.Process.Signal(syscall.SIGHUP)
	p.waitLog(t, "msg=\"config reloaded\"")
	if r := post(t, p.addr, "/v1/acquire", `{"subject":"bob","namespace":"login"}`); r.code != 429 {
		t.Errorf("a reload handed bob a fresh bucket: %d", r.code)
	}
	if r := post(t, p.addr, "/v1/acquire", `{"subject":"bob","namespace":"search"}`); r.code != 200 {
		t.Errorf("new namespace: %d %s", r.code, r.raw)
	}

	m := metrics(t, p.addr)
	wantMetric(t, m,
		`ratelimit_decisions_total{namespace="default",op="acquire",result="denied",source="store"} 1`,
		`ratelimit_decisions_total{namespace="login",op="acquire",result="allowed",source="store"} 3`,
		`ratelimit_decisions_total{namespace="login",op="acquire",result="denied",source="store"} 2`,
		`ratelimit_config_reloads_total{result="error"} 1`,
		`ratelimit_config_reloads_total{result="ok"} 1`,
		`ratelimit_decision_duration_seconds_bucket{namespace="default",source="store",le="+Inf"}`,
		"ratelimit_fallback_active 0",
		`ratelimit_http_requests_total{code="413",path="/v1/acquire"} 1`,
	)
	if r := get(t, "http://"+p.addr+"/healthz"); r.code != 200 || r.body["status"] != "ok" {
		t.Errorf("/healthz: %d %s", r.code, r.raw)
	}
	p.stop(t)
}

func TestServeToken(t *testing.T) {
	t.Parallel()
	p := serve(t, []string{"RATELIMIT_TOKEN=t0k3n"})
	if r := post(t, p.addr, "/v1/acquire", `{"subject":"a"}`); r.code != 401 {
		t.Errorf("without the token: %d", r.code)
	}
	if r := post(t, p.addr, "/v1/acquire", `{"subject":"a"}`, "Authorization", "Bearer t0k3n"); r.code != 200 {
		t.Errorf("with the token: %d %s", r.code, r.raw)
	}
	p.stop(t)
}

func TestServeUpstream(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from upstream, %s", r.Header.Get("X-Forwarded-For"))
	}))
	defer up.Close()
	p := serve(t, nil, "--upstream", up.URL, "--admin-listen", "127.0.0.1:0", "--key", "header:X-API-Key")
	allowed, denied := 0, false
	for i := 0; i < 100; i++ {
		req, _ := http.NewRequest("GET", "http://"+p.addr+"/anything", nil)
		req.Header.Set("X-API-Key", "k1")
		r := do(t, req)
		if r.code == 429 {
			if r.header.Get("Retry-After") != "1" || r.header.Get("RateLimit") == "" {
				t.Errorf("proxy denial: %v %q", r.header, r.raw)
			}
			denied = true
			break
		}
		if r.code != 200 || !strings.HasPrefix(r.raw, "hello from upstream, 127.0.0.1") {
			t.Fatalf("proxied request %d: %d %q", i, r.code, r.raw)
		}
		allowed++
	}
	if !denied {
		t.Fatalf("no 429 after %d proxied requests", allowed)
	}
	if allowed < 10 {
		t.Errorf("%d proxied requests allowed before the 429, want at least the burst of 10", allowed)
	}
	if r := get(t, "http://"+p.addr+"/anything"); r.code != 400 || !strings.Contains(r.raw, "missing X-Api-Key header") {
		t.Errorf("without the key header: %d %q", r.code, r.raw)
	}
	wantMetric(t, metrics(t, p.admin), `ratelimit_decisions_total{namespace="default",op="acquire",result="denied",source="store"} 1`)
	p.stop(t)
}

// run runs the binary to completion and returns its stdout, stderr and exit
// status.
func run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	return runEnv(t, nil, args...)
}

func TestCommandLineErrors(t *testing.T) {
	t.Parallel()
	// The command line is tested in depth in package internal/cli; these
	// check that the binary turns it into one line and an exit status.
	for _, tt := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"frobnicate"}, 2, `ratelimit: unknown command "frobnicate"`},
		{[]string{"serve", "--outage", "sometimes"}, 2, `ratelimit serve: --outage "sometimes": want fail-closed`},
		{[]string{"serve", "--bogus"}, 2, "ratelimit serve: flag provided but not defined: -bogus"},
		{[]string{"serve", "--listen", "127.0.0.1:99999"}, 1, "ratelimit serve: --listen:"},
		{[]string{"serve", "--config", "/nonexistent.yaml"}, 1, "ratelimit serve: config: open /nonexistent.yaml"},
		{[]string{"peek", "alice"}, 2, "ratelimit peek: --redis URL is required"},
		{[]string{"acquire", "--redis", "redis://127.0.0.1:1", "--timeout", "300ms", "a"}, 1, "ratelimit acquire: redis 127.0.0.1:1:"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := run(t, tt.args...)
			if code != tt.code || !strings.Contains(stderr, tt.msg) {
				t.Errorf("exit %d, stderr %q; want exit %d with %q", code, stderr, tt.code, tt.msg)
			}
			if strings.Count(strings.TrimSpace(stderr), "\n") != 0 || stdout != "" {
				t.Errorf("the error is not one line on stderr alone: stdout %q stderr %q", stdout, stderr)
			}
		})
	}
	for _, args := range [][]string{{"--help"}, {"serve", "--help"}, {"acquire", "-h"}, {"bench", "--help"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := run(t, args...)
			if code != 0 || !strings.Contains(stdout, "Usage") || stderr != "" {
				t.Errorf("exit %d, stdout %.60q, stderr %q", code, stdout, stderr)
			}
		})
	}
}

// perMinute writes a config whose default namespace allows n per minute
// (10 in most tests, so that a denied bucket stays denied while a test looks
// at it).
func perMinute(t *testing.T, n ...int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ratelimit.yaml")
	rate := 10
	if len(n) > 0 {
		rate = n[0]
	}
	doc := fmt.Sprintf("namespaces:\n  - name: default\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", rate)
	testkit.WriteFile(t, path, doc)
	return path
}

func TestServeRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	url := "redis://" + srv.Addr()
	cfg := perMinute(t)
	p := serve(t, nil, "--redis", url, "--config", cfg, "--outage", "fail-closed", "--timeout", "300ms")
	if !strings.Contains(p.Log(), "store=\"redis "+srv.Addr()+"\"") {
		t.Errorf("log does not name the Redis store:\n%s", p.Log())
	}
	_, denial := acquireUntilDenied(t, p.addr, "carol")
	checkDenial(t, denial)

	// The shell tool sees the service's bucket.
	stdout, stderr, code := run(t, "peek", "--redis", url, "--config", cfg, "carol")
	if code != 0 || !strings.HasPrefix(stdout, "denied: 0 of 10 tokens left") {
		t.Errorf("peek: exit %d %q %q", code, stdout, stderr)
	}
	if _, stderr, code := run(t, "reset", "--redis", url, "carol"); code != 0 {
		t.Errorf("reset: exit %d %q", code, stderr)
	}
	stdout, _, _ = run(t, "acquire", "--json", "--redis", url, "--config", cfg, "carol", "--cost", "3")
	var d map[string]any
	if json.Unmarshal([]byte(stdout), &d) != nil || d["allowed"] != true || d["remaining"] != 7.0 {
		t.Errorf("acquire after reset: %q", stdout)
	}
	if r := post(t, p.addr, "/v1/peek", `{"subject":"carol"}`); r.body["remaining"] != 7.0 {
		t.Errorf("the service does not see the tool's acquire: %s", r.raw)
	}

	// Redis down: fail closed with 503 at once, then back on the shared
	// buckets after a restart.
	srv.Kill()
	r := post(t, p.addr, "/v1/acquire", `{"subject":"dave"}`)
	if r.code != 503 || r.body["source"] != "fail-closed" {
		t.Errorf("with Redis down: %d %s", r.code, r.raw)
	}
	wantMetric(t, metrics(t, p.addr), "ratelimit_fallback_active 1",
		`ratelimit_decisions_total{namespace="default",op="acquire",result="denied",source="fail-closed"} 1`,
		`ratelimit_primary_up{partition=""} 0`,
		`ratelimit_primary_transitions_total{partition="",state="down"} 1`)
	srv.Restart(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := post(t, p.addr, "/v1/acquire", `{"subject":"dave"}`)
		if r.code == 200 && r.body["source"] == "store" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after Redis restarted: %d %s\n%s", r.code, r.raw, p.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.waitLog(t, "redis unreachable; serving with the outage behaviour")
	p.waitLog(t, "redis answers again")
	// The log line follows the metrics: both come from the observers of
	// the change, in that order.
	wantMetric(t, metrics(t, p.addr), "ratelimit_fallback_active 0",
		`ratelimit_primary_up{partition=""} 1`,
		`ratelimit_primary_transitions_total{partition="",state="up"} 1`)

	stdout, stderr, code = run(t, "bench", "--redis", url, "--duration", "300ms", "--concurrency", "4", "--subjects", "50")
	if code != 0 || !strings.Contains(stdout, "decisions   ") || !strings.Contains(stdout, "subjects    50 of 50 touched") {
		t.Errorf("bench against Redis: exit %d\n%s\n%s", code, stdout, stderr)
	}
	p.stop(t)
}

// startCluster starts a Redis Cluster of masters masters with replicas
// replicas each and returns it with the --redis flags naming every node.
func startCluster(t *testing.T, masters, replicas int) (*redistest.Cluster, []string) {
	t.Helper()
	c := redistest.StartCluster(t, masters, replicas)
	var args []string
	for _, a := range c.Addrs() {
		args = append(args, "--redis", "redis://"+a)
	}
	return c, args
}

func TestServeRedisCluster(t *testing.T) {
	t.Parallel()
	c, args := startCluster(t, 3, 0)
	cfg := perMinute(t)
	p := serve(t, nil, append(args, "--config", cfg)...)
	if !strings.Contains(p.Log(), "store=\"redis cluster ") {
		t.Errorf("log does not name the cluster:\n%s", p.Log())
	}
	masters := map[string]bool{}
	for i := range 12 {
		subject := fmt.Sprintf("user-%d", i)
		_, denial := acquireUntilDenied(t, p.addr, subject)
		checkDenial(t, denial)
		key := fmt.Sprintf("7:default:%s", subject)
		masters[c.MasterOf(redistest.SlotOf(key)).Addr()] = true
	}
	if len(masters) < 2 {
		t.Errorf("the 12 subjects all hashed to one master: the test does not exercise the cluster")
	}
	// One seed and --cluster reach the same buckets.
	stdout, stderr, code := run(t, "peek", "--cluster", "--redis", "redis://"+c.Addrs()[0], "--config", cfg, "user-3")
	if code != 0 || !strings.HasPrefix(stdout, "denied: 0 of 10") {
		t.Errorf("peek via one seed: exit %d %q %q", code, stdout, stderr)
	}
	wantMetric(t, metrics(t, p.addr), `ratelimit_decisions_total{namespace="default",op="acquire",result="denied",source="store"} 12`)
	p.stop(t)
}

// TestServeRedisClusterFailover: a master of the service's cluster is
// killed; its subjects are decided locally until the failover and by the
// promoted replica after it, while another master's subject stays on the
// store throughout. The store timeout is 300 ms in the timing tier
// (RATELIMIT_TIMING=1), which a check of a live master on a loaded machine
// can exceed; 2 s by default, which only a dead master's check runs into.
func TestServeRedisClusterFailover(t *testing.T) {
	t.Parallel()
	timeout := "2s"
	if testkit.Timed(t) {
		timeout = "300ms"
	}
	c, args := startCluster(t, 3, 1)
	args = append(args, "--outage", "local-fallback", "--timeout", timeout, "--config", perMinute(t, 100000))
	p := serve(t, nil, args...)
	victim := c.Masters()[0]
	var onVictim, elsewhere string
	for i := 0; onVictim == "" || elsewhere == ""; i++ {
		s := fmt.Sprint("u", i)
		if c.MasterOf(redistest.SlotOf("7:default:"+s)) == victim {
			onVictim = s
		} else {
			elsewhere = s
		}
	}
	source := func(subject string) string {
		t.Helper()
		r := post(t, p.addr, "/v1/acquire", fmt.Sprintf(`{"subject":%q}`, subject))
		if r.code != 200 {
			t.Fatalf("acquire %s: %d %s", subject, r.code, r.raw)
		}
		return r.body["source"].(string)
	}
	// until polls subject until its decisions come from want.
	until := func(subject, want string, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for source(subject) != want {
			if time.Since(start) > within {
				t.Fatalf("%s: no decision from %q within %v\n%s", subject, want, within, p.Log())
			}
			if got := source(elsewhere); got != "store" {
				t.Fatalf("a subject of a live master was decided by %q while another master was down", got)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return time.Since(start)
	}
	if source(onVictim) != "store" || source(elsewhere) != "store" {
		t.Fatal("decisions before the failover are not the store's")
	}
	victim.Kill()
	detect := until(onVictim, "local", 5*time.Second)
	c.WaitForFailover(t, victim, 20*time.Second)
	back := until(onVictim, "store", 5*time.Second)
	t.Logf("master killed: its subjects on the local buckets after %v; back on the promoted replica %v after the failover", detect, back)
	// The dead master's partition no longer holds the store in an outage.
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(metrics(t, p.addr), "ratelimit_fallback_active 0") {
		if time.Now().After(deadline) {
			t.Fatalf("ratelimit_fallback_active still 1 five seconds after the failover:\n%s", p.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.waitLog(t, "redis answers again")
	// Several probe intervals later the dead master's partition is still
	// forgotten, not marked down again by a probe of its address.
	time.Sleep(10 * fallback.DefaultProbeInterval)
	wantMetric(t, metrics(t, p.addr),
		fmt.Sprintf("ratelimit_primary_transitions_total{partition=%q,state=\"down\"} 1\n", victim.Addr()),
		fmt.Sprintf("ratelimit_primary_up{partition=%q} 1\n", victim.Addr()),
		"ratelimit_fallback_active 0\n")
	p.stop(t)
}
