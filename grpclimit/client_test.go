package grpclimit

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

func clientInterceptor(t *testing.T, opts ...ClientOption) grpc.UnaryClientInterceptor {
	t.Helper()
	ci, err := UnaryClientInterceptor(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ci
}

func TestUnaryClientInterceptor(t *testing.T) {
	inRange := func(d, wait time.Duration) bool { return d >= wait && d < wait+wait/10+time.Millisecond }
	tests := []struct {
		name    string
		store   func(t *testing.T, clock *testkit.Clock) ratelimit.Store
		opts    []ClientOption
		advance bool
		ctx     func() (context.Context, context.CancelFunc)
		before  func(cancel context.CancelFunc) func(context.Context) error
		code    codes.Code
		waits   []time.Duration // each within its jitter
	}{
		{"a denial is waited out and the call retried", nil, nil, true, nil, nil,
			codes.OK, []time.Duration{time.Minute}},
		{"tries are bounded", nil, []ClientOption{WithRetries(2)}, false, nil, nil,
			codes.ResourceExhausted, []time.Duration{time.Minute, time.Minute}},
		{"no retry with WithRetries(0)", nil, []ClientOption{WithRetries(0)}, true, nil, nil,
			codes.ResourceExhausted, nil},
		{"a wait past the deadline is not begun", nil, nil, true,
			func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 5*time.Second)
			}, nil,
			codes.ResourceExhausted, nil},
		{"a context cancelled during the wait ends it", nil, nil, true,
			func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			func(cancel context.CancelFunc) func(context.Context) error {
				return func(ctx context.Context) error { cancel(); return ctx.Err() }
			},
			codes.Canceled, nil},
		{"an outage answer with RetryInfo is retried too", func(*testing.T, *testkit.Clock) ratelimit.Store { return failing{} },
			[]ClientOption{WithRetries(2)}, true, nil, nil,
			codes.Unavailable, []time.Duration{time.Second, time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := testkit.NewClock(testkit.Start)
			newStore := stores(t)[0].new
			if tt.store != nil {
				newStore = tt.store
			}
			lim := newLimiter(t, newStore(t, clock), clock, "api", ratelimit.PerMinute(1))
			fs := &testkit.Sleeper{}
			if tt.advance {
				fs.Clock = clock
			}
			client := serve(t, newInterceptor(t, lim),
				grpc.WithUnaryInterceptor(clientInterceptor(t, append([]ClientOption{WithRetrySleep(fs.Sleep), WithMaxRetryDelay(time.Hour)}, tt.opts...)...)))
			if tt.store == nil {
				if _, _, err := check(client, context.Background()); err != nil {
					t.Fatalf("the call that empties the bucket: %v", err)
				}
			}
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tt.ctx != nil {
				ctx, cancel = tt.ctx()
			}
			defer cancel()
			if tt.before != nil {
				fs.Before = tt.before(cancel)
			}
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			if got := status.Code(err); got != tt.code {
				t.Fatalf("Check: %v, want code %v", err, tt.code)
			}
			got := fs.Slept()
			if len(got) != len(tt.waits) {
				t.Fatalf("waited %v, want %v (plus jitter)", got, tt.waits)
			}
			for i := range got {
				if !inRange(got[i], tt.waits[i]) {
					t.Fatalf("wait %d = %v, want %v plus less than a tenth and 1ms", i, got[i], tt.waits[i])
				}
			}
		})
	}
}

func TestUnaryClientInterceptorReturnsOtherErrorsAtOnce(t *testing.T) {
	rec := &recording{}
	fs := &testkit.Sleeper{}
	client := serve(t, newInterceptor(t, rec),
		grpc.WithUnaryInterceptor(clientInterceptor(t, WithRetrySleep(fs.Sleep))))
	_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "unknown"})
	if status.Code(err) != codes.NotFound || len(fs.Slept()) != 0 || rec.count() != 1 {
		t.Fatalf("Check of an unknown service: %v after %d waits and %d checks; want NotFound, no retry", err, len(fs.Slept()), rec.count())
	}
}

func TestRetryDelay(t *testing.T) {
	if d, ok := RetryDelay(denied(1500 * time.Millisecond)); !ok || d != 1500*time.Millisecond {
		t.Errorf("RetryDelay(denied(1.5s)) = %v, %v", d, ok)
	}
	for _, err := range []error{nil, context.Canceled, status.Error(codes.ResourceExhausted, "no detail")} {
		if d, ok := RetryDelay(err); ok {
			t.Errorf("RetryDelay(%v) = %v, true; want none", err, d)
		}
	}
}

// refusing serves the health service behind an interceptor that refuses
// every call with code and a RetryInfo of delay, and counts the calls.
func refusing(t *testing.T, code codes.Code, delay time.Duration, dialOpts ...grpc.DialOption) (healthpb.HealthClient, *atomic.Int64) {
	calls := new(atomic.Int64)
	refuse := func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		return nil, withRetry(code, "refused", delay)
	}
	return serveWith(t, []grpc.ServerOption{grpc.UnaryInterceptor(refuse)}, dialOpts...), calls
}

func TestUnaryClientInterceptorCapsRetryInfo(t *testing.T) {
	long := time.Duration(math.MaxInt64)
	tests := []struct {
		name     string
		delay    time.Duration
		opts     []ClientOption
		deadline time.Duration // 0: none
		min, max time.Duration // the one wait expected; max 0: no wait
	}{
		{"a delay of 1,000 h is not waited out", 1000 * time.Hour, nil, 0, 0, 0},
		{"a delay near MaxInt64 does not overflow into a retry", long, nil, 0, 0, 0},
		{"a delay of MaxInt64 - 1 ns neither", long - 1, nil, 0, 0, 0},
		{"a delay of the default maximum is waited, without jitter past it", DefaultMaxRetryDelay, nil, 0,
			DefaultMaxRetryDelay, DefaultMaxRetryDelay},
		{"a delay just over the maximum is returned at once", DefaultMaxRetryDelay + 1, nil, 0, 0, 0},
		{"WithMaxRetryDelay lowers the maximum", 3 * time.Second, []ClientOption{WithMaxRetryDelay(2 * time.Second)}, 0, 0, 0},
		{"a delay under WithMaxRetryDelay is waited with its jitter", time.Second, []ClientOption{WithMaxRetryDelay(2 * time.Second)}, 0,
			time.Second, time.Second + time.Second/10 + time.Millisecond},
		{"WithMaxRetryDelay raises the maximum", 5 * time.Minute, []ClientOption{WithMaxRetryDelay(time.Hour)}, 0,
			5 * time.Minute, 5*time.Minute + 30*time.Second + time.Millisecond},
		{"a delay that outlasts the deadline is returned at once", 20 * time.Second, nil, 10 * time.Second, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := &testkit.Sleeper{}
			opts := append([]ClientOption{WithRetrySleep(fs.Sleep), WithRetries(1)}, tt.opts...)
			client, calls := refusing(t, codes.ResourceExhausted, tt.delay, grpc.WithUnaryInterceptor(clientInterceptor(t, opts...)))
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tt.deadline > 0 {
				ctx, cancel = context.WithTimeout(ctx, tt.deadline)
			}
			defer cancel()
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("Check: %v, want the refusal", err)
			}
			waits := fs.Slept()
			if tt.max == 0 {
				if len(waits) != 0 || calls.Load() != 1 {
					t.Fatalf("waited %v over %d calls; want the refusal at once, no wait", waits, calls.Load())
				}
				return
			}
			if len(waits) != 1 || waits[0] < tt.min || waits[0] > tt.max || calls.Load() != 2 {
				t.Fatalf("waited %v over %d calls; want one wait in [%v, %v] and a retry", waits, calls.Load(), tt.min, tt.max)
			}
		})
	}
}

// The deadline is compared with the wait including its jitter.
func TestRetryWaitAgainstTheDeadline(t *testing.T) {
	c := &client{maxDelay: time.Minute, jitter: func(n int64) int64 { return n - 1 }, until: func(time.Time) time.Duration { return 5 * time.Second }}
	ctx, cancel := context.WithDeadline(context.Background(), testkit.Start)
	defer cancel()
	for _, tt := range []struct {
		delay time.Duration
		ok    bool
	}{
		{4 * time.Second, true},               // 4.4 s + 1 ms - 1 ns
		{4540 * time.Millisecond, true},       // 4.994 s + 1 ms - 1 ns
		{4546 * time.Millisecond, false},      // 5.0006 s + 1 ms - 1 ns: past 5 s with its jitter
		{5 * time.Second, false},              // the delay alone reaches it
		{time.Duration(math.MaxInt64), false}, // over the maximum
		{-time.Second, true},                  // a negative delay is none
	} {
		wait, ok := c.wait(ctx, withRetry(codes.Unavailable, "down", tt.delay))
		if ok != tt.ok || wait < 0 || wait > c.maxDelay {
			t.Errorf("delay %v: wait %v, %v; want retried %v, within 0..%v", tt.delay, wait, ok, tt.ok, c.maxDelay)
		}
	}
}

func TestUnaryClientInterceptorRefusesBadOptions(t *testing.T) {
	for _, tt := range []struct {
		opt  ClientOption
		want string
	}{
		{WithRetries(-1), "retries must not be negative"},
		{WithMaxRetryDelay(0), "maximum retry delay must be positive"},
		{WithMaxRetryDelay(-time.Second), "maximum retry delay must be positive"},
		{WithRetrySleep(nil), "sleep must not be nil"},
	} {
		if _, err := UnaryClientInterceptor(tt.opt); !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("UnaryClientInterceptor: %v, want ErrInvalidArgument saying %q", err, tt.want)
		}
	}
}
