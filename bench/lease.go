package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

// The lease section's configuration: processes (each a Limiter over its own
// go-redis client and redisstore, as shipped) × goroutines on one subject.
const (
	leaseProcs      = 4
	leaseGoroutines = 16
	leaseLifetime   = 50 * time.Millisecond
)

// leaseRun is one timed run of the fleet in one mode.
type leaseRun struct {
	ops, allowed, errors int64
	elapsed              time.Duration
	calls                int64 // EVALSHA and EVAL calls Redis served during the run
	stats                ratelimit.LeaseStats
}

func (r leaseRun) rate() float64 { return float64(r.ops) / r.elapsed.Seconds() }

func (r leaseRun) callsPerDecision() float64 { return float64(r.calls) / float64(max(r.ops, 1)) }

// leaseModes are the two modes compared: plain and WithLeases.
var leaseModes = [2]string{"plain", "WithLeases(50ms)"}

// runLeases measures one hot subject checked by leaseProcs limiters ×
// leaseGoroutines goroutines, with and without leases, interleaved over the
// rounds (plain, leases, plain, leases, ...), each run on a fresh subject.
func runLeases(ctx context.Context, admin *redis.Client, e env, cfg config, rep *report, logf func(string, ...any)) error {
	for round := range cfg.rounds {
		for m := range leaseModes {
			r, err := leaseOnce(ctx, admin, e, m == 1, fmt.Sprintf("hot:%d:%d", round, m), cfg.duration)
			if err != nil {
				return err
			}
			rep.leases[m] = append(rep.leases[m], r)
			logf("  %-18s %s decisions/s, %.2g Redis calls/decision, allowed %d, errors %d, leases %+v",
				leaseModes[m], fmtRate(r.rate()), r.callsPerDecision(), r.allowed, r.errors, r.stats)
		}
	}
	return nil
}

// leaseOnce builds the fleet, warms its connections, resets Redis's
// statistics and runs it on subject for d.
func leaseOnce(ctx context.Context, admin *redis.Client, e env, leased bool, subject string, d time.Duration) (leaseRun, error) {
	var r leaseRun
	fleet := make([]*ratelimit.Limiter[string], leaseProcs)
	for i := range fleet {
		c := redis.NewClient(goRedisOptions(e))
		defer c.Close()
		opts := []ratelimit.Option{ratelimit.WithNamespace("lease")}
		if leased {
			opts = append(opts, ratelimit.WithLeases(leaseLifetime))
		}
		lim, err := ratelimit.New[string](redisstore.New(c), ourLimit(e), opts...)
		if err != nil {
			return r, err
		}
		fleet[i] = lim
		if _, err := lim.Peek(ctx, subject); err != nil {
			return r, err
		}
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		return r, err
	}
	rctx, cancel := context.WithTimeout(ctx, d+10*time.Second)
	defer cancel()
	var stop atomic.Bool
	var ops, allowed, errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for _, lim := range fleet {
		for range leaseGoroutines {
			wg.Go(func() {
				var n, ok, bad int64
				for !stop.Load() {
					dec, err := lim.TryAcquire(rctx, subject)
					n++
					switch {
					case err != nil:
						bad++
					case dec.Allowed:
						ok++
					}
				}
				ops.Add(n)
				allowed.Add(ok)
				errs.Add(bad)
			})
		}
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	r.elapsed = time.Since(start)
	r.ops, r.allowed, r.errors = ops.Load(), allowed.Load(), errs.Load()
	stats, err := commandStats(ctx, admin)
	if err != nil {
		return r, err
	}
	r.calls = stats["fcall"].calls + stats["evalsha"].calls + stats["eval"].calls
	if r.calls == 0 && r.ops > 0 {
		// Every run takes at least one lease or checks on Redis: a count
		// of zero means the store calls Redis by a command not counted here.
		return r, fmt.Errorf("lease section: %d decisions and no script call in INFO commandstats", r.ops)
	}
	for _, lim := range fleet {
		s := lim.LeaseStats()
		r.stats.Taken += s.Taken
		r.stats.Returned += s.Returned
		r.stats.Local += s.Local
		r.stats.Degraded += s.Degraded
		r.stats.Lost += s.Lost
		r.stats.Tokens += s.Tokens
		if err := lim.Close(ctx); err != nil {
			return r, err
		}
	}
	return r, nil
}

// leaseStat is the median over the rounds of one mode.
type leaseStat struct {
	rate, calls, admitted, taken float64
	errors                       int64
}

func (rep *report) leaseStat(m int) (leaseStat, bool) {
	rs := rep.leases[m]
	if len(rs) == 0 {
		return leaseStat{}, false
	}
	var rates, calls, admitted, taken []float64
	var s leaseStat
	p := rep.cfg
	for _, r := range rs {
		rates = append(rates, r.rate())
		calls = append(calls, r.callsPerDecision())
		admitted = append(admitted, float64(r.allowed)/(float64(p.burst)+float64(p.rate)*r.elapsed.Seconds()))
		taken = append(taken, float64(r.stats.Taken)/r.elapsed.Seconds())
		s.errors += r.errors
	}
	s.rate, s.calls, s.admitted, s.taken = median(rates), median(calls), median(admitted), median(taken)
	return s, true
}

func (rep *report) writeLeases(w io.Writer) {
	fmt.Fprintf(w, "### One hot subject: leases (%d limiters × %d goroutines, one subject, one redis-server)\n\n", leaseProcs, leaseGoroutines)
	fmt.Fprintf(w, "Each limiter is a process: its own go-redis client and redisstore (as shipped); the policy is saturated. Redis calls are INFO commandstats' EVALSHA and EVAL calls during the run (checks, lease reserves and returns), per decision. Medians over %d rounds, the two modes interleaved.\n\n", rep.cfg.rounds)
	fmt.Fprintln(w, "| mode | decisions/s | admitted ÷ allowed | Redis calls/decision | leases taken/s | errors |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	for m, name := range leaseModes {
		if s, ok := rep.leaseStat(m); ok {
			fmt.Fprintf(w, "| %s | %s | %.3f | %.2g | %.0f | %d |\n", name, fmtRate(s.rate), s.admitted, s.calls, s.taken, s.errors)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "admitted ÷ allowed: the tokens the fleet admitted over burst + rate × the run's length, what the policy allows a fresh subject (at most 1).\n")
	fmt.Fprintln(w)
}

// leaseTargets are target 5's rows.
func (rep *report) leaseTargets() []target {
	n5r := fmt.Sprintf("5. one subject, %d limiters × %d goroutines: WithLeases ÷ plain, decisions/s", leaseProcs, leaseGoroutines)
	n5c := fmt.Sprintf("5. one subject, %d limiters × %d goroutines, WithLeases: Redis calls per decision", leaseProcs, leaseGoroutines)
	p, okP := rep.leaseStat(0)
	l, okL := rep.leaseStat(1)
	if !okP || !okL {
		why := "needs -sections lease"
		return []target{missing(n5r, "≥ 10", why), missing(n5c, "≤ 0.01", why)}
	}
	return []target{
		atLeast(n5r, fmtRate(l.rate)+" ÷ "+fmtRate(p.rate), l.rate, p.rate, 10),
		{name: n5c, measured: fmt.Sprintf("%.2g (plain: %.2g)", l.calls, p.calls), value: fmt.Sprintf("%.2g", l.calls),
			bound: "≤ 0.01", ok: true, pass: l.calls <= 0.01},
	}
}
