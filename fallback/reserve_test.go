package fallback

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
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
	if _, err := onPrimary.Settle(ctx, 10); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("settle of the primary's reservation during the outage: %v; want ErrUnavailable", err)
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
		{ReturnError, false, ErrUnavailable},
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
