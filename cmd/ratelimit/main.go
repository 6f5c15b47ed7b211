// Command ratelimit is an exact token-bucket rate limiter as a program: an
// HTTP decision service that runs with no setup (ratelimit serve), a
// rate-limiting reverse proxy (serve --upstream), a shell tool for the
// buckets kept in Redis (acquire, peek, reset), and a benchmark (bench).
// Run 'ratelimit --help' for the commands and 'ratelimit COMMAND --help' for
// their flags.
package main

import (
	"context"
	"os"

	"github.com/exactlimit/ratelimit/internal/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:], cli.Env{
		Stdout:    os.Stdout,
		Stderr:    os.Stderr,
		Getenv:    os.Getenv,
		StderrTTY: cli.IsTerminal(os.Stderr),
	}))
}
