package cli

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
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
