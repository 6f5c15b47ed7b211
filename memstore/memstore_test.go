package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/storehook"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/storetest"
)

func TestSuite(t *testing.T) {
	store := memstore.New()
	storetest.Run(t, func(*testing.T) ratelimit.Store { return store })
}

func TestStoreClockDecidesRequestsWithoutATime(t *testing.T) {
	clock := testkit.NewClock(testkit.Start)
	s := memstore.New(memstore.WithClock(clock.Now))
	l, _ := ratelimit.New[string](s, ratelimit.PerSecond(1))
	ctx := context.Background()
	if d, _ := l.TryAcquire(ctx, "s"); !d.Allowed {
		t.Fatal("first check denied")
	}
	if d, _ := l.TryAcquire(ctx, "s"); d.Allowed {
		t.Fatal("second check at the same instant allowed")
	}
	clock.Add(time.Second)
	if d, _ := l.TryAcquire(ctx, "s"); !d.Allowed {
		t.Fatal("denied a second later on the store's clock")
	}
}

func TestFullBucketsAreReclaimed(t *testing.T) {
	clock := testkit.NewClock(testkit.Start)
	s := memstore.New(memstore.WithClock(clock.Now))
	l, _ := ratelimit.New[string](s, ratelimit.PerSecond(10))
	ctx := context.Background()
	const n = 10_000
	for i := range n {
		if _, err := l.TryAcquire(ctx, fmt.Sprint("subject-", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Len(); got != n {
		t.Fatalf("holding %d buckets after %d subjects, want %d", got, n, n)
	}
	// 100 ms later each bucket is full again; the store counts expiry in
	// whole seconds, rounded up. Checks on one subject sweep the rest out.
	clock.Add(2 * time.Second)
	for range 2 * n {
		l.TryAcquire(ctx, "hot")
	}
	if got := s.Len(); got > 1+64 {
		t.Fatalf("holding %d buckets after they refilled, want at most the hot one and a shard's slack", got)
	}
	clock.Add(time.Second)
	s.Sweep()
	if got := s.Len(); got != 0 {
		t.Fatalf("Sweep left %d buckets, want 0", got)
	}
}

func TestBucketsAreNotReclaimedBeforeTheyRefill(t *testing.T) {
	clock := testkit.NewClock(testkit.Start)
	s := memstore.New(memstore.WithClock(clock.Now))
	l, _ := ratelimit.New[string](s, ratelimit.PerSecond(10))
	ctx := context.Background()
	l.TryAcquireN(ctx, "s", 10)
	clock.Add(999 * time.Millisecond)
	s.Sweep()
	if d, _ := l.TryAcquireN(ctx, "s", 10); d.Allowed {
		t.Fatal("a bucket 1 ms short of full was swept out and admitted a full burst")
	}
}

func TestCancelledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l, _ := ratelimit.New[string](memstore.New(), ratelimit.PerSecond(1))
	if _, err := l.TryAcquire(ctx, "s"); err != context.Canceled {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestKeysOfAnyShape(t *testing.T) {
	// Apply and the split key the Limiter hands it reach the same bucket
	// for a Limiter's keys, and keys that are not length-framed work too.
	s := memstore.New(memstore.WithClock(testkit.NewClock(testkit.Start).Now))
	applySplit := storehook.Split[ratelimit.Request, ratelimit.Decision](s)
	ctx := context.Background()
	r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerHour(3)}, Cost: 1}
	for _, k := range []struct{ prefix, subject string }{
		{"9:ratelimit:", "user:1"},
		{"3:a:b:", "c"},
		{"1:a:", "b:c"},
		{"", "plain"},
		{"12:", "short"},
		{"x:", "y"},
		{"0::", ""},
	} {
		if d, err := applySplit(ctx, k.prefix, k.subject, r); err != nil || d.Remaining != 2 {
			t.Fatalf("ApplySplit(%q, %q) = %+v, %v; want 2 left", k.prefix, k.subject, d, err)
		}
		if d, err := s.Apply(ctx, k.prefix+k.subject, r); err != nil || d.Remaining != 1 {
			t.Fatalf("Apply(%q) = %+v, %v; want 1 left: the same bucket", k.prefix+k.subject, d, err)
		}
		s.Reset(ctx, k.prefix+k.subject)
		if d, _ := applySplit(ctx, k.prefix, k.subject, r); d.Remaining != 2 {
			t.Fatalf("after Reset(%q), ApplySplit = %+v; want a full bucket", k.prefix+k.subject, d)
		}
	}
	if got := s.Len(); got != 7 {
		t.Fatalf("Len = %d, want 7 buckets", got)
	}
}

// TestAReservationExpiresOnTheStoresClock: a reservation not settled within
// its ttl, on the store's clock, is kept as taken.
func TestAReservationExpiresOnTheStoresClock(t *testing.T) {
	ctx := context.Background()
	clock := testkit.NewClock(testkit.Start)
	s := memstore.New(memstore.WithClock(clock.Now))
	l, err := ratelimit.New[string](s, ratelimit.PerMinute(100), ratelimit.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	rv, err := l.Reserve(ctx, "s", time.Second, 60)
	if err != nil || !rv.Decision.Allowed {
		t.Fatal(rv, err)
	}
	clock.Add(time.Second)
	if err := rv.Cancel(ctx); !errors.Is(err, ratelimit.ErrNotReserved) {
		t.Fatalf("cancel after the ttl: %v; want ErrNotReserved", err)
	}
	d, err := l.Peek(ctx, "s")
	if err != nil || d.Remaining != 41 { // 40 left, and a second's refill
		t.Fatalf("after the expired reservation: %+v, %v; want 41 (kept as taken)", d, err)
	}
}
