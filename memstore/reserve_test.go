package memstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// TestOpenReservationsAreBounded: a store holding its most open
// reservations refuses another reserve before taking anything; a settle
// makes room, and so do reservations whose ttl ended.
func TestOpenReservationsAreBounded(t *testing.T) {
	ctx := context.Background()
	clock := testkit.NewClock(testkit.Start)
	s := memstore.New(memstore.WithClock(clock.Now), memstore.WithMaxReservations(3))
	l, err := ratelimit.New[string](s, ratelimit.PerMinute(100), ratelimit.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	reserve := func(subject string, ttl time.Duration) (*ratelimit.Reservation, error) {
		t.Helper()
		rv, err := l.Reserve(ctx, subject, ttl, 10)
		if err == nil && !rv.Decision.Allowed {
			t.Fatalf("Reserve(%s) = %+v; want allowed", subject, rv.Decision)
		}
		return rv, err
	}
	remaining := func(subject string, want int64) {
		t.Helper()
		if d, err := l.Peek(ctx, subject); err != nil || d.Remaining != want {
			t.Fatalf("%s's bucket = %+v, %v; want %d", subject, d, err, want)
		}
	}
	refused := func(subject string) {
		t.Helper()
		rv, err := reserve(subject, time.Minute)
		if err == nil || !strings.Contains(err.Error(), "open reservations") || errors.Is(err, ratelimit.ErrInvalidArgument) {
			t.Fatalf("Reserve(%s) past the bound = %+v, %v; want refused as too many open reservations", subject, rv, err)
		}
	}

	var open []*ratelimit.Reservation
	for _, ttl := range []time.Duration{time.Second, time.Minute, time.Minute} {
		rv, err := reserve("s", ttl)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, rv)
	}
	refused("t")
	remaining("t", 100)
	remaining("s", 70)

	if _, err := open[1].Settle(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := reserve("t", time.Minute); err != nil {
		t.Fatalf("Reserve after a settle: %v; want room for one", err)
	}
	refused("t")
	remaining("t", 90)

	clock.Add(time.Second) // the first reservation's ttl ends: kept as taken
	if _, err := reserve("t", time.Minute); err != nil {
		t.Fatalf("Reserve after a reservation expired: %v; want room for one", err)
	}
	refused("t")
	remaining("t", 81) // 80 and a second's refill
	remaining("s", 71) // 70 and a second's refill: the expired reservation kept as taken
}
