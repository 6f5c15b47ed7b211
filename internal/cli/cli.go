// Package cli is the ratelimit command: its subcommands and their flags.
// serve turns its flags and environment into a service.Config, starts
// package service's daemon and waits for a signal; the benchmarks drive a
// store or the Envoy service. The main package only calls Main.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/exactlimit/ratelimit/internal/service"
)

// Env is what a command reads and writes besides its arguments.
type Env struct {
	Stdout, Stderr io.Writer
	// Getenv reads an environment variable (os.Getenv in main).
	Getenv func(string) string
	// Stderr is a terminal: bench shows live progress there.
	StderrTTY bool
	// ServeStarted, when set, is called with the service serve started,
	// once it listens: tests ask it for its addresses.
	ServeStarted func(*service.Service)
}

// usageError is an error in the command line: exit status 2.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

type command struct {
	name, args, short string
	run               func(ctx context.Context, env Env, args []string) error
}

var commands []command

func init() {
	commands = []command{
		{"serve", "[flags]", "run the HTTP decision service, or a rate-limiting reverse proxy with --upstream", runServe},
		{"acquire", "--redis URL [flags] SUBJECT", "take tokens from a subject's bucket", runBucket("acquire")},
		{"peek", "--redis URL [flags] SUBJECT", "show a subject's bucket without taking anything", runBucket("peek")},
		{"reset", "--redis URL [flags] SUBJECT", "delete a subject's bucket, so that it starts full", runBucket("reset")},
		{"assign", "--redis URL --config FILE [flags]", "set a subject's plan in a namespace of plans", runAssign},
		{"usage", "--redis URL --config FILE [flags]", "show a subject's plan and the standing of its limits", runUsage},
		{"bench", "[flags]", "drive a store with concurrent checks and report decisions/s and latency", runBench},
		{"envoy-bench", "[flags]", "drive Envoy's rate limit service over gRPC and report calls/s and latency", runEnvoyBench},
	}
}

func mainUsage(w io.Writer) {
	fmt.Fprint(w, `ratelimit is an exact token-bucket rate limiter: a decision service you can run
with no setup, and a shell tool for the buckets it keeps in Redis.

Usage:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  ratelimit %-11s %-30s %s\n", c.name, c.args, c.short)
	}
	fmt.Fprint(w, `
Run 'ratelimit COMMAND --help' for the flags of a command, and
'ratelimit --version' for the version of this build.
`)
}

// Main runs the command line args (without the program name) and returns the
// exit status: 0 on success, 1 when the command failed, 2 for a bad command
// line. Errors are one line on env.Stderr.
func Main(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	quietRedis(nil)
	if len(args) == 0 {
		mainUsage(env.Stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "-version", "--version", "version":
		printVersion(env.Stdout)
		return 0
	case "-h", "-help", "--help", "help":
		if len(args) > 1 && name == "help" {
			return Main(ctx, []string{args[1], "--help"}, env)
		}
		mainUsage(env.Stdout)
		return 0
	}
	for _, c := range commands {
		if c.name != name {
			continue
		}
		err := c.run(ctx, env, args[1:])
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		}
		fmt.Fprintf(env.Stderr, "ratelimit %s: %s\n", name, oneLine(err.Error()))
		var ue usageError
		if errors.As(err, &ue) {
			return 2
		}
		return 1
	}
	fmt.Fprintf(env.Stderr, "ratelimit: unknown command %q; run 'ratelimit --help' for the list\n", name)
	return 2
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// newFlagSet returns a flag set whose --help prints the command's usage to
// stdout, and whose errors are returned rather than printed.
func newFlagSet(env Env, name, args, about string) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), getenv: env.Getenv}
	fs.SetOutput(io.Discard)
	fs.Usage = func() {} // parse prints the help on --help, and nothing on an error
	fs.help = func() {
		var b strings.Builder
		fs.SetOutput(&b)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		// Go's flag package takes -flag and --flag alike; show the latter.
		defaults := strings.ReplaceAll("\n"+b.String(), "\n  -", "\n  --")
		fmt.Fprintf(env.Stdout, "Usage: ratelimit %s %s\n\n%s\n\nFlags:%s\nEvery flag can also be set by an environment variable, RATELIMIT_ and its\nname in upper snake case (--redis: RATELIMIT_REDIS); the command line wins.\n",
			name, args, strings.TrimSpace(about), defaults)
	}
	return fs
}

// flagSet is a command's flags and the printer of its --help.
type flagSet struct {
	*flag.FlagSet
	help   func()
	getenv func(string) string // for applyEnv; nil reads nothing
}

// parse parses args into fs, allowing flags after positional arguments
// ("peek alice --redis URL"), and returns the positional arguments. An
// argument "--" ends the flags.
func parse(fs *flagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.help()
				return nil, err
			}
			return nil, usagef("%v (see 'ratelimit %s --help')", err, fs.Name())
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, applyEnv(fs)
		}
		// fs stopped at a positional argument, or after "--".
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), applyEnv(fs)
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// IsTerminal reports whether f is a character device (a terminal).
func IsTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
