package grpclimit

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/exactlimit/ratelimit/internal/clock"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultRetries is how many times UnaryClientInterceptor retries a call
// unless WithRetries sets another number.
const DefaultRetries = 3

// ClientOption configures UnaryClientInterceptor.
type ClientOption func(*client)

type client struct {
	retries int
	sleep   func(ctx context.Context, d time.Duration) error
	jitter  func(n int64) int64
}

// WithRetries sets how many times a call is retried after its first try
// (default DefaultRetries). 0 turns retrying off; a negative n is taken as 0.
func WithRetries(n int) ClientOption { return func(c *client) { c.retries = max(n, 0) } }

// WithRetrySleep sets how the interceptor waits between tries: sleep must
// return after d, or earlier with ctx's error when ctx ends. The default is a
// timer, which a nil sleep keeps. Tests inject one that does not really
// sleep.
func WithRetrySleep(sleep func(ctx context.Context, d time.Duration) error) ClientOption {
	return func(c *client) {
		if sleep != nil {
			c.sleep = sleep
		}
	}
}

// UnaryClientInterceptor returns a client interceptor that retries a unary
// call refused with codes.ResourceExhausted or codes.Unavailable when the
// refusal carries a google.rpc.RetryInfo detail (the denials and the outage
// answers of this package's server interceptors do): it waits for the
// RetryInfo's delay, plus up to a tenth of it and 1 ms of random jitter, and
// tries again, at most WithRetries times. It gives up, returning the last
// refusal, when a wait would end after ctx's deadline, and returns ctx's
// error (as a status) when ctx ends during a wait. Errors without RetryInfo
// are returned at once. Like the server's Wait, it polls: retries are not
// queued, and have no priority over other callers.
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	c := &client{retries: DefaultRetries, sleep: clock.Sleep, jitter: rand.Int64N}
	for _, o := range opts {
		o(c)
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		for try := 0; ; try++ {
			err := invoker(ctx, method, req, reply, cc, callOpts...)
			if err == nil || try >= c.retries {
				return err
			}
			code := status.Code(err)
			if code != codes.ResourceExhausted && code != codes.Unavailable {
				return err
			}
			wait, ok := RetryDelay(err)
			if !ok {
				return err
			}
			wait += time.Duration(c.jitter(int64(wait/10 + time.Millisecond)))
			if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
				return err
			}
			if serr := c.sleep(ctx, wait); serr != nil {
				if ctx.Err() != nil {
					return status.FromContextError(ctx.Err()).Err()
				}
				return serr
			}
		}
	}
}
