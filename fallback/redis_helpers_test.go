package fallback

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the fault tests cause hundreds.
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// probeInterval is the interval of every fault test's ProbeForever.
const probeInterval = DefaultProbeInterval

// slack is what a loaded 2-core machine under -race may add to a wait that
// the code bounds (a deadline, a probe interval).
const slack = 300 * time.Millisecond

// newRedisClient returns a go-redis client for addr with the fast-failure
// settings of redistest.ClientOptions (no command retries, context
// deadlines honoured, one dial attempt, 500 ms dial timeout), passed
// through redisstore.ClientOptions.
func newRedisClient(t testing.TB, addr string) redis.UniversalClient {
	t.Helper()
	c := redis.NewUniversalClient(redisstore.ClientOptions(redistest.ClientOptions(addr)))
	t.Cleanup(func() { c.Close() })
	return c
}

// pingAddr sends PING to the Redis server at addr on a connection of its
// own, bounded by ctx: the liveness probe of the fault tests. It does not go
// through go-redis's pool, whose dial breaker would delay the recovery (see
// GO-REDIS-NOTES.md); redisstore.Store does not have a Ping method yet.
func pingAddr(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING: unexpected reply %q", strings.TrimSpace(line))
	}
	return nil
}

// redisClusterClient returns a go-redis cluster client for c with the
// fast-failure settings of newRedisClient.
func redisClusterClient(t testing.TB, c *redistest.Cluster) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(redisstore.ClientOptions(redistest.ClientOptions(c.Addrs()...)).Cluster())
	t.Cleanup(func() { cc.Close() })
	return cc
}

// runProbe runs s.ProbeForever in a goroutine until the test ends.
func runProbe(t *testing.T, s *Store) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ProbeForever(ctx, probeInterval, nil)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// event is one check made by a load worker.
type event struct {
	worker     int
	subject    string
	start, end time.Time
	d          ratelimit.Decision
	err        error
}

func (e event) took() time.Duration { return e.end.Sub(e.start) }

// onStore reports whether the shared store decided the check.
func (e event) onStore() bool { return e.err == nil && e.d.Source == ratelimit.SourceStore }

// ranOut reports whether the check ran into its deadline: it took nearly
// the whole of it. On a loaded machine a check of a healthy Redis can, its
// goroutine or redis-server waiting for a CPU that long; it is then
// answered without the store (the caller's deadline) or, when it ran out
// before the store was asked, gets the context's error. The default run
// forgives these; the timing tier counts them against its bounds.
func (e event) ranOut(deadline time.Duration) bool {
	return e.took() >= deadline*9/10 && (e.err == nil || errors.Is(e.err, context.DeadlineExceeded))
}

// load runs checks from several goroutines and records each one.
type load struct {
	mu     sync.Mutex
	events []event
	stop   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
}

// roundRobin is a check for startLoad: worker w takes a token of
// subjects[w%len(subjects)] from lim.
func roundRobin(lim *ratelimit.Limiter[string], subjects ...string) func(context.Context, int) (string, ratelimit.Decision, error) {
	return func(ctx context.Context, w int) (string, ratelimit.Decision, error) {
		s := subjects[w%len(subjects)]
		d, err := lim.TryAcquire(ctx, s)
		return s, d, err
	}
}

// warmUp checks every subject once through each limiter, with a generous
// deadline, and fails the test unless the shared buckets decided: the
// client learns the cluster state and the command table and opens its
// connections, so that the first checks under load do not pay for it.
func warmUp(t *testing.T, subjects []string, lims ...*ratelimit.Limiter[string]) {
	t.Helper()
	for _, lim := range lims {
		for _, s := range subjects {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			d, err := lim.TryAcquire(ctx, s)
			cancel()
			if err != nil || d.Source != ratelimit.SourceStore {
				t.Fatalf("warm-up check of %s: %+v, %v", s, d, err)
			}
		}
	}
}

// startLoad starts workers goroutines, each calling check in a loop with a
// context of the given deadline and a pause of a millisecond between calls
// (so that the checks answered locally, in microseconds, do not starve the
// redis-server processes of the 2 CPUs). check returns the subject it asked
// about and the outcome.
func startLoad(workers int, deadline time.Duration, check func(ctx context.Context, worker int) (string, ratelimit.Decision, error)) *load {
	l := &load{stop: make(chan struct{})}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				subject, d, err := check(ctx, w)
				end := time.Now()
				cancel()
				l.mu.Lock()
				l.events = append(l.events, event{worker: w, subject: subject, start: start, end: end, d: d, err: err})
				l.mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		}()
	}
	return l
}

// finish stops the workers and returns every event. It is idempotent.
func (l *load) finish() []event {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
	return l.snapshot()
}

func (l *load) snapshot() []event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]event(nil), l.events...)
}

// waitFor polls cond (every 2 ms, up to timeout) while the load runs, and
// returns when it first saw cond hold.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Now()
}

// outageFigures are the measurements of one fault.
type outageFigures struct {
	detect    time.Duration // fault injected -> first check answered without the store
	recover   time.Duration // fault cleared -> start of the first check sent to the store again
	answered  time.Duration // fault cleared -> end of that check
	slowest   time.Duration // the longest check
	deadlined int           // checks that ran into their deadline and were answered without the store
	bad       int           // checks answered without the store
	errs      int           // checks that returned an error
	starved   int           // of errs, the context's error of a check that ran out before the store was asked
}

// measure computes the figures of a fault injected at faultAt and cleared
// at clearedAt from the events.
func measure(events []event, faultAt, clearedAt time.Time, deadline time.Duration) outageFigures {
	var f outageFigures
	var firstBad, firstBack, firstBackEnd time.Time
	for _, e := range events {
		f.slowest = max(f.slowest, e.took())
		if e.took() >= deadline*9/10 && !e.onStore() {
			f.deadlined++
		}
		if e.err != nil {
			f.errs++
			if e.ranOut(deadline) {
				f.starved++
			}
		}
		if !e.onStore() {
			f.bad++
			if !e.end.Before(faultAt) && (firstBad.IsZero() || e.end.Before(firstBad)) {
				firstBad = e.end
			}
		} else if !e.start.Before(clearedAt) && (firstBack.IsZero() || e.start.Before(firstBack)) {
			firstBack, firstBackEnd = e.start, e.end
		}
	}
	if !firstBad.IsZero() {
		f.detect = firstBad.Sub(faultAt)
	} else {
		f.detect = -1
	}
	if !firstBack.IsZero() {
		f.recover, f.answered = firstBack.Sub(clearedAt), firstBackEnd.Sub(clearedAt)
	} else {
		f.recover, f.answered = -1, -1
	}
	return f
}

// admitted counts the admitted checks per subject and source.
func admitted(events []event) map[string]map[ratelimit.Source]int64 {
	out := map[string]map[ratelimit.Source]int64{}
	for _, e := range events {
		if e.err != nil || !e.d.Allowed {
			continue
		}
		if out[e.subject] == nil {
			out[e.subject] = map[ratelimit.Source]int64{}
		}
		out[e.subject][e.d.Source]++
	}
	return out
}
