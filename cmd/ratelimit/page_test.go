package main_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/redistest"
)

// chromiumPath is Debian's chromium, which scripts/test.sh installs.
const chromiumPath = "/usr/bin/chromium"

// needBrowser skips the test under go test -short, which starts no
// browser, and fails it when Debian's chromium is missing. Every test that
// starts Chromium calls it first; chromium and openDevtools call it too.
func needBrowser(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: starts no browser; run without -short")
	}
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("%s not found (%v): the operator page tests need Debian's chromium; run scripts/test.sh, which installs it", chromiumPath, err)
	}
}

// chromium runs headless Chromium on url with args added, giving the page's
// scripts 5 s of virtual time (they fetch /v1/stats at once and every 2 s),
// and returns what it printed.
func chromium(t *testing.T, url string, args ...string) string {
	t.Helper()
	needBrowser(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=5000"}
	cmd := exec.CommandContext(ctx, chromiumPath, append(append(base, args...), url)...)
	// Its own process group, so that a timeout ends its helper processes
	// too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", url, err, stderr.String())
	}
	return stdout.String()
}

// page is the DOM of the operator page after its scripts ran.
type page string

func openPage(t *testing.T, url string) page {
	t.Helper()
	dom := chromium(t, url, "--dump-dom")
	if !strings.Contains(dom, `id="status"`) {
		t.Fatalf("%s: not the operator page:\n%s", url, dom)
	}
	return page(dom)
}

var tagRE = regexp.MustCompile(`<[^>]*>`)

// text returns the text of the element with the id, without its tags, up
// to the first closing dd, p or section tag.
func (p page) text(t *testing.T, id string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)id="` + id + `"[^>]*>(.*?)</(dd|p|section)>`).FindStringSubmatch(string(p))
	if m == nil {
		t.Fatalf("no element %q on the page:\n%s", id, p)
	}
	return strings.TrimSpace(tagRE.ReplaceAllString(m[1], ""))
}

// field returns the figure of field in namespace ns, as the page shows it.
func (p page) field(t *testing.T, ns, field string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)data-ns="` + regexp.QuoteMeta(ns) + `".*?</article>`).FindString(string(p))
	if m == "" {
		t.Fatalf("namespace %q is not on the page:\n%s", ns, p)
	}
	f := regexp.MustCompile(`data-field="` + field + `">([^<]*)<`).FindStringSubmatch(m)
	if f == nil {
		t.Fatalf("namespace %q shows no %s:\n%s", ns, field, m)
	}
	return f[1]
}

// count returns the page's figure of field in namespace ns as a number.
func (p page) count(t *testing.T, ns, field string) int {
	t.Helper()
	s := p.field(t, ns, field)
	n, err := strconv.Atoi(strings.ReplaceAll(s, ",", ""))
	if err != nil {
		t.Fatalf("namespace %q: %s is %q, not a count", ns, field, s)
	}
	return n
}

// acquires sums ratelimit_decisions_total of the acquires of namespace ns
// with result (allowed or denied) over every source, as /metrics reports
// them.
func acquires(t *testing.T, body, ns, result string) int {
	t.Helper()
	prefix := fmt.Sprintf(`ratelimit_decisions_total{namespace=%q,op="acquire",result=%q,`, ns, result)
	sum := 0
	for line := range strings.Lines(body) {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		f := strings.Fields(line)
		n, err := strconv.Atoi(f[len(f)-1])
		if err != nil {
			t.Fatalf("/metrics: %q", line)
		}
		sum += n
	}
	return sum
}

// TestOperatorPage opens the operator page of 'ratelimit serve' over Redis
// in headless Chromium, and checks that what it renders (after its script
// fetched /v1/stats with the token) is what /metrics reports, that the store
// and a refused reload are shown, and that Redis stopped shows as an outage
// with the behaviour in force. It saves a screenshot of each state in the
// test's artifact directory (go test -artifacts keeps them).
func TestOperatorPage(t *testing.T) {
	needBrowser(t)
	t.Parallel()
	srv := redistest.StartServer(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ratelimit.yaml")
	// Per minute: how fast the checks below run changes none of their
	// decisions (alice and bob are denied, carol is not).
	os.WriteFile(cfg, []byte("namespaces:\n  - name: default\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"+
		"  - name: login\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"), 0o644)
	const token = "op-page-t0ken"
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	p := serve(t, nil, "--redis", "redis://"+srv.Addr(), "--config", cfg, "--token-file", tokenFile,
		"--show-top-denied", "--outage", "fail-closed", "--timeout", "300ms")
	auth := []string{"Authorization", "Bearer " + token}

	for range 15 {
		post(t, p.addr, "/v1/acquire", `{"subject":"alice"}`, auth...)
	}
	for range 3 {
		post(t, p.addr, "/v1/acquire", `{"subject":"carol"}`, auth...)
	}
	for range 8 {
		post(t, p.addr, "/v1/acquire", `{"namespace":"login","subject":"bob"}`, auth...)
	}
	// A bad file: the reload is refused and the policies stay.
	os.WriteFile(cfg, []byte("namespaces: [\n"), 0o644)
	p.cmd.Process.Signal(syscall.SIGHUP)
	p.waitLog(t, "config reload refused")
	m := metrics(t, p.addr, auth...)
	base := "http://" + p.addr + "/"
	art := t.ArtifactDir()

	t.Run("without the token the page asks for it and shows no figure", func(t *testing.T) {
		pg := openPage(t, base)
		if !strings.Contains(string(pg), `<form id="token-form" class="card">`) || strings.Contains(string(pg), "data-ns=") {
			t.Errorf("the token form is not shown, or figures are:\n%s", pg)
		}
		if s := pg.text(t, "status"); !strings.Contains(s, "wants its API token") {
			t.Errorf("status %q", s)
		}
	})

	t.Run("with the token the page shows what /metrics reports", func(t *testing.T) {
		pg := openPage(t, base+"#token="+token)
		for _, ns := range []string{"default", "login"} {
			for _, result := range []string{"allowed", "denied"} {
				want := acquires(t, m, ns, result)
				if got := pg.count(t, ns, result); got != want || want == 0 {
					t.Errorf("%s %s: the page shows %d, /metrics %d", ns, result, got, want)
				}
			}
		}
		if got := pg.field(t, "login", "policy"); got != "5 per 1m, burst 5" {
			t.Errorf("login's policy: %q", got)
		}
		for id, want := range map[string]string{
			"store-kind": "Redis",
			"store-name": "redis " + srv.Addr(),
			"primary":    "✓ up",
			"outage":     "would apply fail-closed",
			"reload":     "⚠ refused",
		} {
			if got := pg.text(t, id); !strings.Contains(got, want) {
				t.Errorf("%s: %q, want it to hold %q", id, got, want)
			}
		}
		if s := pg.text(t, "status"); !strings.HasPrefix(s, "Updated ") {
			t.Errorf("status %q", s)
		}
		top := pg.text(t, "top-table")
		if !strings.Contains(top, "alice") || !strings.Contains(top, "bob") || strings.Contains(top, "carol") {
			t.Errorf("most denied: %q, want alice and bob (carol was never denied)", top)
		}
		chromium(t, base+"#token="+token, "--window-size=1200,900", "--screenshot="+filepath.Join(art, "operator-page.png"))
	})

	t.Run("with Redis stopped the page shows the outage", func(t *testing.T) {
		srv.Kill()
		p.waitLog(t, "redis unreachable")
		if r := post(t, p.addr, "/v1/acquire", `{"subject":"dave"}`, auth...); r.code != 503 || r.body["source"] != "fail-closed" {
			t.Errorf("acquire with Redis down: %d %s", r.code, r.raw)
		}
		m := metrics(t, p.addr, auth...)
		pg := openPage(t, base+"#token="+token)
		if got := pg.text(t, "primary"); !strings.Contains(got, "✗ DOWN, outage in progress") || !strings.Contains(got, "Cause: ") {
			t.Errorf("primary: %q", got)
		}
		if got := pg.text(t, "outage"); !strings.Contains(got, "in force: fail-closed") {
			t.Errorf("outage: %q", got)
		}
		if got, want := pg.count(t, "default", "denied"), acquires(t, m, "default", "denied"); got != want {
			t.Errorf("denied with the fail-closed one: the page shows %d, /metrics %d", got, want)
		}
		chromium(t, base+"#token="+token, "--window-size=1200,900", "--screenshot="+filepath.Join(art, "operator-page-outage.png"))
		t.Logf("screenshots in %s", art)
	})
	p.stop(t)
}

// stats returns the /v1/stats report of the service at addr.
func stats(t *testing.T, addr string) map[string]any {
	t.Helper()
	r := get(t, "http://"+addr+"/v1/stats")
	if r.code != 200 || r.body == nil {
		t.Fatalf("/v1/stats: %d %s", r.code, r.raw)
	}
	return r.body
}

// TestOperatorPageOnAdminListen checks that with --upstream the page and
// /v1/stats are on --admin-listen, counting the proxied requests, while /
// of --listen is the upstream's.
func TestOperatorPageOnAdminListen(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "upstream root")
	}))
	defer up.Close()
	p := serve(t, nil, "--upstream", up.URL, "--admin-listen", "127.0.0.1:0")
	if r := get(t, "http://"+p.addr+"/"); r.code != 200 || r.raw != "upstream root" {
		t.Errorf("/ of --listen: %d %q, want the upstream's", r.code, r.raw)
	}
	if r := get(t, "http://"+p.admin+"/"); r.code != 200 || !strings.Contains(r.raw, `<script src="page.js"`) {
		t.Errorf("/ of --admin-listen: %d %q, want the page", r.code, r.raw)
	}
	ns := stats(t, p.admin)["namespaces"].([]any)[0].(map[string]any)
	if ns["name"] != "default" || ns["allowed"] != 1.0 {
		t.Errorf("/v1/stats of --admin-listen: %v, want the proxied request allowed in default", ns)
	}
	p.stop(t)
}

// TestStatsCluster checks /v1/stats over Redis Cluster: the masters listed
// from the client's layout, all up, then the killed one down while the
// others stay up.
func TestStatsCluster(t *testing.T) {
	t.Parallel()
	c, args := startCluster(t, 3, 0)
	p := serve(t, nil, append(args, "--outage", "local-fallback", "--timeout", "300ms")...)
	post(t, p.addr, "/v1/acquire", `{"subject":"first"}`) // the client learns the layout

	mastersOf := func(r map[string]any) map[string]bool {
		up := map[string]bool{}
		ms, _ := r["store"].(map[string]any)["masters"].([]any)
		for _, m := range ms {
			m := m.(map[string]any)
			up[m["addr"].(string)] = m["up"].(bool)
		}
		return up
	}
	r := stats(t, p.addr)
	if st := r["store"].(map[string]any); st["kind"] != "cluster" || st["primary_up"] != true || st["outage"] != "local-fallback" {
		t.Errorf("store: %v", st)
	}
	got := mastersOf(r)
	masters := c.Masters()
	for _, m := range masters {
		if !got[m.Addr()] {
			t.Errorf("master %s not listed up: %v", m.Addr(), got)
		}
	}
	if len(got) != 3 {
		t.Errorf("masters %v, want the 3 of the cluster", got)
	}

	dead := masters[0]
	// A check on one of its keys marks it down.
	subject := ""
	for i := 0; subject == "" && i < 1000; i++ {
		if s := fmt.Sprintf("user-%d", i); c.MasterOf(redistest.SlotOf("7:default:"+s)) == dead {
			subject = s
		}
	}
	if subject == "" {
		t.Fatalf("no subject of 1000 on master %s", dead.Addr())
	}
	dead.Kill()
	post(t, p.addr, "/v1/acquire", fmt.Sprintf(`{"subject":%q}`, subject))
	p.waitLog(t, "master="+dead.Addr())
	r = stats(t, p.addr)
	got = mastersOf(r)
	if r["store"].(map[string]any)["primary_up"] != false || got[dead.Addr()] || len(got) != 3 {
		t.Errorf("with %s killed: primary_up %v, masters %v", dead.Addr(), r["store"].(map[string]any)["primary_up"], got)
	}
	for _, m := range masters[1:] {
		if !got[m.Addr()] {
			t.Errorf("master %s not up while another is down: %v", m.Addr(), got)
		}
	}
	p.stop(t)
}
