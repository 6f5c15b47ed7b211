package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/redisstore"
)

// TestTwoClientsSettleOneReservationOnce: limiters on two clients of one
// server (two processes, as far as Redis can tell) settle the same token at
// once, many times over: each reservation refunds exactly once.
func TestTwoClientsSettleOneReservationOnce(t *testing.T) {
	srv, client := standalone(t)
	other := redistest.NewClient(srv.Addr())
	t.Cleanup(func() { other.Close() })
	ctx := context.Background()
	limit := ratelimit.PerHour(1000)
	a, _ := ratelimit.New[string](redisstore.New(client), limit, ratelimit.WithNamespace("two"))
	b, _ := ratelimit.New[string](redisstore.New(other), limit, ratelimit.WithNamespace("two"))
	for round := range 50 {
		rv, err := a.Reserve(ctx, "tenant", time.Minute, 100)
		if err != nil || !rv.Decision.Allowed {
			t.Fatalf("round %d: reserve %+v %v", round, rv, err)
		}
		var wg sync.WaitGroup
		refunds := make(chan error, 2)
		for _, l := range []*ratelimit.Limiter[string]{a, b} {
			wg.Go(func() {
				_, err := l.Settle(ctx, rv.Token(), 0)
				refunds <- err
			})
		}
		wg.Wait()
		close(refunds)
		settled := 0
		for err := range refunds {
			switch {
			case err == nil:
				settled++
			case !errors.Is(err, ratelimit.ErrNotReserved):
				t.Fatal(err)
			}
		}
		if settled != 1 {
			t.Fatalf("round %d: %d settles refunded, want 1", round, settled)
		}
	}
	d, err := a.Peek(ctx, "tenant")
	if err != nil || d.Remaining < 999 { // everything back, but what refilled
		t.Fatalf("after 50 reserves each cancelled once: %+v %v", d, err)
	}
}

// TestAReservationRecordLivesForItsTTL: the record beside the bucket expires
// with the reservation's ttl, and a reservation whose record is gone is kept
// as taken.
func TestAReservationRecordLivesForItsTTL(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	l, _ := ratelimit.New[string](redisstore.New(client), ratelimit.PerHour(1000), ratelimit.WithNamespace("ttl"))
	rv, err := l.Reserve(ctx, "tenant", 90*time.Second, 100)
	if err != nil || !rv.Decision.Allowed {
		t.Fatal(rv, err)
	}
	id, _, _ := strings.Cut(rv.Token(), ".")
	record := keyfmt.Record(l.Key("tenant"), id)
	pttl, err := client.PTTL(ctx, record).Result()
	if err != nil || pttl > 90*time.Second || pttl < 80*time.Second {
		t.Fatalf("record %q PTTL %v %v; want about 90s", record, pttl, err)
	}
	client.Del(ctx, record) // as its expiry would
	if err := rv.Cancel(ctx); !errors.Is(err, ratelimit.ErrNotReserved) {
		t.Fatalf("cancel without a record: %v; want ErrNotReserved", err)
	}
	if d, err := l.Peek(ctx, "tenant"); err != nil || d.Remaining > 901 {
		t.Fatalf("after the expired reservation: %+v %v; want the 100 kept", d, err)
	}
}
