package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/tokenbucket"
	"github.com/redis/go-redis/v9"
)

// TestUnreachableErrorsWrapErrUnavailable holds which failures of go-redis a
// Store reports as ratelimit.ErrUnavailable: those that say Redis could not
// be reached or did not answer in time, and no answer that would be the
// same again.
func TestUnreachableErrorsWrapErrUnavailable(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"a refused dial", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, true},
		{"go-redis's pool timeout", redis.ErrPoolTimeout, true},
		{"a cluster slot not served", errors.New("CLUSTERDOWN Hash slot not served"), true},
		{"a loading server", errors.New("LOADING Redis is loading the dataset in memory"), true},
		{"a replica without its master", errors.New("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), true},
		{"a resharding slot", errors.New("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{"one of several joined errors", errors.Join(errors.New("first"), fmt.Errorf("wrapped: %w", errors.New("CLUSTERDOWN The cluster is down"))), true},
		{"the caller's cancellation", context.Canceled, false},
		{"the caller's deadline", context.DeadlineExceeded, false},
		{"an invalid argument found by the script", errors.New("ratelimit: invalid argument: malformed argument"), false},
		{"a corrupt bucket", errors.New("ratelimit: malformed bucket state: too short"), false},
		{"a script error", errors.New("ERR Error running script (call to f_0): @user_script:3: boom"), false},
		{"a wrong type", errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{"a closed client", redis.ErrClosed, false},
		{"a wrong password", errors.New("WRONGPASS invalid username-password pair or user is disabled."), false},
		{"no password", errors.New("NOAUTH Authentication required."), false},
		{"a missing permission", errors.New("NOPERM User limiter has no permissions to run the 'evalsha' command"), false},
		{"a reply that merely mentions a busy word", errors.New("ERR unknown command 'CLUSTERDOWN'"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := wrapErr("check", "7:default:k", tt.err)
			if got := errors.Is(err, ratelimit.ErrUnavailable); got != tt.want {
				t.Errorf("wrapErr(%v) = %v: wraps ErrUnavailable %v, want %v", tt.err, err, got, tt.want)
			}
			if tt.want && !errors.Is(err, tt.err) {
				t.Errorf("wrapErr(%v) = %v, which does not wrap the cause", tt.err, err)
			}
		})
	}
	if err := wrapErr("check", "7:default:k", errors.New("ratelimit: malformed bucket state: too short")); !errors.Is(err, tokenbucket.ErrCorruptState) {
		t.Errorf("a corrupt bucket: %v, want ErrCorruptState", err)
	}
}

// TestDeadServerIsUnavailable checks a killed redis-server: every call of a
// Store fails with an error wrapping ratelimit.ErrUnavailable.
func TestDeadServerIsUnavailable(t *testing.T) {
	srv := redistest.StartServer(t)
	s := New(redistest.Client(t, srv.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerMinute(10)}, Cost: 1}
	if _, err := s.Apply(ctx, "7:default:k", r); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if _, err := s.Apply(ctx, "7:default:k", r); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Errorf("Apply on a dead server: %v, want ErrUnavailable", err)
	}
	if err := s.Reset(ctx, "7:default:k"); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Errorf("Reset on a dead server: %v, want ErrUnavailable", err)
	}
	if _, err := s.Reserve(ctx, "7:default:k", "id", r, time.Minute); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Errorf("Reserve on a dead server: %v, want ErrUnavailable", err)
	}
	items := []ratelimit.BatchItem{{Key: "7:default:a", Request: r}, {Key: "7:default:b", Request: r}}
	if err := s.ApplyAll(ctx, items); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Errorf("ApplyAll on a dead server: %v, want ErrUnavailable", err)
	}
	s.ApplyBatch(ctx, items)
	for i, it := range items {
		if !errors.Is(it.Err, ratelimit.ErrUnavailable) {
			t.Errorf("ApplyBatch item %d on a dead server: %v, want ErrUnavailable", i, it.Err)
		}
	}
}
