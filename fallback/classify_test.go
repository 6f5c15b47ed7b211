package fallback

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

func TestIsUnreachable(t *testing.T) {
	_, invalidErr := ratelimit.New[string](newFakePrimary(time.Now), ratelimit.Limit{})
	wrap := func(err error) error { return fmt.Errorf("ratelimit: redis check of %q: %w", "k", err) }
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"no error", nil, false},
		{"a refused dial", wrap(refusedError()), true},
		{"a context deadline", wrap(context.DeadlineExceeded), true},
		// A store says which of its own failures are outages, by wrapping
		// ratelimit.ErrUnavailable (redisstore's tests hold the Redis
		// replies and go-redis's errors it recognises).
		{"an outage a store reports", wrap(fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, errors.New("CLUSTERDOWN Hash slot not served"))), true},
		{"an outage seen by a nested fallback", wrap(ratelimit.ErrUnavailable), true},
		{"one of several joined errors", errors.Join(errors.New("first"), wrap(fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, errors.New("CLUSTERDOWN The cluster is down")))), true},
		{"a busy reply that the store did not report as an outage", wrap(errors.New("CLUSTERDOWN Hash slot not served")), false},
		{"an invalid argument", invalidErr, false},
		{"an invalid argument found by the script", fmt.Errorf("%w: redis check: cost must be at least 1", ratelimit.ErrInvalidArgument), false},
		{"a corrupt bucket", fmt.Errorf("%w: redis check: bad level", tokenbucket.ErrCorruptState), false},
		{"a corrupt bucket even beside an EOF", errors.Join(io.EOF, tokenbucket.ErrCorruptState), false},
		{"a cancelled context", wrap(context.Canceled), false},
		{"a script error", wrap(errors.New("ERR Error running script (call to f_0): @user_script:3: boom")), false},
		{"a wrong type", wrap(errors.New("WRONGTYPE Operation against a key holding the wrong kind of value")), false},
		{"a closed client", wrap(errors.New("redis: client is closed")), false},
		// Credentials and permissions are configuration errors: Redis
		// answered, and would answer the same again.
		{"a wrong password", wrap(errors.New("WRONGPASS invalid username-password pair or user is disabled.")), false},
		{"no password", wrap(errors.New("NOAUTH Authentication required.")), false},
		{"a missing permission", wrap(errors.New("NOPERM User limiter has no permissions to run the 'evalsha' command")), false},
		{"a reply that merely mentions a busy word", wrap(errors.New("ERR unknown command 'CLUSTERDOWN'")), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsUnreachable(tt.err); got != tt.want {
				t.Errorf("IsUnreachable(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestClassifierOption(t *testing.T) {
	p := newFakePrimary(time.Now)
	oom := errors.New("OOM command not allowed when used memory > 'maxmemory'")
	s := mustNew(t, p, WithOutage(FailOpen), WithClassifier(func(err error) bool {
		return errors.Is(err, oom) || IsUnreachable(err)
	}))
	p.failWith(oom)
	d, err := s.Apply(context.Background(), "k", req(perMinute100, 1, time.Time{}))
	if err != nil || d.Source != ratelimit.SourceFailOpen || s.IsAlive() {
		t.Fatalf("= %+v, %v, alive %v; want the custom classifier to mark the primary down", d, err, s.IsAlive())
	}

	s = mustNew(t, p, WithClassifier(func(error) bool { return true }))
	p.set(hung)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	if _, err := s.Apply(ctx, "k", req(perMinute100, 1, time.Time{})); !errors.Is(err, context.Canceled) || !s.IsAlive() {
		t.Fatalf("a classifier that says yes to everything: %v, alive %v; a cancellation must stay the caller's", err, s.IsAlive())
	}
}
