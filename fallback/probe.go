package fallback

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
)

// minProbeBound is the least time ProbeForever gives one probe.
const minProbeBound = time.Second

// part is the liveness flag of the primary, or of one partition of it.
type part struct {
	name string
	// sample is the key whose check created the partition. While the
	// partition function still maps it to name, some key maps there; once
	// it maps elsewhere (a Cluster failover gave the slot to another
	// master), the probe forgets the partition.
	sample string
	// gen counts transitions: even while alive, odd while down. A
	// transition is a compare-and-swap from the generation its caller
	// observed, so a call that started before the primary went down and
	// came back cannot mark it down again with its stale failure, and a
	// probe that started before a failure cannot undo it.
	gen   atomic.Uint64
	cause atomic.Pointer[downCause]
	// answered counts the checks the primary answered. A probe that fails
	// while it moves was slow on its own connection: the primary was
	// answering, so the probe does not mark it down.
	answered atomic.Uint64
	// kicked is when kick last started a probe of the partition (µs on the
	// Store's clock).
	kicked atomic.Int64
}

type downCause struct {
	err error
	at  time.Time
}

// errMarkedDown is the cause recorded by MarkDown.
var errMarkedDown = errors.New("marked down by the caller")

func (p *part) alive() bool { return p.gen.Load()&1 == 0 }

// markDown marks the partition down if it is still in generation gen and
// alive, and records why.
func (p *part) markDown(gen uint64, err error, at time.Time) bool {
	if gen&1 != 0 {
		return false
	}
	if !p.gen.CompareAndSwap(gen, gen+1) {
		return false
	}
	p.cause.Store(&downCause{err: err, at: at})
	return true
}

// markAlive marks the partition alive if it is still in generation gen and
// down.
func (p *part) markAlive(gen uint64) bool {
	return gen&1 != 0 && p.gen.CompareAndSwap(gen, gen+1)
}

// down marks p down if it is still in generation gen and alive, and tells
// the observer, with ctx, when it did.
func (s *Store) down(ctx context.Context, p *part, gen uint64, err error) {
	at := s.clock()
	if p.markDown(gen, err, at) && s.observer != nil {
		s.observer.ObserveFallback(ctx, Event{Partition: p.name, Alive: false, Outage: s.outage, Cause: err, At: at})
	}
}

// up marks p alive if it is still in generation gen and down, and tells the
// observer, with ctx, when it did.
func (s *Store) up(ctx context.Context, p *part, gen uint64) {
	if p.markAlive(gen) && s.observer != nil {
		s.observer.ObserveFallback(ctx, Event{Partition: p.name, Alive: true, Outage: s.outage, At: s.clock()})
	}
}

// unavailable is the error of a check answered by the breaker under
// ReturnError. It names the error that marked the primary down without
// wrapping it, so that errors.Is(err, context.DeadlineExceeded) does not
// mistake an instant answer for the caller's deadline.
func (p *part) unavailable() error {
	if c := p.cause.Load(); c != nil {
		return fmt.Errorf("%w (down since %s: %v)", ratelimit.ErrUnavailable, c.at.Format(time.RFC3339Nano), c.err)
	}
	return ratelimit.ErrUnavailable
}

// wrapUnavailable returns cause, the error that found the primary down, wrapped
// in ratelimit.ErrUnavailable: cause itself when it wraps it already, as the
// errors of redisstore and of a nested Store do.
func wrapUnavailable(cause error) error {
	if errors.Is(cause, ratelimit.ErrUnavailable) {
		return cause
	}
	return fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, cause)
}

// partition returns the flag that guards key.
func (s *Store) partition(ctx context.Context, key string) *part {
	if s.partOf == nil {
		return s.single
	}
	name := s.partOf(ctx, key)
	if p, ok := s.parts.Load(name); ok {
		return p.(*part)
	}
	p, _ := s.parts.LoadOrStore(name, &part{name: name, sample: strings.Clone(key)})
	return p.(*part)
}

// forgetMoved drops p from the partitions when its sample key maps to
// another partition now, and reports whether it did (or p was dropped
// already). Checks no longer reach p, so it must not hold IsAlive down or be
// pinged; a later key that still maps to p's name makes a new partition,
// alive until a check or a probe finds otherwise. A p that was down is marked
// alive, which the observer hears as the partition's return: its keys are
// served by the primary again, through the partition that took them over.
func (s *Store) forgetMoved(ctx context.Context, p *part) bool {
	if s.partOf(ctx, p.sample) == p.name {
		return false
	}
	if s.parts.CompareAndDelete(p.name, p) {
		if gen := p.gen.Load(); gen&1 != 0 {
			s.up(ctx, p, gen)
		}
	}
	return true
}

// each calls fn on every flag: the single one, or every partition in use.
func (s *Store) each(fn func(name string, p *part)) {
	if s.partOf == nil {
		fn("", s.single)
		return
	}
	s.parts.Range(func(k, v any) bool {
		fn(k.(string), v.(*part))
		return true
	})
}

// IsAlive reports whether checks go to the primary: false while it is marked
// down (over a partitioned primary, while any partition in use is), waiting
// for a probe to find it again.
func (s *Store) IsAlive() bool {
	alive := true
	s.each(func(_ string, p *part) { alive = alive && p.alive() })
	return alive
}

// MarkDown marks the primary down without waiting for a call to fail, as a
// probe does when it sees it go away. Over a partitioned primary it marks
// every partition in use. Checks are answered by the outage behaviour until a
// probe sees the primary answer, or until MarkAlive.
func (s *Store) MarkDown() {
	s.each(func(_ string, p *part) {
		for {
			gen := p.gen.Load()
			if gen&1 != 0 {
				return
			}
			s.down(context.Background(), p, gen, errMarkedDown)
		}
	})
}

// MarkAlive marks the primary as answering again (over a partitioned
// primary, every partition in use), so that checks go to it. Its buckets still hold
// what the fleet left in them: this process picks up the fleet's quota, not
// a fresh one.
func (s *Store) MarkAlive() {
	s.each(func(_ string, p *part) {
		for {
			gen := p.gen.Load()
			if gen&1 == 0 {
				return
			}
			s.up(context.Background(), p, gen)
		}
	})
}

// kick probes p once, in a goroutine of its own bounded by the probe
// interval (ProbeForever's, or DefaultProbeInterval), unless a kick started
// one within the last interval. A check whose caller's deadline ran out
// while the primary was slow calls it: a slow answer is not an outage, but a
// hung primary must still be found.
func (s *Store) kick(ctx context.Context, p *part) {
	interval := time.Duration(s.interval.Load())
	if interval <= 0 {
		interval = DefaultProbeInterval
	}
	now := s.clock().UnixMicro()
	last := p.kicked.Load()
	if now-last < interval.Microseconds() || !p.kicked.CompareAndSwap(last, now) {
		return
	}
	go func() {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), interval)
		defer cancel()
		if p == s.single {
			s.probeOne(pctx, p, s.ping)
		} else {
			s.probePart(pctx, p)
		}
	}()
}

// Probing reports whether a ProbeForever is running on this Store.
func (s *Store) Probing() bool { return s.probing.Load() > 0 }

// Probe pings the primary once (over a partitioned primary, every partition
// in use, at the same time) and marks it alive when it answers within ctx, or
// down when it does not, unless checks were answered by the primary while
// the ping waited (then the ping, not the primary, was slow: a loaded
// machine). It reports whether every ping was answered. An unreachable
// primary is not an error here: it is what the outage behaviour is for. A
// ctx cancelled before the answer changes nothing and reports false. Give
// ctx a deadline: a ping of a hung primary waits for it (or for
// WithTimeout).
//
// Over a partitioned primary (redisstore on Cluster), a partition is in use while
// the partition function still maps to it the key whose check created it.
// Probe asks it before the ping and again after a failed one (which may have
// reloaded the layout, as redisstore's ping does), and forgets a partition that no longer has that key: it
// is not pinged, does not count in the result or in IsAlive, and a later
// key that maps to it again starts it afresh. With no partition in use there
// is nothing to ping, and Probe reports true.
func (s *Store) Probe(ctx context.Context) bool {
	if s.partOf == nil {
		return s.probeOne(ctx, s.single, s.ping)
	}
	var targets []*part
	s.each(func(_ string, p *part) { targets = append(targets, p) })
	switch len(targets) {
	case 0:
		return true
	case 1:
		return s.probePart(ctx, targets[0])
	}
	var wg sync.WaitGroup
	var down atomic.Bool
	for _, p := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !s.probePart(ctx, p) {
				down.Store(true)
			}
		}()
	}
	wg.Wait()
	return !down.Load()
}

// probePart probes one partition, or forgets it when its key has moved.
func (s *Store) probePart(ctx context.Context, p *part) bool {
	if s.forgetMoved(ctx, p) {
		return true
	}
	ping := func(ctx context.Context) error { return s.pingPart(ctx, p.name) }
	return s.probeOne(ctx, p, ping)
}

// probeOne pings one flag's primary and updates the flag. After a failed
// ping a partition whose key has moved is forgotten rather than marked down.
func (s *Store) probeOne(ctx context.Context, p *part, ping func(context.Context) error) bool {
	gen := p.gen.Load()
	answered := p.answered.Load()
	pctx, cancel := s.withTimeout(ctx)
	err := ping(pctx)
	cancel()
	if err == nil {
		s.up(ctx, p, gen)
		return true
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return false
	}
	if p != s.single && s.forgetMoved(ctx, p) {
		return true
	}
	if p.answered.Load() == answered {
		s.down(ctx, p, gen, err)
	}
	return false
}

// ProbeForever probes the primary at once and then every interval
// (DefaultProbeInterval when interval is not positive), and passes each
// reading to report when it is not nil. It returns when ctx is done. The
// caller runs it in the goroutine and for the lifetime it chooses, and it
// leaves no goroutine behind: the pings of a partitioned primary's
// partitions run at the same time, and each probe waits for all of them.
// (The one goroutine of the package's own that outlives a call is the
// probe a check kicks when its caller's deadline runs out: see the package
// doc.)
//
// Each probe is bounded by the interval or by one second, whichever is
// longer (and by WithTimeout when that is set): a ping that a loaded machine
// delays by more than an interval is not an outage, and a ping waiting on a
// hung server is answered as soon as the server resumes, so the longer
// bound does not delay the recovery. A probe that outlasts the interval is
// followed by the next one at once. Running ProbeForever while the primary
// is alive also lets a probe mark it down before a check has to find out.
func (s *Store) ProbeForever(ctx context.Context, interval time.Duration, report func(alive bool)) {
	if interval <= 0 {
		interval = DefaultProbeInterval
	}
	bound := max(interval, minProbeBound)
	s.interval.Store(int64(interval))
	s.probing.Add(1)
	defer s.probing.Add(-1)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, bound)
		alive := s.Probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if report != nil {
			report(alive)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
