package main_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

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
