package cli

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

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
}

// peerTLS is the peer's gRPC listener TLS: GRPC_SERVER_USE_TLS with
// GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY, and GRPC_CLIENT_TLS_CACERT
// for mutual TLS. The paths are PEM files. The --grpc-tls-* flags combine
// with it field by field (grpcTLS.withPeer).
type peerTLS struct {
	use                 bool
	cert, key, clientCA string
}

// readPeerEnv reads the peer's settings through getenv. A boolean that is
// not one (strconv.ParseBool), and a setting the service does not take
// whose value would change answers (QUOTA_MODE=true, GRPC_CLIENT_TLS_SAN),
// is a usage error naming the variable: refused, not ignored.
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
	var quota bool
	flag("SHADOW_MODE", &p.shadowMode)
	flag("MERGE_DOMAIN_CONFIG", &p.mergeDomains)
	flag("RUNTIME_IGNOREDOTFILES", &p.ignoreDotFiles)
	flag("RESPONSE_DYNAMIC_METADATA", &p.dynamicMetadata)
	flag("GRPC_SERVER_USE_TLS", &p.tls.use)
	flag("QUOTA_MODE", &quota)
	if err != nil {
		return p, err
	}
	switch {
	case quota:
		return p, usagef("QUOTA_MODE=true is not supported by this service (see docs/envoy.md)")
	case getenv("GRPC_CLIENT_TLS_SAN") != "":
		return p, usagef("GRPC_CLIENT_TLS_SAN is not supported: a client certificate is checked against GRPC_CLIENT_TLS_CACERT only")
	}
	if p.tls.use {
		// The certificate and key may come from the --grpc-tls-* flags
		// instead: grpcTLS.withPeer checks the combination.
		p.tls.cert, p.tls.key, p.tls.clientCA = getenv("GRPC_SERVER_TLS_CERT"), getenv("GRPC_SERVER_TLS_KEY"), getenv("GRPC_CLIENT_TLS_CACERT")
	}
	return p, nil
}
