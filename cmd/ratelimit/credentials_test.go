package main_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/redistest"
)

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
