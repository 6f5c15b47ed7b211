package grpclimit

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/storetest"
)

// fakeSleep is a WithRetrySleep that records each wait and, when advance is
// set, moves the server's clock by it instead of sleeping. before, when set,
// runs first and may end the wait with an error.
type fakeSleep struct {
	mu      sync.Mutex
	waits   []time.Duration
	clock   *storetest.Clock
	advance bool
	before  func(ctx context.Context) error
}

func (f *fakeSleep) sleep(ctx context.Context, d time.Duration) error {
	if f.before != nil {
		if err := f.before(ctx); err != nil {
			return err
		}
	}
	f.mu.Lock()
	f.waits = append(f.waits, d)
	f.mu.Unlock()
	if f.advance {
		f.clock.Add(d)
	}
	return nil
}

func (f *fakeSleep) slept() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.waits...)
}

func TestUnaryClientInterceptor(t *testing.T) {
	inRange := func(d, wait time.Duration) bool { return d >= wait && d < wait+wait/10+time.Millisecond }
	tests := []struct {
		name    string
		store   func(t *testing.T, clock *storetest.Clock) ratelimit.Store
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
		{"an outage answer with RetryInfo is retried too", func(*testing.T, *storetest.Clock) ratelimit.Store { return failing{} },
			[]ClientOption{WithRetries(2)}, true, nil, nil,
			codes.Unavailable, []time.Duration{time.Second, time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := storetest.NewClock(storetest.Start)
			newStore := stores(t)[0].new
			if tt.store != nil {
				newStore = tt.store
			}
			lim := newLimiter(t, newStore(t, clock), clock, "api", ratelimit.PerMinute(1))
			fs := &fakeSleep{clock: clock, advance: tt.advance}
			client := serve(t, newInterceptor(t, lim),
				grpc.WithUnaryInterceptor(UnaryClientInterceptor(append([]ClientOption{WithRetrySleep(fs.sleep)}, tt.opts...)...)))
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
				fs.before = tt.before(cancel)
			}
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			if got := status.Code(err); got != tt.code {
				t.Fatalf("Check: %v, want code %v", err, tt.code)
			}
			got := fs.slept()
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
	fs := &fakeSleep{}
	client := serve(t, newInterceptor(t, rec),
		grpc.WithUnaryInterceptor(UnaryClientInterceptor(WithRetrySleep(fs.sleep))))
	_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "unknown"})
	if status.Code(err) != codes.NotFound || len(fs.slept()) != 0 || rec.count() != 1 {
		t.Fatalf("Check of an unknown service: %v after %d waits and %d checks; want NotFound, no retry", err, len(fs.slept()), rec.count())
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
