package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// testClock is a clock the test moves by hand, in microseconds; a running
// one also moves with real time.
type testClock struct {
	us      atomic.Int64
	running time.Time // the real time it runs from; zero for a frozen clock
}

func newTestClock() *testClock {
	c := &testClock{}
	c.us.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro())
	return c
}

// newRunningClock returns a clock at real time that moves with it, and by
// hand on top: against Redis, which expires keys in real time, a clock that
// never falls behind real time never sees a bucket dropped early (see
// WithClock).
func newRunningClock() *testClock {
	c := &testClock{running: time.Now()}
	c.us.Store(c.running.UnixMicro())
	return c
}

func (c *testClock) now() time.Time {
	t := time.UnixMicro(c.us.Load())
	if !c.running.IsZero() {
		t = t.Add(time.Since(c.running))
	}
	return t
}

func (c *testClock) advance(d time.Duration) { c.us.Add(d.Microseconds()) }

// leasePolicy is the policy of the lease tests: 1000 per second, burst
// 1000, so that a lease is at most 1000/16 = 62 tokens and a millisecond
// refills one token exactly.
var leasePolicy = ratelimit.NewLimit(1000, time.Second, 1000)

const leaseMost = 1000 / 16

// slowPolicy has leasePolicy's capacity and a slow refill (a token in 3.6 s),
// for Redis tests at a frozen instant: a bucket it writes lives for seconds
// of real time.
var slowPolicy = ratelimit.NewLimit(1000, time.Hour, 1000)

// newLeased returns a limiter of policy with leases of lifetime on store.
func newLeased(t testing.TB, store ratelimit.Store, policy ratelimit.Limit, clk *testClock, lifetime time.Duration, opts ...ratelimit.Option) *ratelimit.Limiter[string] {
	t.Helper()
	opts = append([]ratelimit.Option{ratelimit.WithClock(clk.now), ratelimit.WithNamespace("lease"), ratelimit.WithLeases(lifetime)}, opts...)
	l, err := ratelimit.New[string](store, policy, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// hammerFleet runs limiters (one per process, each on its own store of one
// shared bucket) with goroutines checking one subject concurrently, in steps
// at frozen instants while the clock advances between them. It asserts that
// the fleet never admits more than capacity + rate × elapsed, that leases
// never hold more than processes × the largest lease, and that a probe check
// of each process, made alone at the end of each step, is denied only while
// the bucket and every lease hold fewer tokens than that in all. At the end
// it closes every limiter and checks that the leases are all back.
// The clock may be frozen or running. With keepLow the bucket is drained
// first and the clock makes no long pauses, so that it stays far from full:
// Redis expires a bucket in real time once it would be full, and a check
// stamped before that but run after it would find it full (see WithClock).
func hammerFleet(t *testing.T, stores []ratelimit.Store, clk *testClock, steps, goroutines, checks int, seed uint64, keepLow bool) {
	ctx := context.Background()
	const subject = "hot"
	lifetime := 20 * time.Millisecond
	fleet := make([]*ratelimit.Limiter[string], len(stores))
	for i, s := range stores {
		fleet[i] = newLeased(t, s, leasePolicy, clk, lifetime)
	}
	bound := int64(len(fleet) * leaseMost)
	start := clk.now()
	var admitted, denied, local atomic.Int64
	free := func() int64 {
		d, err := fleet[0].Peek(ctx, subject)
		if err != nil {
			t.Fatal(err)
		}
		n := d.Remaining
		for _, l := range fleet {
			n += l.LeaseStats().Tokens
		}
		return n
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	if keepLow {
		d, err := fleet[0].TryAcquireN(ctx, subject, leasePolicy.Capacity)
		if err != nil || !d.Allowed {
			t.Fatalf("draining the bucket: %+v, %v", d, err)
		}
		admitted.Add(leasePolicy.Capacity)
	}
	for step := range steps {
		var wg sync.WaitGroup
		for p, l := range fleet {
			for g := range goroutines {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(seed, uint64(step*1000+p*100+g)))
					for range checks {
						cost := 1 + r.Int64N(3)
						d, err := l.TryAcquireN(ctx, subject, cost)
						if err != nil {
							t.Error(err)
							return
						}
						if d.Source == ratelimit.SourceLease {
							local.Add(1)
						}
						if d.Allowed {
							admitted.Add(cost)
						} else {
							denied.Add(1)
							if d.RetryAfter <= 0 {
								t.Errorf("denial %+v without a wait", d)
							}
						}
					}
				})
			}
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		// The give-backs the step started are made in the background:
		// the bucket and the leases are measured after them.
		for _, l := range fleet {
			ratelimit.WaitLeaseReturns(l)
		}
		elapsed := clk.now().Sub(start).Milliseconds()
		if got, most := admitted.Load(), leasePolicy.Capacity+elapsed; got > most {
			t.Fatalf("step %d: admitted %d tokens in %d ms; the policy allows %d", step, got, elapsed, most)
		}
		var held int64
		for _, l := range fleet {
			held += l.LeaseStats().Tokens
		}
		if held > bound {
			t.Fatalf("step %d: %d tokens in leases; at most %d", step, held, bound)
		}
		for _, l := range fleet {
			f := free()
			d, err := l.TryAcquire(ctx, subject)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted.Add(1)
				continue
			}
			if f >= bound {
				t.Fatalf("step %d: a probe was denied (%+v) while %d tokens were free; the bound is fewer than %d", step, d, f, bound)
			}
		}
		// Mostly short steps (the fleet saturates), now and then one past
		// a lease's lifetime, or a pause that refills the bucket.
		switch x := rng.IntN(20); {
		case x == 0:
			clk.advance(lifetime + time.Duration(rng.IntN(5))*time.Millisecond)
		case x == 1 && !keepLow:
			clk.advance(time.Duration(200+rng.IntN(800)) * time.Millisecond)
		default:
			clk.advance(time.Duration(rng.IntN(4000)) * time.Microsecond)
		}
	}
	var taken uint64
	for _, l := range fleet {
		s := l.LeaseStats()
		taken += s.Taken
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if s := l.LeaseStats(); s.Tokens != 0 || s.Lost != 0 {
			t.Fatalf("after Close: %+v; want no tokens in leases, none lost", s)
		}
	}
	if taken == 0 || local.Load() == 0 || denied.Load() == 0 {
		t.Fatalf("%d leases taken, %d decisions served from them, %d denials: the test did not exercise leases", taken, local.Load(), denied.Load())
	}
	t.Logf("%d tokens admitted, %d denials, %d decisions from %d leases, in %v", admitted.Load(), denied.Load(), local.Load(), taken, clk.now().Sub(start))
}

func TestLeasesFleetOnMemstore(t *testing.T) {
	clk := newTestClock()
	store := memstore.New(memstore.WithClock(clk.now))
	stores := []ratelimit.Store{store, store, store, store}
	hammerFleet(t, stores, clk, 300, 6, 40, 1, false)
}

// TestLeasesReturnOnClose: a lease's unused tokens go back at Close, and
// the limiter then checks through the store.
func TestLeasesReturnOnClose(t *testing.T) {
	ctx := context.Background()
	clk := newTestClock()
	store := memstore.New(memstore.WithClock(clk.now))
	l := newLeased(t, store, leasePolicy, clk, time.Second)
	leaseAndReturn(t, l, 0, func() {
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
	})
	d, err := l.TryAcquire(ctx, "s")
	if err != nil || d.Source != ratelimit.SourceStore || !d.Allowed {
		t.Fatalf("check after Close = %+v, %v; want one through the store", d, err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestLeasesReturnOnCoolDown: the lease of a subject no longer checked goes
// back once its lifetime is over, from the next check of another subject.
func TestLeasesReturnOnCoolDown(t *testing.T) {
	ctx := context.Background()
	clk := newTestClock()
	store := memstore.New(memstore.WithClock(clk.now))
	l := newLeased(t, store, leasePolicy, clk, 10*time.Millisecond)
	leaseAndReturn(t, l, 10, func() {
		clk.advance(10 * time.Millisecond)
		if _, err := l.TryAcquire(ctx, "other"); err != nil {
			t.Fatal(err)
		}
		ratelimit.WaitLeaseReturns(l) // made in the background
	})
}

// leaseAndReturn makes subject "s" of l hot at a frozen instant, so that it
// takes the largest lease, checks what the bucket and the decisions report,
// then calls giveBack and checks that the unused tokens are in the bucket
// again, with refill tokens more.
func leaseAndReturn(t *testing.T, l *ratelimit.Limiter[string], refill int64, giveBack func()) {
	t.Helper()
	ctx := context.Background()
	const used = 20
	var last ratelimit.Decision
	for i := range used {
		d, err := l.TryAcquire(ctx, "s")
		if err != nil || !d.Allowed {
			t.Fatalf("check %d = %+v, %v", i, d, err)
		}
		last = d
	}
	// The first check is cold (through the store); the second takes a
	// lease of the most, less nothing in hand.
	s := l.LeaseStats()
	if s.Taken != 1 || s.Tokens != leaseMost-(used-1) || s.Local != used-1 {
		t.Fatalf("stats %+v; want 1 lease of %d with %d used", s, leaseMost, used-1)
	}
	if last.Source != ratelimit.SourceLease {
		t.Fatalf("last decision %+v; want one from the lease", last)
	}
	inBucket := leasePolicy.Capacity - 1 - leaseMost
	if want := inBucket + s.Tokens; last.Remaining != want {
		t.Fatalf("Remaining %d; want the bucket's %d plus the lease's %d", last.Remaining, inBucket, s.Tokens)
	}
	if d, _ := l.Peek(ctx, "s"); d.Remaining != inBucket {
		t.Fatalf("bucket holds %d; want %d", d.Remaining, inBucket)
	}
	giveBack()
	if d, _ := l.Peek(ctx, "s"); d.Remaining != leasePolicy.Capacity-used+refill {
		t.Fatalf("after the return the bucket holds %d; want %d", d.Remaining, leasePolicy.Capacity-used+refill)
	}
	if s := l.LeaseStats(); s.Returned != 1 || s.Tokens != 0 || s.Lost != 0 {
		t.Fatalf("stats %+v; want the lease returned", s)
	}
}

// gatedStore is a memstore whose settles wait until release is closed,
// each telling entered first.
type gatedStore struct {
	*memstore.Store
	entered chan struct{}
	release chan struct{}
}

func (g *gatedStore) Settle(ctx context.Context, key, id string, r ratelimit.Request, actual []int64) (ratelimit.Decision, error) {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.release:
	case <-ctx.Done():
		return ratelimit.Decision{}, ctx.Err()
	}
	return g.Store.Settle(ctx, key, id, r, actual)
}

// TestLeasesCheckAfterItsSubjectsGiveBack: a check of a subject whose lease
// is being given back, in the background, asks the store only after the
// give-back is made, so that the tokens given back count; it returns within
// its deadline if the give-back takes longer.
func TestLeasesCheckAfterItsSubjectsGiveBack(t *testing.T) {
	ctx := context.Background()
	clk := newTestClock()
	store := memstore.New(memstore.WithClock(clk.now))
	gated := &gatedStore{Store: store, entered: make(chan struct{}, 1), release: make(chan struct{})}
	const lifetime = 10 * time.Millisecond
	l := newLeased(t, gated, slowPolicy, clk, lifetime)
	plain, err := ratelimit.New[string](store, slowPolicy, ratelimit.WithClock(clk.now), ratelimit.WithNamespace("lease"))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // cold, then a lease of the most
		if d, err := l.TryAcquire(ctx, "s"); err != nil || !d.Allowed {
			t.Fatalf("check = %+v, %v", d, err)
		}
	}
	// Only the lease's unused tokens can admit s now.
	if d, err := plain.TryAcquireN(ctx, "s", slowPolicy.Capacity-1-leaseMost); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("draining the bucket: %+v, %v", d, err)
	}
	clk.advance(lifetime)

	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err = l.TryAcquire(short, "s")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("check with a 20ms deadline while its subject's give-back waits = %v; want its deadline's error", err)
	}
	<-gated.entered

	type result struct {
		d   ratelimit.Decision
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := l.TryAcquire(ctx, "s")
		done <- result{d, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("check = %+v, %v before its subject's give-back was made; want it to wait", r.d, r.err)
	case <-time.After(50 * time.Millisecond):
	}
	close(gated.release)
	if r := <-done; r.err != nil || !r.d.Allowed {
		t.Fatalf("check after its subject's give-back = %+v, %v; want allowed from the tokens given back", r.d, r.err)
	}
	ratelimit.WaitLeaseReturns(l)
	if s := l.LeaseStats(); s.Returned != 1 || s.Lost != 0 {
		t.Fatalf("stats %+v; want the lease returned", s)
	}
}

// TestLeasesGiveBacksWaitingAreBounded: while the store holds up every
// give-back, those past the bound of the queue are not made, their tokens
// counted lost at once; the others are made once the store answers.
func TestLeasesGiveBacksWaitingAreBounded(t *testing.T) {
	ctx := context.Background()
	clk := newTestClock()
	store := memstore.New(memstore.WithClock(clk.now))
	gated := &gatedStore{Store: store, entered: make(chan struct{}, 1), release: make(chan struct{})}
	const lifetime = 10 * time.Millisecond
	l := newLeased(t, gated, slowPolicy, clk, lifetime)
	const over = 100
	subjects := ratelimit.LeaseReturnQueue + over
	for i := range subjects {
		for range 2 { // cold, then a lease of the most
			if d, err := l.TryAcquire(ctx, fmt.Sprint("s", i)); err != nil || !d.Allowed {
				t.Fatalf("check of s%d = %+v, %v", i, d, err)
			}
		}
	}
	clk.advance(lifetime)
	if _, err := l.TryAcquire(ctx, "other"); err != nil { // sweeps every lease
		t.Fatal(err)
	}
	if s := l.LeaseStats(); s.Tokens != 0 || s.Lost != over*(leaseMost-1) || s.Returned != 0 {
		t.Fatalf("stats %+v with every give-back held up; want the %d past the queue's bound lost", s, over)
	}
	close(gated.release)
	ratelimit.WaitLeaseReturns(l)
	if s := l.LeaseStats(); s.Lost != over*(leaseMost-1) || s.Returned != uint64(ratelimit.LeaseReturnQueue) {
		t.Fatalf("stats %+v; want the %d waiting returned", s, ratelimit.LeaseReturnQueue)
	}
}

// flakyStore is a memstore whose calls fail while down is set: an outage
// of the shared store.
type flakyStore struct {
	*memstore.Store
	down atomic.Bool
}

var errDown = errors.New("store down")

func (f *flakyStore) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if f.down.Load() {
		return ratelimit.Decision{}, errDown
	}
	return f.Store.Apply(ctx, key, r)
}

func (f *flakyStore) Reserve(ctx context.Context, key, id string, r ratelimit.Request, ttl time.Duration) (ratelimit.Decision, error) {
	if f.down.Load() {
		return ratelimit.Decision{}, errDown
	}
	return f.Store.Reserve(ctx, key, id, r, ttl)
}

func (f *flakyStore) Settle(ctx context.Context, key, id string, r ratelimit.Request, actual []int64) (ratelimit.Decision, error) {
	if f.down.Load() {
		return ratelimit.Decision{}, errDown
	}
	return f.Store.Settle(ctx, key, id, r, actual)
}

// TestLeasesOutage: while the store is down, the lease in hand is spent as
// degraded decisions, and then the store's error is returned, as without
// leases; when it is back, leases are taken again.
func TestLeasesOutage(t *testing.T) {
	clk := newTestClock()
	store := &flakyStore{Store: memstore.New(memstore.WithClock(clk.now))}
	var errs atomic.Int64
	obs := ratelimit.ObserverFuncs{Error: func(_ context.Context, e ratelimit.ErrorEvent) {
		if errors.Is(e.Err, errDown) {
			errs.Add(1)
		}
	}}
	l := newLeased(t, store, leasePolicy, clk, time.Second, ratelimit.WithObserver(obs))
	checkOutage(t, l, func(down bool) { store.down.Store(down) }, func(err error) bool { return errors.Is(err, errDown) })
	if errs.Load() == 0 {
		t.Fatal("the failed renewal was not observed")
	}
}

// checkOutage takes a lease on l, takes the store down with setDown, and
// checks that the tokens in hand are spent (degraded), that the next check
// fails with wantErr, and that after the store is back leases are served
// again. Each check is one at a frozen instant.
func checkOutage(t *testing.T, l *ratelimit.Limiter[string], setDown func(bool), storeErr func(error) bool) {
	t.Helper()
	ctx := context.Background()
	for range 2 {
		if d, err := l.TryAcquire(ctx, "s"); err != nil || !d.Allowed {
			t.Fatalf("check = %+v, %v", d, err)
		}
	}
	inHand := l.LeaseStats().Tokens
	if inHand == 0 {
		t.Fatal("no lease taken")
	}
	setDown(true)
	for i := range inHand {
		d, err := l.TryAcquire(ctx, "s")
		if err != nil || !d.Allowed || d.Source != ratelimit.SourceLease {
			t.Fatalf("check %d of the %d in hand during the outage = %+v, %v; want served from the lease", i, inHand, d, err)
		}
	}
	s := l.LeaseStats()
	if s.Tokens != 0 || s.Degraded == 0 || s.Degraded > uint64(inHand) {
		t.Fatalf("stats %+v after spending %d; want the lease spent, some of it degraded", s, inHand)
	}
	for range 3 {
		if _, err := l.TryAcquire(ctx, "s"); err == nil || !storeErr(err) {
			t.Fatalf("check past the lease during the outage: %v; want the store's error", err)
		}
	}
	setDown(false)
	if d, err := l.TryAcquire(ctx, "s"); err != nil || !d.Allowed || d.Source != ratelimit.SourceStore {
		t.Fatalf("first check after the outage = %+v, %v; want one through the store", d, err)
	}
	if d, err := l.TryAcquire(ctx, "s"); err != nil || !d.Allowed || d.Source != ratelimit.SourceLease {
		t.Fatalf("second check after the outage = %+v, %v; want one from a new lease", d, err)
	}
	if got := l.LeaseStats().Taken; got != s.Taken+1 {
		t.Fatalf("%d leases taken; want %d", got, s.Taken+1)
	}
}

// TestLeasesAllocations: a check served from a lease allocates nothing.
func TestLeasesAllocations(t *testing.T) {
	ctx := context.Background()
	clk := newTestClock()
	l := newLeased(t, memstore.New(memstore.WithClock(clk.now)), leasePolicy, clk, time.Hour)
	var allowed int
	// At a frozen instant: a lease of 62, renewed at a quarter left, and
	// denied once the bucket is empty; none of it past the first check
	// allocates but the renewals.
	l.TryAcquire(ctx, "s")
	l.TryAcquire(ctx, "s")
	n := testing.AllocsPerRun(40, func() {
		if d, _ := l.TryAcquire(ctx, "s"); d.Allowed {
			allowed++
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per check served from a lease; want 0", n)
	}
	if allowed == 0 {
		t.Fatal("no check admitted")
	}
}

func TestLeasesOptions(t *testing.T) {
	clk := newTestClock()
	store := memstore.New(memstore.WithClock(clk.now))
	if _, err := ratelimit.New[string](store, leasePolicy, ratelimit.WithLeases(time.Microsecond)); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Fatalf("lifetime 1µs: %v; want ErrInvalidArgument", err)
	}
	if _, err := ratelimit.New[string](plainStore{store}, leasePolicy, ratelimit.WithLeases(time.Second)); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("a store without reservations: %v; want errors.ErrUnsupported", err)
	}
	l, err := ratelimit.New[string](store, leasePolicy)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(context.Background()); err != nil || l.LeaseStats() != (ratelimit.LeaseStats{}) {
		t.Fatalf("Close without leases = %v, stats %+v", err, l.LeaseStats())
	}
}

// plainStore hides a store's reservations.
type plainStore struct{ s ratelimit.Store }

func (p plainStore) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	return p.s.Apply(ctx, key, r)
}
func (p plainStore) Reset(ctx context.Context, key string) error { return p.s.Reset(ctx, key) }

// TestLeasesSweptAfterTheClockStepsBack: after the limiter's clock steps
// back an hour, the leases of subjects no longer checked still go back, and
// their records are still dropped, within a few lifetimes of the clock.
func TestLeasesSweptAfterTheClockStepsBack(t *testing.T) {
	ctx := context.Background()
	clk := newTestClock()
	store := memstore.New(memstore.WithClock(clk.now))
	const lifetime = 10 * time.Millisecond
	l := newLeased(t, store, leasePolicy, clk, lifetime)
	const subjects = 1000
	for i := range subjects {
		for range 2 { // cold, then a lease of the most
			if d, err := l.TryAcquire(ctx, fmt.Sprint("s", i)); err != nil || !d.Allowed {
				t.Fatalf("check of s%d = %+v, %v", i, d, err)
			}
		}
	}
	if s := l.LeaseStats(); s.Taken != subjects || s.Tokens != subjects*(leaseMost-1) {
		t.Fatalf("stats %+v; want %d leases of %d tokens, one used of each", s, subjects, leaseMost)
	}
	clk.advance(-time.Hour)
	for range 8 { // four lifetimes
		if _, err := l.TryAcquire(ctx, "other"); err != nil {
			t.Fatal(err)
		}
		ratelimit.WaitLeaseReturns(l)
		clk.advance(lifetime / 2)
	}
	if n := ratelimit.LeaseRecords(l); n != 1 {
		t.Errorf("%d lease records four lifetimes after the step back; want 1 (the subject still checked)", n)
	}
	if s := l.LeaseStats(); s.Returned < subjects || s.Lost != 0 || s.Tokens > leaseMost {
		t.Errorf("stats %+v; want the %d leases returned, none lost, and at most other's lease in hand", s, subjects)
	}
	for i := range subjects {
		if d, err := l.Peek(ctx, fmt.Sprint("s", i)); err != nil || d.Remaining != leasePolicy.Capacity-2 {
			t.Fatalf("s%d's bucket = %+v, %v; want %d: its lease back", i, d, err, leasePolicy.Capacity-2)
		}
	}
}
