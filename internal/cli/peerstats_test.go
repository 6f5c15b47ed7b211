package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/testkit"
)

// detailedEdge is a rule of 2 a minute per remote_address whose statistics
// key holds the address (detailed_metric), which the peer rewrites.
const detailedEdge = "domain: edge\ndescriptors:\n  - key: remote_address\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"

// peerRuntimeOf lays out RUNTIME_ROOT/ratelimit/config/edge.yaml holding
// yaml and returns the root.
func peerRuntimeOf(t *testing.T, yaml string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "ratelimit", "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), yaml)
	return root
}

// askThrice sends three calls for 10.0.0.1 and fails the test on an error.
func askThrice(t *testing.T, e *envoyServe) {
	t.Helper()
	for range 3 {
		if _, err := e.ask(t, "10.0.0.1"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestServeSendsThePeersStatsOverStatsd: with USE_STATSD=true, the peer's
// statistics reach a statsd server (a UDP socket of the test's) under the
// peer's names, its rule's key rewritten as the peer rewrites it; three
// calls on a rule of 2 are 3 hits, 2 within the limit, 1 over it, 1 near it,
// and three lines of the timer response_time, each a whole number of
// milliseconds (|ms), as the peer's.
func TestServeSendsThePeersStatsOverStatsd(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	port := strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port)
	e := servePeerEnv(t, loopback(map[string]string{"RUNTIME_ROOT": peerRuntimeOf(t, detailedEdge), "RUNTIME_SUBDIRECTORY": "ratelimit",
		"USE_STATSD": "true", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": port, "STATSD_PROTOCOL": "udp", "STATS_FLUSH_INTERVAL": "20ms"}))
	askThrice(t, e)

	const rule = "ratelimit.service.rate_limit.edge.remote_address_10_0_0_1."
	want := map[string]uint64{
		rule + "total_hits": 3, rule + "within_limit": 2, rule + "over_limit": 1, rule + "near_limit": 1,
		"ratelimit.service.config_load_success":           1,
		"ratelimit_server.ShouldRateLimit.total_requests": 3,
		"ratelimit_server.ShouldRateLimit.response_time":  3, // lines, not milliseconds
	}
	got := map[string]uint64{}
	var lines []string
	buf := make([]byte, 64<<10)
	for deadline := time.Now().Add(5 * time.Second); ; {
		done := true
		for name, n := range want {
			if got[name] != n {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("statsd counts %v, want %v; lines:\n%s", got, want, strings.Join(lines, "\n"))
		}
		pc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(strings.TrimSpace(string(buf[:n])), "\n") {
			lines = append(lines, line)
			name, rest, _ := strings.Cut(line, ":")
			value, kind, _ := strings.Cut(rest, "|")
			v, err := strconv.ParseUint(value, 10, 64)
			switch {
			case name == "ratelimit_server.ShouldRateLimit.response_time":
				if kind != "ms" || err != nil {
					t.Errorf("statsd line %q: want a timer of whole milliseconds (|ms)", line)
				}
				got[name]++
			case kind != "c":
				t.Errorf("statsd line %q: want a counter (|c)", line)
			default:
				got[name] += v
			}
		}
	}
	for name := range got {
		if strings.Contains(name, "10.0.0.1") {
			t.Errorf("statsd name %q keeps the address's dots, which the peer rewrites", name)
		}
	}
}

// TestServeServesThePeersPrometheusNames: with USE_PROMETHEUS=true (and
// USE_STATSD=false, as the peer requires), PROMETHEUS_ADDR serves the names
// and labels of the peer's mapping, scraped over HTTP, the histogram of
// response_time among them, in seconds (its help says so).
func TestServeServesThePeersPrometheusNames(t *testing.T) {
	e := servePeerEnv(t, loopback(map[string]string{"RUNTIME_ROOT": peerRuntimeOf(t, detailedEdge), "RUNTIME_SUBDIRECTORY": "ratelimit",
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:0", "PROMETHEUS_PATH": "/peer-metrics", "STATS_FLUSH_INTERVAL": "20ms"}))
	askThrice(t, e)
	scrapeUntil(t, "http://"+e.prometheus+"/peer-metrics",
		`ratelimit_service_rate_limit_total_hits{domain="edge",key1="remote_address_10_0_0_1",key2=""} 3`,
		`ratelimit_service_rate_limit_within_limit{domain="edge",key1="remote_address_10_0_0_1",key2=""} 2`,
		`ratelimit_service_rate_limit_over_limit{domain="edge",key1="remote_address_10_0_0_1",key2=""} 1`,
		`ratelimit_service_rate_limit_near_limit{domain="edge",key1="remote_address_10_0_0_1",key2=""} 1`,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 3`,
		"ratelimit_service_config_load_success 1",
		"# TYPE ratelimit_service_response_time_seconds histogram",
		`ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="+Inf"} 3`,
		`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 3`,
		"# HELP ratelimit_service_response_time_seconds The duration of ShouldRateLimit calls, by gRPC method, in seconds (envoyproxy/ratelimit's response_time, timed in whole milliseconds).")
}

// TestServePrometheusResponseTimeAsMilliseconds: with the peer's
// PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS=true the histogram keeps its name
// and observes milliseconds, as its help says.
func TestServePrometheusResponseTimeAsMilliseconds(t *testing.T) {
	e := servePeerEnv(t, loopback(map[string]string{"RUNTIME_ROOT": peerRuntimeOf(t, detailedEdge), "RUNTIME_SUBDIRECTORY": "ratelimit",
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:0", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "true"}))
	askThrice(t, e)
	scrapeUntil(t, "http://"+e.prometheus+"/metrics",
		`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 3`,
		"# HELP ratelimit_service_response_time_seconds The duration of ShouldRateLimit calls, by gRPC method, in milliseconds despite the name (PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS, as envoyproxy/ratelimit's).")
}

// scrapeUntil scrapes url until its body holds every line of want (a line
// of its own), failing the test after 5 s.
func scrapeUntil(t *testing.T, url string, want ...string) {
	t.Helper()
	var body string
	for deadline := time.Now().Add(5 * time.Second); ; {
		res, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		body = string(b)
		missing := false
		for _, w := range want {
			if !strings.Contains(body, w+"\n") {
				missing = true
			}
		}
		if !missing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the scrape lacks some of %q:\n%s", want, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServeRefusesABadPeerStatsSetting: what the peer refuses (two sinks,
// which USE_STATSD's default makes of USE_PROMETHEUS=true alone) and what
// this service does not do stop serve with the setting named.
func TestServeRefusesABadPeerStatsSetting(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{"USE_PROMETHEUS": "true", "USE_STATSD": ""}, "USE_STATSD and USE_PROMETHEUS are both true"},
		{map[string]string{"USE_DOG_STATSD": "true"}, "USE_DOG_STATSD=true is not supported"},
		{map[string]string{"USE_STATSD": "true", "STATSD_PROTOCOL": "sctp"}, `STATSD_PROTOCOL="sctp": want tcp or udp`},
		{map[string]string{"USE_STATSD": "true", "STATS_FLUSH_INTERVAL": "0s"}, `STATS_FLUSH_INTERVAL="0s": want a positive duration`},
		{map[string]string{"USE_STATSD": "true", "EXTRA_TAGS": "novalue"}, `EXTRA_TAGS="novalue": want key:value`},
		{map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_MAPPER_YAML": "/etc/mapper.yaml"}, "PROMETHEUS_MAPPER_YAML is not supported"},
		{map[string]string{"USE_PROMETHEUS": "true", "EXTRA_TAGS": "team:edge"}, "EXTRA_TAGS with USE_PROMETHEUS=true is not supported"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			vars := loopback(map[string]string{"RUNTIME_ROOT": peerRuntimeOf(t, detailedEdge), "RUNTIME_SUBDIRECTORY": "ratelimit"})
			for k, v := range tc.vars {
				vars[k] = v
			}
			var stdout, stderr testkit.Buffer
			env := Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return vars[k] }}
			if code := Main(context.Background(), []string{"serve"}, env); code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("got exit %d and %q, want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
}
