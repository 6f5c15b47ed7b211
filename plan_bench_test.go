package ratelimit_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// BenchmarkPlans compares a check of a namespace of plans (the subject's
// plan from Plans.For, then its Limiter's check) with the same check on a
// Limiter of that policy alone, on memstore, over 1,000 subjects, none or
// half of them assigned pro: what choosing the plan adds to a check (and,
// with two plans in use, memstore's switching between their policies).
func BenchmarkPlans(b *testing.B) {
	ctx := context.Background()
	plans := []ratelimit.Plan{
		{Name: "free", Limits: []ratelimit.Limit{ratelimit.PerSecond(1_000_000)}},
		{Name: "pro", Limits: []ratelimit.Limit{ratelimit.PerSecond(2_000_000)}},
	}
	subjects := make([]string, 1000)
	for i := range subjects {
		subjects[i] = "s" + strconv.Itoa(i)
	}
	b.Run("plain", func(b *testing.B) {
		l, err := ratelimit.New[string](memstore.New(), ratelimit.PerSecond(1_000_000), ratelimit.WithNamespace("api"))
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; b.Loop(); i++ {
			l.TryAcquire(ctx, subjects[i%len(subjects)])
		}
	})
	b.Run("plans, none assigned", func(b *testing.B) {
		p, err := ratelimit.NewPlans[string](memstore.New(), plans, "free", ratelimit.WithNamespace("api"))
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		for i := 0; b.Loop(); i++ {
			s := subjects[i%len(subjects)]
			_, l := p.For(s)
			l.TryAcquire(ctx, s)
		}
	})
	b.Run("plans, half assigned pro", func(b *testing.B) {
		p, err := ratelimit.NewPlans[string](memstore.New(), plans, "free", ratelimit.WithNamespace("api"))
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		for i, s := range subjects {
			if i%2 == 0 {
				if _, err := p.Assign(ctx, s, ratelimit.Assignment{Plan: "pro"}); err != nil {
					b.Fatal(err)
				}
			}
		}
		for i := 0; b.Loop(); i++ {
			s := subjects[i%len(subjects)]
			_, l := p.For(s)
			l.TryAcquire(ctx, s)
		}
	})
}
