package fallback

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// TestReservationsAcrossAnOutage: a reservation made on the local bucket
// during an outage settles there, also once the primary is back; one made on
// the primary whose settle meets the outage changes nothing and says so, and
// settles on the primary once it answers.
func TestReservationsAcrossAnOutage(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	primary := newFakePrimary(clock.Now)
	s := mustNew(t, primary, WithOutage(LocalFallback), WithClock(clock.Now))
	l, err := ratelimit.New[string](s, ratelimit.PerMinute(100), ratelimit.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}

	onPrimary, err := l.Reserve(ctx, "s", time.Minute, 60)
	if err != nil || onPrimary.Decision.Source != ratelimit.SourceStore || onPrimary.Decision.Remaining != 40 {
		t.Fatalf("reserve on the primary = %+v, %v", onPrimary, err)
	}
	primary.set(refused)
	local, err := l.Reserve(ctx, "s", time.Minute, 30)
	if err != nil || !local.Decision.Allowed || local.Decision.Source != ratelimit.SourceLocal || local.Decision.Remaining != 70 {
		t.Fatalf("reserve during the outage = %+v, %v; want the local bucket's", local, err)
	}
	if _, err := onPrimary.Settle(ctx, 10); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Fatalf("settle of the primary's reservation during the outage: %v; want ratelimit.ErrUnavailable", err)
	}
	primary.set(up)
	s.Probe(ctx)
	d, err := local.Settle(ctx, 0)
	if err != nil || d.Source != ratelimit.SourceLocal || d.Remaining != 100 {
		t.Fatalf("settle of the local reservation after the outage = %+v, %v; want the local bucket refunded", d, err)
	}
	d, err = onPrimary.Settle(ctx, 10)
	if err != nil || d.Source != ratelimit.SourceStore || d.Remaining != 90 {
		t.Fatalf("settle of the primary's reservation once it is back = %+v, %v", d, err)
	}
}

// TestReservationOutageBehaviours: while the primary is down a reserve is
// answered by the outage behaviour, and only LocalFallback's holds anything.
func TestReservationOutageBehaviours(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		outage  Outage
		allowed bool
		err     error
	}{
		{ReturnError, false, ratelimit.ErrUnavailable},
		{FailOpen, true, nil},
		{FailClosed, false, nil},
	} {
		t.Run(tc.outage.String(), func(t *testing.T) {
			clock := testkit.NewClock(testkit.Start)
			primary := newFakePrimary(clock.Now)
			primary.set(refused)
			s := mustNew(t, primary, WithOutage(tc.outage), WithClock(clock.Now))
			l, _ := ratelimit.New[string](s, ratelimit.PerMinute(100), ratelimit.WithClock(clock.Now))
			rv, err := l.Reserve(ctx, "s", time.Minute, 10)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("reserve = %+v, %v; want %v", rv, err, tc.err)
				}
				return
			}
			if err != nil || rv.Decision.Allowed != tc.allowed || rv.Decision.Enforced() {
				t.Fatalf("reserve = %+v, %v; want allowed %v, not enforced", rv.Decision, err, tc.allowed)
			}
			if !tc.allowed {
				return
			}
			primary.set(up)
			s.Probe(ctx)
			if _, err := rv.Settle(ctx, 0); !errors.Is(err, ratelimit.ErrNotReserved) {
				t.Fatalf("settle of a fail-open reservation: %v; want ErrNotReserved (nothing was taken)", err)
			}
		})
	}
}

// TestSettleByTokenAcrossAnOutage: Limiter.Settle, which knows the token
// alone, finds a reservation the local bucket made during an outage, during
// it and after it, from another limiter of the process; and one the primary
// holds once the primary is back.
func TestSettleByTokenAcrossAnOutage(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	primary := newFakePrimary(clock.Now)
	s := mustNew(t, primary, WithOutage(LocalFallback), WithClock(clock.Now))
	newLimiter := func() *ratelimit.Limiter[string] {
		l, err := ratelimit.New[string](s, ratelimit.PerMinute(100), ratelimit.WithClock(clock.Now), ratelimit.WithNamespace("tok"))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l, other := newLimiter(), newLimiter()
	onPrimary, err := l.Reserve(ctx, "s", time.Minute, 60)
	if err != nil || onPrimary.Decision.Source != ratelimit.SourceStore {
		t.Fatalf("reserve on the primary = %+v, %v", onPrimary, err)
	}
	primary.set(refused)
	during, err := l.Reserve(ctx, "s", time.Minute, 30)
	if err != nil || during.Decision.Source != ratelimit.SourceLocal {
		t.Fatalf("reserve during the outage = %+v, %v; want the local bucket's", during, err)
	}
	after, err := l.Reserve(ctx, "s", time.Minute, 20)
	if err != nil || after.Decision.Source != ratelimit.SourceLocal || after.Decision.Remaining != 50 {
		t.Fatalf("second reserve during the outage = %+v, %v", after, err)
	}
	d, err := other.Settle(ctx, during.Token(), 10)
	if err != nil || d.Source != ratelimit.SourceLocal || d.Remaining != 70 {
		t.Fatalf("settle by token during the outage = %+v, %v; want the local bucket refunded 20", d, err)
	}
	if _, err := other.Settle(ctx, onPrimary.Token(), 10); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Fatalf("settle by token of the primary's reservation during the outage: %v; want ratelimit.ErrUnavailable", err)
	}
	primary.set(up)
	s.Probe(ctx)
	d, err = other.Settle(ctx, after.Token(), 0)
	if err != nil || d.Source != ratelimit.SourceLocal || d.Remaining != 90 {
		t.Fatalf("settle by token of a local reservation after the outage = %+v, %v", d, err)
	}
	d, err = other.Settle(ctx, onPrimary.Token(), 10)
	if err != nil || d.Source != ratelimit.SourceStore || d.Remaining != 90 {
		t.Fatalf("settle by token of the primary's reservation once it is back = %+v, %v", d, err)
	}
	for _, rv := range []*ratelimit.Reservation{onPrimary, during, after} {
		if _, err := other.Settle(ctx, rv.Token(), 0); !errors.Is(err, ratelimit.ErrNotReserved) {
			t.Fatalf("a second settle: %v; want ErrNotReserved", err)
		}
	}
}

// TestSettleByTokenGoesToItsBucketsPartition: with partitions (Redis
// Cluster's masters), a settle by token goes to the partition of the
// reservation's bucket, which the token names through its slot, and not to
// that of the namespace's prefix, whatever that partition's state.
func TestSettleByTokenGoesToItsBucketsPartition(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	var dead atomic.Value
	dead.Store("")
	// Two partitions, by the parity of the key's slot.
	partOf := func(_ context.Context, key string) string { return strconv.Itoa(int(keyfmt.Slot(key) % 2)) }
	ping := func(_ context.Context, part string) error {
		if part == dead.Load().(string) {
			return refusedError()
		}
		return nil
	}
	primary := &slotPartitioned{fakePrimary: newFakePrimary(clock.Now), partOf: partOf, dead: &dead}
	s := mustNew(t, primary, WithOutage(ReturnError), WithClock(clock.Now), withPartitions(partOf, ping))
	l, err := ratelimit.New[string](s, ratelimit.PerMinute(100), ratelimit.WithClock(clock.Now), ratelimit.WithNamespace("parts"))
	if err != nil {
		t.Fatal(err)
	}
	prefixPart := partOf(ctx, keyfmt.Prefix("parts"))
	var live, down string // subjects whose buckets are in the other partition, and in the prefix's
	for i := 0; live == "" || down == ""; i++ {
		subject := "s" + strconv.Itoa(i)
		if partOf(ctx, l.Key(subject)) != prefixPart {
			live = subject
		} else {
			down = subject
		}
	}
	rv, err := l.Reserve(ctx, live, time.Minute, 60)
	if err != nil || rv.Decision.Source != ratelimit.SourceStore {
		t.Fatalf("reserve = %+v, %v", rv, err)
	}
	dead.Store(prefixPart)
	if _, err := l.TryAcquire(ctx, down); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Fatalf("a check in the dead partition: %v; want ratelimit.ErrUnavailable", err)
	}
	d, err := l.Settle(ctx, rv.Token(), 10)
	if err != nil || d.Source != ratelimit.SourceStore || d.Remaining != 90 {
		t.Fatalf("settle by token with the bucket's partition alive = %+v, %v", d, err)
	}
}

// slotPartitioned is a partitioned primary that refuses the keys of its dead
// partition, a settle by token by the partition of its record.
type slotPartitioned struct {
	*fakePrimary
	partOf func(ctx context.Context, key string) string
	dead   *atomic.Value
}

func (p *slotPartitioned) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if p.partOf(ctx, key) == p.dead.Load().(string) {
		return ratelimit.Decision{}, refusedError()
	}
	return p.fakePrimary.Apply(ctx, key, r)
}

func (p *slotPartitioned) Settle(ctx context.Context, key, id string, r ratelimit.Request, actual []int64) (ratelimit.Decision, error) {
	if p.partOf(ctx, keyfmt.Record(key, id)) == p.dead.Load().(string) {
		return ratelimit.Decision{}, refusedError()
	}
	return p.fakePrimary.Settle(ctx, key, id, r, actual)
}
