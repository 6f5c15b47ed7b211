package ratelimit_test

// Leases against real Redis: processes are limiters on redisstores of their
// own clients, on one server started by internal/redistest.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

func TestLeasesFleetOnRedis(t *testing.T) {
	srv := redistest.StartServer(t)
	clk := newRunningClock()
	stores := make([]ratelimit.Store, 4)
	for i := range stores {
		c := redistest.NewClient(srv.Addr())
		t.Cleanup(func() { c.Close() })
		stores[i] = redisstore.New(c)
	}
	hammerFleet(t, stores, clk, 150, 6, 40, 2, true)
}

func TestLeasesReturnOnCloseOnRedis(t *testing.T) {
	_, client := redisStandalone(t)
	clk := newTestClock()
	l := newLeased(t, redisstore.New(client), slowPolicy, clk, time.Second)
	leaseAndReturn(t, l, 0, func() {
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestLeasesReturnOnCoolDownOnRedis(t *testing.T) {
	_, client := redisStandalone(t)
	clk := newTestClock()
	l := newLeased(t, redisstore.New(client), slowPolicy, clk, 10*time.Millisecond)
	leaseAndReturn(t, l, 0, func() {
		clk.advance(10 * time.Millisecond)
		if _, err := l.TryAcquire(context.Background(), "other"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLeasesOutageOnRedis: the proxy in front of the server drops every
// connection; the lease in hand is spent, then the store's error returns.
func TestLeasesOutageOnRedis(t *testing.T) {
	srv := redistest.StartServer(t)
	proxy := redistest.StartProxy(t, srv.Addr())
	client := redistest.NewClient(proxy.Addr())
	t.Cleanup(func() { client.Close() })
	clk := newTestClock()
	l := newLeased(t, redisstore.New(client), slowPolicy, clk, time.Minute)
	checkOutage(t, l, func(down bool) {
		if down {
			proxy.Drop()
		} else {
			proxy.Resume()
		}
	}, func(err error) bool {
		return !errors.Is(err, ratelimit.ErrInvalidArgument) && !errors.Is(err, tokenbucket.ErrCorruptState)
	})
}
