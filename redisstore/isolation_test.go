package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

// faultHook delays or panics the commands and pipelines whose keys contain
// a marker, and records the context values they were sent with.
type faultHook struct {
	delayKey  string        // a command on a key containing it is delayed
	delay     time.Duration //
	release   chan struct{} // if not nil, closing it ends the delay early
	panicOnce atomic.Int32  // 1: the next command panics; 2: the next pipeline
	started   chan struct{} // closed when the delayed command starts
	once      sync.Once
	seen      sync.Map // values of ctxKey seen by pipelines
}

type ctxKey struct{}

func (h *faultHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *faultHook) hit(ctx context.Context, cmds []redis.Cmder) {
	for _, c := range cmds {
		for _, a := range c.Args() {
			if s, ok := a.(string); ok && h.delayKey != "" && strings.Contains(s, h.delayKey) {
				h.once.Do(func() { close(h.started) })
				select {
				case <-time.After(h.delay):
				case <-h.release:
				case <-ctx.Done():
				}
				return
			}
		}
	}
}

func (h *faultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.panicOnce.CompareAndSwap(1, 0) {
			panic("a hook panics once")
		}
		h.hit(ctx, []redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (h *faultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if v := ctx.Value(ctxKey{}); v != nil {
			h.seen.Store(v, true)
		}
		if h.panicOnce.CompareAndSwap(2, 0) {
			panic("a pipeline hook panics once")
		}
		h.hit(ctx, cmds)
		return next(ctx, cmds)
	}
}

func faultyStore(t *testing.T, h *faultHook, opts ...redisstore.Option) (*redisstore.Store, *ratelimit.Limiter[string]) {
	t.Helper()
	srv, _ := standalone(t)
	client, _ := hookedClient(t, srv)
	client.AddHook(h)
	store := redisstore.New(client, opts...)
	l, err := ratelimit.New[string](store, ratelimit.PerSecond(1_000_000), ratelimit.WithNamespace("iso"))
	if err != nil {
		t.Fatal(err)
	}
	return store, l
}

// holdCheck starts a check of the subject whose command h holds back and
// returns once h holds it; the channel receives the check's error.
func holdCheck(ctx context.Context, h *faultHook, l *ratelimit.Limiter[string]) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := l.TryAcquire(ctx, h.delayKey)
		done <- err
	}()
	<-h.started
	return done
}

// wantAllowed makes 5 checks of subject, each with a deadline of 2 s, and
// fails the test unless every one is allowed.
func wantAllowed(t *testing.T, l *ratelimit.Limiter[string], subject, after string) {
	t.Helper()
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		d, err := l.TryAcquire(ctx, subject)
		cancel()
		if err != nil || !d.Allowed {
			t.Fatalf("check %d after %s: %+v, %v", i, after, d, err)
		}
	}
}

// TestASlowCommandDelaysNoOtherSubject: one subject's command is held back
// until the test releases it; 10 checks of another subject, sent meanwhile,
// all succeed before it is released: they go out on other lanes. In the
// timing tier (RATELIMIT_TIMING=1) each of them has a 200 ms deadline, and
// the command is released after 1.5 s at the latest; in the default run the
// deadline is 10 s, which only a check queued behind the held command would
// run into.
func TestASlowCommandDelaysNoOtherSubject(t *testing.T) {
	deadline := 10 * time.Second
	if testkit.Timed(t) {
		deadline = 200 * time.Millisecond
	}
	h := &faultHook{delayKey: "slow-subject", delay: 1500 * time.Millisecond, started: make(chan struct{}), release: make(chan struct{})}
	if deadline > h.delay {
		h.delay = 2 * deadline
	}
	_, l := faultyStore(t, h)
	ctx := context.Background()
	if _, err := l.TryAcquire(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	slowDone := holdCheck(ctx, h, l)
	var wg sync.WaitGroup
	var failed atomic.Int32
	var slowest atomic.Int64
	for range 10 {
		wg.Go(func() {
			start := time.Now()
			cctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			if d, err := l.TryAcquire(cctx, "other"); err != nil || !d.Allowed {
				failed.Add(1)
				t.Errorf("a check of another subject: %+v, %v", d, err)
			}
			if took := time.Since(start); int64(took) > slowest.Load() {
				slowest.Store(int64(took))
			}
		})
	}
	wg.Wait()
	select {
	case err := <-slowDone:
		t.Errorf("the held check ended (%v) before the checks of the other subject did", err)
	default:
	}
	close(h.release)
	t.Logf("FIGURE 10 checks beside a held command (deadline %v): %d failed, slowest %v", deadline, failed.Load(), time.Duration(slowest.Load()))
	if err := <-slowDone; err != nil {
		t.Fatalf("the slow check itself: %v", err)
	}
}

// TestAPanicLeavesTheStoreWorking: a check that panics (on the direct path
// and inside a coalesced batch) releases its lane, and the next checks
// succeed.
func TestAPanicLeavesTheStoreWorking(t *testing.T) {
	h := &faultHook{delayKey: "hold-the-lane", delay: 300 * time.Millisecond, started: make(chan struct{})}
	_, l := faultyStore(t, h, redisstore.WithLanes(1))
	ctx := context.Background()
	h.panicOnce.Store(1)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the hook's panic did not reach the caller")
			}
		}()
		l.TryAcquire(ctx, "a")
	}()
	wantAllowed(t, l, "a", "a panic")
	// A panic in a batch: the one lane is held by a slow check while 16
	// others queue, so they go out together in one pipeline, whose hook
	// panics; the batch's callers get an error, the process lives on.
	h.panicOnce.Store(2)
	held := holdCheck(ctx, h, l)
	var wg sync.WaitGroup
	var errs atomic.Int32
	for range 16 {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if _, err := l.TryAcquire(cctx, "b"); err != nil {
				errs.Add(1)
			}
		})
	}
	wg.Wait()
	if err := <-held; err != nil {
		t.Fatalf("the check that held the lane: %v", err)
	}
	if h.panicOnce.Load() != 0 || errs.Load() == 0 {
		t.Errorf("the batch's panic was not reached (%d of 16 checks got an error)", errs.Load())
	}
	wantAllowed(t, l, "c", "a panic in a batch")
}

// TestBatchesKeepTheirCallersContextValues: a coalesced pipeline runs with
// the values of one of its callers' contexts.
func TestBatchesKeepTheirCallersContextValues(t *testing.T) {
	h := &faultHook{delayKey: "hold-the-lane", delay: 300 * time.Millisecond, started: make(chan struct{})}
	_, l := faultyStore(t, h, redisstore.WithLanes(1))
	// The one lane is held while the checks queue: they go out together.
	holdCheck(context.Background(), h, l)
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			ctx := context.WithValue(context.Background(), ctxKey{}, i)
			if _, err := l.TryAcquire(ctx, "s"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	n := 0
	h.seen.Range(func(any, any) bool { n++; return true })
	if n == 0 {
		t.Fatal("no pipeline saw a caller's context value")
	}
}

// TestACallerThatGivesUpInTheQueueConsumesNothing: with the only lane held
// by a slow command, a queued check whose deadline passes returns its
// context's error and takes no token.
func TestACallerThatGivesUpInTheQueueConsumesNothing(t *testing.T) {
	h := &faultHook{delayKey: "hold", delay: 500 * time.Millisecond, started: make(chan struct{})}
	_, l := faultyStore(t, h, redisstore.WithLanes(1))
	one, err := ratelimit.New[string](l.Store(), ratelimit.PerMinute(1), ratelimit.WithNamespace("one"))
	if err != nil {
		t.Fatal(err)
	}
	holdCheck(context.Background(), h, l)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = one.TryAcquire(ctx, "s")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued check past its deadline: err = %v, want DeadlineExceeded", err)
	}
	time.Sleep(600 * time.Millisecond) // the lane comes free
	if d, err := one.TryAcquire(context.Background(), "s"); err != nil || !d.Allowed {
		t.Fatalf("the token was taken by a check that gave up: %+v, %v", d, err)
	}
}
