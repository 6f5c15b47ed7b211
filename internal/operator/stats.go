package operator

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
)

// Store kinds, for StoreReport.Kind.
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
	rateSlots    = RatePoints + 4                    // the points, the current step and spares, so a reader never sees a slot being reused
	latencySlots = int64(LatencyWindow/RateStep) + 1 // the window and the current step
	maxParts     = 256                               // masters remembered from fallback events
	stepSeconds  = int64(RateStep / time.Second)     // RateStep is whole seconds
	halfLifeSecs = int64(TopDeniedHalfLife / time.Second)
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
// A Stats is a ratelimit.Observer: the HTTP API (package server) attaches
// it to every namespace's Limiter beside its metrics; give it to the store too
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

// RecordReload records the outcome of a config reload of file: err is
// nil when it was put in force.
func (s *Stats) RecordReload(file string, err error) {
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
