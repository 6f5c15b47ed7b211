package ratelimit_test

// Leases against real Redis: processes are limiters on redisstores of their
// own clients, on one server started by internal/redistest.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
	"github.com/redis/go-redis/v9"
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
		ratelimit.WaitLeaseReturns(l) // made in the background
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

// TestLeasesGiveBackToHungRedis: the give-backs of leases to a server
// stopped with SIGSTOP hold up neither a check nor Close past its deadline.
func TestLeasesGiveBackToHungRedis(t *testing.T) {
	srv, client := redisSlowTimeouts(t)
	clk := newTestClock()
	const lifetime = 10 * time.Millisecond
	l := newLeased(t, redisstore.New(client), slowPolicy, clk, lifetime)
	checkHungGiveBacks(t, l, clk, lifetime, srv.Stop)
}

// TestLeasesGiveBackToHungRedisThroughFallback: as
// TestLeasesGiveBackToHungRedis, through a fallback store that serves from
// local buckets while Redis is down.
func TestLeasesGiveBackToHungRedisThroughFallback(t *testing.T) {
	srv, client := redisSlowTimeouts(t)
	clk := newTestClock()
	store, err := fallback.New(redisstore.New(client), fallback.WithOutage(fallback.LocalFallback), fallback.WithClock(clk.now))
	if err != nil {
		t.Fatal(err)
	}
	const lifetime = 10 * time.Millisecond
	l := newLeased(t, store, slowPolicy, clk, lifetime)
	checkHungGiveBacks(t, l, clk, lifetime, srv.Stop)
}

// redisSlowTimeouts starts a server and returns a client of it with
// redistest's fast-failure settings but go-redis's default read timeout,
// 3 s: a call on a hung server that no deadline bounds takes that long.
func redisSlowTimeouts(t *testing.T) (*redistest.Server, redis.UniversalClient) {
	srv := redistest.StartServer(t)
	opts := redistest.ClientOptions(srv.Addr())
	opts.ReadTimeout = 3 * time.Second
	client := redis.NewUniversalClient(opts)
	t.Cleanup(func() { client.Close() })
	return srv, client
}

// checkHungGiveBacks takes leases on l for two sets of subjects, half a
// lifetime apart, and hangs the store with stop. Then a check with a 100 ms
// deadline, whose sweep gives the first set back, and Close with a 200 ms
// deadline, which gives the second set back, must each return within a
// generous bound of their deadlines (not after the store's timeouts, one
// give-back after another), Close with an error saying what it could not
// give back; every unused token of the leases is then counted lost.
func checkHungGiveBacks(t *testing.T, l *ratelimit.Limiter[string], clk *testClock, lifetime time.Duration, stop func()) {
	t.Helper()
	ctx := context.Background()
	const perSet = 8
	take := func(set string) {
		for i := range perSet {
			for range 2 { // cold, then a lease of the most
				if d, err := l.TryAcquire(ctx, fmt.Sprint(set, i)); err != nil || !d.Allowed {
					t.Fatalf("check of %s%d = %+v, %v", set, i, d, err)
				}
			}
		}
	}
	take("a")
	clk.advance(lifetime / 2)
	take("b")
	held := l.LeaseStats()
	if held.Taken != 2*perSet {
		t.Fatalf("stats %+v; want %d leases", held, 2*perSet)
	}
	const bound = 2 * time.Second
	stop()
	clk.advance(lifetime / 2) // the first set's leases are over

	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	start := time.Now()
	_, err := l.TryAcquire(cctx, "other")
	cancel()
	if took := time.Since(start); took > bound {
		t.Errorf("a check with a 100ms deadline returned after %v (%v); want it within %v", took, err, bound)
	}

	cctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
	start = time.Now()
	err = l.Close(cctx)
	cancel()
	took := time.Since(start)
	t.Logf("Close with a 200ms deadline: %v after %v", err, took)
	if took > bound {
		t.Errorf("Close with a 200ms deadline returned after %v; want it within %v", took, bound)
	}
	if err == nil || !strings.Contains(err.Error(), "not given back") {
		t.Errorf("Close = %v; want an error saying what was not given back", err)
	}
	ratelimit.WaitLeaseReturns(l)
	if s := l.LeaseStats(); s.Tokens != 0 || s.Returned != 0 || s.Lost != held.Tokens {
		t.Errorf("stats %+v after Close; want the %d tokens of the leases lost", s, held.Tokens)
	}
}
