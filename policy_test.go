package ratelimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
)

// TestPolicyValidatedOnceInNew counts the validations of a Limiter's policy:
// one in New, and none per check after it, on each store and through package
// fallback (which validates a request and passes it to a primary that
// validates it too). A request from a Limiter carries the proof that New
// validated its limits, so each layer checks only its cost and time.
func TestPolicyValidatedOnceInNew(t *testing.T) {
	ctx := context.Background()
	srv := redistest.StartServer(t)
	stores := []struct {
		name  string
		store func() ratelimit.Store
	}{
		{"memstore", func() ratelimit.Store { return memstore.New() }},
		{"redisstore", func() ratelimit.Store { return redisstore.New(redistest.Client(t, srv.Addr())) }},
		{"fallback over memstore", func() ratelimit.Store { return must(fallback.New(memstore.New())) }},
		{"fallback over redisstore", func() ratelimit.Store {
			return must(fallback.New(redisstore.New(redistest.Client(t, srv.Addr()))))
		}},
	}
	ops := []struct {
		name string
		op   func(l *ratelimit.Limiter[string]) error
	}{
		{"TryAcquire", func(l *ratelimit.Limiter[string]) error {
			_, err := l.TryAcquire(ctx, "s")
			return err
		}},
		{"Peek", func(l *ratelimit.Limiter[string]) error {
			_, err := l.Peek(ctx, "s")
			return err
		}},
		{"TryAcquireMany of 2", func(l *ratelimit.Limiter[string]) error {
			for _, r := range l.TryAcquireMany(ctx, []ratelimit.Item[string]{{Subject: "a", Cost: 1}, {Subject: "b", Cost: 1}}) {
				if r.Err != nil {
					return r.Err
				}
			}
			return nil
		}},
		{"Reserve and Settle", func(l *ratelimit.Limiter[string]) error {
			rv, err := l.Reserve(ctx, "s", time.Minute, 2)
			if err != nil {
				return err
			}
			_, err = rv.Settle(ctx, 1)
			return err
		}},
	}
	limits := []ratelimit.Limit{ratelimit.PerMinute(100000), ratelimit.PerHour(1000000)}
	for _, st := range stores {
		for _, op := range ops {
			t.Run(st.name+": "+op.name, func(t *testing.T) {
				ratelimit.PolicyChecks.Store(0)
				l, err := ratelimit.NewMulti[string](st.store(), limits, ratelimit.WithNamespace(t.Name()))
				if err != nil {
					t.Fatal(err)
				}
				if n := ratelimit.PolicyChecks.Load(); n != 1 {
					t.Fatalf("New validated the policy %d times, want 1", n)
				}
				// The first call may teach a store the policy (memstore
				// validates it once per policy it learns).
				if err := op.op(l); err != nil {
					t.Fatal(err)
				}
				before := ratelimit.PolicyChecks.Load()
				const calls = 100
				for range calls {
					if err := op.op(l); err != nil {
						t.Fatal(err)
					}
				}
				if n := ratelimit.PolicyChecks.Load() - before; n != 0 {
					t.Errorf("%d calls validated the policy %d times, want 0: New did", calls, n)
				}
			})
		}
	}
}

// TestStoreRefusesAnInvalidRequest checks that a store still validates what
// a Limiter did not vouch for: a request of its own, or a Limiter's whose
// limits were changed.
func TestStoreRefusesAnInvalidRequest(t *testing.T) {
	ctx := context.Background()
	srv := redistest.StartServer(t)
	for _, st := range []struct {
		name  string
		store ratelimit.Store
	}{
		{"memstore", memstore.New()},
		{"redisstore", redisstore.New(redistest.Client(t, srv.Addr()))},
		{"fallback over memstore", must(fallback.New(memstore.New(), fallback.WithOutage(fallback.LocalFallback)))},
		{"fallback over redisstore", must(fallback.New(redisstore.New(redistest.Client(t, srv.Addr())), fallback.WithOutage(fallback.LocalFallback)))},
	} {
		t.Run(st.name, func(t *testing.T) {
			bad := []ratelimit.Limit{{Capacity: 10, RefillTokens: 1, RefillPeriod: 0}}
			if _, err := st.store.Apply(ctx, "k", ratelimit.Request{Limits: bad, Cost: 1}); !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Errorf("a request of its own with an invalid limit: %v, want ErrInvalidArgument", err)
			}
			l := must(ratelimit.New[string](st.store, ratelimit.PerMinute(10)))
			key, r, err := l.Request("s", 1)
			if err != nil {
				t.Fatal(err)
			}
			r.Limits = bad
			if _, err := st.store.Apply(ctx, key, r); !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Errorf("a Limiter's request with other limits: %v, want ErrInvalidArgument", err)
			}
			_, r, _ = l.Request("s", 1)
			r.Limits[0].RefillPeriod = 0 // the limiter's own slice
			if _, err := st.store.Apply(ctx, key, r); !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Errorf("a Limiter's request whose limit was changed in place: %v, want ErrInvalidArgument", err)
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
