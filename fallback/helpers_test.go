package fallback

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// newFakeClock returns a clock that moves only when told to.
func newFakeClock() *testkit.Clock {
	return testkit.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
}

// mode is what a fakePrimary does with a call.
type mode int32

const (
	up      mode = iota // decides with its memstore
	refused             // fails with a real "connection refused" error
	hung                // blocks until the call's context is done
	broken              // fails with the error in fakePrimary.fail
)

// fakePrimary is a primary Store whose reachability the test sets. It keeps
// its buckets in a memstore with the test's clock and counts what it is
// asked.
type fakePrimary struct {
	store *memstore.Store
	mode  atomic.Int32
	fail  atomic.Pointer[error]
	calls atomic.Int64 // Apply and Reset calls
	pings atomic.Int64
	// gate, when set, is received from before a call proceeds, so that a
	// test can hold a call in flight.
	gate atomic.Pointer[chan struct{}]
}

func newFakePrimary(clock func() time.Time) *fakePrimary {
	return &fakePrimary{store: memstore.New(memstore.WithClock(clock))}
}

func (f *fakePrimary) set(m mode) { f.mode.Store(int32(m)) }

func (f *fakePrimary) failWith(err error) {
	f.fail.Store(&err)
	f.set(broken)
}

func (f *fakePrimary) outcome(ctx context.Context) error {
	if g := f.gate.Load(); g != nil {
		select {
		case <-*g:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	switch mode(f.mode.Load()) {
	case refused:
		return refusedError()
	case hung:
		<-ctx.Done()
		return ctx.Err()
	case broken:
		return *f.fail.Load()
	}
	return nil
}

func (f *fakePrimary) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	f.calls.Add(1)
	if err := f.outcome(ctx); err != nil {
		return ratelimit.Decision{}, err
	}
	return f.store.Apply(ctx, key, r)
}

func (f *fakePrimary) Reset(ctx context.Context, key string) error {
	f.calls.Add(1)
	if err := f.outcome(ctx); err != nil {
		return err
	}
	return f.store.Reset(ctx, key)
}

func (f *fakePrimary) Reserve(ctx context.Context, key, id string, r ratelimit.Request, ttl time.Duration) (ratelimit.Decision, error) {
	f.calls.Add(1)
	if err := f.outcome(ctx); err != nil {
		return ratelimit.Decision{}, err
	}
	return f.store.Reserve(ctx, key, id, r, ttl)
}

func (f *fakePrimary) Settle(ctx context.Context, key, id string, r ratelimit.Request, actual []int64) (ratelimit.Decision, error) {
	f.calls.Add(1)
	if err := f.outcome(ctx); err != nil {
		return ratelimit.Decision{}, err
	}
	return f.store.Settle(ctx, key, id, r, actual)
}

// pingingPrimary is a fakePrimary with a Ping method.
type pingingPrimary struct{ *fakePrimary }

func (p pingingPrimary) Ping(ctx context.Context) error {
	p.pings.Add(1)
	return p.outcome(ctx)
}

// refusedError returns the error of a real TCP dial to a loopback port
// that nobody listens on.
func refusedError() error {
	refusedOnce.Do(func() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			refusedErr = err
			return
		}
		addr := ln.Addr().String()
		ln.Close()
		_, refusedErr = net.DialTimeout("tcp", addr, time.Second)
		if refusedErr == nil || !errors.Is(refusedErr, syscall.ECONNREFUSED) {
			// Someone took the port in between: use the shape a
			// refused dial has.
			refusedErr = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		}
	})
	return refusedErr
}

var (
	refusedOnce sync.Once
	refusedErr  error
)

// mustNew builds a Store or fails the test.
func mustNew(t testing.TB, primary ratelimit.Store, opts ...Option) *Store {
	t.Helper()
	s, err := New(primary, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// req is a check of cost against limit at the clock's time.
func req(limit ratelimit.Limit, cost int64, now time.Time) ratelimit.Request {
	return ratelimit.Request{Limits: []ratelimit.Limit{limit}, Cost: cost, Now: now}
}

// checkNoLeak fails the test when a goroutine running this package's Store
// code outlives the test (give it up to 3 s to wind down).
func checkNoLeak(t *testing.T) {
	t.Helper()
	checkGone(t, "fallback.Store code", "fallback.(*Store)")
}

// checkGone fails the test when a goroutine whose stack contains marker
// (what, in the message) outlives the test and the cleanups registered
// after this call: give it up to 3 s to wind down.
func checkGone(t *testing.T, what, marker string) {
	t.Helper()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for {
			leaked := goroutinesWith(marker)
			if leaked == "" {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("goroutines still running %s after the test:\n%s", what, leaked)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// goroutinesWith returns the stacks of the goroutines whose stack contains
// marker.
func goroutinesWith(marker string) string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, marker) {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
