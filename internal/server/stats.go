package server

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/latency"
)

// Store kinds, for Options.StoreKind.
const (
	StoreEmbedded = "embedded" // memstore, in this process
	StoreRedis    = "redis"    // one Redis server (or Sentinel)
	StoreCluster  = "cluster"  // Redis Cluster
)

// The windows of Stats.
const (
	// RateStep is the width of one point of the decisions-per-second
	// series.
	RateStep = 5 * time.Second
	// RatePoints is the number of points of that series: five minutes.
	RatePoints = 60
	// LatencyWindow is the span of the latency percentiles.
	LatencyWindow = time.Minute
	// TopDeniedCounters is the fixed size of the most-denied sketch.
	TopDeniedCounters = 64
	// TopDeniedHalfLife is the time after which a denial counts half in
	// the most-denied ranking.
	TopDeniedHalfLife = time.Minute
	// TopDeniedShown is the number of subjects /v1/stats lists.
	TopDeniedShown = 10
	// MaxTopSubjectBytes bounds a subject kept by the sketch: a longer one
	// is kept as its first bytes and a hash of the whole.
	MaxTopSubjectBytes = 128
)

const (
	rateSlots    = RatePoints + 4                                 // the points, the current step and spares, so a reader never sees a slot being reused
	latencySlots = int64(LatencyWindow/RateStep) + 1              // the window and the current step
	latencyBins  = (latencyMaxOctave - latencyMinOctave + 1) << 2 // checkLatency.Len()
	maxParts     = 256                                            // masters remembered from fallback events
	stepSeconds  = int64(RateStep / time.Second)                  // RateStep is whole seconds
	halfLifeSecs = int64(TopDeniedHalfLife / time.Second)
)

// checkLatency bins the checks' latencies: 4 bins per power of two of
// nanoseconds, from 2^10 ns (about 1 µs) to 2^35 ns (about 34 s). A bin
// spans at most 20% of its upper bound; shorter and longer latencies fall
// in the first and last bins.
var checkLatency = latency.Layout{SubBits: 2, MinOctave: latencyMinOctave, MaxOctave: latencyMaxOctave}

const (
	latencyMinOctave = 10
	latencyMaxOctave = 34
)

// StatsOptions configure Stats.
type StatsOptions struct {
	// TopDenied keeps the most denied subjects of the last minutes, in a
	// sketch of TopDeniedCounters counters, and lists them in /v1/stats.
	// Off by default: subjects can be personal data.
	TopDenied bool
	// Clock is the time of the windows (default time.Now).
	Clock func() time.Time
}

// Stats are the figures of the operator page (GET / and GET /v1/stats):
// per namespace the decisions since start, the decisions per second over
// the last RatePoints steps of RateStep, and the check latency over the last
// LatencyWindow; the state of the store's primary and of each Cluster master
// as package fallback reports them; the last config reload; and, with
// StatsOptions.TopDenied, the most denied subjects.
//
// A Stats is a ratelimit.Observer: the Service attaches it to every
// namespace's Limiter beside its Metrics; give it to the store too
// (fallback.WithObserver) so that it sees outages. Its memory is fixed,
// whatever the traffic: about 6 KiB per namespace that has seen a check and,
// for the subjects, TopDeniedCounters counters. It is safe for simultaneous
// use by multiple goroutines; recording a decision costs a few atomic
// additions (and a short lock on a denial with TopDenied).
type Stats struct {
	clock     func() time.Time
	started   time.Time
	namespace sync.Map // string -> *nsStats

	mu     sync.Mutex // guards the fields below
	parts  map[string]*partState
	reload *reloadState
	top    *spaceSaving // nil without TopDenied
}

// NewStats returns Stats with every figure at zero.
func NewStats(o StatsOptions) *Stats {
	s := &Stats{clock: o.Clock, parts: make(map[string]*partState)}
	if s.clock == nil {
		s.clock = time.Now
	}
	s.started = s.clock()
	if o.TopDenied {
		s.top = newSpaceSaving(TopDeniedCounters)
	}
	return s
}

// ObserveDecision counts a decided check: acquires in the totals and the
// rates and, when a bucket denied them (not fail-closed, which denies
// everyone), in the most-denied sketch; peeks only in the latency.
func (s *Stats) ObserveDecision(_ context.Context, e ratelimit.DecisionEvent) {
	ns := s.ns(e.Namespace)
	now := s.clock()
	step := now.Unix() / stepSeconds
	ns.latency.add(step, e.Latency)
	if e.Peek {
		return
	}
	if e.Decision.Allowed {
		ns.allowed.Add(1)
	} else {
		ns.denied.Add(1)
	}
	ns.rate.add(step, e.Decision.Allowed)
	if !e.Decision.Allowed && e.Decision.Enforced() && s.top != nil {
		s.mu.Lock()
		s.top.add(e.Namespace, subjectOf(e.Key), now.Unix()/halfLifeSecs)
		s.mu.Unlock()
	}
}

// ObserveError counts a check that could not be decided.
func (s *Stats) ObserveError(_ context.Context, e ratelimit.ErrorEvent) {
	s.ns(e.Namespace).errors.Add(1)
}

// ObserveFallback records a change of state of the store's primary, or of
// one Cluster master.
func (s *Stats) ObserveFallback(_ context.Context, e fallback.Event) {
	at := e.At
	if at.IsZero() {
		at = s.clock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.parts[e.Partition]
	if p == nil {
		if len(s.parts) >= maxParts {
			return
		}
		p = &partState{}
		s.parts[e.Partition] = p
	}
	p.up = e.Alive
	p.since = at
	if e.Alive {
		p.cause = ""
		p.outages++
	} else {
		p.cause = errString(e.Cause)
	}
}

// recordReload records the outcome of a config reload.
func (s *Stats) recordReload(file string, err error) {
	r := &reloadState{file: file, at: s.clock(), ok: err == nil, err: errString(err)}
	s.mu.Lock()
	s.reload = r
	s.mu.Unlock()
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// idle stands for a namespace that has seen no check yet.
var idle nsStats

// lookup returns the figures of namespace name, or idle's.
func (s *Stats) lookup(name string) *nsStats {
	if v, ok := s.namespace.Load(name); ok {
		return v.(*nsStats)
	}
	return &idle
}

func (s *Stats) ns(name string) *nsStats {
	if v, ok := s.namespace.Load(name); ok {
		return v.(*nsStats)
	}
	v, _ := s.namespace.LoadOrStore(name, new(nsStats))
	return v.(*nsStats)
}

// subjectOf returns the subject of a store key: the key without the frame
// of its namespace (len ":" namespace ":"), whichever namespace it is (an
// Envoy domain's events carry the keys of its rules' namespaces), cut to
// MaxTopSubjectBytes.
func subjectOf(key string) string {
	_, subject := keyfmt.Split(key)
	if len(subject) <= MaxTopSubjectBytes {
		return strings.Clone(subject)
	}
	h := fnv.New64a()
	h.Write([]byte(subject)) //nolint:errcheck // a hash does not fail
	tail := fmt.Sprintf("…#%016x", h.Sum64())
	cut := MaxTopSubjectBytes - len(tail)
	for cut > 0 && !isRuneStart(subject[cut]) {
		cut--
	}
	return subject[:cut] + tail
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// nsStats are the figures of one namespace.
type nsStats struct {
	allowed, denied, errors atomic.Uint64
	rate                    rateRing
	latency                 latencyRing
}

// rateRing counts the acquires of each step (a RateStep of the clock) in a
// ring of slots. A slot is claimed for a step by the first event of the
// step; an event of a step older than its slot's is dropped from the ring
// (it is in the totals).
type rateRing struct {
	mu    sync.Mutex // held only to claim a slot for a new step
	slots [rateSlots]rateSlot
}

type rateSlot struct {
	step            atomic.Int64
	allowed, denied atomic.Uint32 // in one step: 4e9 is far beyond any store's rate
}

func (r *rateRing) add(step int64, allowed bool) {
	sl := &r.slots[uint64(step)%rateSlots]
	if sl.step.Load() != step {
		r.mu.Lock()
		if cur := sl.step.Load(); cur < step {
			sl.allowed.Store(0)
			sl.denied.Store(0)
			sl.step.Store(step)
		} else if cur > step {
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
	if allowed {
		sl.allowed.Add(1)
	} else {
		sl.denied.Add(1)
	}
}

// counts returns the acquires allowed and denied in each of the n steps
// ending with step last, oldest first.
func (r *rateRing) counts(last int64, n int) (allowed, denied []uint64) {
	allowed, denied = make([]uint64, n), make([]uint64, n)
	for i := range n {
		step := last - int64(n-1-i)
		sl := &r.slots[uint64(step)%rateSlots]
		if sl.step.Load() == step {
			allowed[i], denied[i] = uint64(sl.allowed.Load()), uint64(sl.denied.Load())
		}
	}
	return allowed, denied
}

// latencyRing is a latency histogram per step, over the steps of
// LatencyWindow.
type latencyRing struct {
	mu    sync.Mutex
	slots [latencySlots]latencySlot
}

type latencySlot struct {
	step atomic.Int64
	bins [latencyBins]atomic.Uint32
}

func (r *latencyRing) add(step int64, d time.Duration) {
	sl := &r.slots[uint64(step)%uint64(latencySlots)]
	if sl.step.Load() != step {
		r.mu.Lock()
		if cur := sl.step.Load(); cur < step {
			for i := range sl.bins {
				sl.bins[i].Store(0)
			}
			sl.step.Store(step)
		} else if cur > step {
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
	sl.bins[checkLatency.Bin(d)].Add(1)
}

// histogram sums the bins of the steps of LatencyWindow ending with last.
func (r *latencyRing) histogram(last int64) (bins [latencyBins]uint64, total uint64) {
	for i := range int64(latencySlots) {
		step := last - i
		sl := &r.slots[uint64(step)%uint64(latencySlots)]
		if sl.step.Load() != step {
			continue
		}
		for j := range bins {
			n := uint64(sl.bins[j].Load())
			bins[j] += n
			total += n
		}
	}
	return bins, total
}

// partState is the last known state of the primary (partition "") or of a
// Cluster master.
type partState struct {
	up      bool
	since   time.Time
	cause   string
	outages int // outages ended
}

type reloadState struct {
	file string
	at   time.Time
	ok   bool
	err  string
}

// spaceSaving is the Space-Saving heavy-hitters sketch (Metwally, Agrawal
// and El Abbadi, 2005) over a fixed number of counters, with the counts
// halved every half-life so that it ranks the last minutes. Any subject
// denied more than a 1/len(counters) share of the (decayed) denials is in
// it; a count overestimates by at most its err. The caller locks.
type spaceSaving struct {
	counters []counter
	epoch    int64 // half-lives since the Unix epoch, at the last decay
}

type counter struct {
	namespace, subject string
	count, err         uint64
}

func newSpaceSaving(n int) *spaceSaving { return &spaceSaving{counters: make([]counter, 0, n)} }

// add counts one denial of subject in namespace ns at half-life epoch.
func (s *spaceSaving) add(ns, subject string, epoch int64) {
	s.decay(epoch)
	lowest := -1
	for i := range s.counters {
		c := &s.counters[i]
		if c.subject == subject && c.namespace == ns {
			c.count++
			return
		}
		if lowest < 0 || c.count < s.counters[lowest].count {
			lowest = i
		}
	}
	if len(s.counters) < cap(s.counters) {
		s.counters = append(s.counters, counter{namespace: ns, subject: subject, count: 1})
		return
	}
	c := &s.counters[lowest]
	*c = counter{namespace: ns, subject: subject, count: c.count + 1, err: c.count}
}

// decay halves the counts once per half-life passed since the last decay,
// and frees the counters that fall to zero.
func (s *spaceSaving) decay(epoch int64) {
	if epoch <= s.epoch {
		return
	}
	shift := min(epoch-s.epoch, 63)
	s.epoch = epoch
	s.counters = slices.DeleteFunc(s.counters, func(c counter) bool {
		c.count >>= shift
		return c.count == 0
	})
	for i := range s.counters {
		s.counters[i].count >>= shift
		s.counters[i].err >>= shift
	}
}

// top returns the n highest counters at epoch, highest first.
func (s *spaceSaving) top(n int, epoch int64) []counter {
	s.decay(epoch)
	out := slices.Clone(s.counters)
	slices.SortFunc(out, func(a, b counter) int {
		if a.count != b.count {
			if a.count > b.count {
				return -1
			}
			return 1
		}
		return strings.Compare(a.namespace+"\x00"+a.subject, b.namespace+"\x00"+b.subject)
	})
	return out[:min(n, len(out))]
}
