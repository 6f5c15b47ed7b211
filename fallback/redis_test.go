package fallback

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

// The fault tests run real redis-server processes on 127.0.0.1 (package
// redistest), with a client built with fast-failure settings, a probe that
// PINGs on its own connection every DefaultProbeInterval, and a fake clock
// that stands still: every request carries the clock's time, so the shared
// and the local buckets refill only when a test says so, and the counts of
// admitted checks are exact. Each test logs its figures on lines that start
// with "FIGURE".
//
// The default run checks what a fault does to the decisions (every check
// gets a Decision, the local buckets hold their share, decisions come back
// to the shared store); the timing tier (RATELIMIT_TIMING=1, see
// testkit.Timed and docs/outages.md) also holds the figures to their
// bounds: how long a check took, how soon the fault was seen, how soon
// decisions came back.
//
// Recovery is measured from the moment the fault is cleared (the restarted
// server answers, SIGCONT, Resume) to the start of the first check that is
// sent to the shared store again: that is when decisions are back on the
// shared bucket. The figures also give the end of that check.

// standaloneFixture is a redis-server, a fallback Store over a redisstore
// Store on it, and a Limiter with a stopped fake clock.
type standaloneFixture struct {
	server *redistest.Server
	store  *Store
	lim    *ratelimit.Limiter[string]
	clock  *testkit.Clock
}

func newStandalone(t *testing.T, policy ratelimit.Limit, addr func(*redistest.Server) string, opts ...Option) *standaloneFixture {
	t.Helper()
	f := &standaloneFixture{server: redistest.StartServer(t), clock: newFakeClock()}
	target := f.server.Addr()
	if addr != nil {
		target = addr(f.server)
	}
	opts = append([]Option{
		WithClock(f.clock.Now),
		WithProbe(func(ctx context.Context) error { return pingAddr(ctx, target) }),
	}, opts...)
	f.store = mustNew(t, redisstore.New(newRedisClient(t, target)), opts...)
	var err error
	f.lim, err = ratelimit.New[string](f.store, policy, ratelimit.WithClock(f.clock.Now), ratelimit.WithNamespace("fault"))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestRedisKilledUnderLoad: SIGKILL under load from 8 goroutines, then a
// restart on the same port.
//
// Bounds checked: no call takes longer than its 250 ms deadline (+ slack);
// with LocalFallback every call gets a Decision (no error); with the clock
// stopped and a fleet share of 4, each subject's local bucket admits at most
// ⌊100/4⌋ = 25 of its 100/min policy; after redis-server answers again the
// probe brings decisions back to the shared bucket within 3 probe intervals.
func TestRedisKilledUnderLoad(t *testing.T) {
	checkNoLeak(t)
	const deadline = 250 * time.Millisecond
	policy := ratelimit.PerMinute(100)
	f := newStandalone(t, policy, nil, WithOutage(LocalFallback), WithFleetShare(4))
	runProbe(t, f.store)
	subjects := []string{"s0", "s1", "s2", "s3"}
	l := startLoad(8, deadline, roundRobin(f.lim, subjects...))
	waitFor(t, 5*time.Second, "checks on the shared store before the kill", func() bool {
		n := 0
		for _, e := range l.snapshot() {
			if e.onStore() {
				n++
			}
		}
		return n >= 40
	})

	killAt := time.Now()
	f.server.Kill()
	downAt := waitFor(t, 5*time.Second, "the primary marked down", func() bool { return !f.store.IsAlive() })
	time.Sleep(300 * time.Millisecond) // the outage, under load
	waitFor(t, 10*time.Second, "every subject decided by its local bucket", func() bool {
		local := map[string]bool{}
		for _, e := range l.snapshot() {
			if e.err == nil && e.d.Source == ratelimit.SourceLocal {
				local[e.subject] = true
			}
		}
		return len(local) == len(subjects)
	})
	outage := l.snapshot()
	f.server.Restart(t)
	restartedAt := time.Now()
	waitFor(t, 5*time.Second, "decisions back on the shared store", func() bool {
		for _, e := range l.snapshot()[len(outage):] {
			if e.onStore() && !e.start.Before(restartedAt) {
				return true
			}
		}
		return false
	})
	time.Sleep(50 * time.Millisecond)
	events := l.finish()

	fig := measure(events, killAt, restartedAt, deadline)
	t.Logf("FIGURE sigkill: breaker open %v after the kill, first fallback decision after %v, recover %v after the restart answered (bound %v; first store answer %v), slowest check %v (deadline %v), %d checks, %d not on the store, %d errors",
		downAt.Sub(killAt), fig.detect, fig.recover, 3*probeInterval, fig.answered, fig.slowest, deadline, len(events), fig.bad, fig.errs)
	wantDecisions(t, "", events, deadline)
	if fig.detect < 0 || fig.recover < 0 {
		t.Errorf("detection %v, recovery %v: no check was answered locally, or none by the store after the restart", fig.detect, fig.recover)
	}
	if testkit.Timed(t) {
		if fig.starved > 0 {
			t.Errorf("%d checks ran out of their deadline before the store was asked", fig.starved)
		}
		if fig.slowest > deadline+slack {
			t.Errorf("slowest check %v, want at most the deadline %v (+%v)", fig.slowest, deadline, slack)
		}
		if fig.detect > deadline+slack {
			t.Errorf("detection took %v, want at most one deadline", fig.detect)
		}
		if fig.recover > 3*probeInterval {
			t.Errorf("recovery took %v after the restart, want at most 3 probe intervals (%v)", fig.recover, 3*probeInterval)
		}
	}

	share := Share(policy, 4).Capacity
	var before, after []event
	for _, e := range events {
		if e.end.Before(killAt) {
			before = append(before, e)
		} else if !e.start.Before(restartedAt) {
			after = append(after, e)
		}
	}
	all := admitted(events)
	for _, s := range subjects {
		local := all[s][ratelimit.SourceLocal]
		t.Logf("FIGURE sigkill %s: admitted by the store before the kill %d, locally %d (bound %d), by the store after the restart %d",
			s, admitted(before)[s][ratelimit.SourceStore], local, share, admitted(after)[s][ratelimit.SourceStore])
		if local > share {
			t.Errorf("%s: the local bucket admitted %d with the clock stopped, above the share %d", s, local, share)
		}
		if local == 0 {
			t.Errorf("%s: nothing admitted locally during the outage: the fallback did not serve", s)
		}
		if got := all[s][ratelimit.SourceStore]; got > 2*policy.Capacity {
			t.Errorf("%s: the store admitted %d across one restart with the clock stopped, above 2 × %d", s, got, policy.Capacity)
		}
	}
}

// TestRedisHung: SIGSTOP, then SIGCONT.
//
// Bounds checked: every check ends within its 200 ms deadline (+ slack);
// the checks that waited on the stopped server are at most two per
// goroutine (8): the one in flight when it stopped, and the one started
// after it while the probe that its deadline kicked (a caller's deadline
// does not open the breaker on its own) waited one probe interval; the
// breaker answers the rest at once from the local buckets; every check gets a Decision;
// after SIGCONT the probe brings decisions back to the shared bucket within
// 3 probe intervals.
func TestRedisHung(t *testing.T) {
	checkNoLeak(t)
	const deadline = 200 * time.Millisecond
	const workers = 4
	f := newStandalone(t, ratelimit.PerMinute(1000), nil, WithOutage(LocalFallback))
	runProbe(t, f.store)
	l := startLoad(workers, deadline, roundRobin(f.lim, "s0", "s1", "s2", "s3"))
	time.Sleep(100 * time.Millisecond)
	stopAt := time.Now()
	f.server.Stop()
	downAt := waitFor(t, 5*time.Second, "the primary marked down", func() bool { return !f.store.IsAlive() })
	time.Sleep(400 * time.Millisecond)
	f.server.Cont()
	contAt := time.Now()
	waitFor(t, 5*time.Second, "decisions back on the shared store", func() bool {
		for _, e := range l.snapshot() {
			if e.onStore() && !e.start.Before(contAt) {
				return true
			}
		}
		return false
	})
	events := l.finish()

	fig := measure(events, stopAt, contAt, deadline)
	t.Logf("FIGURE sigstop: breaker open %v after SIGSTOP, first fallback decision after %v, recover %v after SIGCONT (bound %v; first store answer %v), slowest check %v (deadline %v), %d checks ran into their deadline (bound %d), %d checks, %d not on the store, %d errors",
		downAt.Sub(stopAt), fig.detect, fig.recover, 3*probeInterval, fig.answered, fig.slowest, deadline, fig.deadlined, 2*workers, len(events), fig.bad, fig.errs)
	wantDecisions(t, "", events, deadline)
	if fig.detect < 0 || fig.recover < 0 {
		t.Errorf("detection %v, recovery %v: no check was answered locally, or none by the store after SIGCONT", fig.detect, fig.recover)
	}
	if testkit.Timed(t) {
		if fig.starved > 0 {
			t.Errorf("%d checks ran out of their deadline before the store was asked", fig.starved)
		}
		if fig.slowest > deadline+slack {
			t.Errorf("slowest check %v, want at most the deadline %v (+%v)", fig.slowest, deadline, slack)
		}
		if fig.deadlined > 2*workers {
			t.Errorf("%d checks ran into their deadline on the stopped server, want at most two per goroutine (%d)", fig.deadlined, 2*workers)
		}
		if fig.detect > deadline+slack {
			t.Errorf("detection took %v, want at most one deadline (%v)", fig.detect, deadline)
		}
		if d := downAt.Sub(stopAt); d > deadline+probeInterval+slack {
			t.Errorf("the breaker opened %v after SIGSTOP, want within the deadline plus one probe interval (%v)", d, deadline+probeInterval)
		}
		if fig.recover > 3*probeInterval {
			t.Errorf("recovery took %v after SIGCONT, want at most 3 probe intervals (%v)", fig.recover, 3*probeInterval)
		}
	}
}

// TestRedisRestartedEmpty: a redis-server without persistence restarts and
// forgets every bucket.
//
// Bound checked: with the clock stopped, a 10/min subject is admitted its
// capacity (10) before the restart, at most its capacity locally while the
// primary is down (fleet share 1), and at most its capacity again after the
// restart: the restart itself over-admits at most one capacity per subject.
// A restart that no check notices (no outage seen) over-admits the same.
func TestRedisRestartedEmpty(t *testing.T) {
	checkNoLeak(t)
	policy := ratelimit.PerMinute(10)
	ctx := context.Background()
	check := func(f *standaloneFixture, subject string, n int) map[ratelimit.Source]int64 {
		t.Helper()
		got := map[ratelimit.Source]int64{}
		for range n {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			d, err := f.lim.TryAcquire(cctx, subject)
			cancel()
			if err != nil {
				t.Fatalf("%s: %v", subject, err)
			}
			if d.Allowed {
				got[d.Source]++
			}
		}
		return got
	}
	t.Run("with the outage seen", func(t *testing.T) {
		f := newStandalone(t, policy, nil, WithOutage(LocalFallback))
		runProbe(t, f.store)
		subjects := []string{"a", "b", "c"}
		before := map[string]int64{}
		for _, s := range subjects {
			before[s] = check(f, s, 15)[ratelimit.SourceStore]
		}
		f.server.Kill()
		local := map[string]int64{}
		for _, s := range subjects {
			local[s] = check(f, s, 15)[ratelimit.SourceLocal]
		}
		if f.store.IsAlive() {
			t.Fatal("the primary is alive with redis-server killed")
		}
		f.server.Restart(t)
		waitFor(t, 5*time.Second, "the probe finding the restarted server", f.store.IsAlive)
		for _, s := range subjects {
			after := check(f, s, 15)[ratelimit.SourceStore]
			over := before[s] + local[s] + after - policy.Capacity
			t.Logf("FIGURE restart-empty %s: store before %d, local during the outage %d, store after the restart %d: over-admission %d = %d from the restart + %d local (policy %v, clock stopped)",
				s, before[s], local[s], after, over, after, local[s], policy)
			if before[s] != policy.Capacity {
				t.Errorf("%s: the store admitted %d before the restart, want the capacity %d", s, before[s], policy.Capacity)
			}
			if local[s] > policy.Capacity {
				t.Errorf("%s: %d admitted locally, above the capacity %d", s, local[s], policy.Capacity)
			}
			if after > policy.Capacity {
				t.Errorf("%s: the restarted store admitted %d, above one capacity (%d)", s, after, policy.Capacity)
			}
		}
	})
	t.Run("with no check during the restart", func(t *testing.T) {
		f := newStandalone(t, policy, nil, WithOutage(ReturnError))
		before := check(f, "a", 15)[ratelimit.SourceStore]
		f.server.Restart(t)
		after := check(f, "a", 15)
		t.Logf("FIGURE restart-empty unnoticed: store before %d, after %d: over-admission %d (bound %d), primary alive %v",
			before, after[ratelimit.SourceStore], before+after[ratelimit.SourceStore]-policy.Capacity, policy.Capacity, f.store.IsAlive())
		if after[ratelimit.SourceStore] > policy.Capacity || len(after) != 1 {
			t.Errorf("after an unnoticed restart: %v admitted, want at most %d, all by the store", after, policy.Capacity)
		}
	})
}

// TestProxyDropAndStall: a loopback TCP proxy between the client and
// redis-server drops or stalls the traffic on command, with no signal to
// the server.
//
// Bounds checked: every check ends within its 200 ms deadline (+ slack);
// under Drop every check is answered (locally) and detection is immediate
// (within one deadline); under Stall the checks that waited are at most the
// 4 in flight; after Resume the probe, which goes through the proxy too,
// brings decisions back to the shared bucket within 3 probe intervals.
func TestProxyDropAndStall(t *testing.T) {
	checkNoLeak(t)
	const deadline = 200 * time.Millisecond
	const workers = 4
	var proxy *redistest.Proxy
	f := newStandalone(t, ratelimit.PerMinute(1000), func(s *redistest.Server) string {
		proxy = redistest.StartProxy(t, s.Addr())
		return proxy.Addr()
	}, WithOutage(LocalFallback))
	runProbe(t, f.store)
	timed := testkit.Timed(t)
	l := startLoad(workers, deadline, roundRobin(f.lim, "s0", "s1", "s2", "s3"))
	defer l.finish()
	for _, fault := range []struct {
		name   string
		inject func()
	}{{"drop", proxy.Drop}, {"stall", proxy.Stall}} {
		time.Sleep(100 * time.Millisecond)
		from := len(l.snapshot())
		faultAt := time.Now()
		fault.inject()
		downAt := waitFor(t, 5*time.Second, fault.name+": the primary marked down", func() bool { return !f.store.IsAlive() })
		time.Sleep(300 * time.Millisecond)
		proxy.Resume()
		resumedAt := time.Now()
		waitFor(t, 5*time.Second, fault.name+": decisions back on the shared store", func() bool {
			for _, e := range l.snapshot()[from:] {
				if e.onStore() && !e.start.Before(resumedAt) {
					return true
				}
			}
			return false
		})
		events := l.snapshot()[from:]
		fig := measure(events, faultAt, resumedAt, deadline)
		t.Logf("FIGURE proxy %s: breaker open %v after the fault, first fallback decision after %v, recover %v after Resume (bound %v; first store answer %v), slowest check %v (deadline %v), %d checks ran into their deadline (bound %d), %d checks, %d not on the store, %d errors",
			fault.name, downAt.Sub(faultAt), fig.detect, fig.recover, 3*probeInterval, fig.answered, fig.slowest, deadline, fig.deadlined, 2*workers, len(events), fig.bad, fig.errs)
		wantDecisions(t, fault.name+": ", events, deadline)
		if fig.detect < 0 || fig.recover < 0 {
			t.Errorf("%s: detection %v, recovery %v: no check was answered locally, or none by the store after Resume", fault.name, fig.detect, fig.recover)
		}
		if !timed {
			continue
		}
		if fig.starved > 0 {
			t.Errorf("%s: %d checks ran out of their deadline before the store was asked", fault.name, fig.starved)
		}
		if fig.slowest > deadline+slack {
			t.Errorf("%s: slowest check %v, want at most the deadline %v (+%v)", fault.name, fig.slowest, deadline, slack)
		}
		if fig.deadlined > 2*workers {
			t.Errorf("%s: %d checks ran into their deadline, want at most two per goroutine (%d)", fault.name, fig.deadlined, 2*workers)
		}
		if fig.detect > deadline+slack {
			t.Errorf("%s: detection took %v, want at most one deadline (%v)", fault.name, fig.detect, deadline)
		}
		if fig.recover > 3*probeInterval {
			t.Errorf("%s: recovery took %v after Resume, want at most 3 probe intervals (%v)", fault.name, fig.recover, 3*probeInterval)
		}
	}
}

// TestClusterFailover: a master of a 3-master cluster with one replica each
// is killed and its replica promoted.
//
// Bounds checked, for a Store with LocalFallback and one with ReturnError,
// both with a liveness flag per master: the checks of the
// other masters' subjects never fail and never leave the shared buckets; the
// checks of the killed master's subjects fall back (LocalFallback) or fail
// with ratelimit.ErrUnavailable (ReturnError), and only between the kill and the end
// of the failover plus the time to see the new topology (bound: 2 s, a
// cluster-state reload, which go-redis spaces 200 ms apart, and a probe
// interval, with room for a loaded machine); afterwards they are decided by
// the promoted replica, and IsAlive is true again within the same bound: the
// dead master's partition, which no key maps to any more, is forgotten. The
// LocalFallback store uses the partitions redisstore reports; the ReturnError
// one, on a client of its own, a partition ping written by hand that calls
// ReloadState when it fails.
func TestClusterFailover(t *testing.T) {
	checkNoLeak(t)
	const deadline = time.Second
	const reloadBound = 2 * time.Second
	timed := testkit.Timed(t)
	clusterStart := time.Now()
	c := redistest.StartCluster(t, 3, 1)
	t.Logf("cluster of 6 started in %v", time.Since(clusterStart))
	cc := redisClusterClient(t, c)
	ownCC := redisClusterClient(t, c)
	clk := newFakeClock()
	partOf := func(ctx context.Context, key string) string {
		m, err := ownCC.MasterForKey(ctx, key)
		if err != nil {
			return ""
		}
		return m.Options().Addr
	}
	pingMaster := func(ctx context.Context, addr string) error {
		err := pingAddr(ctx, addr)
		if err != nil {
			ownCC.ReloadState(ctx) // find the promoted replica; go-redis reloads lazily
		}
		return err
	}
	newStore := func(o Outage, cc *redis.ClusterClient, more ...Option) (*Store, *ratelimit.Limiter[string]) {
		s := mustNew(t, redisstore.New(cc), append([]Option{WithOutage(o), WithClock(clk.Now)}, more...)...)
		lim, err := ratelimit.New[string](s, ratelimit.PerMinute(100000), ratelimit.WithClock(clk.Now), ratelimit.WithNamespace("fault"))
		if err != nil {
			t.Fatal(err)
		}
		runProbe(t, s)
		return s, lim
	}
	localStore, localLim := newStore(LocalFallback, cc)
	errStore, errLim := newStore(ReturnError, ownCC, withPartitions(partOf, pingMaster))

	victim := c.Masters()[0]
	// Two subjects on the victim's slots and two on the others'.
	var onVictim, elsewhere []string
	for i := 0; len(onVictim) < 2 || len(elsewhere) < 2; i++ {
		s := fmt.Sprint("u", i)
		if c.MasterOf(redistest.SlotOf(localLim.Key(s))) == victim {
			if len(onVictim) < 2 {
				onVictim = append(onVictim, s)
			}
		} else if len(elsewhere) < 2 && (len(elsewhere) == 0 || c.MasterOf(redistest.SlotOf(localLim.Key(s))) != c.MasterOf(redistest.SlotOf(localLim.Key(elsewhere[0])))) {
			elsewhere = append(elsewhere, s)
		}
	}
	subjects := append(append([]string(nil), onVictim...), elsewhere...)
	lims := []*ratelimit.Limiter[string]{localLim, errLim}
	// Warm the client up (cluster state, command table, a connection per
	// master) with a generous deadline, so that the first checks under
	// load do not pay for it.
	warmUp(t, subjects, lims...)
	// Workers 0-3 check through the LocalFallback store, 4-7 through the
	// ReturnError one, each on one subject.
	l := startLoad(8, deadline, func(ctx context.Context, w int) (string, ratelimit.Decision, error) {
		s := subjects[w%4]
		d, err := lims[w/4].TryAcquire(ctx, s)
		return fmt.Sprint(w/4, "/", s), d, err
	})
	defer l.finish()
	// The bounds hold from the moment every worker has had decisions from
	// the shared store (each needs a connection of its own first).
	waitFor(t, 10*time.Second, "every worker on the shared store", func() bool {
		n := map[int]int{}
		for _, e := range l.snapshot() {
			if e.onStore() {
				n[e.worker]++
			}
		}
		for w := range 8 {
			if n[w] < 3 {
				return false
			}
		}
		return true
	})
	steadyAt := time.Now()
	time.Sleep(100 * time.Millisecond)

	killAt := time.Now()
	victim.Kill()
	c.WaitForFailover(t, victim, 15*time.Second)
	failoverAt := time.Now()
	stores := map[string]*Store{"LocalFallback (found by the store)": localStore, "ReturnError (ReloadState)": errStore}
	aliveAfter := map[string]time.Duration{}
	waitFor(t, 10*time.Second, "the victim's subjects back on the shared store, and IsAlive true on both stores", func() bool {
		for name, s := range stores {
			if _, ok := aliveAfter[name]; !ok && s.IsAlive() {
				aliveAfter[name] = time.Since(failoverAt)
			}
		}
		back := map[string]bool{}
		for _, e := range l.snapshot() {
			if e.onStore() && e.start.After(failoverAt) {
				back[e.subject] = true
			}
		}
		return len(back) == 8 && len(aliveAfter) == len(stores)
	})
	time.Sleep(100 * time.Millisecond)
	events := l.finish()

	victimSet := map[string]bool{}
	for _, s := range onVictim {
		victimSet["0/"+s], victimSet["1/"+s] = true, true
	}
	var firstBad, lastBad time.Time
	var badLocal, badErr, otherBad int
	for _, e := range events {
		if e.onStore() || e.start.Before(steadyAt) {
			continue
		}
		if !victimSet[e.subject] {
			otherBad++
			if timed || !e.ranOut(deadline) {
				t.Errorf("a check of %s, on a master that stayed up, left the shared store %v after the kill (took %v): %+v, %v", e.subject, e.end.Sub(killAt), e.took(), e.d, e.err)
			}
			continue
		}
		switch {
		case e.err == nil && e.d.Source == ratelimit.SourceLocal:
			badLocal++
		case errors.Is(e.err, ratelimit.ErrUnavailable):
			badErr++
		case !timed && e.ranOut(deadline):
		default:
			t.Errorf("a check of %s: %+v, %v; want a local decision or ratelimit.ErrUnavailable", e.subject, e.d, e.err)
		}
		if e.start.Before(killAt) && e.end.Before(killAt) && (timed || !e.ranOut(deadline)) {
			t.Errorf("a check of %s left the shared store before the kill: %+v, %v", e.subject, e.d, e.err)
		}
		if firstBad.IsZero() || e.end.Before(firstBad) {
			firstBad = e.end
		}
		if e.end.After(lastBad) {
			lastBad = e.end
		}
	}
	var slowOther event
	for _, e := range events {
		if !victimSet[e.subject] && e.took() > slowOther.took() {
			slowOther = e
		}
	}
	t.Logf("FIGURE cluster: slowest check on the other masters took %v, %v after the kill", slowOther.took(), slowOther.start.Sub(killAt))
	failover := failoverAt.Sub(killAt)
	window := lastBad.Sub(killAt)
	t.Logf("FIGURE cluster: failover (kill to promoted replica serving) %v; the victim's subjects off the shared store from %v to %v after the kill, i.e. back %v after the failover (bound %v); %d local decisions, %d ratelimit.ErrUnavailable, %d off-store checks on the other masters; %d checks",
		failover, firstBad.Sub(killAt), window, lastBad.Sub(failoverAt), reloadBound, badLocal, badErr, otherBad, len(events))
	if badLocal == 0 || badErr == 0 {
		t.Errorf("the kill was not seen: %d local decisions, %d errors", badLocal, badErr)
	}
	if timed && window > failover+reloadBound {
		t.Errorf("the victim's subjects were off the shared store until %v after the kill, want at most the failover (%v) + %v", window, failover, reloadBound)
	}
	for name, s := range stores {
		t.Logf("FIGURE cluster: %s: IsAlive true again %v after the failover (bound %v)", name, aliveAfter[name], reloadBound)
		if timed && aliveAfter[name] > reloadBound {
			t.Errorf("%s: IsAlive true again only %v after the failover, want at most %v", name, aliveAfter[name], reloadBound)
		}
		if !s.IsAlive() {
			t.Errorf("%s: IsAlive false again after the failover: the dead master's partition came back", name)
		}
	}
}

// wantDecisions fails the test, once, for a check that returned an error
// other than its context's deadline run out before the store was asked
// (which the timing tier counts): with LocalFallback every check gets a
// Decision.
func wantDecisions(t *testing.T, prefix string, events []event, deadline time.Duration) {
	t.Helper()
	for _, e := range events {
		if e.err != nil && !e.ranOut(deadline) {
			t.Errorf("%sa check of %s returned an error after %v, want a Decision from the fallback: %v", prefix, e.subject, e.took(), e.err)
			return
		}
	}
}
