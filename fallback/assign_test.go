package fallback

import (
	"context"
	"errors"
	"testing"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
)

// TestAssignmentsDuringAnOutage: while the primary is down, whatever the
// outage behaviour, an assignment can be neither made nor read (the error
// wraps ratelimit.ErrUnavailable), and a Plans keeps the view it last had;
// once the primary is back, the view follows it again.
func TestAssignmentsDuringAnOutage(t *testing.T) {
	plans := []ratelimit.Plan{
		{Name: "free", Limits: []ratelimit.Limit{ratelimit.PerMinute(3)}},
		{Name: "pro", Limits: []ratelimit.Limit{ratelimit.PerMinute(60)}},
	}
	for _, tc := range []struct {
		name  string
		after string // acme's plan once the primary is back
		start func(t *testing.T) (primary ratelimit.Store, down, up func(s *Store))
	}{
		{"memstore, marked down", "pro", func(t *testing.T) (ratelimit.Store, func(*Store), func(*Store)) {
			return memstore.New(), (*Store).MarkDown, (*Store).MarkAlive
		}},
		{"redis, killed and restarted", "free", func(t *testing.T) (ratelimit.Store, func(*Store), func(*Store)) {
			srv := redistest.StartServer(t)
			return redisstore.New(newRedisClient(t, srv.Addr())),
				func(*Store) { srv.Kill() },
				func(s *Store) {
					srv.Restart(t) // empty: it lost every assignment
					if !s.Probe(context.Background()) {
						t.Fatal("the restarted primary does not answer the probe")
					}
				}
		}},
	} {
		for _, o := range []Outage{ReturnError, LocalFallback} {
			t.Run(tc.name+", "+o.String(), func(t *testing.T) {
				ctx := context.Background()
				primary, down, up := tc.start(t)
				store := mustNew(t, primary, WithOutage(o))
				p, err := ratelimit.NewPlans[string](store, plans, "free", ratelimit.WithNamespace("api"))
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				if _, err := p.Assign(ctx, "acme", ratelimit.Assignment{Plan: "pro"}); err != nil {
					t.Fatal(err)
				}
				down(store)
				if _, err := p.Assign(ctx, "acme", ratelimit.Assignment{}); !errors.Is(err, ratelimit.ErrUnavailable) {
					t.Fatalf("Assign while down = %v; want ErrUnavailable", err)
				}
				if _, err := p.Assignment(ctx, "acme"); !errors.Is(err, ratelimit.ErrUnavailable) {
					t.Fatalf("Assignment while down = %v; want ErrUnavailable", err)
				}
				if err := p.Refresh(ctx); !errors.Is(err, ratelimit.ErrUnavailable) {
					t.Fatalf("Refresh while down = %v; want ErrUnavailable", err)
				}
				if plan, _ := p.For("acme"); plan != "pro" {
					t.Fatalf("For while down = %q; want pro, the view last seen", plan)
				}
				up(store)
				if err := p.Refresh(ctx); err != nil {
					t.Fatalf("Refresh once back: %v", err)
				}
				if plan, _ := p.For("acme"); plan != tc.after {
					t.Fatalf("For once back = %q; want %q, as the store holds it", plan, tc.after)
				}
			})
		}
	}
}

// TestAssignmentsOfAPrimaryWithoutThem: over a primary that keeps no
// assignments, the Store's methods give errors.ErrUnsupported.
func TestAssignmentsOfAPrimaryWithoutThem(t *testing.T) {
	store := mustNew(t, struct{ ratelimit.Store }{memstore.New()})
	if _, err := store.Assign(context.Background(), "api", "s", "p:pro"); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Assign = %v; want ErrUnsupported", err)
	}
	if _, _, _, err := store.AssignmentsSince(context.Background(), "api", ""); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("AssignmentsSince = %v; want ErrUnsupported", err)
	}
}
