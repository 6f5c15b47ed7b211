package cli

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/exactlimit/ratelimit/internal/version"
)

// envName is the environment variable of a flag: RATELIMIT_ and the flag's
// name in upper snake case (--redis-password-file: RATELIMIT_REDIS_PASSWORD_FILE).
func envName(flagName string) string {
	return "RATELIMIT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets each flag of fs that the command line did not set from its
// environment variable (envName), when that is not empty: flags win over the
// environment. A bad value is a usage error naming the variable.
func applyEnv(fs *flagSet) error {
	if fs.getenv == nil {
		return nil
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] {
			return
		}
		v := fs.getenv(envName(f.Name))
		if v == "" {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = usagef("%s: invalid value for --%s: %v", envName(f.Name), f.Name, e)
		}
	})
	return err
}

// setFlags returns the names of the flags set on the command line or from
// the environment.
func setFlags(fs *flagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// Version returns the release version of this build (internal/version), as
// ratelimit_build_info and GET /v1/config report it.
func Version() string { return version.Version }

// revision returns the VCS revision this binary was built from, shortened to
// 12 digits with "+dirty" when the work tree had changes, or "" when the build
// does not record one (go install ...@version records none).
func revision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev == "" {
		return ""
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	return rev + dirty
}

// printVersion writes "ratelimit VERSION [REVISION] GOVERSION OS/ARCH".
func printVersion(w io.Writer) {
	v := Version()
	if rev := revision(); rev != "" {
		v += " " + rev
	}
	fmt.Fprintf(w, "ratelimit %s %s %s/%s\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// newLogger returns the logger of --log-format (text or json) and
// --log-level (debug, info, warn or error).
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", format)
}

// peerEnv is the part of envoyproxy/ratelimit's environment settings that
// the Envoy service takes (see docs/envoy.md for the whole list).
type peerEnv struct {
	shadowMode      bool // SHADOW_MODE
	mergeDomains    bool // MERGE_DOMAIN_CONFIG
	ignoreDotFiles  bool // RUNTIME_IGNOREDOTFILES
	dynamicMetadata bool // RESPONSE_DYNAMIC_METADATA
	tls             peerTLS
	nearLimitRatio  float64 // NEAR_LIMIT_RATIO, 0 when unset
	keyPrefix       string  // CACHE_KEY_PREFIX
}

// peerTLS is the peer's gRPC listener TLS: GRPC_SERVER_USE_TLS with
// GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY, and GRPC_CLIENT_TLS_CACERT
// for mutual TLS. The paths are PEM files. The --grpc-tls-* flags combine
// with it field by field (grpcTLS.withPeer).
type peerTLS struct {
	use                 bool
	cert, key, clientCA string
}

// readPeerEnv reads the peer's settings of the Envoy service through
// getenv. A boolean that is not one (strconv.ParseBool) is a usage error
// naming the variable; checkPeerSettings refuses the settings the service
// does not take whose values would change answers (QUOTA_MODE=true).
func readPeerEnv(getenv func(string) string) (peerEnv, error) {
	var p peerEnv
	var err error
	flag := func(name string, dst *bool) {
		v := strings.TrimSpace(getenv(name))
		if v == "" || err != nil {
			return
		}
		b, e := strconv.ParseBool(v)
		if e != nil {
			err = usagef("%s=%q: want true or false", name, v)
			return
		}
		*dst = b
	}
	flag("SHADOW_MODE", &p.shadowMode)
	flag("MERGE_DOMAIN_CONFIG", &p.mergeDomains)
	flag("RUNTIME_IGNOREDOTFILES", &p.ignoreDotFiles)
	flag("RESPONSE_DYNAMIC_METADATA", &p.dynamicMetadata)
	flag("GRPC_SERVER_USE_TLS", &p.tls.use)
	if err != nil {
		return p, err
	}
	// checkPeerSettings has refused a ratio that is not in (0, 1].
	p.nearLimitRatio, _ = strconv.ParseFloat(strings.TrimSpace(getenv("NEAR_LIMIT_RATIO")), 64)
	p.keyPrefix = getenv("CACHE_KEY_PREFIX")
	if p.tls.use {
		// The certificate and key may come from the --grpc-tls-* flags
		// instead: grpcTLS.withPeer checks the combination.
		p.tls.cert, p.tls.key, p.tls.clientCA = getenv("GRPC_SERVER_TLS_CERT"), getenv("GRPC_SERVER_TLS_KEY"), getenv("GRPC_CLIENT_TLS_CACERT")
	}
	return p, nil
}

// peerKind is the type of one of the peer's settings that is not a string.
type peerKind int

const (
	peerBoolean peerKind = iota
	peerInteger
	peerFloat
	peerDuration
)

// peerTyped are the peer's settings (its src/settings/settings.go) whose
// values are booleans, numbers or durations, as it parses them. serve checks
// every one that is set, read or not, as the peer refuses to start on a
// value it cannot parse.
var peerTyped = map[string]peerKind{
	"GRPC_SERVER_USE_TLS": peerBoolean, "FORCE_START_WITHOUT_INITIAL_CONFIG": peerBoolean,
	"CONFIG_GRPC_XDS_SERVER_USE_TLS": peerBoolean, "XDS_CLIENT_BACKOFF_JITTER": peerBoolean,
	"USE_DOG_STATSD": peerBoolean, "USE_STATSD": peerBoolean, "DISABLE_STATS": peerBoolean,
	"USE_PROMETHEUS": peerBoolean, "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": peerBoolean,
	"RUNTIME_IGNOREDOTFILES": peerBoolean, "RUNTIME_WATCH_ROOT": peerBoolean,
	"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": peerBoolean, "LIMIT_RESPONSE_HEADERS_ENABLED": peerBoolean,
	"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": peerBoolean, "REDIS_TLS": peerBoolean,
	"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": peerBoolean, "REDIS_PERSECOND": peerBoolean,
	"REDIS_PERSECOND_TLS": peerBoolean, "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": peerBoolean,
	"MEMCACHE_TLS": peerBoolean, "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION": peerBoolean,
	"SHADOW_MODE": peerBoolean, "QUOTA_MODE": peerBoolean, "RESPONSE_DYNAMIC_METADATA": peerBoolean,
	"MERGE_DOMAIN_CONFIG": peerBoolean, "TRACING_ENABLED": peerBoolean,

	"PORT": peerInteger, "DEBUG_PORT": peerInteger, "GRPC_PORT": peerInteger, "STATSD_PORT": peerInteger,
	"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": peerInteger, "EXPIRATION_JITTER_MAX_SECONDS": peerInteger,
	"LOCAL_CACHE_SIZE_IN_BYTES": peerInteger, "REDIS_POOL_SIZE": peerInteger, "REDIS_PIPELINE_LIMIT": peerInteger,
	"REDIS_CLUSTER_PIPELINE_PARALLELISM": peerInteger, "REDIS_PERSECOND_POOL_SIZE": peerInteger,
	"REDIS_PERSECOND_PIPELINE_LIMIT": peerInteger, "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM": peerInteger,
	"MEMCACHE_MAX_IDLE_CONNS": peerInteger,

	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR": peerFloat, "NEAR_LIMIT_RATIO": peerFloat, "TRACING_SAMPLING_RATE": peerFloat,

	"GRPC_MAX_CONNECTION_AGE": peerDuration, "GRPC_MAX_CONNECTION_AGE_GRACE": peerDuration,
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": peerDuration, "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": peerDuration,
	"XDS_CLIENT_BACKOFF_MAX_INTERVAL": peerDuration, "STATS_FLUSH_INTERVAL": peerDuration,
	"REDIS_PIPELINE_WINDOW": peerDuration, "REDIS_PERSECOND_PIPELINE_WINDOW": peerDuration,
	"REDIS_TIMEOUT": peerDuration, "REDIS_PERSECOND_TIMEOUT": peerDuration,
	"REDIS_STARTUP_INITIAL_INTERVAL": peerDuration, "REDIS_STARTUP_MAX_INTERVAL": peerDuration,
	"REDIS_STARTUP_MAX_ELAPSED_TIME": peerDuration, "MEMCACHE_SRV_REFRESH": peerDuration,
}

// checkPeerSettings refuses the peer's settings that serve cannot honour
// and whose values would change what it answers or where it listens: a
// boolean, number or duration that does not parse (peerTyped), a
// NEAR_LIMIT_RATIO outside (0, 1], and the settings docs/envoy.md lists as
// refused. The Redis settings are readPeerRedis's.
func checkPeerSettings(getenv func(string) string) error {
	if getenv == nil {
		return nil
	}
	names := make([]string, 0, len(peerTyped))
	for name := range peerTyped {
		names = append(names, name)
	}
	slices.Sort(names) // the first bad one in a stable order
	for _, name := range names {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			continue
		}
		var err error
		var want string
		switch peerTyped[name] {
		case peerBoolean:
			err, want = strconvBool(v), "true or false"
		case peerInteger:
			_, err = strconv.ParseInt(v, 0, 64)
			want = "a whole number"
		case peerFloat:
			_, err = strconv.ParseFloat(v, 64)
			want = "a number"
		case peerDuration:
			_, err = time.ParseDuration(v)
			want = "a duration such as 10s"
		}
		if err != nil {
			return usagef("%s=%q: want %s", name, v, want)
		}
	}
	if v := strings.TrimSpace(getenv("NEAR_LIMIT_RATIO")); v != "" {
		if r, _ := strconv.ParseFloat(v, 64); !(r > 0 && r <= 1) {
			return usagef("NEAR_LIMIT_RATIO=%q: want a number above 0 and at most 1", v)
		}
	}
	for _, r := range []struct {
		name    string
		refused func(v string) bool
		why     string
	}{
		{"QUOTA_MODE", isTrue, "is not supported by this service"},
		{"GRPC_CLIENT_TLS_SAN", isSet, "is not supported: a client certificate is checked against GRPC_CLIENT_TLS_CACERT only"},
		{"GRPC_UDS", isSet, "is not supported: --grpc-listen takes a TCP address"},
		{"CONFIG_TYPE", func(v string) bool { return !strings.EqualFold(v, "FILE") }, "is not supported: the rules come from --envoy-config's files (CONFIG_TYPE=FILE)"},
		{"REDIS_POOL_ON_EMPTY_BEHAVIOR", func(v string) bool { return !strings.EqualFold(v, "WAIT") }, "is not supported: a check waits for a free connection, within --timeout (WAIT)"},
	} {
		if v := strings.TrimSpace(getenv(r.name)); v != "" && r.refused(v) {
			return usagef("%s=%s %s (see docs/envoy.md)", r.name, v, r.why)
		}
	}
	return nil
}

func strconvBool(v string) error {
	_, err := strconv.ParseBool(v)
	return err
}

func isSet(string) bool { return true }

func isTrue(v string) bool {
	b, _ := strconv.ParseBool(v)
	return b
}

// peerLogging sets f's log level and format from the peer's LOG_LEVEL (its
// logrus levels: trace and debug are debug, warning is warn, fatal and
// panic are error) and LOG_FORMAT (text or json), where --log-level and
// --log-format (or their RATELIMIT_ variables) are not set. It returns the
// pairs of flag and setting where the flag won, for the log.
func peerLogging(getenv func(string) string, set map[string]bool, f *serveFlags) ([][2]string, error) {
	if getenv == nil {
		return nil, nil
	}
	var won [][2]string
	if v := strings.TrimSpace(getenv("LOG_LEVEL")); v != "" {
		level, ok := map[string]string{"trace": "debug", "debug": "debug", "info": "info", "warn": "warn", "warning": "warn",
			"error": "error", "fatal": "error", "panic": "error"}[strings.ToLower(v)]
		switch {
		case !ok:
			return nil, usagef("LOG_LEVEL=%q: want trace, debug, info, warn, error, fatal or panic", v)
		case set["log-level"]:
			won = append(won, [2]string{"--log-level", "LOG_LEVEL"})
		default:
			f.logLevel = level
		}
	}
	if v := strings.TrimSpace(getenv("LOG_FORMAT")); v != "" {
		switch {
		case !strings.EqualFold(v, "text") && !strings.EqualFold(v, "json"):
			return nil, usagef("LOG_FORMAT=%q: want text or json", v)
		case set["log-format"]:
			won = append(won, [2]string{"--log-format", "LOG_FORMAT"})
		default:
			f.logFormat = v
		}
	}
	return won, nil
}
