package grpclimit

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/exactlimit/ratelimit/internal/clientkey"
	"github.com/exactlimit/ratelimit/internal/clock"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultRetries is how many times UnaryClientInterceptor retries a call
// unless WithRetries sets another number.
const DefaultRetries = 3

// DefaultMaxRetryDelay is the longest delay UnaryClientInterceptor waits
// before a retry unless WithMaxRetryDelay sets another.
const DefaultMaxRetryDelay = 30 * time.Second

// ClientOption configures UnaryClientInterceptor.
type ClientOption func(*client)

type client struct {
	retries  int
	maxDelay time.Duration
	sleep    func(ctx context.Context, d time.Duration) error
	jitter   func(n int64) int64
	until    func(t time.Time) time.Duration
	opts     clientkey.Options
}

// WithRetries sets how many times a call is retried after its first try
// (default DefaultRetries). 0 turns retrying off; n must not be negative.
func WithRetries(n int) ClientOption {
	return func(c *client) {
		if n < 0 {
			c.opts.Fail("retries must not be negative (got %d)", n)
		}
		c.retries = n
	}
}

// WithMaxRetryDelay sets the longest the interceptor waits before a retry
// (default DefaultMaxRetryDelay): a refusal whose RetryInfo names a longer
// delay is returned at once, not waited out. d must be positive.
func WithMaxRetryDelay(d time.Duration) ClientOption {
	return func(c *client) {
		if d <= 0 {
			c.opts.Fail("maximum retry delay must be positive (got %v)", d)
		}
		c.maxDelay = d
	}
}

// WithRetrySleep sets how the interceptor waits between tries: sleep must
// return after d, or earlier with ctx's error when ctx ends. The default is
// clock.Sleep, a timer. Tests inject one that does not really sleep.
// sleep must not be nil.
func WithRetrySleep(sleep func(ctx context.Context, d time.Duration) error) ClientOption {
	return func(c *client) { c.sleep = sleep }
}

// UnaryClientInterceptor returns a client interceptor that retries a unary
// call refused with codes.ResourceExhausted or codes.Unavailable when the
// refusal carries a google.rpc.RetryInfo detail (the denials and the outage
// answers of this package's server interceptors do): it waits for the
// RetryInfo's delay, plus up to a tenth of it and 1 ms of random jitter (the
// whole wait at most WithMaxRetryDelay's), and tries again, at most
// WithRetries times. It returns the refusal at once, without waiting, when
// the delay is longer than WithMaxRetryDelay's maximum or the wait would
// end after ctx's deadline, and returns ctx's error (as a status) when ctx
// ends during a wait. Errors without RetryInfo are returned at once. Like
// the server's Wait, it polls: retries are not queued, and have no priority
// over other callers. The error wraps ratelimit.ErrInvalidArgument and
// reports an invalid option.
func UnaryClientInterceptor(opts ...ClientOption) (grpc.UnaryClientInterceptor, error) {
	c := &client{
		retries:  DefaultRetries,
		maxDelay: DefaultMaxRetryDelay,
		sleep:    clock.Sleep,
		jitter:   rand.Int64N,
		until:    time.Until,
		opts:     clientkey.NewOptions("grpclimit"),
	}
	for _, o := range opts {
		o(c)
	}
	c.opts.Require("sleep", c.sleep != nil)
	if err := c.opts.Err(); err != nil {
		return nil, err
	}
	return c.intercept, nil
}

func (c *client) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
	for try := 0; ; try++ {
		err := invoker(ctx, method, req, reply, cc, callOpts...)
		if err == nil || try >= c.retries {
			return err
		}
		wait, ok := c.wait(ctx, err)
		if !ok {
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

// wait returns how long to wait before retrying a call refused with err,
// and false when the call is not to be retried: err is not a refusal with
// RetryInfo, its delay is longer than the maximum, or the wait would end
// after ctx's deadline.
func (c *client) wait(ctx context.Context, err error) (time.Duration, bool) {
	if code := status.Code(err); code != codes.ResourceExhausted && code != codes.Unavailable {
		return 0, false
	}
	delay, ok := RetryDelay(err)
	if !ok || delay > c.maxDelay {
		return 0, false
	}
	// delay <= maxDelay: neither the jitter's bound nor the sum overflows.
	wait := min(delay+time.Duration(c.jitter(int64(delay/10+time.Millisecond))), c.maxDelay)
	if deadline, ok := ctx.Deadline(); ok && c.until(deadline) < wait {
		return 0, false
	}
	return wait, true
}
