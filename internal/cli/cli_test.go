package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/latency"
	"github.com/exactlimit/ratelimit/internal/version"
)

func TestRedisOptions(t *testing.T) {
	tests := []struct {
		name    string
		urls    []string
		cluster bool
		check   func(t *testing.T, addrs []string, user, pass string, db int, tls, cluster bool, desc string)
	}{
		{"one URL with a user, a password and a database", []string{"redis://app:s3cret@10.0.0.5:6380/2"}, false,
			func(t *testing.T, addrs []string, user, pass string, db int, tls, cluster bool, desc string) {
				if addrs[0] != "10.0.0.5:6380" || user != "app" || pass != "s3cret" || db != 2 || tls || cluster {
					t.Errorf("got %v %q %q %d tls=%v cluster=%v", addrs, user, pass, db, tls, cluster)
				}
				if desc != "redis 10.0.0.5:6380 db 2" {
					t.Errorf("description %q", desc)
				}
			}},
		{"rediss uses TLS", []string{"rediss://:pw@cache.example:6379"}, false,
			func(t *testing.T, addrs []string, user, pass string, db int, tls, cluster bool, desc string) {
				if !tls || pass != "pw" || desc != "redis (TLS) cache.example:6379" {
					t.Errorf("tls=%v pass=%q desc=%q", tls, pass, desc)
				}
			}},
		{"several URLs are a cluster", []string{"redis://a:7000", "redis://b:7001,redis://c:7002"}, false,
			func(t *testing.T, addrs []string, user, pass string, db int, tls, cluster bool, desc string) {
				if strings.Join(addrs, " ") != "a:7000 b:7001 c:7002" || !cluster || desc != "redis cluster a:7000,b:7001,c:7002" {
					t.Errorf("addrs %v cluster=%v desc %q", addrs, cluster, desc)
				}
			}},
		{"--cluster with one seed and addr parameters", []string{"redis://u:p@a:7000?addr=b:7001"}, true,
			func(t *testing.T, addrs []string, user, pass string, db int, tls, cluster bool, desc string) {
				if strings.Join(addrs, " ") != "a:7000 b:7001" || !cluster || user != "u" || pass != "p" {
					t.Errorf("addrs %v cluster=%v user %q pass %q", addrs, cluster, user, pass)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := redisFlags{cluster: tt.cluster}
			for _, u := range tt.urls {
				f.urls.Set(u)
			}
			o, desc, err := f.options()
			if err != nil {
				t.Fatal(err)
			}
			if o.MaxRetries != -1 || !o.ContextTimeoutEnabled || o.DialerRetries != 1 {
				t.Errorf("limiter settings missing: MaxRetries %d ContextTimeoutEnabled %v DialerRetries %d", o.MaxRetries, o.ContextTimeoutEnabled, o.DialerRetries)
			}
			if strings.Contains(desc, "s3cret") || strings.Contains(desc, "pw") {
				t.Errorf("description %q shows the password", desc)
			}
			tt.check(t, o.Addrs, o.Username, o.Password, o.DB, o.TLSConfig != nil, o.IsClusterMode, desc)
		})
	}
}

func TestRedisOptionErrors(t *testing.T) {
	for _, tt := range []struct {
		urls    []string
		cluster bool
		want    string
	}{
		{[]string{"localhost:6379"}, false, "want a URL such as redis://localhost:6379"},
		{[]string{"http://x:1"}, false, `scheme "http": want redis:// or rediss://`},
		{[]string{"unix:///tmp/redis.sock"}, false, `scheme "unix"`},
		{[]string{"redis://a:1/1", "redis://b:2/1"}, false, "Redis Cluster has only database 0"},
		{[]string{"redis://u:secret1@a:1", "redis://u:other@b:2"}, false, "same scheme, user and password"},
		{[]string{"redis://a:1", "rediss://b:2"}, false, "same scheme, user and password"},
		{[]string{"redis://u:secret1@a:1/x"}, false, "redis://u:xxxxx@a:1/x"},
		{nil, true, "--cluster needs --redis URL"},
	} {
		f := redisFlags{urls: tt.urls, cluster: tt.cluster}
		_, _, err := f.options()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want one containing %q", tt.urls, err, tt.want)
		}
		if err != nil && (strings.Contains(err.Error(), "secret1") || strings.Contains(err.Error(), ":other@")) {
			t.Errorf("%v: the error shows a password: %v", tt.urls, err)
		}
	}
	f := redisFlags{}
	if o, _, err := f.options(); o != nil || err != nil {
		t.Errorf("no --redis: %v %v, want the embedded store", o, err)
	}
}

func TestParseInterleaved(t *testing.T) {
	env := Env{Stdout: &strings.Builder{}, Stderr: &strings.Builder{}}
	for _, tt := range []struct {
		args    []string
		pos     string
		ns      string
		verbose bool
	}{
		{[]string{"--namespace", "x", "alice"}, "alice", "x", false},
		{[]string{"alice", "--namespace", "x", "-v"}, "alice", "x", true},
		{[]string{"-v", "alice", "bob", "--namespace=y"}, "alice bob", "y", true},
		{[]string{"--", "-v", "--namespace"}, "-v --namespace", "", false},
		{[]string{"a", "--", "-v"}, "a -v", "", false},
	} {
		fs := newFlagSet(env, "t", "", "")
		ns := fs.String("namespace", "", "")
		v := fs.Bool("v", false, "")
		pos, err := parse(fs, tt.args)
		if err != nil || strings.Join(pos, " ") != tt.pos || *ns != tt.ns || *v != tt.verbose {
			t.Errorf("%q: pos %q ns %q v %v err %v", tt.args, pos, *ns, *v, err)
		}
	}
}

func TestMainUsage(t *testing.T) {
	var stdout, stderr strings.Builder
	env := Env{Stdout: &stdout, Stderr: &stderr}
	if code := Main(context.Background(), nil, env); code != 2 || !strings.Contains(stderr.String(), "ratelimit serve") {
		t.Errorf("no arguments: exit %d, stderr %q", code, stderr.String())
	}
	stderr.Reset()
	if code := Main(context.Background(), []string{"help", "peek"}, env); code != 0 || !strings.Contains(stdout.String(), "Usage: ratelimit peek --redis URL [flags] SUBJECT") || !strings.Contains(stdout.String(), "  --namespace") {
		t.Errorf("help peek: exit %d, stdout %q", code, stdout.String())
	}
	if code := Main(context.Background(), []string{"serve", "extra"}, env); code != 2 || !strings.Contains(stderr.String(), `ratelimit serve: unexpected argument "extra"`) {
		t.Errorf("serve extra: exit %d, stderr %q", code, stderr.String())
	}
	stderr.Reset()
	for _, args := range [][]string{
		{"serve", "--fleet-size", "3"},
		{"serve", "--timeout", "0s"},
		{"serve", "--gc-percent", "0"},
		{"serve", "--body", "xml"},
		{"serve", "--upstream", "http://127.0.0.1:1", "--key", "cookie"},
		{"serve", "--upstream", "http://127.0.0.1:1", "--trusted-proxies", "10.0.0.0/33"},
		{"serve", "--upstream", "127.0.0.1:1"},
		{"bench", "--rate", "0"},
		{"bench", "--cost", "101"},
		{"bench", "--progress", "maybe"},
		{"envoy-bench", "--call-timeout", "0s"},
		{"envoy-bench", "--descriptors", "65"},
		{"reset", "--redis", "redis://127.0.0.1:1", "a", "b"},
		{"acquire", "--redis", "redis://127.0.0.1:1", "--namespace", "nope", "a"},
	} {
		stderr.Reset()
		if code := Main(context.Background(), args, env); code != 2 || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("%q: exit %d, stderr %q; want 2 and one line", args, code, stderr.String())
		}
	}
}

func TestBenchEmbedded(t *testing.T) {
	var stdout, stderr strings.Builder
	code := Main(context.Background(), []string{"bench", "--concurrency", "2", "--subjects", "20", "--rate", "5", "--progress", "on", "--duration", "450ms"},
		Env{Stdout: &stdout, Stderr: &stderr})
	out := stdout.String()
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out, stderr.String())
	}
	for _, want := range []string{"bench: memory (embedded", "policy (capacity 5, refill 5 per 1s)", "decisions   ", "/s\n", "allowed     ", "latency     p50 ", " p99 ", "subjects    20 of 20 touched"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(stderr.String(), "decisions") {
		t.Errorf("no progress on stderr with --progress on: %q", stderr.String())
	}
}

// TestHistogram holds the bench commands' bins to their resolution: a
// bin i holds [Upper(i-1), Upper(i)), at most 7% wide above 32 ns.
func TestHistogram(t *testing.T) {
	l := benchLatency
	for v := int64(0); v < 1<<40; v = v*5/4 + 1 {
		i := l.Bin(time.Duration(v))
		if up := int64(l.Upper(i)); up <= v || (i > 0 && int64(l.Upper(i-1)) > v) {
			t.Fatalf("value %d in bucket %d of upper bound %d (previous %d)", v, i, up, l.Upper(i-1))
		}
		if v >= 32 && float64(l.Upper(i))/float64(v) > 1.07 {
			t.Fatalf("value %d: bucket upper bound %d is more than 7%% above", v, l.Upper(i))
		}
	}
	h := latency.NewHistogram(l)
	for i := 1; i <= 100; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	if p50 := roundLatency(h.Quantile(0.5)); p50 < 50*time.Microsecond || p50 > 53*time.Microsecond {
		t.Errorf("p50 = %v, want about 50µs", p50)
	}
	if p99 := roundLatency(h.Quantile(0.99)); p99 < 99*time.Microsecond || p99 > 104*time.Microsecond {
		t.Errorf("p99 = %v, want about 99µs", p99)
	}
	if m := roundLatency(h.Max()); m < 100*time.Microsecond || m > 104*time.Microsecond {
		t.Errorf("max = %v", m)
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	os.WriteFile(path, []byte("  abc123\n"), 0o600)
	if tok, err := readToken(path, nil); tok != "abc123" || err != nil {
		t.Errorf("token file: %q %v", tok, err)
	}
	os.WriteFile(path, []byte("\n"), 0o600)
	if _, err := readToken(path, nil); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Errorf("empty token file: %v", err)
	}
	env := func(k string) string { return map[string]string{"RATELIMIT_TOKEN": "fromenv"}[k] }
	if tok, _ := readToken("", env); tok != "fromenv" {
		t.Errorf("RATELIMIT_TOKEN: %q", tok)
	}
}

func TestFormatDecision(t *testing.T) {
	l := ratelimit.PerSecond(10)
	if got := formatDecision(ratelimit.Decision{Allowed: true, Remaining: 9, ResetAfter: 100 * time.Millisecond, Limit: l}); got != "allowed: 9 of 10 tokens left, full in 100ms" {
		t.Errorf("allowed: %q", got)
	}
	if got := formatDecision(ratelimit.Decision{RetryAfter: 99700 * time.Microsecond, ResetAfter: time.Second, Limit: l}); got != "denied: 0 of 10 tokens left, retry in 99.7ms, full in 1s" {
		t.Errorf("denied: %q", got)
	}
	for _, name := range []string{"fail-closed", "FAIL-OPEN", "local-fallback", "return-error"} {
		if _, err := parseOutage(name); err != nil {
			t.Errorf("parseOutage(%q): %v", name, err)
		}
	}
}

func TestVersionIsTheRelease(t *testing.T) {
	var stdout, stderr strings.Builder
	env := Env{Stdout: &stdout, Stderr: &stderr}
	if code := Main(context.Background(), []string{"--version"}, env); code != 0 || !strings.HasPrefix(stdout.String(), "ratelimit "+version.Version+" ") {
		t.Errorf("--version: exit %d, stdout %q; want it to start with %q", code, stdout.String(), "ratelimit "+version.Version+" ")
	}
	if Version() != version.Version {
		t.Errorf("Version() = %q, want %q (ratelimit_build_info and /v1/config report it)", Version(), version.Version)
	}
}
