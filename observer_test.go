package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// events records what an Observer is told, as one line per event.
type events struct {
	mu    sync.Mutex
	lines []string
}

func (e *events) add(format string, args ...any) {
	e.mu.Lock()
	e.lines = append(e.lines, fmt.Sprintf(format, args...))
	e.mu.Unlock()
}

func (e *events) ObserveDecision(_ context.Context, ev ratelimit.DecisionEvent) {
	if ev.Latency < 0 {
		e.add("negative latency")
	}
	e.add("decision ns=%s key=%s cost=%d peek=%v allowed=%v source=%v", ev.Namespace, ev.Key, ev.Cost, ev.Peek, ev.Decision.Allowed, ev.Decision.Source)
}

func (e *events) ObserveError(_ context.Context, ev ratelimit.ErrorEvent) {
	kind := "store"
	switch {
	case errors.Is(ev.Err, ratelimit.ErrInvalidArgument):
		kind = "invalid"
	case errors.Is(ev.Err, context.Canceled):
		kind = "canceled"
	}
	e.add("error ns=%s key=%s op=%v cost=%d kind=%s", ev.Namespace, ev.Key, ev.Op, ev.Cost, kind)
}

func (e *events) ObserveFallback(_ context.Context, ev fallback.Event) {
	e.add("fallback partition=%s alive=%v outage=%v", ev.Partition, ev.Alive, ev.Outage)
}

func (e *events) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.lines
	e.lines = nil
	return l
}

func TestObserver(t *testing.T) {
	ctx := context.Background()
	clock := testkit.NewClock(testkit.Start)
	newLimiter := func(store ratelimit.Store, obs ratelimit.Observer, opts ...ratelimit.Option) *ratelimit.Limiter[string] {
		t.Helper()
		opts = append([]ratelimit.Option{ratelimit.WithNamespace("n"), ratelimit.WithClock(clock.Now), ratelimit.WithObserver(obs)}, opts...)
		l, err := ratelimit.New[string](store, ratelimit.PerMinute(2), opts...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	tests := []struct {
		name  string
		store func() ratelimit.Store
		opts  []ratelimit.Option
		run   func(l *ratelimit.Limiter[string])
		want  []string
	}{
		{"every decision, with its source", func() ratelimit.Store { return memstore.New() }, []ratelimit.Option{ratelimit.WithDenyCache(4)}, func(l *ratelimit.Limiter[string]) {
			l.TryAcquireN(ctx, "s", 2)
			l.TryAcquire(ctx, "s")
			l.TryAcquire(ctx, "s")
			l.Peek(ctx, "s")
		}, []string{
			"decision ns=n key=1:n:s cost=2 peek=false allowed=true source=store",
			"decision ns=n key=1:n:s cost=1 peek=false allowed=false source=store",
			"decision ns=n key=1:n:s cost=1 peek=false allowed=false source=cache",
			"decision ns=n key=1:n:s cost=1 peek=true allowed=false source=store",
		}},
		{"invalid arguments, before any store", func() ratelimit.Store { return failingStore{Err: errors.New("connection refused")} }, nil, func(l *ratelimit.Limiter[string]) {
			l.TryAcquireN(ctx, "s", 3)
			l.TryAcquire(ctx, "")
			l.Peek(ctx, "")
			l.Reset(ctx, "")
		}, []string{
			"error ns=n key=1:n:s op=acquire cost=3 kind=invalid",
			"error ns=n key= op=acquire cost=1 kind=invalid",
			"error ns=n key= op=peek cost=1 kind=invalid",
			"error ns=n key= op=reset cost=0 kind=invalid",
		}},
		{"a valid subject refused for its time still names its key", func() ratelimit.Store { return memstore.New() },
			[]ratelimit.Option{ratelimit.WithClock(func() time.Time { return time.Unix(-1, 0) })}, func(l *ratelimit.Limiter[string]) {
				l.TryAcquire(ctx, "s")
				l.Peek(ctx, "s")
			}, []string{
				"error ns=n key=1:n:s op=acquire cost=1 kind=invalid",
				"error ns=n key=1:n:s op=peek cost=1 kind=invalid",
			}},
		{"store errors, for checks, peeks and resets", func() ratelimit.Store { return failingStore{Err: errors.New("connection refused")} }, nil, func(l *ratelimit.Limiter[string]) {
			l.TryAcquire(ctx, "s")
			l.Peek(ctx, "s")
			l.Reset(ctx, "s")
		}, []string{
			"error ns=n key=1:n:s op=acquire cost=1 kind=store",
			"error ns=n key=1:n:s op=peek cost=1 kind=store",
			"error ns=n key=1:n:s op=reset cost=0 kind=store",
		}},
		{"the caller's cancellation", func() ratelimit.Store { return memstore.New() }, nil, func(l *ratelimit.Limiter[string]) {
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			l.TryAcquire(cctx, "s")
		}, []string{
			"error ns=n key=1:n:s op=acquire cost=1 kind=canceled",
		}},
		{"each item of a batch", func() ratelimit.Store { return memstore.New() }, []ratelimit.Option{ratelimit.WithDenyCache(4)}, func(l *ratelimit.Limiter[string]) {
			l.TryAcquireMany(ctx, []ratelimit.Item[string]{{"a", 2}, {"", 1}, {"a", 1}, {"b", 5}})
			l.TryAcquireMany(ctx, []ratelimit.Item[string]{{"a", 1}})
		}, []string{
			"error ns=n key= op=acquire cost=1 kind=invalid",
			"error ns=n key=1:n:b op=acquire cost=5 kind=invalid",
			"decision ns=n key=1:n:a cost=2 peek=false allowed=true source=store",
			"decision ns=n key=1:n:a cost=1 peek=false allowed=false source=store",
			"decision ns=n key=1:n:a cost=1 peek=false allowed=false source=cache",
		}},
		{"a successful reset is no event", func() ratelimit.Store { return memstore.New() }, nil, func(l *ratelimit.Limiter[string]) {
			l.Reset(ctx, "s")
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := &events{}
			tt.run(newLimiter(tt.store(), ev, tt.opts...))
			got := ev.take()
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("events:\n%s\nwant:\n%s", lines(got), lines(tt.want))
			}
		})
	}
}

func lines(l []string) string {
	var s string
	for _, x := range l {
		s += "\t" + x + "\n"
	}
	return s
}

func TestSeveralObservers(t *testing.T) {
	a, b := &events{}, &events{}
	var decisions int
	funcs := ratelimit.ObserverFuncs{Decision: func(context.Context, ratelimit.DecisionEvent) { decisions++ }}
	l, err := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(1), ratelimit.WithNamespace("n"),
		ratelimit.WithObserver(a, b), ratelimit.WithObserver(funcs))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l.TryAcquire(ctx, "s")
	l.TryAcquire(ctx, "") // an error: funcs has no Error, so it is ignored there
	want := "[decision ns=n key=1:n:s cost=1 peek=false allowed=true source=store error ns=n key= op=acquire cost=1 kind=invalid]"
	for i, e := range []*events{a, b} {
		if got := fmt.Sprint(e.take()); got != want {
			t.Errorf("observer %d got %s, want %s", i, got, want)
		}
	}
	if decisions != 1 {
		t.Errorf("ObserverFuncs saw %d decisions, want 1", decisions)
	}
	var empty ratelimit.ObserverFuncs
	empty.ObserveDecision(ctx, ratelimit.DecisionEvent{})
	empty.ObserveError(ctx, ratelimit.ErrorEvent{})
	if _, err := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(1), ratelimit.WithObserver(a, nil)); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Errorf("a nil observer: err = %v, want ErrInvalidArgument", err)
	}
}

func TestObservedLatencyIsTheChecksOwn(t *testing.T) {
	// The injected clock does not move, but the latency is real time.
	clock := testkit.NewClock(testkit.Start)
	var latency time.Duration
	slow := &gated{Store: memstore.New()}
	l, _ := ratelimit.New[string](slow, ratelimit.PerMinute(1), ratelimit.WithClock(clock.Now),
		ratelimit.WithObserver(ratelimit.ObserverFuncs{Decision: func(_ context.Context, e ratelimit.DecisionEvent) { latency = e.Latency }}))
	slow.hold()
	done := make(chan struct{})
	go func() {
		l.TryAcquire(context.Background(), "s")
		close(done)
	}()
	slow.waitHeld()
	time.Sleep(2 * time.Millisecond) // the store is slow; no refill is waited for
	slow.release()
	<-done
	if latency < 2*time.Millisecond {
		t.Fatalf("observed latency %v for a check held 2ms", latency)
	}
}

func TestObserverGetsTheChecksContext(t *testing.T) {
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "trace-7")
	var got []any
	obs := ratelimit.ObserverFuncs{
		Decision: func(ctx context.Context, _ ratelimit.DecisionEvent) { got = append(got, ctx.Value(key{})) },
		Error:    func(ctx context.Context, _ ratelimit.ErrorEvent) { got = append(got, ctx.Value(key{})) },
	}
	l, _ := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(1), ratelimit.WithObserver(obs))
	l.TryAcquire(ctx, "s")
	l.TryAcquire(ctx, "")
	l.TryAcquireMany(ctx, []ratelimit.Item[string]{{"s", 1}})
	l.Peek(ctx, "s")
	if fmt.Sprint(got) != "[trace-7 trace-7 trace-7 trace-7]" {
		t.Fatalf("observer saw contexts carrying %v", got)
	}
}
