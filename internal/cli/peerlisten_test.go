package cli

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/exactlimit/ratelimit/internal/testkit"
)

// TestReadPeerListen: where the peer's settings put the listeners and the
// config, their defaults, and a flag winning over a setting.
func TestReadPeerListen(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		vars                    map[string]string
		set                     []string
		http, grpc, debug, conf string
		won                     string
	}{
		{name: "nothing set: none of the peer's listeners", vars: map[string]string{}},
		{name: "HOST and PORT alone move the HTTP listener only", vars: map[string]string{"PORT": "9000"}, http: "0.0.0.0:9000"},
		{name: "RUNTIME_ROOT alone: the peer's container, with its defaults",
			vars: map[string]string{"RUNTIME_ROOT": "/data"},
			http: "0.0.0.0:8080", grpc: "0.0.0.0:8081", debug: "0.0.0.0:6070", conf: "/data/config"},
		{name: "GRPC_PORT alone: the config at the peer's default root",
			vars: map[string]string{"GRPC_PORT": "9081"},
			http: "0.0.0.0:8080", grpc: "0.0.0.0:9081", debug: "0.0.0.0:6070", conf: "/srv/runtime_data/current/config"},
		{name: "every setting",
			vars: map[string]string{"HOST": "127.0.0.1", "PORT": "1", "GRPC_HOST": "::1", "GRPC_PORT": "2", "DEBUG_HOST": "localhost", "DEBUG_PORT": "3",
				"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_APPDIRECTORY": "rules"},
			http: "127.0.0.1:1", grpc: "[::1]:2", debug: "localhost:3", conf: "/data/ratelimit/rules"},
		{name: "flags win over the settings",
			vars:  map[string]string{"HOST": "127.0.0.1", "GRPC_PORT": "2", "RUNTIME_ROOT": "/data"},
			set:   []string{"listen", "grpc-listen", "envoy-config"},
			debug: "0.0.0.0:6070", won: "--listen HOST, --grpc-listen GRPC_PORT, --envoy-config RUNTIME_ROOT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := map[string]bool{}
			for _, s := range tc.set {
				set[s] = true
			}
			p, err := readPeerListen(func(k string) string { return tc.vars[k] }, set)
			if err != nil {
				t.Fatal(err)
			}
			var won []string
			for _, w := range p.won {
				won = append(won, w[0]+" "+w[1])
			}
			if p.http != tc.http || p.grpc != tc.grpc || p.debug != tc.debug || p.config != tc.conf || strings.Join(won, ", ") != tc.won {
				t.Errorf("got http %q grpc %q debug %q config %q won %q,\nwant http %q grpc %q debug %q config %q won %q",
					p.http, p.grpc, p.debug, p.config, strings.Join(won, ", "), tc.http, tc.grpc, tc.debug, tc.conf, tc.won)
			}
		})
	}
	for _, bad := range []string{"PORT=70000", "GRPC_PORT=-1", "DEBUG_PORT=http"} {
		k, v, _ := strings.Cut(bad, "=")
		_, err := readPeerListen(func(name string) string {
			if name == k {
				return v
			}
			return ""
		}, nil)
		if err == nil || !strings.Contains(err.Error(), k+`="`+v+`": want a port number`) {
			t.Errorf("%s: got %v, want a usage error naming it", bad, err)
		}
	}
}

// peerRuntime lays out the peer's runtime directory under a temporary
// root: ROOT/ratelimit/config/edge.yaml with a rule of rpu a minute, and
// returns the root.
func peerRuntime(t *testing.T, rpu string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "ratelimit", "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeEnvoyConfig(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), rpu)
	return root
}

// servePeerEnv starts serve with the peer's environment vars and args (no
// --listen, --grpc-listen nor --envoy-config), and returns it with a gRPC
// client of its Envoy service.
func servePeerEnv(t *testing.T, vars map[string]string, args ...string) *envoyServe {
	t.Helper()
	s := startServe(t, vars, args...)
	if s.svc.Addrs().GRPC == nil {
		t.Fatalf("serve with the peer's settings runs no Envoy service: %s", s.stderr.String())
	}
	e := &envoyServe{http: s.svc.Addrs().HTTP.String(), stderr: s.stderr, done: s.done}
	if a := s.svc.Addrs().Debug; a != nil {
		e.debug = a.String()
	}
	if a := s.svc.Addrs().Prometheus; a != nil {
		e.prometheus = a.String()
	}
	conn, err := grpc.NewClient(s.svc.Addrs().GRPC.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.conn, e.client = conn, rlsv3.NewRateLimitServiceClient(conn)
	return e
}

// loopback are the peer's listen settings on 127.0.0.1, each port picked
// free, and USE_STATSD=false (the peer's default, true, sends to
// localhost:8125: peerstats_test.go tests it with a statsd server of its
// own), with vars.
func loopback(vars map[string]string) map[string]string {
	out := map[string]string{"HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0",
		"USE_STATSD": "false"}
	for k, v := range vars {
		out[k] = v
	}
	return out
}

// TestServeFromThePeersEnvironment: with no flags, serve takes the gRPC and
// HTTP listeners from GRPC_HOST:GRPC_PORT and HOST:PORT, the debug one from
// DEBUG_HOST:DEBUG_PORT and the config from
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, and answers there.
func TestServeFromThePeersEnvironment(t *testing.T) {
	root := peerRuntime(t, "2")
	e := servePeerEnv(t, loopback(map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit"}))
	if !strings.HasPrefix(e.http, "127.0.0.1:") {
		t.Errorf("the HTTP listener is on %s, want HOST=127.0.0.1", e.http)
	}
	var codes []string
	for range 3 {
		r, err := e.ask(t, "10.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, r.OverallCode.String())
	}
	if got, want := strings.Join(codes, " "), "OK OK OVER_LIMIT"; got != want {
		t.Errorf("three calls on a rule of 2 a minute: %s, want %s", got, want)
	}
	res, err := http.Get("http://" + e.http + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(body) != "OK" {
		t.Errorf("GET /healthcheck on HOST:PORT: %d %q", res.StatusCode, body)
	}
	if e.debug == "" {
		t.Fatal("no debug listener on DEBUG_HOST:DEBUG_PORT")
	}
	res, err = http.Get("http://" + e.debug + "/rlconfig")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if want := "edge.remote_address: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n"; string(body) != want {
		t.Errorf("GET /rlconfig on DEBUG_HOST:DEBUG_PORT: %q, want %q", body, want)
	}
	want := filepath.Join(root, "ratelimit", "config")
	if !strings.Contains(e.stderr.String(), "envoy_config="+want) {
		t.Errorf("the log does not name the config directory %s:\n%s", want, e.stderr.String())
	}
}

// TestServePeerRuntimeWatch: RUNTIME_WATCH_ROOT=true (the peer's default)
// reloads when RUNTIME_ROOT, a link, is swapped to another directory, as
// the peer does; RUNTIME_WATCH_ROOT=false reloads on a file written in the
// config directory, as the peer does too.
func TestServePeerRuntimeWatch(t *testing.T) {
	t.Run("RUNTIME_WATCH_ROOT=true: the root link swapped", func(t *testing.T) {
		dir := t.TempDir()
		v1, v2 := peerRuntime(t, "1"), peerRuntime(t, "3")
		link := filepath.Join(dir, "current")
		if err := os.Symlink(v1, link); err != nil {
			t.Fatal(err)
		}
		e := servePeerEnv(t, loopback(map[string]string{"RUNTIME_ROOT": link, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "true"}),
			"--envoy-config-watch", "20ms")
		next := filepath.Join(dir, "next")
		if err := os.Symlink(v2, next); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(next, link); err != nil {
			t.Fatal(err)
		}
		waitLog(t, e.stderr, e.done, regexp.MustCompile(`msg="envoy config reloaded"`))
		e.wantRequestsPerUnit(t, "a", 3, "after the swap")
	})
	t.Run("RUNTIME_WATCH_ROOT=false: a file written in the directory", func(t *testing.T) {
		root := peerRuntime(t, "1")
		e := servePeerEnv(t, loopback(map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false"}),
			"--envoy-config-watch", "20ms")
		writeEnvoyConfig(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), "4")
		waitLog(t, e.stderr, e.done, regexp.MustCompile(`msg="envoy config reloaded"`))
		e.wantRequestsPerUnit(t, "a", 4, "after the edit")
	})
}

// TestServeFlagsWinOverThePeersListeners: --listen, --grpc-listen and
// --envoy-config win over HOST:PORT, GRPC_HOST:GRPC_PORT and RUNTIME_ROOT,
// each with a warning naming both; the settings' values are never used
// (their ports would not be free, their root does not exist).
func TestServeFlagsWinOverThePeersListeners(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	writeEnvoyConfig(t, cfg, "5")
	vars := map[string]string{"HOST": "192.0.2.1", "PORT": "1", "GRPC_HOST": "192.0.2.1", "GRPC_PORT": "2", "RUNTIME_ROOT": "/nonexistent",
		"DEBUG_HOST": "192.0.2.1", "DEBUG_PORT": "3", "USE_STATSD": "false"}
	e := startServeEnvoy(t, vars, "--envoy-config", cfg, "--debug-listen", "127.0.0.1:0")
	if _, err := e.ask(t, "a"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`level=WARN msg="a flag wins over the peer's setting" flag=--listen overrides=HOST`,
		`level=WARN msg="a flag wins over the peer's setting" flag=--grpc-listen overrides=GRPC_HOST`,
		`level=WARN msg="a flag wins over the peer's setting" flag=--envoy-config overrides=RUNTIME_ROOT`,
		`level=WARN msg="a flag wins over the peer's setting" flag=--debug-listen overrides=DEBUG_HOST`,
	} {
		if !strings.Contains(e.stderr.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, e.stderr.String())
		}
	}
}

// TestServeRefusesABadPeerListenSetting: a port that is not one, and a
// runtime directory that does not exist, stop serve with exit status 2 and
// the variable or the directory named.
func TestServeRefusesABadPeerListenSetting(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{"GRPC_PORT": "65536"}, `GRPC_PORT="65536": want a port number from 0 to 65535`},
		{map[string]string{"PORT": "http"}, `PORT="http": want a whole number`},
		{loopback(map[string]string{"RUNTIME_ROOT": "/nonexistent/runtime"}), "/nonexistent/runtime/config"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			var stdout, stderr testkit.Buffer
			env := Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return tc.vars[k] }}
			code := Main(context.Background(), []string{"serve"}, env)
			if code == 0 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("got exit %d and %q, want an error and %q", code, stderr.String(), tc.want)
			}
		})
	}
}

// TestServeThePeersShippedConfigs: serve started with the peer's
// environment alone loads the peer's own example and integration-test
// configs from RUNTIME_ROOT, lists every rule on the debug listener's
// /rlconfig as the peer does, warns of the rules with quota_mode, and
// decides the integration config's rule of 1 a minute.
func TestServeThePeersShippedConfigs(t *testing.T) {
	for _, tc := range []struct {
		dir   string
		rules int
		warn  string
	}{
		{"examples", 19, `msg="envoy rules with quota_mode: true are decided as ordinary rules`},
		{"integration", 11, ""},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			root := t.TempDir()
			src := filepath.Join("..", "envoyrls", "testdata", "peer", tc.dir)
			files, err := filepath.Glob(filepath.Join(src, "*.yaml"))
			if err != nil || len(files) == 0 {
				t.Fatalf("the peer's configs in %s: %v %v", src, files, err)
			}
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				testkit.WriteFile(t, filepath.Join(root, "ratelimit", "config", filepath.Base(f)), string(b))
			}
			e := servePeerEnv(t, loopback(map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false"}))
			res, body := testkit.Do(t, testkit.Request(t, "GET", "http://"+e.debug+"/rlconfig", nil))
			if n := strings.Count(body, "\n"); res.StatusCode != http.StatusOK || n != tc.rules {
				t.Errorf("GET /rlconfig: %d, %d rules, want %d:\n%s", res.StatusCode, n, tc.rules, body)
			}
			if tc.warn != "" && !strings.Contains(e.stderr.String(), tc.warn) {
				t.Errorf("the log lacks %s:\n%s", tc.warn, e.stderr.String())
			}
			if tc.dir != "integration" {
				return
			}
			var codes []string
			for range 2 {
				r, err := rlsv3.NewRateLimitServiceClient(e.conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
					Domain:      "basic",
					Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "one_per_minute"}}}},
				})
				if err != nil {
					t.Fatal(err)
				}
				codes = append(codes, r.OverallCode.String())
			}
			if got := strings.Join(codes, " "); got != "OK OVER_LIMIT" {
				t.Errorf("two calls on basic's rule of 1 a minute: %s, want OK OVER_LIMIT", got)
			}
		})
	}
}
