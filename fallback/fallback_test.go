package fallback

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

var perMinute100 = ratelimit.PerMinute(100)

func TestNewRejectsInvalidOptions(t *testing.T) {
	p := newFakePrimary(time.Now)
	tests := []struct {
		name string
		prim ratelimit.Store
		opts []Option
		want string
	}{
		{"a nil primary", nil, nil, "primary store must not be nil"},
		{"a fleet share of 0", p, []Option{WithFleetShare(0)}, "fleet share must be at least 1"},
		{"an unknown outage", p, []Option{WithOutage(Outage(9))}, "unknown outage behaviour"},
		{"a negative timeout", p, []Option{WithTimeout(-time.Second)}, "timeout must not be negative"},
		{"a nil clock", p, []Option{WithClock(nil)}, "clock must not be nil"},
		{"a nil classifier", p, []Option{WithClassifier(nil)}, "classifier must not be nil"},
		{"a nil probe", p, []Option{WithProbe(nil)}, "probe must not be nil"},
		{"a nil observer", p, []Option{WithObserver(nil)}, "observer must not be nil"},
		{"a nil partition ping", p, []Option{withPartitions(func(context.Context, string) string { return "" }, nil)}, "must not be nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name+" is an invalid argument", func(t *testing.T) {
			s, err := New(tt.prim, tt.opts...)
			if s != nil || !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, %v; want nil and an ErrInvalidArgument saying %q", s, err, tt.want)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	s := mustNew(t, newFakePrimary(time.Now))
	if s.Outage() != ReturnError || s.FleetShare() != 1 || !s.IsAlive() || s.Probing() {
		t.Fatalf("defaults: outage %v, share %d, alive %v, probing %v; want return-error, 1, true, false",
			s.Outage(), s.FleetShare(), s.IsAlive(), s.Probing())
	}
}

func TestAliveDecisionsAreThePrimarys(t *testing.T) {
	clk := newFakeClock()
	p := newFakePrimary(clk.Now)
	ref := memstore.New(memstore.WithClock(clk.Now))
	s := mustNew(t, p, WithOutage(LocalFallback), WithClock(clk.Now))
	ctx := context.Background()
	for i := range 120 {
		r := req(perMinute100, 1, clk.Now())
		got, err := s.Apply(ctx, "k", r)
		want, _ := ref.Apply(ctx, "k", r)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("check %d = %+v, %v; want %+v", i, got, err, want)
		}
		clk.Add(100 * time.Millisecond)
	}
	if got := p.calls.Load(); got != 120 {
		t.Errorf("primary calls = %d, want 120", got)
	}
	if s.Local().Len() != 0 {
		t.Errorf("local buckets = %d while alive, want 0", s.Local().Len())
	}
}

// TestOutageBehaviours checks each behaviour on the call that finds the
// primary down and on the next one, which must not touch the primary.
func TestOutageBehaviours(t *testing.T) {
	lim := ratelimit.NewLimit(10, time.Second, 20) // 20 burst, 10/s: a token per 100 ms
	tests := []struct {
		outage Outage
		check  func(t *testing.T, d ratelimit.Decision, err error, first bool)
	}{
		{ReturnError, func(t *testing.T, d ratelimit.Decision, err error, first bool) {
			if !errors.Is(err, ratelimit.ErrUnavailable) {
				t.Fatalf("err = %v, want ratelimit.ErrUnavailable", err)
			}
			if got := errors.Is(err, syscall.ECONNREFUSED); got != first {
				t.Errorf("errors.Is(err, ECONNREFUSED) = %v, want %v (only the call that saw it wraps it)", got, first)
			}
			if !first && !strings.Contains(err.Error(), "connection refused") {
				t.Errorf("breaker error %q does not name the cause", err)
			}
		}},
		{FailOpen, func(t *testing.T, d ratelimit.Decision, err error, first bool) {
			want := ratelimit.Decision{Allowed: true, Remaining: 17, ResetAfter: 300 * time.Millisecond, Limit: lim, Source: ratelimit.SourceFailOpen}
			if err != nil || !reflect.DeepEqual(d, want) {
				t.Fatalf("= %+v, %v; want %+v (a full bucket's answer)", d, err, want)
			}
			if d.Enforced() {
				t.Error("a fail-open decision says it was enforced")
			}
		}},
		{FailClosed, func(t *testing.T, d ratelimit.Decision, err error, first bool) {
			want := ratelimit.Decision{Allowed: false, RetryAfter: 300 * time.Millisecond, ResetAfter: 2 * time.Second, Limit: lim, Source: ratelimit.SourceFailClosed}
			if err != nil || !reflect.DeepEqual(d, want) {
				t.Fatalf("= %+v, %v; want %+v (an empty bucket's answer)", d, err, want)
			}
		}},
		{LocalFallback, func(t *testing.T, d ratelimit.Decision, err error, first bool) {
			remaining := int64(17)
			if !first {
				remaining = 14
			}
			want := ratelimit.Decision{Allowed: true, Remaining: remaining, ResetAfter: time.Duration(20-remaining) * 100 * time.Millisecond, Limit: lim, Source: ratelimit.SourceLocal}
			if err != nil || !reflect.DeepEqual(d, want) {
				t.Fatalf("= %+v, %v; want %+v", d, err, want)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.outage.String(), func(t *testing.T) {
			clk := newFakeClock()
			p := newFakePrimary(clk.Now)
			s := mustNew(t, p, WithOutage(tt.outage), WithClock(clk.Now))
			ctx := context.Background()
			p.set(refused)
			d, err := s.Apply(ctx, "k", req(lim, 3, clk.Now()))
			t.Run("the call that finds the primary down", func(t *testing.T) { tt.check(t, d, err, true) })
			if s.IsAlive() {
				t.Fatal("IsAlive after a refused connection")
			}
			d, err = s.Apply(ctx, "k", req(lim, 3, clk.Now()))
			t.Run("the next call, answered by the breaker", func(t *testing.T) { tt.check(t, d, err, false) })
			if got := p.calls.Load(); got != 1 {
				t.Errorf("primary calls = %d, want 1: the breaker must answer without it", got)
			}
		})
	}
}

func TestPeekDuringAnOutage(t *testing.T) {
	lim := ratelimit.PerSecond(5)
	for _, o := range []Outage{FailOpen, FailClosed, LocalFallback} {
		clk := newFakeClock()
		s := mustNew(t, newFakePrimary(clk.Now), WithOutage(o), WithClock(clk.Now))
		s.MarkDown()
		d, err := s.Apply(context.Background(), "k", ratelimit.Request{Limits: []ratelimit.Limit{lim}, Peek: true})
		wantAllowed := o != FailClosed
		if err != nil || d.Allowed != wantAllowed {
			t.Errorf("%v: peek = %+v, %v; want allowed %v", o, d, err, wantAllowed)
		}
		if o == LocalFallback && s.Local().Len() != 0 {
			t.Errorf("%v: a peek at a missing bucket stored one", o)
		}
	}
}

// TestErrorsThatAreNotOutages checks that the caller's own errors and the
// store's answers leave the primary alive and reach the caller unchanged.
func TestErrorsThatAreNotOutages(t *testing.T) {
	_, invalidErr := ratelimit.New[string](memstore.New(), ratelimit.Limit{})
	corrupt := fmt.Errorf("%w: redis check of %q: bad level", tokenbucket.ErrCorruptState, "k")
	script := errors.New("ERR Error running script (call to f_x): @user_script:1: boom")
	for _, o := range []Outage{ReturnError, FailOpen, FailClosed, LocalFallback} {
		t.Run(o.String(), func(t *testing.T) {
			for _, fail := range []error{invalidErr, corrupt, script} {
				p := newFakePrimary(time.Now)
				s := mustNew(t, p, WithOutage(o))
				p.failWith(fail)
				_, err := s.Apply(context.Background(), "k", req(perMinute100, 1, time.Time{}))
				if err != fail || !s.IsAlive() {
					t.Errorf("primary error %q: got %v, alive %v; want the error itself and still alive", fail, err, s.IsAlive())
				}
			}

			p := newFakePrimary(time.Now)
			s := mustNew(t, p, WithOutage(o))
			if _, err := s.Apply(context.Background(), "k", req(perMinute100, 101, time.Time{})); !errors.Is(err, ratelimit.ErrInvalidArgument) || p.calls.Load() != 0 {
				t.Errorf("cost above capacity: err %v, primary calls %d; want ErrInvalidArgument before any call", err, p.calls.Load())
			}
			done, cancel := context.WithCancel(context.Background())
			cancel()
			if _, err := s.Apply(done, "k", req(perMinute100, 1, time.Time{})); err != context.Canceled || p.calls.Load() != 0 {
				t.Errorf("done context: err %v, primary calls %d; want context.Canceled before any call", err, p.calls.Load())
			}

			p.set(hung)
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(20*time.Millisecond, cancel)
			if _, err := s.Apply(ctx, "k", req(perMinute100, 1, time.Time{})); !errors.Is(err, context.Canceled) {
				t.Errorf("caller cancelled during the call: err %v, want context.Canceled", err)
			}
			if !s.IsAlive() {
				t.Error("a cancellation by the caller marked the primary down")
			}
		})
	}
}

// TestHungPrimaryCostsTheDeadline checks that a primary that never answers
// costs the call in flight its deadline (or WithTimeout's), and, since a
// caller's own deadline does not open the breaker but kicks a probe bounded
// by the probe interval, at most the calls started before that probe finds
// the primary hung; the following calls nothing. The default run checks
// the decisions, that a hung call takes at least its deadline and that the
// breaker opens; the timing tier (RATELIMIT_TIMING=1) holds the times and
// the count of calls that waited to their bounds.
func TestHungPrimaryCostsTheDeadline(t *testing.T) {
	checkNoLeak(t)
	const deadline = 50 * time.Millisecond
	const slack = 500 * time.Millisecond // a loaded machine under -race
	timed := testkit.Timed(t)
	t.Run("the caller's deadline", func(t *testing.T) {
		p := newFakePrimary(time.Now)
		s := mustNew(t, p, WithOutage(LocalFallback))
		p.set(hung)
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		d, err := s.Apply(ctx, "k", req(perMinute100, 1, time.Time{}))
		took := time.Since(start)
		if err != nil || !d.Allowed || d.Source != ratelimit.SourceLocal {
			t.Fatalf("= %+v, %v; want a local admission", d, err)
		}
		if took < deadline || timed && took > deadline+slack {
			t.Errorf("the hung call took %v, want its deadline %v (+ at most %v)", took, deadline, slack)
		}
	})
	t.Run("WithTimeout shorter than the caller's deadline", func(t *testing.T) {
		p := newFakePrimary(time.Now)
		s := mustNew(t, p, WithOutage(FailOpen), WithTimeout(deadline))
		p.set(hung)
		start := time.Now()
		d, err := s.Apply(context.Background(), "k", req(perMinute100, 1, time.Time{}))
		took := time.Since(start)
		if err != nil || d.Source != ratelimit.SourceFailOpen {
			t.Fatalf("= %+v, %v; want a fail-open admission", d, err)
		}
		if took < deadline || timed && took > deadline+slack {
			t.Errorf("the hung call took %v, want the timeout %v (+ at most %v)", took, deadline, slack)
		}
		start = time.Now()
		for range 100 {
			s.Apply(context.Background(), "k", req(perMinute100, 1, time.Time{}))
		}
		if took := time.Since(start); timed && took > slack {
			t.Errorf("100 checks on the open breaker took %v", took)
		}
		if p.calls.Load() != 1 {
			t.Errorf("primary calls = %d, want 1", p.calls.Load())
		}
	})
	t.Run("concurrent calls cost a deadline until the kicked probe finds the primary hung, later ones none", func(t *testing.T) {
		const deadline = 4 * deadline
		p := newFakePrimary(time.Now)
		s := mustNew(t, p, WithOutage(FailClosed))
		p.set(hung)
		var wg sync.WaitGroup
		var slow atomic.Int64
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 50 {
					start := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					d, err := s.Apply(ctx, "k", req(perMinute100, 1, time.Time{}))
					took := time.Since(start)
					cancel()
					if errors.Is(err, context.DeadlineExceeded) && took >= deadline {
						// This goroutine was not scheduled before its
						// deadline: Apply returns the done context.
						slow.Add(1)
						continue
					}
					if err != nil || d.Source != ratelimit.SourceFailClosed {
						t.Errorf("= %+v, %v; want a fail-closed denial", d, err)
						return
					}
					if timed && took > deadline+slack {
						t.Errorf("a check took %v, past its deadline %v", took, deadline)
					}
					if took >= deadline/2 {
						slow.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		// Each goroutine's first check runs into its deadline (200 ms) and
		// kicks a probe, which finds the primary hung one probe interval
		// (100 ms) later; the second check, started meanwhile, is already
		// waiting on the primary. None after that.
		if n := slow.Load(); timed && n > 16 {
			t.Errorf("%d checks waited on the hung primary, want at most two per goroutine (16)", n)
		}
		if s.IsAlive() {
			t.Error("the hung primary was never marked down")
		}
	})
}

// TestLocalFallbackIsTheSameArithmetic runs random checks on a Store that is
// down and on a memstore, and wants the same decisions.
func TestLocalFallbackIsTheSameArithmetic(t *testing.T) {
	clk := newFakeClock()
	s := mustNew(t, newFakePrimary(clk.Now), WithOutage(LocalFallback), WithClock(clk.Now))
	s.MarkDown()
	ref := memstore.New(memstore.WithClock(clk.Now))
	policies := [][]ratelimit.Limit{
		{ratelimit.NewLimit(7, 3*time.Second, 11)},
		{ratelimit.PerSecond(3), ratelimit.PerMinute(20)},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	for i := range 3000 {
		limits := policies[rng.IntN(len(policies))]
		r := ratelimit.Request{Limits: limits, Cost: 1 + rng.Int64N(3), Peek: rng.IntN(5) == 0}
		if rng.IntN(2) == 0 {
			r.Now = clk.Now()
		}
		key := fmt.Sprint("k", rng.IntN(3))
		got, err := s.Apply(ctx, key, r)
		want, werr := ref.Apply(ctx, key, r)
		want.Source = ratelimit.SourceLocal
		if err != nil || werr != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("check %d %+v on %s = %+v, %v; memstore says %+v, %v", i, r, key, got, err, want, werr)
		}
		clk.Add(time.Duration(rng.Int64N(int64(700 * time.Millisecond))))
	}
}

func TestShare(t *testing.T) {
	tests := []struct {
		name string
		l    ratelimit.Limit
		n    int64
		want ratelimit.Limit
	}{
		{"a share of 1 is the policy", ratelimit.PerSecond(100), 1, ratelimit.PerSecond(100)},
		{"a share below 1 is the policy", ratelimit.PerSecond(100), 0, ratelimit.PerSecond(100)},
		{"capacity and refill divide", ratelimit.PerSecond(100), 4, ratelimit.PerSecond(25)},
		{"they round down", ratelimit.NewLimit(10, time.Minute, 30), 4, ratelimit.NewLimit(2, time.Minute, 7)},
		{"but never below 1", ratelimit.NewLimit(2, time.Hour, 3), 5, ratelimit.NewLimit(1, time.Hour, 1)},
		// 33,333,333 a day is, in lowest terms, 11,111,111 every 28.8·10^9
		// µs: too long a period for a capacity of 33,333,333. A hundred
		// million every 3 days is the same rate, exactly.
		{"a daily quota whose divided rate needs too long a period", ratelimit.PerDay(100_000_000), 3, ratelimit.NewLimit(100_000_000, 72*time.Hour, 33_333_333)},
		{"a daily quota that divides", ratelimit.PerDay(1_000_000), 4, ratelimit.PerDay(250_000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Share(tt.l, tt.n)
			if got != tt.want {
				t.Fatalf("Share(%v, %d) = %v, want %v", tt.l, tt.n, got, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("Share(%v, %d) is invalid: %v", tt.l, tt.n, err)
			}
		})
	}
}

func TestFleetShareDuringAnOutage(t *testing.T) {
	clk := newFakeClock()
	s := mustNew(t, newFakePrimary(clk.Now), WithOutage(LocalFallback), WithFleetShare(4), WithClock(clk.Now))
	s.MarkDown()
	ctx := context.Background()
	share := ratelimit.PerMinute(25)
	admitted := 0
	for range 40 {
		d, err := s.Apply(ctx, "k", req(perMinute100, 1, clk.Now()))
		if err != nil || d.Source != ratelimit.SourceLocal || d.Limit != share {
			t.Fatalf("= %+v, %v; want a local decision bound by the share %v", d, err, share)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 25 {
		t.Errorf("admitted %d of 100/min with a share of 4 and the clock stopped, want 25", admitted)
	}
	clk.Add(12 * time.Second) // 25/min refills 5 tokens in 12 s
	for range 10 {
		if d, _ := s.Apply(ctx, "k", req(perMinute100, 1, clk.Now())); d.Allowed {
			admitted++
		}
	}
	if admitted != 30 {
		t.Errorf("admitted %d after 12 s, want 30", admitted)
	}

	t.Run("a cost above the share's capacity is denied without taking", func(t *testing.T) {
		d, err := s.Apply(ctx, "big", req(perMinute100, 26, clk.Now()))
		want := ratelimit.Decision{Allowed: false, RetryAfter: time.Minute, ResetAfter: time.Minute, Limit: share, Source: ratelimit.SourceLocal}
		if err != nil || !reflect.DeepEqual(d, want) {
			t.Fatalf("= %+v, %v; want %+v", d, err, want)
		}
		if d, _ := s.Apply(ctx, "big", req(perMinute100, 25, clk.Now())); !d.Allowed {
			t.Fatalf("the share's full capacity was not there after the denial: %+v", d)
		}
	})
}

// TestFleetShareBound runs n processes, each with a share of n, through an
// outage, and checks the documented bound on what they admit together:
// n·max(1, ⌊C/n⌋) + n·max(1, ⌊R/n⌋)·T/P.
func TestFleetShareBound(t *testing.T) {
	policies := []ratelimit.Limit{ratelimit.PerSecond(10), ratelimit.NewLimit(7, time.Second, 30), ratelimit.NewLimit(2, time.Second, 3)}
	for _, policy := range policies {
		for _, n := range []int64{1, 3, 5} {
			t.Run(fmt.Sprintf("%v over %d processes", policy, n), func(t *testing.T) {
				clk := newFakeClock()
				fleet := make([]*Store, n)
				for i := range fleet {
					fleet[i] = mustNew(t, newFakePrimary(clk.Now), WithOutage(LocalFallback), WithFleetShare(int(n)), WithClock(clk.Now))
					fleet[i].MarkDown()
				}
				rng := rand.New(rand.NewPCG(uint64(n), 7))
				start := clk.Now()
				admitted := int64(0)
				for range 5000 {
					d, err := fleet[rng.IntN(len(fleet))].Apply(context.Background(), "k", req(policy, 1, clk.Now()))
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						admitted++
					}
					clk.Add(time.Duration(rng.Int64N(int64(5 * time.Millisecond))))
				}
				elapsed := clk.Now().Sub(start)
				sh := Share(policy, n)
				bound := n*sh.Capacity + n*sh.RefillTokens*int64(elapsed)/int64(policy.RefillPeriod)
				policyBound := policy.Capacity + policy.RefillTokens*int64(elapsed)/int64(policy.RefillPeriod)
				t.Logf("admitted %d over %v; bound %d; the policy alone allows %d", admitted, elapsed, bound, policyBound)
				if admitted > bound {
					t.Errorf("admitted %d, above the bound %d", admitted, bound)
				}
				if policy.Capacity >= n && policy.RefillTokens >= n && admitted > policyBound {
					t.Errorf("admitted %d, above the policy's %d although C and R are at least n", admitted, policyBound)
				}
			})
		}
	}
}

func TestProbe(t *testing.T) {
	checkNoLeak(t)
	ctx := context.Background()
	t.Run("a ping that fails keeps the primary down, one that answers brings it back", func(t *testing.T) {
		p := newFakePrimary(time.Now)
		s := mustNew(t, pingingPrimary{p}, WithOutage(LocalFallback))
		p.set(refused)
		s.Apply(ctx, "k", req(perMinute100, 1, time.Time{}))
		if s.IsAlive() || s.Probe(ctx) || s.IsAlive() {
			t.Fatal("down, probed while refused: want still down and Probe false")
		}
		p.set(up)
		if !s.Probe(ctx) || !s.IsAlive() {
			t.Fatal("probed while up: want alive and Probe true")
		}
		if d, err := s.Apply(ctx, "k", req(perMinute100, 1, time.Time{})); err != nil || d.Source != ratelimit.SourceStore {
			t.Fatalf("after the probe: %+v, %v; want the primary's decision", d, err)
		}
		if p.pings.Load() != 2 {
			t.Errorf("pings = %d, want 2 (the primary's Ping method)", p.pings.Load())
		}
	})
	t.Run("a probe that sees the primary gone marks it down", func(t *testing.T) {
		p := newFakePrimary(time.Now)
		s := mustNew(t, pingingPrimary{p}, WithOutage(FailClosed))
		p.set(refused)
		if s.Probe(ctx) || s.IsAlive() {
			t.Fatal("want down after a failed ping")
		}
		calls := p.calls.Load()
		if d, _ := s.Apply(ctx, "k", req(perMinute100, 1, time.Time{})); d.Source != ratelimit.SourceFailClosed || p.calls.Load() != calls {
			t.Fatalf("after the probe marked it down: %+v, primary calls %d -> %d", d, calls, p.calls.Load())
		}
	})
	t.Run("a probe on a hung primary marks it down at its deadline", func(t *testing.T) {
		p := newFakePrimary(time.Now)
		s := mustNew(t, pingingPrimary{p})
		p.set(hung)
		pctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		if s.Probe(pctx) || s.IsAlive() {
			t.Fatal("want down after a ping that timed out")
		}
	})
	t.Run("a cancelled probe changes nothing", func(t *testing.T) {
		p := newFakePrimary(time.Now)
		s := mustNew(t, pingingPrimary{p})
		p.set(hung)
		pctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(10*time.Millisecond, cancel)
		if s.Probe(pctx) || !s.IsAlive() {
			t.Fatal("a cancelled probe: want false and still alive")
		}
		s.MarkDown()
		pctx, cancel = context.WithCancel(ctx)
		time.AfterFunc(10*time.Millisecond, cancel)
		if s.Probe(pctx) || s.IsAlive() {
			t.Fatal("a cancelled probe of a down primary: want false and still down")
		}
	})
	t.Run("without a Pinger the probe peeks and writes nothing", func(t *testing.T) {
		p := newFakePrimary(time.Now)
		s := mustNew(t, p)
		s.MarkDown()
		if !s.Probe(ctx) || !s.IsAlive() {
			t.Fatal("want alive after a peek that answered")
		}
		if p.calls.Load() != 1 || p.store.Len() != 0 {
			t.Errorf("primary calls %d, buckets %d; want 1 and 0", p.calls.Load(), p.store.Len())
		}
	})
	t.Run("WithProbe is used instead of the primary's Ping", func(t *testing.T) {
		p := newFakePrimary(time.Now)
		var probes atomic.Int64
		s := mustNew(t, pingingPrimary{p}, WithProbe(func(context.Context) error { probes.Add(1); return nil }))
		s.MarkDown()
		if !s.Probe(ctx) || probes.Load() != 1 || p.pings.Load() != 0 {
			t.Fatalf("probe %v, WithProbe calls %d, Ping calls %d; want true, 1, 0", s.IsAlive(), probes.Load(), p.pings.Load())
		}
	})
	t.Run("WithTimeout bounds the ping", func(t *testing.T) {
		p := newFakePrimary(time.Now)
		s := mustNew(t, pingingPrimary{p}, WithTimeout(20*time.Millisecond))
		p.set(hung)
		start := time.Now()
		if s.Probe(ctx) || s.IsAlive() {
			t.Fatal("want down")
		}
		if took := time.Since(start); testkit.Timed(t) && took > time.Second {
			t.Errorf("the probe took %v, want its 20ms timeout (+ slack)", took)
		}
	})
}

// TestStaleResultsDoNotFlipTheFlag checks the generation guard: a failure
// of a call that started before the primary went down and came back does not
// mark it down again, and a ping that answered before a newer failure does
// not bring it back.
func TestStaleResultsDoNotFlipTheFlag(t *testing.T) {
	checkNoLeak(t)
	ctx := context.Background()
	t.Run("a stale failure", func(t *testing.T) {
		p := newFakePrimary(time.Now)
		s := mustNew(t, p, WithOutage(FailOpen))
		gate := make(chan struct{})
		p.gate.Store(&gate)
		p.set(refused)
		done := make(chan ratelimit.Decision)
		go func() {
			d, _ := s.Apply(ctx, "k", req(perMinute100, 1, time.Time{}))
			done <- d
		}()
		for p.calls.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		s.MarkDown()
		s.MarkAlive()
		close(gate)
		if d := <-done; d.Source != ratelimit.SourceFailOpen {
			t.Errorf("the failed call = %+v, want a fail-open answer", d)
		}
		if !s.IsAlive() {
			t.Error("a failure older than the last recovery marked the primary down")
		}
	})
	t.Run("a stale success", func(t *testing.T) {
		p := newFakePrimary(time.Now)
		s := mustNew(t, pingingPrimary{p})
		s.MarkDown()
		gate := make(chan struct{})
		p.gate.Store(&gate)
		done := make(chan bool)
		go func() { done <- s.Probe(ctx) }()
		for p.pings.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		s.MarkAlive()
		s.MarkDown() // a newer failure
		close(gate)
		if !<-done {
			t.Error("the ping answered but Probe reported false")
		}
		if s.IsAlive() {
			t.Error("a ping older than the last failure brought the primary back")
		}
	})
}

// TestSlowProbeBesideAnsweredChecks checks that a ping that fails while the
// primary answers checks (a loaded machine delayed the probe's own
// connection) does not mark the primary down, and that one that fails while
// nothing is answered does.
func TestSlowProbeBesideAnsweredChecks(t *testing.T) {
	ctx := context.Background()
	p := newFakePrimary(time.Now)
	started, release := make(chan struct{}), make(chan struct{})
	s := mustNew(t, p, WithProbe(func(context.Context) error {
		started <- struct{}{}
		<-release
		return context.DeadlineExceeded
	}))
	done := make(chan bool)
	go func() { done <- s.Probe(ctx) }()
	<-started
	if _, err := s.Apply(ctx, "k", req(perMinute100, 1, time.Time{})); err != nil {
		t.Fatal(err)
	}
	release <- struct{}{}
	if <-done || !s.IsAlive() {
		t.Fatal("a failed probe while a check was answered: want Probe false and still alive")
	}
	go func() { done <- s.Probe(ctx) }()
	<-started
	release <- struct{}{}
	if <-done || s.IsAlive() {
		t.Fatal("a failed probe with no check answered: want down")
	}
}

func TestProbeForever(t *testing.T) {
	checkNoLeak(t)
	p := newFakePrimary(time.Now)
	s := mustNew(t, pingingPrimary{p}, WithOutage(LocalFallback))
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan bool, 100)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		s.ProbeForever(ctx, 5*time.Millisecond, func(alive bool) {
			select {
			case reports <- alive:
			default:
			}
		})
	}()
	wait := func(want bool) {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case got := <-reports:
				if got == want {
					return
				}
			case <-timeout:
				t.Fatalf("no report of alive=%v within 5 s", want)
			}
		}
	}
	wait(true)
	if !s.Probing() {
		t.Error("Probing() = false while ProbeForever runs")
	}
	p.set(refused)
	wait(false)
	if s.IsAlive() {
		t.Error("the probe reported the primary gone but did not mark it down")
	}
	p.set(up)
	wait(true)
	if !s.IsAlive() {
		t.Error("the probe reported the primary back but did not mark it alive")
	}
	p.set(hung)
	time.Sleep(20 * time.Millisecond) // let a probe start waiting
	cancelAt := time.Now()
	cancel()
	select {
	case <-stopped:
		if took := time.Since(cancelAt); testkit.Timed(t) && took > 500*time.Millisecond {
			t.Errorf("ProbeForever took %v to return from a hung probe after its context was cancelled", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ProbeForever did not return after its context was cancelled")
	}
	if !s.IsAlive() {
		t.Error("cancelling ProbeForever during a probe marked the primary down")
	}
	if s.Probing() {
		t.Error("Probing() = true after ProbeForever returned")
	}
}

func TestProbeForeverDefaultInterval(t *testing.T) {
	checkNoLeak(t)
	s := mustNew(t, pingingPrimary{newFakePrimary(time.Now)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var times []time.Time
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ProbeForever(ctx, 0, func(bool) {
			mu.Lock()
			times = append(times, time.Now())
			if len(times) == 3 {
				cancel()
			}
			mu.Unlock()
		})
	}()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(times) < 3 {
		t.Fatalf("%d reports, want 3", len(times))
	}
	if gap := times[2].Sub(times[0]); gap < 2*DefaultProbeInterval-20*time.Millisecond {
		t.Errorf("three reports within %v, want about 2 × %v apart", gap, DefaultProbeInterval)
	}
}

func TestPartitions(t *testing.T) {
	ctx := context.Background()
	p := newFakePrimary(time.Now)
	var deadPart atomic.Value
	deadPart.Store("")
	// The partition is the key's first letter; keys of the dead partition
	// are refused, the others go through.
	partOf := func(_ context.Context, key string) string { return key[:1] }
	prim := &partitionedPrimary{fakePrimary: p, dead: &deadPart}
	var pinged sync.Map
	ping := func(_ context.Context, part string) error {
		pinged.Store(part, true)
		if part == deadPart.Load().(string) {
			return refusedError()
		}
		return nil
	}
	s := mustNew(t, prim, WithOutage(ReturnError), withPartitions(partOf, ping))
	for _, k := range []string{"a1", "b1", "c1"} {
		if _, err := s.Apply(ctx, k, req(perMinute100, 1, time.Time{})); err != nil {
			t.Fatalf("%s while all up: %v", k, err)
		}
	}
	deadPart.Store("a")
	if _, err := s.Apply(ctx, "a2", req(perMinute100, 1, time.Time{})); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Fatalf("a key of the dead partition: %v, want ratelimit.ErrUnavailable", err)
	}
	for _, k := range []string{"b2", "c2", "b3"} {
		if d, err := s.Apply(ctx, k, req(perMinute100, 1, time.Time{})); err != nil || d.Source != ratelimit.SourceStore {
			t.Fatalf("%s of a live partition: %+v, %v; want the primary's decision", k, d, err)
		}
	}
	if s.IsAlive() {
		t.Error("IsAlive with one partition down")
	}
	if s.Probe(ctx) {
		t.Error("Probe = true with one partition still dead")
	}
	for _, part := range []string{"a", "b", "c"} {
		if _, ok := pinged.Load(part); !ok {
			t.Errorf("partition %s was not pinged", part)
		}
	}
	deadPart.Store("")
	if !s.Probe(ctx) || !s.IsAlive() {
		t.Fatal("want every partition alive after a probe that reached them all")
	}
	s.MarkDown()
	if _, err := s.Apply(ctx, "c3", req(perMinute100, 1, time.Time{})); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Errorf("after MarkDown: %v, want ratelimit.ErrUnavailable on every partition", err)
	}
	s.MarkAlive()
	if _, err := s.Apply(ctx, "a3", req(perMinute100, 1, time.Time{})); err != nil {
		t.Errorf("after MarkAlive: %v", err)
	}
}

// movingPartitions is a partitioned primary whose layout a test changes, as
// a Cluster failover does: a key's partition is its first letter, renamed by
// the moves, and the partitions in dead refuse every call and ping.
type movingPartitions struct {
	*fakePrimary
	mu    sync.Mutex
	moved map[string]string // first letter -> partition, when not the letter
	dead  map[string]bool
	pings map[string]int
	// onFailedPing, when set, runs inside a ping that fails, as a
	// reload of the layout does.
	onFailedPing func()
}

func newMovingPartitions() *movingPartitions {
	return &movingPartitions{fakePrimary: newFakePrimary(time.Now), moved: map[string]string{}, dead: map[string]bool{}, pings: map[string]int{}}
}

func (m *movingPartitions) partition(_ context.Context, key string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.moved[key[:1]]; ok {
		return p
	}
	return key[:1]
}

func (m *movingPartitions) ping(_ context.Context, part string) error {
	m.mu.Lock()
	m.pings[part]++
	dead, reload := m.dead[part], m.onFailedPing
	m.mu.Unlock()
	if !dead {
		return nil
	}
	if reload != nil {
		reload()
	}
	return refusedError()
}

func (m *movingPartitions) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if m.isDead(m.partition(ctx, key)) {
		return ratelimit.Decision{}, refusedError()
	}
	return m.fakePrimary.Apply(ctx, key, r)
}

func (m *movingPartitions) isDead(part string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dead[part]
}

func (m *movingPartitions) set(f func()) {
	m.mu.Lock()
	f()
	m.mu.Unlock()
}

func (m *movingPartitions) pinged(part string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pings[part]
}

func TestPartitionsFollowAFailover(t *testing.T) {
	ctx := context.Background()
	// newStore returns a store whose partitions "a" and "b" have decided a
	// check each, and the observer's events as "partition=alive".
	newStore := func(t *testing.T) (*Store, *movingPartitions, func() string) {
		m := newMovingPartitions()
		var mu sync.Mutex
		var events []string
		s := mustNew(t, m, WithOutage(ReturnError), withPartitions(m.partition, m.ping),
			WithObserver(ObserverFunc(func(_ context.Context, e Event) {
				mu.Lock()
				events = append(events, fmt.Sprint(e.Partition, "=", e.Alive))
				mu.Unlock()
			})))
		for _, k := range []string{"a1", "b1"} {
			if _, err := s.Apply(ctx, k, req(perMinute100, 1, time.Time{})); err != nil {
				t.Fatalf("%s while all up: %v", k, err)
			}
		}
		return s, m, func() string {
			mu.Lock()
			defer mu.Unlock()
			return strings.Join(events, " ")
		}
	}
	onPrimary := func(t *testing.T, s *Store, key string) {
		t.Helper()
		if d, err := s.Apply(ctx, key, req(perMinute100, 1, time.Time{})); err != nil || d.Source != ratelimit.SourceStore {
			t.Fatalf("%s: %+v, %v; want the primary's decision", key, d, err)
		}
	}

	t.Run("a dead partition whose keys moved is forgotten and stops holding IsAlive down", func(t *testing.T) {
		s, m, events := newStore(t)
		m.set(func() { m.dead["a"] = true })
		if _, err := s.Apply(ctx, "a2", req(perMinute100, 1, time.Time{})); !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Fatalf("a key of the dead partition: %v, want ratelimit.ErrUnavailable", err)
		}
		if s.Probe(ctx) || s.IsAlive() {
			t.Fatal("Probe or IsAlive true while a's keys still map to the dead partition")
		}
		m.set(func() { m.moved["a"] = "a'" }) // the replica of a is promoted
		if !s.Probe(ctx) {
			t.Error("Probe = false after a's keys moved to a live partition")
		}
		if !s.IsAlive() {
			t.Error("IsAlive = false: the dead partition still counts though no key maps to it")
		}
		onPrimary(t, s, "a3")
		pings := m.pinged("a")
		s.Probe(ctx)
		if m.pinged("a") != pings {
			t.Error("the forgotten partition was pinged again")
		}
		if !s.IsAlive() {
			t.Error("IsAlive = false after a second probe")
		}
		if got, want := events(), "a=false a=true"; got != want {
			t.Errorf("events %q, want %q: the forgotten partition is heard back", got, want)
		}
	})

	t.Run("a ping that reloads the layout gets its partition forgotten in the same probe", func(t *testing.T) {
		s, m, events := newStore(t)
		m.set(func() {
			m.dead["a"] = true
			m.onFailedPing = func() { m.set(func() { m.moved["a"] = "a'" }) }
		})
		if !s.Probe(ctx) || !s.IsAlive() {
			t.Fatal("want the partition forgotten by the probe whose ping saw the new layout")
		}
		if got := events(); got != "" {
			t.Errorf("events %q, want none: a partition that moved away is not reported down", got)
		}
		onPrimary(t, s, "a2")
	})

	t.Run("a live partition whose keys moved is forgotten without a ping", func(t *testing.T) {
		s, m, _ := newStore(t)
		m.set(func() { m.moved["b"] = "a" })
		if !s.Probe(ctx) || m.pinged("b") != 0 {
			t.Fatalf("b pinged %d times; want it forgotten before any ping", m.pinged("b"))
		}
		var names []string
		s.each(func(name string, _ *part) { names = append(names, name) })
		if len(names) != 1 || names[0] != "a" {
			t.Errorf("partitions in use %v, want [a]", names)
		}
	})

	t.Run("a key that maps to a forgotten partition again starts it afresh", func(t *testing.T) {
		s, m, _ := newStore(t)
		m.set(func() { m.dead["a"] = true })
		s.Apply(ctx, "a2", req(perMinute100, 1, time.Time{}))
		m.set(func() { m.moved["a"] = "a'" })
		s.Probe(ctx)
		// A key whose slot the dead partition still owns (say a slot
		// migration moved only some): the first check finds it down again.
		m.set(func() { m.moved["x"] = "a" })
		if _, err := s.Apply(ctx, "x1", req(perMinute100, 1, time.Time{})); !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Fatalf("a key of the dead partition: %v, want ratelimit.ErrUnavailable", err)
		}
		if s.Probe(ctx) || s.IsAlive() {
			t.Error("Probe or IsAlive true while a key maps to the dead partition")
		}
	})
}

// partitionedPrimary refuses the keys of one partition.
type partitionedPrimary struct {
	*fakePrimary
	dead *atomic.Value
}

func (p *partitionedPrimary) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if key[:1] == p.dead.Load().(string) {
		return ratelimit.Decision{}, refusedError()
	}
	return p.fakePrimary.Apply(ctx, key, r)
}

func TestReset(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	p := newFakePrimary(clk.Now)
	s := mustNew(t, p, WithOutage(LocalFallback), WithClock(clk.Now))
	drain := func() {
		for range 100 {
			s.Apply(ctx, "k", req(perMinute100, 1, clk.Now()))
		}
	}
	drain()
	if err := s.Reset(ctx, "k"); err != nil {
		t.Fatalf("Reset while alive: %v", err)
	}
	if d, _ := s.Apply(ctx, "k", req(perMinute100, 1, clk.Now())); d.Remaining != 99 || d.Source != ratelimit.SourceStore {
		t.Fatalf("after Reset: %+v, want a full shared bucket", d)
	}
	p.set(refused)
	drain() // marks down, then drains the local bucket
	if err := s.Reset(ctx, "k"); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Fatalf("Reset while down: %v, want ratelimit.ErrUnavailable", err)
	}
	if d, _ := s.Apply(ctx, "k", req(perMinute100, 1, clk.Now())); d.Remaining != 99 || d.Source != ratelimit.SourceLocal {
		t.Fatalf("after Reset while down: %+v, want a full local bucket", d)
	}
	s.MarkAlive()
	if err := s.Reset(ctx, "k"); !errors.Is(err, ratelimit.ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) || s.IsAlive() {
		t.Fatalf("Reset on a refused primary: %v, alive %v; want ratelimit.ErrUnavailable wrapping the cause, and down", err, s.IsAlive())
	}
}

// ctxKey marks the context of a call, to see which one the observer got.
type ctxKey struct{}

func TestObserver(t *testing.T) {
	clk := newFakeClock()
	p := newFakePrimary(clk.Now)
	var mu sync.Mutex
	var events []Event
	var ctxs []any
	obs := ObserverFunc(func(ctx context.Context, e Event) {
		mu.Lock()
		events = append(events, e)
		ctxs = append(ctxs, ctx.Value(ctxKey{}))
		mu.Unlock()
	})
	s := mustNew(t, pingingPrimary{p}, WithOutage(FailOpen), WithClock(clk.Now), WithObserver(obs))
	callCtx := context.WithValue(context.Background(), ctxKey{}, "check")
	probeCtx := context.WithValue(context.Background(), ctxKey{}, "probe")

	p.set(refused)
	s.Apply(callCtx, "k", req(perMinute100, 1, time.Time{}))
	s.Apply(callCtx, "k", req(perMinute100, 1, time.Time{})) // the breaker: no change
	s.Probe(probeCtx)                                        // still refused: no change
	clk.Add(time.Second)
	p.set(up)
	s.Probe(probeCtx)
	s.MarkAlive() // already alive: no change
	s.MarkDown()
	s.MarkDown()
	s.MarkAlive()

	mu.Lock()
	defer mu.Unlock()
	type got struct {
		alive bool
		ctx   any
	}
	want := []got{{false, "check"}, {true, "probe"}, {false, nil}, {true, nil}}
	if len(events) != len(want) {
		t.Fatalf("%d events %+v, want %d: one per change", len(events), events, len(want))
	}
	for i, w := range want {
		e := events[i]
		if e.Alive != w.alive || ctxs[i] != w.ctx || e.Partition != "" || e.Outage != FailOpen {
			t.Errorf("event %d = %+v with context %v; want alive %v, context %v, partition \"\", fail-open", i, e, ctxs[i], w.alive, w.ctx)
		}
		if (e.Cause != nil) == e.Alive {
			t.Errorf("event %d: cause %v with alive %v; want a cause exactly when down", i, e.Cause, e.Alive)
		}
	}
	if !errors.Is(events[0].Cause, syscall.ECONNREFUSED) || !events[0].At.Equal(newFakeClock().Now()) || !events[1].At.Equal(clk.Now()) {
		t.Errorf("first events: %+v, %+v; want the refused cause and the fake clock's times", events[0], events[1])
	}

	t.Run("partitions are named", func(t *testing.T) {
		var names []string
		var dead atomic.Value
		dead.Store("a")
		s := mustNew(t, &partitionedPrimary{fakePrimary: newFakePrimary(time.Now), dead: &dead},
			withPartitions(func(_ context.Context, key string) string { return key[:1] }, func(context.Context, string) error { return nil }),
			WithObserver(ObserverFunc(func(_ context.Context, e Event) {
				names = append(names, fmt.Sprint(e.Partition, "=", e.Alive))
			})))
		s.Apply(context.Background(), "b1", req(perMinute100, 1, time.Time{}))
		s.Apply(context.Background(), "a1", req(perMinute100, 1, time.Time{}))
		s.Probe(context.Background())
		if got := strings.Join(names, " "); got != "a=false a=true" {
			t.Errorf("events %q, want %q", got, "a=false a=true")
		}
	})
}

// TestFleetShareOfAQuota: during an outage each of 4 processes counts a
// quota's window against a quarter of its allowance, from nothing, and
// denies a cost above that quarter without taking.
func TestFleetShareOfAQuota(t *testing.T) {
	clk := newFakeClock()
	s := mustNew(t, newFakePrimary(clk.Now), WithOutage(LocalFallback), WithFleetShare(4), WithClock(clk.Now))
	s.MarkDown()
	ctx := context.Background()
	q := ratelimit.CalendarQuota(40, ratelimit.Day, nil)
	r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(1000)}, Quotas: []ratelimit.Quota{q}, Cost: 1}
	admitted := 0
	for range 20 {
		r.Now = clk.Now()
		d, err := s.Apply(ctx, "k", r)
		if err != nil || d.Source != ratelimit.SourceLocal {
			t.Fatalf("= %+v, %v; want a local decision", d, err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("admitted %d of a quota of 40 a day with a share of 4, want 10", admitted)
	}
	big := r
	big.Cost = 11
	d, err := s.Apply(ctx, "other", big)
	if err != nil || d.Allowed || d.Source != ratelimit.SourceLocal {
		t.Fatalf("a cost of 11 against a share of 10: %+v %v; want denied", d, err)
	}
	if d, err := s.Apply(ctx, "other", r); err != nil || !d.Allowed || d.Standings[1].Remaining != 9 {
		t.Fatalf("the denial took nothing: %+v %v", d, err)
	}
}
