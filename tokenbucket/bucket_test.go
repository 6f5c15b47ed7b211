package tokenbucket

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/arith"
)

func TestBucket(t *testing.T) {
	b, err := New(ratelimit.NewLimit(2, time.Second, 4))
	if err != nil {
		t.Fatal(err)
	}
	start := time.UnixMicro(t0)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	if got := b.Available(at(0)); got != 4 {
		t.Fatalf("a new bucket holds %d, want 4 (full)", got)
	}
	if !b.AllowN(at(0), 3) || !b.Allow(at(0)) {
		t.Fatal("a full bucket of 4 denied 3 then 1")
	}
	if b.Allow(at(499)) {
		t.Fatal("allowed at 499 ms; the first token refills at 500 ms")
	}
	if !b.Allow(at(500)) {
		t.Fatal("denied at 500 ms, when one token has refilled")
	}
	if b.AllowN(at(500), 5) {
		t.Fatal("AllowN above the capacity returned true")
	}
	if _, err := b.Take(at(500), 5); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Fatalf("Take above the capacity: err = %v, want ErrInvalidArgument", err)
	}
	if _, err := b.Take(time.Unix(-10, 0), 1); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Fatalf("Take before the epoch: err = %v, want ErrInvalidArgument", err)
	}
	d, err := b.Peek(at(1500))
	if err != nil || !d.Allowed || d.Remaining != 2 || d.ResetAfter != time.Second {
		t.Fatalf("Peek at 1.5 s = %+v, %v; want allowed, 2 remaining, full in 1s", d, err)
	}
	if got := b.Available(at(1500)); got != 2 {
		t.Fatalf("Peek took tokens: %d available, want 2", got)
	}
	if _, err := New(ratelimit.Limit{}); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Fatalf("New(ratelimit.Limit{}) err = %v, want ErrInvalidArgument", err)
	}
}

func TestBucketConcurrentUseAdmitsExactlyTheCapacity(t *testing.T) {
	b, err := New(ratelimit.PerHour(1000))
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMicro(t0)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				if b.Allow(now) {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 1000 {
		t.Fatalf("admitted %d of 4000 at one instant, want exactly 1000", got)
	}
}

func TestBucketSeveralLimits(t *testing.T) {
	perSecond, perMinute := ratelimit.PerSecond(2), ratelimit.PerMinute(3)
	b, err := New(perSecond, perMinute)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMicro(t0)
	for i, want := range []bool{true, true, false} {
		if got := b.Allow(now); got != want {
			t.Fatalf("check %d at 0s = %v, want %v", i, got, want)
		}
	}
	// A second later the per-second limit has 2 again, the minute only 1.
	now = now.Add(time.Second)
	d, err := b.Take(now, 2)
	if err != nil || d.Allowed || d.Limit != perMinute || d.Remaining != 1 {
		t.Fatalf("cost 2 after a second = %+v, %v; want denied by the minute limit with 1 left", d, err)
	}
	if !b.Allow(now) || b.Allow(now) {
		t.Fatal("after a second one more check should pass and the next fail")
	}
	if _, err := New(perSecond, ratelimit.Limit{}); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Fatalf("an invalid second limit: err = %v", err)
	}
}

func TestBucketZeroTimeIsAProgrammingError(t *testing.T) {
	b, err := New(ratelimit.PerSecond(2))
	if err != nil {
		t.Fatal(err)
	}
	if b.Allow(time.Time{}) || b.AllowN(time.Time{}, 1) {
		t.Fatal("Allow(time.Time{}) = true, want false")
	}
	if got := b.Available(time.Time{}); got != 0 {
		t.Fatalf("Available(time.Time{}) = %d, want 0", got)
	}
	for name, f := range map[string]func() (ratelimit.Decision, error){
		"Take": func() (ratelimit.Decision, error) { return b.Take(time.Time{}, 1) },
		"Peek": func() (ratelimit.Decision, error) { return b.Peek(time.Time{}) },
	} {
		if _, err := f(); !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), "zero time.Time") {
			t.Errorf("%s(time.Time{}) error = %v, want ratelimit.ErrInvalidArgument saying it is the zero time", name, err)
		}
	}
	if got := b.Available(time.UnixMicro(t0)); got != 2 {
		t.Fatalf("the zero-time calls took tokens: %d available, want 2", got)
	}
}

func TestBucketLimitsReturnsACopy(t *testing.T) {
	b, err := New(ratelimit.PerSecond(2))
	if err != nil {
		t.Fatal(err)
	}
	b.Limits()[0] = ratelimit.PerSecond(1000)
	if got := b.Limits()[0]; got != ratelimit.PerSecond(2) {
		t.Fatalf("Bucket.Limits() after a change = %v, want the policy unchanged", got)
	}
}

func TestBoundsAreTheArithmetics(t *testing.T) {
	if MaxExact != arith.MaxExact || MaxTime != arith.MaxTime || MaxLimits != arith.MaxLimits {
		t.Fatal("the exported bounds differ from the ones the arithmetic checks")
	}
}
