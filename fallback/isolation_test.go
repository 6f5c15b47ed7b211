package fallback

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/redisstore"
)

var masterKillRuns = flag.Int("fallback.killruns", 5, "runs of TestClusterMasterKilledPlainSetUp in the timing tier (RATELIMIT_TIMING=1; the default run makes one)")

// clusterSubjects returns n subjects of lim spread over c's masters, round
// robin, and the master of each.
func clusterSubjects(c *redistest.Cluster, lim *ratelimit.Limiter[string], n int) (subjects []string, master map[string]*redistest.Server) {
	masters := c.Masters()
	master = map[string]*redistest.Server{}
	for i := 0; len(subjects) < n; i++ {
		s := fmt.Sprint("u", i)
		m := c.MasterOf(redistest.SlotOf(lim.Key(s)))
		if m == masters[len(subjects)%len(masters)] {
			subjects = append(subjects, s)
			master[s] = m
		}
	}
	return subjects, master
}

// plainClusterSetUp starts a cluster of 3 masters with replicas replicas
// each and the plain set-up over it, fallback.New(redisstore.New(cc),
// WithOutage(LocalFallback)) with a probe, and warms 6 subjects spread over
// the masters up on the shared buckets.
func plainClusterSetUp(t *testing.T, replicas int, ns string) (*redistest.Cluster, *Store, *ratelimit.Limiter[string], []string, map[string]*redistest.Server) {
	t.Helper()
	c := redistest.StartCluster(t, 3, replicas)
	s := mustNew(t, redisstore.New(redisClusterClient(t, c)), WithOutage(LocalFallback))
	lim, err := ratelimit.New[string](s, ratelimit.PerMinute(1_000_000), ratelimit.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	runProbe(t, s)
	subjects, master := clusterSubjects(c, lim, 6)
	warmUp(t, subjects, lim)
	return c, s, lim, subjects, master
}

// TestClusterMasterKilledPlainSetUp: the plain set-up,
// fallback.New(redisstore.New(cc), WithOutage(LocalFallback)), with no
// WithPartitions, on a cluster of 3 masters with a replica each; 8
// goroutines check 6 subjects spread over the masters; one master is
// SIGKILLed and its replica promoted. Repeated (-fallback.killruns, 5 by
// default), each run on a fresh cluster.
//
// Bounds checked in every run: no check of the other masters' subjects
// leaves the shared buckets or fails; the dead master's subjects are back on
// the shared buckets within 300 ms of the failover (the promoted replica
// serving its slots). The default run checks, once, that the dead master's
// subjects come back and that no check of the other masters leaves the
// shared buckets without running into its deadline; the timing tier
// (RATELIMIT_TIMING=1) holds the bounds, in every run.
func TestClusterMasterKilledPlainSetUp(t *testing.T) {
	checkNoLeak(t)
	const deadline = 200 * time.Millisecond
	const backBound = 300 * time.Millisecond
	timed := testkit.Timed(t)
	runs := 1
	if timed {
		runs = *masterKillRuns
	}
	for run := range runs {
		t.Run(fmt.Sprint("run ", run), func(t *testing.T) {
			c, _, lim, subjects, master := plainClusterSetUp(t, 1, "kill")
			victim := master[subjects[0]]
			l := startLoad(8, deadline, roundRobin(lim, subjects...))
			defer l.finish()
			time.Sleep(200 * time.Millisecond)
			killAt := time.Now()
			victim.Kill()
			c.WaitForFailover(t, victim, 15*time.Second)
			failoverAt := time.Now()
			var backAt time.Time
			waitFor(t, 10*time.Second, "the dead master's subjects back on the shared buckets", func() bool {
				for _, e := range l.snapshot() {
					if master[e.subject] == victim && e.onStore() && e.start.After(failoverAt) {
						backAt = e.end
						return true
					}
				}
				return false
			})
			time.Sleep(100 * time.Millisecond)
			events := l.finish()
			var otherBad, victimOff int
			var slowestOther time.Duration
			for _, e := range events {
				if master[e.subject] == victim {
					if !e.onStore() {
						victimOff++
					}
					continue
				}
				slowestOther = max(slowestOther, e.took())
				if !e.onStore() {
					otherBad++
					if timed || !e.ranOut(deadline) {
						t.Errorf("a check of %s, on a master that stayed up, left the shared buckets %v after the kill (took %v): %+v, %v", e.subject, e.start.Sub(killAt), e.took(), e.d, e.err)
					}
				}
			}
			back := backAt.Sub(failoverAt)
			t.Logf("FIGURE plain set-up, run %d: failover %v after the kill; the dead master's subjects back %v after it (bound %v), %d of their checks off the shared buckets; other masters: %d degraded or failed, slowest check %v; %d checks",
				run, failoverAt.Sub(killAt), back, backBound, victimOff, otherBad, slowestOther, len(events))
			if timed && back > backBound {
				t.Errorf("the dead master's subjects came back %v after the failover, want within %v", back, backBound)
			}
		})
	}
}

// TestClusterMasterStopped: SIGSTOP of one master of three (no replicas),
// then SIGCONT, under the plain set-up with LocalFallback. The other
// masters' checks keep their latency (p99 quoted) and never leave the shared
// buckets; the stopped master's checks wait out at most their deadline and
// are back on the shared buckets after SIGCONT. The default run checks that
// the stopped master's partition is marked down and its subjects come back,
// and that no check of the other masters leaves the shared buckets without
// running into its deadline; the p99, the deadlines kept and the slowest
// check are held to their bounds in the timing tier (RATELIMIT_TIMING=1).
func TestClusterMasterStopped(t *testing.T) {
	checkNoLeak(t)
	const deadline = 200 * time.Millisecond
	timed := testkit.Timed(t)
	_, s, lim, subjects, master := plainClusterSetUp(t, 0, "stop")
	victim := master[subjects[0]]
	l := startLoad(8, deadline, roundRobin(lim, subjects...))
	defer l.finish()
	time.Sleep(300 * time.Millisecond)
	before := len(l.snapshot())
	stopAt := time.Now()
	victim.Stop()
	waitFor(t, 5*time.Second, "the stopped master's partition marked down", func() bool { return !s.IsAlive() })
	time.Sleep(500 * time.Millisecond)
	victim.Cont()
	contAt := time.Now()
	waitFor(t, 5*time.Second, "the stopped master's subjects back on the shared buckets", func() bool {
		for _, e := range l.snapshot() {
			if master[e.subject] == victim && e.onStore() && e.start.After(contAt) {
				return true
			}
		}
		return false
	})
	events := l.finish()
	p99 := func(evs []event, keep func(event) bool) time.Duration {
		var ds []time.Duration
		for _, e := range evs {
			if keep(e) {
				ds = append(ds, e.took())
			}
		}
		if len(ds) == 0 {
			return 0
		}
		slices.Sort(ds)
		return ds[len(ds)*99/100]
	}
	other := func(e event) bool { return master[e.subject] != victim }
	during := func(e event) bool { return other(e) && !e.start.Before(stopAt) && e.start.Before(contAt) }
	var otherBad int
	var slowestVictim time.Duration
	for _, e := range events[before:] {
		if !other(e) {
			slowestVictim = max(slowestVictim, e.took())
			continue
		}
		if !e.onStore() {
			otherBad++
			if timed || !e.ranOut(deadline) {
				t.Errorf("a check of %s, on a running master, left the shared buckets %v after SIGSTOP (took %v): %+v, %v", e.subject, e.start.Sub(stopAt), e.took(), e.d, e.err)
			}
		}
	}
	pBefore, pDuring := p99(events[:before], other), p99(events[before:], during)
	t.Logf("FIGURE sigstop of one master: the other masters' p99 %v before, %v while it was stopped; %d of their checks off the shared buckets; the stopped master's slowest check %v (deadline %v)", pBefore, pDuring, otherBad, slowestVictim, deadline)
	if !timed {
		return
	}
	if pDuring > deadline/2 {
		t.Errorf("the other masters' p99 was %v while one master was stopped, want well under the deadline %v", pDuring, deadline)
	}
	if slowestVictim > deadline+slack {
		t.Errorf("a check of the stopped master took %v, past its deadline %v", slowestVictim, deadline)
	}
}

// TestACallersShortDeadlineIsNotAnOutage: a check with a deadline too short
// for any Redis leaves IsAlive true, and the next caller, a moment later, is
// decided by the shared bucket.
func TestACallersShortDeadlineIsNotAnOutage(t *testing.T) {
	checkNoLeak(t)
	f := newStandalone(t, ratelimit.PerMinute(1000), nil, WithOutage(LocalFallback))
	ctx := context.Background()
	if _, err := f.lim.TryAcquire(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		short, cancel := context.WithTimeout(ctx, 30*time.Microsecond)
		f.lim.TryAcquire(short, "impatient")
		cancel()
	}
	if !f.store.IsAlive() {
		t.Fatal("a caller's own short deadline marked a healthy Redis down")
	}
	time.Sleep(2 * probeInterval) // any kicked probe is done
	d, err := f.lim.TryAcquire(ctx, "other")
	if err != nil || d.Source != ratelimit.SourceStore || !f.store.IsAlive() {
		t.Fatalf("the next caller: %+v, %v, alive %v; want the shared bucket", d, err, f.store.IsAlive())
	}
}

// TestTheProbeFindsASingleServerDownWithoutChecks: over one Redis server the
// store is one partition, so the probe watches it before any check is made.
func TestTheProbeFindsASingleServerDownWithoutChecks(t *testing.T) {
	checkNoLeak(t)
	f := newStandalone(t, ratelimit.PerMinute(10), nil, WithOutage(FailClosed))
	runProbe(t, f.store)
	f.server.Kill()
	waitFor(t, 5*time.Second, "the probe marks the primary down", func() bool { return !f.store.IsAlive() })
}
