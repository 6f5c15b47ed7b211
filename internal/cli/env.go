package cli

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"strings"
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

// Version returns the version of this build: the module version when built
// by 'go install ...@version', else "(devel)", with the VCS revision when
// known.
func Version() string {
	v := "(devel)"
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if info.Main.Version != "" {
		v = info.Main.Version
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
	if rev != "" && v == "(devel)" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		v += " " + rev + dirty
	}
	return v
}

func printVersion(w io.Writer) {
	fmt.Fprintf(w, "ratelimit %s %s %s/%s\n", Version(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
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
