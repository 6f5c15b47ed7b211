package memstore_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// TestChecksAllocateNothing holds memstore's checks to no allocation of its
// own: a policy of one limit allocates nothing, and a policy of several
// limits or quotas the one slice of its Decision's Standings (a value the
// caller keeps, so it cannot be the store's).
func TestChecksAllocateNothing(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		limits []ratelimit.Limit
		allocs float64 // the Decision's Standings
	}{
		{"one limit", []ratelimit.Limit{ratelimit.PerSecond(1_000_000_000)}, 0},
		{"two limits", []ratelimit.Limit{ratelimit.PerSecond(1_000_000_000), ratelimit.PerMinute(1_000_000)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := ratelimit.NewMulti[string](memstore.New(), tc.limits)
			if err != nil {
				t.Fatal(err)
			}
			for _, subject := range []string{"hot", "a subject of 30 bytes, or so.."} {
				l.TryAcquire(ctx, subject)
				if n := testing.AllocsPerRun(1000, func() { l.TryAcquire(ctx, subject) }); n != tc.allocs {
					t.Errorf("%d allocations per check of %q, want %d", int(n), subject, int(tc.allocs))
				}
			}
		})
	}
}

func TestRemadeBucketsAllocateNothing(t *testing.T) {
	// Subjects come back after their buckets were swept out, while others of
	// their namespace stay: their new buckets reuse the entries and map slots
	// the old ones left.
	const n = 5_000
	clock := testkit.NewClock(testkit.Start)
	s := memstore.New(memstore.WithClock(clock.Now))
	ctx := context.Background()
	l, _ := ratelimit.New[string](s, ratelimit.PerSecond(10))
	stay, come := make([]string, n), make([]string, n)
	for i := range n {
		stay[i], come[i] = "stay-"+strconv.Itoa(i), "come-"+strconv.Itoa(i)
	}
	round := func() (mallocs uint64) {
		for _, sub := range stay {
			l.TryAcquire(ctx, sub)
		}
		for _, sub := range come {
			l.TryAcquire(ctx, sub)
		}
		// The comers are away long enough to be swept out; the others are
		// checked meanwhile.
		clock.Add(3 * time.Second)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 8 {
			for _, sub := range stay {
				l.TryAcquire(ctx, sub)
			}
		}
		if got := s.Len(); got > n+n/100 {
			t.Fatalf("%d buckets held while the comers are away, want %d: they were not swept out", got, n)
		}
		for _, sub := range come {
			l.TryAcquire(ctx, sub)
		}
		runtime.ReadMemStats(&after)
		clock.Add(3 * time.Second)
		return after.Mallocs - before.Mallocs
	}
	round() // the tables grow to their size
	round()
	checks := uint64(9 * n)
	m := round()
	t.Logf("%d allocations over %d checks", m, checks)
	// A Go map grows now and then as its deleted slots fill up (an
	// allocation per table at most); a remade bucket itself allocates
	// nothing.
	if m > checks/100 {
		t.Fatalf("%d allocations over %d checks, %d of them on remade buckets: want at most one per 100 checks", m, checks, n)
	}
}

func TestHeapPerSubject(t *testing.T) {
	// Issue 9's bound: at most 100 heap bytes per live subject, the subject
	// included (each a string of its own, as a server parses it from a
	// request), here at 11 bytes like "user:123456".
	const n = 300_000
	s := memstore.New(memstore.WithClock(func() time.Time { return testkit.Start }))
	l, _ := ratelimit.New[string](s, ratelimit.PerSecond(1000))
	ctx := context.Background()
	before := testkit.LiveHeap()
	var buf []byte
	for i := range n {
		buf = strconv.AppendInt(append(buf[:0], "user:"...), int64(100_000+i), 10)
		l.TryAcquire(ctx, string(buf))
	}
	after := testkit.LiveHeap()
	if s.Len() != n {
		t.Fatalf("%d buckets held, want %d", s.Len(), n)
	}
	per := float64(after-before) / n
	t.Logf("%.1f heap bytes per subject", per)
	if per > 100 {
		t.Fatalf("%.1f heap bytes per subject, want at most 100", per)
	}
}
