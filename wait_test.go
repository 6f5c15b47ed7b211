package ratelimit_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
)

// newWaiter returns a limiter of limit on a fresh memstore, on a fake clock
// that its sleeps advance, with the jitter fixed at jitter (nil: random).
func newWaiter(t *testing.T, limit ratelimit.Limit, jitter func(int64) int64) (*ratelimit.Limiter[string], *testkit.Sleeper, *countingStore) {
	t.Helper()
	s := &testkit.Sleeper{Clock: testkit.NewClock(testkit.Start)}
	store := &countingStore{Store: memstore.New(memstore.WithClock(s.Clock.Now))}
	l, err := ratelimit.New[string](store, limit, ratelimit.WithClock(s.Clock.Now), ratelimit.WithSleep(s.Sleep))
	if err != nil {
		t.Fatal(err)
	}
	if jitter != nil {
		ratelimit.SetWaitJitter(l, jitter)
	}
	return l, s, store
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestWait(t *testing.T) {
	ctx := context.Background()
	noJitter := func(int64) int64 { return 0 }
	tests := []struct {
		name   string
		limit  ratelimit.Limit
		spend  int64 // tokens taken before the wait
		cost   int64
		jitter func(int64) int64
		sleeps []time.Duration
		remain int64
	}{
		{"a bucket that holds the cost admits at once, with no sleep",
			ratelimit.PerSecond(2), 1, 1, noJitter, nil, 0},
		{"an empty bucket is waited out for exactly its RetryAfter",
			ratelimit.PerSecond(2), 2, 1, noJitter, []time.Duration{500 * time.Millisecond}, 0},
		{"a cost of several tokens waits for all of them",
			ratelimit.PerSecond(4), 4, 3, noJitter, []time.Duration{750 * time.Millisecond}, 0},
		{"the jitter is added to the wait",
			ratelimit.PerSecond(2), 2, 1, func(n int64) int64 { return n - 1 },
			// 500ms + up to (500ms/10 + 1ms), exclusive.
			[]time.Duration{500*time.Millisecond + 51*time.Millisecond - 1}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, s, _ := newWaiter(t, tt.limit, tt.jitter)
			if tt.spend > 0 {
				if d, err := l.TryAcquireN(ctx, "k", tt.spend); err != nil || !d.Allowed {
					t.Fatalf("spending %d: %+v, %v", tt.spend, d, err)
				}
			}
			d, err := l.WaitN(ctx, "k", tt.cost)
			if err != nil || !d.Allowed || d.Remaining != tt.remain {
				t.Fatalf("WaitN = %+v, %v; want allowed with %d remaining", d, err, tt.remain)
			}
			if got := s.Slept(); !equalDurations(got, tt.sleeps) {
				t.Fatalf("slept %v, want %v", got, tt.sleeps)
			}
		})
	}
}

func TestWaitRetriesWhileAnotherTakesTheToken(t *testing.T) {
	ctx := context.Background()
	l, s, store := newWaiter(t, ratelimit.PerSecond(1), func(int64) int64 { return 0 })
	l.TryAcquire(ctx, "k")
	// Another client takes the token that refills during the first sleep.
	first := true
	s.Before = func(context.Context) error {
		if !first {
			return nil
		}
		first = false
		s.Clock.Add(time.Second)
		if d, _ := l.TryAcquire(ctx, "k"); !d.Allowed {
			t.Error("the other client was denied")
		}
		s.Clock.Add(-time.Second)
		return nil
	}
	d, err := l.Wait(ctx, "k")
	if err != nil || !d.Allowed {
		t.Fatalf("Wait = %+v, %v", d, err)
	}
	if got, want := s.Slept(), []time.Duration{time.Second, time.Second}; !equalDurations(got, want) {
		t.Fatalf("slept %v, want %v (a second try after the first was taken)", got, want)
	}
	// One spend, one by the other client, and three tries by the waiter.
	if got := store.Applies.Load(); got != 5 {
		t.Fatalf("%d store calls, want 5 (each try is one check)", got)
	}
}

func TestWaitEndsWithoutTaking(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	bg := func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }
	tests := []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		cost    int64
		subject string
		before  func(cancel context.CancelFunc) func(context.Context) error
		wantErr error
		calls   int64 // store calls by the wait
	}{
		{"a cost above the capacity is refused at once", bg, 3, "k", nil,
			ratelimit.ErrInvalidArgument, 0},
		{"a cost of zero is refused at once", bg, 0, "k", nil,
			ratelimit.ErrInvalidArgument, 0},
		{"an empty subject is refused at once", bg, 1, "", nil,
			ratelimit.ErrInvalidArgument, 0},
		{"an ended context is returned before any check",
			func() (context.Context, context.CancelFunc) { return canceled, func() {} }, 1, "k", nil,
			context.Canceled, 0},
		{"a context cancelled during the sleep ends the wait",
			func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, 1, "k",
			func(cancel context.CancelFunc) func(context.Context) error {
				return func(ctx context.Context) error { cancel(); return ctx.Err() }
			},
			context.Canceled, 1},
		{"a passed deadline is returned before any check",
			func() (context.Context, context.CancelFunc) {
				return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			}, 1, "k", nil,
			context.DeadlineExceeded, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, s, store := newWaiter(t, ratelimit.PerSecond(2), nil)
			l.TryAcquire(context.Background(), "k")
			l.TryAcquire(context.Background(), "k")
			ctx, cancel := tt.ctx()
			defer cancel()
			if tt.before != nil {
				s.Before = tt.before(cancel)
			}
			before := store.Applies.Load()
			d, err := l.WaitN(ctx, tt.subject, tt.cost)
			if !errors.Is(err, tt.wantErr) || !reflect.DeepEqual(d, (ratelimit.Decision{})) {
				t.Fatalf("WaitN = %+v, %v; want the zero Decision and %v", d, err, tt.wantErr)
			}
			if got := store.Applies.Load() - before; got != tt.calls {
				t.Fatalf("%d store calls, want %d", got, tt.calls)
			}
			if got := s.Slept(); len(got) != 0 {
				t.Fatalf("slept %v, want no completed sleep", got)
			}
			// Nothing was taken: the bucket refills as if no one waited.
			s.Clock.Add(500 * time.Millisecond)
			if d, _ := l.Peek(context.Background(), "k"); !d.Allowed || d.Remaining != 1 {
				t.Fatalf("after the wait, Peek = %+v; want 1 token (nothing taken)", d)
			}
		})
	}
}

func TestWaitBeyondTheDeadlineAnswersAtOnce(t *testing.T) {
	// The context's deadline is on the wall clock, the buckets on the fake
	// clock; the margins (a minute against an hour, 3 s against 6 s of
	// jitter) leave the wall clock's few microseconds no say.
	bg := context.Background()
	fixed := func(n int64) int64 { return n - 1 } // the largest jitter
	tests := []struct {
		name     string
		limit    ratelimit.Limit
		timeout  time.Duration
		exceeded bool
		sleeps   []time.Duration
	}{
		{"a wait of an hour against a minute's deadline: refused at once, nothing slept",
			ratelimit.PerHour(1), time.Minute, true, nil},
		{"a wait within the deadline is slept, jitter included",
			ratelimit.PerMinute(1), time.Hour, false, []time.Duration{time.Minute + 6*time.Second + time.Millisecond - 1}},
		{"a wait that fits only without its jitter is slept without it",
			ratelimit.PerMinute(1), time.Minute + 3*time.Second, false, []time.Duration{time.Minute}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, s, store := newWaiter(t, tt.limit, fixed)
			if d, err := l.TryAcquire(bg, "k"); err != nil || !d.Allowed {
				t.Fatalf("spending the bucket: %+v, %v", d, err)
			}
			ctx, cancel := context.WithTimeout(bg, tt.timeout)
			defer cancel()
			before := store.Applies.Load()
			d, err := l.Wait(ctx, "k")
			if got := s.Slept(); !equalDurations(got, tt.sleeps) {
				t.Fatalf("slept %v, want %v", got, tt.sleeps)
			}
			if !tt.exceeded {
				if err != nil || !d.Allowed {
					t.Fatalf("Wait = %+v, %v; want admitted", d, err)
				}
				return
			}
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "would exceed context deadline") {
				t.Fatalf("Wait = %v; want an error that says it would exceed the deadline and wraps context.DeadlineExceeded", err)
			}
			if ctx.Err() != nil {
				t.Fatalf("the context ended (%v): Wait did not answer at once", ctx.Err())
			}
			if d.Allowed || d.RetryAfter != time.Hour {
				t.Fatalf("Wait's Decision = %+v; want the denial, RetryAfter 1h", d)
			}
			if got := store.Applies.Load() - before; got != 1 {
				t.Fatalf("%d store calls, want 1 (one check, then the answer)", got)
			}
			s.Clock.Add(time.Hour)
			if d, _ := l.Peek(bg, "k"); !d.Allowed || d.Remaining != 1 {
				t.Fatalf("an hour later, Peek = %+v; want the token (nothing taken)", d)
			}
		})
	}
}

func TestWaitReturnsAStoreErrorAtOnce(t *testing.T) {
	s := &testkit.Sleeper{Clock: testkit.NewClock(testkit.Start)}
	l, err := ratelimit.New[string](failingStore{Err: errors.New("connection refused")}, ratelimit.PerSecond(1), ratelimit.WithSleep(s.Sleep))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Wait(context.Background(), "k"); err == nil || err.Error() != "connection refused" {
		t.Fatalf("Wait on a failing store = %v, want its error", err)
	}
	if got := s.Slept(); len(got) != 0 {
		t.Fatalf("slept %v before returning the error, want none", got)
	}
}

func TestWaitJitterSpreadsAFleet(t *testing.T) {
	// Eight waiters denied at the same instant, with the default jitter:
	// each sleeps RetryAfter plus less than RetryAfter/10 + 1ms, and they do
	// not all sleep the same.
	ctx := context.Background()
	seen := map[time.Duration]bool{}
	for range 8 {
		l, s, _ := newWaiter(t, ratelimit.PerSecond(1), nil)
		l.TryAcquire(ctx, "k")
		if _, err := l.Wait(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		got := s.Slept()
		if len(got) != 1 || got[0] < time.Second || got[0] >= time.Second+101*time.Millisecond {
			t.Fatalf("slept %v, want one sleep in [1s, 1.101s)", got)
		}
		seen[got[0]] = true
	}
	if len(seen) < 2 {
		t.Fatalf("eight waiters all slept %v: no jitter", seen)
	}
}

func TestWaitersTakeNoMoreThanThePolicy(t *testing.T) {
	// Waiters on one bucket, sharing a fake clock their sleeps advance: each
	// is admitted in the end, and together they never take more than the
	// capacity plus the refill of the time that passed.
	ctx := context.Background()
	l, s, _ := newWaiter(t, ratelimit.PerSecond(5), nil)
	start := s.Clock.Now()
	const waiters = 20
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for range waiters {
		wg.Go(func() {
			if d, err := l.Wait(ctx, "k"); err != nil || !d.Allowed {
				t.Errorf("Wait = %+v, %v", d, err)
				return
			}
			admitted.Add(1)
		})
	}
	wg.Wait()
	elapsed := s.Clock.Now().Sub(start)
	if got, most := admitted.Load(), 5+int64(elapsed/(200*time.Millisecond)); got != waiters || got > most {
		t.Fatalf("admitted %d of %d waiters in %v; at most %d fit the policy", got, waiters, elapsed, most)
	}
}

func TestWithSleepNil(t *testing.T) {
	_, err := ratelimit.New[string](memstore.New(), ratelimit.PerSecond(1), ratelimit.WithSleep(nil))
	if !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Fatalf("WithSleep(nil): %v, want ErrInvalidArgument", err)
	}
}

func TestWaitDefaultSleepEndsWithTheContext(t *testing.T) {
	// The default sleep is a real timer: a wait of an hour must end as soon
	// as the context does. The observer cancels right after the denial, so
	// the cancellation lands in the sleep.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var denials atomic.Int64
	obs := ratelimit.ObserverFuncs{Decision: func(_ context.Context, ev ratelimit.DecisionEvent) {
		if !ev.Decision.Allowed {
			denials.Add(1)
			cancel()
		}
	}}
	l, err := ratelimit.New[string](memstore.New(), ratelimit.PerHour(1), ratelimit.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	l.TryAcquire(context.Background(), "k")
	done := make(chan error, 1)
	go func() { _, err := l.Wait(ctx, "k"); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || denials.Load() != 1 {
			t.Fatalf("Wait = %v after %d denials; want context.Canceled after 1", err, denials.Load())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return when its context was cancelled during the sleep")
	}
}

func TestWaitOnRedis(t *testing.T) {
	// The waiter's tries are script calls on the shared bucket; the clock is
	// injected and only moves forward, so Redis's own key expiry (in real
	// time) cannot forget a bucket during the test.
	ctx := context.Background()
	_, client := redisStandalone(t)
	s := &testkit.Sleeper{Clock: testkit.NewClock(testkit.Start)}
	store := &countingStore{Store: redisstore.New(client)}
	l, err := ratelimit.New[string](store, ratelimit.PerSecond(4), ratelimit.WithNamespace("wait"),
		ratelimit.WithClock(s.Clock.Now), ratelimit.WithSleep(s.Sleep))
	if err != nil {
		t.Fatal(err)
	}
	ratelimit.SetWaitJitter(l, func(int64) int64 { return 0 })
	if d, err := l.TryAcquireN(ctx, "k", 4); err != nil || !d.Allowed {
		t.Fatalf("spending the bucket: %+v, %v", d, err)
	}
	d, err := l.WaitN(ctx, "k", 2)
	if err != nil || !d.Allowed || d.Remaining != 0 || d.Source != ratelimit.SourceStore {
		t.Fatalf("WaitN = %+v, %v; want admitted by the store with 0 left", d, err)
	}
	if got, want := s.Slept(), []time.Duration{500 * time.Millisecond}; !equalDurations(got, want) {
		t.Fatalf("slept %v, want %v", got, want)
	}
	if got := store.Applies.Load(); got != 3 {
		t.Fatalf("%d script calls, want 3 (the spend and two tries)", got)
	}
	if _, err := l.WaitN(ctx, "k", 5); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Fatalf("WaitN above the capacity on Redis: %v, want ErrInvalidArgument at once", err)
	}
}
