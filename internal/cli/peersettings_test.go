package cli

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit/internal/testkit"
)

// What serve does with one of the peer's settings (docs/envoy.md, "The peer's
// settings").
const (
	honoured = "honoured"
	refused  = "refused"
	ignored  = "ignored"
)

// peerSettings is every setting of envoyproxy/ratelimit's
// src/settings/settings.go (the envconfig tags of its Settings, in its
// order), what serve does with it, and for a refused one a value that serve
// must refuse.
var peerSettings = []struct {
	name, does, refuse string
}{
	{"HOST", honoured, ""},
	{"PORT", honoured, ""},
	{"DEBUG_HOST", honoured, ""},
	{"DEBUG_PORT", honoured, ""},
	{"GRPC_UDS", refused, "/tmp/ratelimit.sock"},
	{"GRPC_HOST", honoured, ""},
	{"GRPC_PORT", honoured, ""},
	{"GRPC_MAX_CONNECTION_AGE", ignored, ""},
	{"GRPC_MAX_CONNECTION_AGE_GRACE", ignored, ""},
	{"GRPC_SERVER_USE_TLS", honoured, ""},
	{"GRPC_SERVER_TLS_CERT", honoured, ""},
	{"GRPC_SERVER_TLS_KEY", honoured, ""},
	{"GRPC_CLIENT_TLS_CACERT", honoured, ""},
	{"GRPC_CLIENT_TLS_SAN", refused, "envoy.example"},
	{"LOG_LEVEL", honoured, ""},
	{"LOG_FORMAT", honoured, ""},
	{"CONFIG_TYPE", refused, "GRPC_XDS_SOTW"},
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", ignored, ""},
	{"CONFIG_GRPC_XDS_NODE_ID", ignored, ""},
	{"CONFIG_GRPC_XDS_NODE_METADATA", ignored, ""},
	{"CONFIG_GRPC_XDS_SERVER_URL", ignored, ""},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", ignored, ""},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ignored, ""},
	{"CONFIG_GRPC_XDS_SERVER_USE_TLS", ignored, ""},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", ignored, ""},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", ignored, ""},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ignored, ""},
	{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", ignored, ""},
	{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", ignored, ""},
	{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", ignored, ""},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", ignored, ""},
	{"XDS_CLIENT_BACKOFF_JITTER", ignored, ""},
	{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", ignored, ""},
	{"USE_DOG_STATSD", refused, "true"},
	{"USE_DOG_STATSD_MOGRIFIERS", ignored, ""},
	{"USE_STATSD", honoured, ""},
	{"STATSD_HOST", honoured, ""},
	{"STATSD_PORT", honoured, ""},
	{"EXTRA_TAGS", honoured, ""},
	{"STATS_FLUSH_INTERVAL", honoured, ""},
	{"DISABLE_STATS", honoured, ""},
	{"USE_PROMETHEUS", honoured, ""},
	{"PROMETHEUS_ADDR", honoured, ""},
	{"PROMETHEUS_PATH", honoured, ""},
	{"PROMETHEUS_MAPPER_YAML", ignored, ""},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", honoured, ""},
	{"RUNTIME_ROOT", honoured, ""},
	{"RUNTIME_SUBDIRECTORY", honoured, ""},
	{"RUNTIME_APPDIRECTORY", honoured, ""},
	{"RUNTIME_IGNOREDOTFILES", honoured, ""},
	{"RUNTIME_WATCH_ROOT", honoured, ""},
	{"EXPIRATION_JITTER_MAX_SECONDS", ignored, ""},
	{"LOCAL_CACHE_SIZE_IN_BYTES", ignored, ""},
	{"NEAR_LIMIT_RATIO", honoured, ""},
	{"CACHE_KEY_PREFIX", honoured, ""},
	{"BACKEND_TYPE", refused, "memcache"},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", ignored, ""},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", honoured, ""},
	{"LIMIT_LIMIT_HEADER", honoured, ""},
	{"LIMIT_REMAINING_HEADER", honoured, ""},
	{"LIMIT_RESET_HEADER", honoured, ""},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", ignored, ""},
	{"REDIS_SOCKET_TYPE", honoured, ""},
	{"REDIS_TYPE", honoured, ""},
	{"REDIS_URL", honoured, ""},
	{"REDIS_POOL_SIZE", honoured, ""},
	{"REDIS_AUTH", honoured, ""},
	{"REDIS_TLS", honoured, ""},
	{"REDIS_TLS_CLIENT_CERT", honoured, ""},
	{"REDIS_TLS_CLIENT_KEY", honoured, ""},
	{"REDIS_TLS_CACERT", honoured, ""},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", honoured, ""},
	{"REDIS_PIPELINE_WINDOW", ignored, ""},
	{"REDIS_PIPELINE_LIMIT", ignored, ""},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", ignored, ""},
	{"REDIS_PERSECOND", refused, "true"},
	{"REDIS_PERSECOND_SOCKET_TYPE", ignored, ""},
	{"REDIS_PERSECOND_TYPE", ignored, ""},
	{"REDIS_PERSECOND_URL", ignored, ""},
	{"REDIS_PERSECOND_POOL_SIZE", ignored, ""},
	{"REDIS_PERSECOND_AUTH", ignored, ""},
	{"REDIS_PERSECOND_TLS", ignored, ""},
	{"REDIS_SENTINEL_AUTH", honoured, ""},
	{"REDIS_PERSECOND_SENTINEL_AUTH", ignored, ""},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", ignored, ""},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", ignored, ""},
	{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", ignored, ""},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", ignored, ""},
	{"REDIS_TIMEOUT", honoured, ""},
	{"REDIS_PERSECOND_TIMEOUT", ignored, ""},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", refused, "ERROR"},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", ignored, ""},
	{"REDIS_STARTUP_INITIAL_INTERVAL", ignored, ""},
	{"REDIS_STARTUP_MAX_INTERVAL", ignored, ""},
	{"REDIS_STARTUP_MAX_ELAPSED_TIME", ignored, ""},
	{"MEMCACHE_HOST_PORT", ignored, ""},
	{"MEMCACHE_MAX_IDLE_CONNS", ignored, ""},
	{"MEMCACHE_SRV", ignored, ""},
	{"MEMCACHE_SRV_REFRESH", ignored, ""},
	{"MEMCACHE_TLS", ignored, ""},
	{"MEMCACHE_TLS_CLIENT_CERT", ignored, ""},
	{"MEMCACHE_TLS_CLIENT_KEY", ignored, ""},
	{"MEMCACHE_TLS_CACERT", ignored, ""},
	{"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", ignored, ""},
	{"SHADOW_MODE", honoured, ""},
	{"QUOTA_MODE", refused, "true"},
	{"RESPONSE_DYNAMIC_METADATA", honoured, ""},
	{"MERGE_DOMAIN_CONFIG", honoured, ""},
	{"TRACING_ENABLED", ignored, ""},
	{"TRACING_SERVICE_NAME", ignored, ""},
	{"TRACING_SERVICE_NAMESPACE", ignored, ""},
	{"TRACING_SERVICE_INSTANCE_ID", ignored, ""},
	{"TRACING_EXPORTER_PROTOCOL", ignored, ""},
	{"TRACING_SAMPLING_RATE", ignored, ""},
}

// settingsTable returns the rows of docs/envoy.md's table of the peer's
// settings by the names they hold (a row names several).
func settingsTable(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "## The peer's settings")
	if start < 0 {
		t.Fatal(`docs/envoy.md has no "## The peer's settings"`)
	}
	section := doc[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	name := regexp.MustCompile("`([A-Z][A-Z0-9_]+)(=[^`]*)?`")
	rows := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.SplitN(line, "|", 3)
		if len(cells) < 3 || cells[0] != "" {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(cells[1], -1) {
			rows[m[1]] = cells[2]
		}
	}
	return rows
}

// TestPeerSettingsAreAllAccountedFor: docs/envoy.md's table names every
// setting of the peer, and no other, and says what serve does with it as
// peerSettings does; serve refuses each refused one, naming it, and starts
// with every ignored one set.
func TestPeerSettingsAreAllAccountedFor(t *testing.T) {
	rows := settingsTable(t)
	known := map[string]bool{}
	for _, s := range peerSettings {
		known[s.name] = true
		row, ok := rows[s.name]
		switch {
		case !ok:
			t.Errorf("docs/envoy.md's table of the peer's settings does not name %s", s.name)
		case !strings.Contains(row, s.does):
			t.Errorf("docs/envoy.md: the row of %s does not say %s: %s", s.name, s.does, row)
		}
	}
	for name := range rows {
		if !known[name] {
			t.Errorf("docs/envoy.md's table names %s, which is no setting of the peer", name)
		}
	}

	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	writeEnvoyConfig(t, cfg, "5")
	args := []string{"serve", "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--envoy-config", cfg}
	for _, s := range peerSettings {
		if s.does != refused {
			continue
		}
		t.Run(s.name+"="+s.refuse+" is refused", func(t *testing.T) {
			var stdout, stderr testkit.Buffer
			env := Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return map[string]string{s.name: s.refuse}[k] }}
			if code := Main(context.Background(), args, env); code != 2 || !strings.Contains(stderr.String(), s.name) {
				t.Errorf("got exit %d and %q, want 2 and a message naming %s", code, stderr.String(), s.name)
			}
		})
	}
	t.Run("every ignored setting set: served", func(t *testing.T) {
		vars := map[string]string{}
		for _, s := range peerSettings {
			if s.does != ignored {
				continue
			}
			vars[s.name] = map[peerKind]string{peerBoolean: "true", peerInteger: "1", peerFloat: "0.5", peerDuration: "1s"}[peerTyped[s.name]]
			if _, typed := peerTyped[s.name]; !typed {
				vars[s.name] = "x"
			}
		}
		e := peerEnvoy(t, vars, "5")
		if got := admitted(t, 6, "ignored", e); got != 5 {
			t.Errorf("admitted %d of a rule of 5, want 5", got)
		}
	})
}

// TestServeLoggingFromThePeersSettings: LOG_LEVEL (the peer's logrus levels)
// and LOG_FORMAT set serve's logging where --log-level and --log-format do
// not; a flag wins, and the log says so.
func TestServeLoggingFromThePeersSettings(t *testing.T) {
	for _, tc := range []struct {
		name      string
		vars      map[string]string
		args      []string
		has, lack string
	}{
		{"json", map[string]string{"LOG_FORMAT": "json"}, nil, `"msg":"serving envoy rate limit service"`, "level=INFO"},
		{"the peer's WARNING", map[string]string{"LOG_LEVEL": "WARNING"}, nil, "", "level=INFO"},
		{"the peer's trace is debug", map[string]string{"LOG_LEVEL": "trace"}, nil, "level=INFO", ""},
		{"a flag wins", map[string]string{"LOG_LEVEL": "error", "LOG_FORMAT": "json"}, []string{"--log-level", "info", "--log-format", "text"},
			`level=WARN msg="logging: a flag wins over the peer's setting" flag=--log-level overrides=LOG_LEVEL`, `"msg"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := peerEnvoy(t, tc.vars, "5", tc.args...)
			log := e.stderr.String()
			if !strings.Contains(log, tc.has) || (tc.lack != "" && strings.Contains(log, tc.lack)) {
				t.Errorf("the log should hold %q and not %q:\n%s", tc.has, tc.lack, log)
			}
		})
	}
	for _, v := range []map[string]string{{"LOG_LEVEL": "loud"}, {"LOG_FORMAT": "logfmt"}} {
		var stdout, stderr testkit.Buffer
		env := Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return v[k] }}
		if code := Main(context.Background(), []string{"serve", "--listen", "127.0.0.1:0"}, env); code != 2 || !strings.Contains(stderr.String(), "LOG_") {
			t.Errorf("%v: got exit %d and %q, want 2 naming the setting", v, code, stderr.String())
		}
	}
}
