// Package memstore is a ratelimit.Store that keeps token buckets in this
// process: for a single instance, for tests, and as the local bucket of
// package fallback.
//
// It decides with tokenbucket's State.Step, the same exact arithmetic as the
// Redis script, so a Limiter gives the same Decisions on either store (a
// check of one limit runs State.Step's arithmetic on scalars, held equal to
// State.Step by a differential test).
//
// Buckets are spread over shards by key, each shard behind its own mutex.
// The bucket of a hot subject (one of up to 15 bytes checked twice in a row
// in its shard, under a policy of one limit) is also copied where checks read
// it without the mutex: those that write nothing, denials and peeks, are
// decided from the copy, so goroutines that keep checking one denied subject
// do not queue for its lock.
//
// The bucket of a subject of up to 15 bytes is a 40-byte slot of an
// open-addressing table, the subject's key beside its state, so that a check
// finds both in the one or two cache lines of the slot; the table is kept
// between half and three quarters full: about 70 heap bytes per subject. A
// longer subject's bucket is a 24-byte entry in a slice, found by one map
// lookup from the subject, which is kept in a fixed array up to 39 bytes
// (and copied into a string of its own beyond). A Limiter's key prefix (its namespace) is kept once per shard, and
// each policy once per store, found by its value in constant time however
// many policies there are.
//
// A bucket full again is the same as a missing one, and is dropped (as a
// Redis key expires on the server's clock): each shard sweeps out the buckets
// that have been full again for a second on the store's clock after twice as
// many checks as it holds buckets, and sweeps a part of another shard at the
// same time, so memory follows the subjects active within about the last
// refill window and second, at a constant amortized cost per check. A
// namespace whose buckets are all gone and a policy that no bucket uses any
// more are dropped with them, and tables compact once mostly empty; Sweep
// does all of that at once. A check on a subject of up to 39 bytes allocates
// nothing, but now and then to grow a table. The store starts no goroutine.
//
// A Store is safe for simultaneous use by multiple goroutines.
package memstore

import (
	"context"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/storehook"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// shardCount is the number of shards, 1<<shardBits.
const (
	shardBits  = 6
	shardCount = 1 << shardBits
)

// Store keeps token buckets in memory. The zero Store is not usable; call New.
type Store struct {
	// Every check reads these; they are written seldom (hot) or never.
	seed  maphash.Seed          // the hash of subjects beyond maxShort bytes
	kseed [2]uint64             // the hash of short subjects (hashShort)
	clock func() time.Time      // nil: start's monotonic clock
	start time.Time             // the store's creation, with a monotonic reading
	base  int64                 // µs on the store's clock at start; expiry seconds count from it
	hot   atomic.Pointer[shard] // the shard that published a hot subject last
	_     [64]byte

	cursor atomic.Uint32 // the next shard a sweep visits besides its own

	// policies holds, by value, every policy some shard refers to, and
	// those looked up since the index was last pruned. Lock order: a
	// shard's mu, then polMu.
	polMu    sync.RWMutex
	policies map[policyKey]*policy
	polPeak  int // the most policies held since policies was made
	pruneAt  int // the size of the index at which to prune it next

	shards [shardCount]shard

	reserved reservations // see Reserve
	assigned assignments  // see Assign

	storeHooks // applySplit, for the Limiter and package fallback
}

// storeHooks is what a Store offers the Limiter and package fallback and no
// user calls (see package storehook).
type storeHooks = storehook.Hooks[ratelimit.Request, ratelimit.Decision]

// shard is the part of the store behind one mutex.
type shard struct {
	// Keep what checks read without the lock on a cache line of its own,
	// apart from the lock and the counters every locked check writes, and
	// each shard on cache lines of its own.
	fast fastHit
	_    [fastPad]byte
	shardState
	_ [(128 - (unsafe.Sizeof(fastHit{})+fastPad+unsafe.Sizeof(shardState{}))%128) % 128]byte
}

const fastPad = (64 - unsafe.Sizeof(fastHit{})%64) % 64

type shardState struct {
	// What every check writes fills the first cache line, so that a check
	// takes one line from the core that checked the shard last: the fields
	// after it are read by every check, and written only when buckets come
	// and go or a hot subject is published.
	mu     sync.Mutex // unlocked by unlock once buckets may have changed, so that fast follows them
	ops    int        // checks since the last sweep
	last   *space     // the space of the latest check
	recent *policy    // the policy of the latest check
	hit    hit        // the bucket of the latest check on a short subject

	n      int               // buckets in all spaces
	pub    published         // the bucket fast copies
	spaces map[string]*space // by key prefix
	peak   int               // the most spaces held since spaces was made
	pols   []polRef          // the policies of the shard's buckets, by entry.pol
	free   []uint32          // unused indexes of pols
	// one and many index pols by value, for policies of one limit and of
	// several.
	one  map[ratelimit.Limit]uint32
	many map[policyKey]uint32
}

// hit remembers the entry of a short subject's bucket, so that a subject
// checked again and again (a hot one) is found without a map lookup. It is
// cleared (see forget) whenever an entry may move or be reused: a bucket
// added, dropped or a table compacted in the shard.
type hit struct {
	sp  *space
	key short
	e   *entry // nil: nothing remembered
}

// space holds a shard's buckets of one key prefix (a Limiter's namespace),
// keyed by the rest of the key: the prefix is kept once, not per bucket.
// Subjects are kept in one of three tables by their length.
type space struct {
	prefix string
	n      int             // buckets in the three tables
	short  shortTable      // subjects of up to 15 bytes
	mid    table[[40]byte] // subjects of 16 to 39 bytes
	long   table[string]   // longer subjects, each its own copy
}

// Subjects of up to maxShort bytes are kept in a short, and those of up to
// maxMid bytes in an array, with their length in the last byte.
const (
	maxShort = 15
	maxMid   = 39
)

// Option configures a Store.
type Option func(*Store)

// WithClock sets the clock the store reads the current time from. It
// decides the requests that carry no time (the zero Request.Now), and it
// times the expiry of every bucket, as the server's clock does for Redis
// keys. The default is the wall clock read
// at New advanced by the monotonic clock, so that a step of the system clock
// neither credits nor withholds refill.
func WithClock(clock func() time.Time) Option { return func(s *Store) { s.clock = clock } }

// New returns an empty Store.
func New(opts ...Option) *Store {
	s := &Store{seed: maphash.MakeSeed(), kseed: [2]uint64{rand.Uint64(), rand.Uint64()},
		start: time.Now(), policies: make(map[policyKey]*policy)}
	for _, o := range opts {
		o(s)
	}
	storehook.OfferSplit(&s.storeHooks, s.applySplit)
	s.base = s.start.UnixMicro()
	if s.clock != nil {
		s.base = s.clock().UnixMicro()
	}
	for i := range s.shards {
		s.shards[i].spaces = make(map[string]*space)
		s.shards[i].one = make(map[ratelimit.Limit]uint32)
		s.shards[i].many = make(map[policyKey]uint32)
	}
	return s
}

// Apply decides r against the bucket at key and updates it, atomically with
// respect to every other call on the same key. It honours ctx only in that a
// cancelled context is an error: the decision itself never blocks. The store
// keeps a copy of key, never key itself.
func (s *Store) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	prefix, subject := keyfmt.Split(key)
	return s.applySplit(ctx, prefix, subject, r)
}

// applySplit is Apply on the key prefix+subject, without joining them: the
// store keeps prefix once for all its buckets. It is the one function a
// check runs through: the Limiter and package fallback call it (the store
// offers it with storehook.OfferSplit).
func (s *Store) applySplit(ctx context.Context, prefix, subject string, r ratelimit.Request) (ratelimit.Decision, error) {
	if err := ctx.Err(); err != nil {
		return ratelimit.Decision{}, err
	}
	// Buckets expire on the store's own clock, as Redis keys expire on the
	// server's, whatever time the request carries.
	clock, ns := s.nowNs()
	us := clock
	if !r.Now.IsZero() {
		us = r.Now.UnixMicro()
	}
	if us < 0 || us > tokenbucket.MaxTime {
		if err := r.Validate(); err != nil {
			return ratelimit.Decision{}, err
		}
		_, err := tokenbucket.Micros(time.UnixMicro(us))
		return ratelimit.Decision{}, err
	}

	var k0, k1, h uint64 // a short subject's key and its hash, made before taking the lock
	var d ratelimit.Decision
	isShort := len(subject) <= maxShort
	hot := s.hot.Load()
	if isShort {
		k0, k1 = shortWords(subject)
		// The latest hot subject's shard may be this one's (a space's
		// prefix is always length-framed, so prefix is one).
		// (The first word of the key is compared here, so that a check of
		// another subject does not call decideFast.)
		if hot != nil && hot.fast.k0.Load() == k0 && hot.decideFast(prefix, k0, k1, &r, us, &d) {
			s.countFast(hot, clock, ns)
			return d, nil
		}
	}
	var sh *shard
	if isShort {
		h = hashShort(&s.kseed, k0, k1)
		sh = &s.shards[shortShard(prefix, h)]
	} else {
		sh = s.shardOf(prefix, subject)
	}
	if isShort && sh != hot && sh.fast.k0.Load() == k0 && sh.decideFast(prefix, k0, k1, &r, us, &d) {
		s.countFast(sh, clock, ns)
		return d, nil
	}
	k := keyOf(k0, k1)
	sh.mu.Lock()
	swept := s.sweep(sh, clock)
	p := s.policyIn(sh, r.Limits, r.Quotas)
	cost := r.Cost
	valid := p != nil && (r.Peek || cost >= 1 && cost <= p.minCap)
	if r.Costs != nil && p != nil && !r.Peek {
		// A cost per limit: the first for one limit (several are decided
		// by State.Step).
		cost, valid = r.Costs[0], r.Validate() == nil
	}
	if !valid {
		sh.unlock()
		return ratelimit.Decision{}, r.Validate()
	}
	sp := sh.last
	if sp == nil || sp.prefix != prefix {
		sp = sh.spaces[prefix]
	}
	if sp == nil {
		// Every space's prefix is a Limiter's length-framed one; a prefix
		// of none is checked here, so that a check of a known namespace
		// does not parse its prefix.
		if p, rest := keyfmt.Split(prefix); p != prefix || rest != "" {
			// Not a Limiter's length-framed prefix: file the key as Apply
			// would, in the shard of the key so split.
			sh.unlock()
			if swept {
				s.sweepOther(clock)
			}
			return s.Apply(ctx, prefix+subject, r)
		}
	}
	var e *entry
	again := false // the subject of the shard's latest check
	if len(subject) <= maxShort && sp != nil {
		if sh.hit.e != nil && sh.hit.sp == sp && sh.hit.key == k {
			e, again = sh.hit.e, true
		} else if e = sp.short.get(h, k0, k1); e != nil {
			sh.hit = hit{sp: sp, key: k, e: e}
		}
	} else {
		e = sp.find(subject)
	}
	var ep *policy // the policy that wrote e
	if e != nil {
		ep = sh.pols[e.pol].p
	}
	if p.one && (e == nil || ep == p || ep.one && ep.low == p.low) {
		// One limit on a bucket of its own rate: State.Step on scalars.
		var b scalar
		if e != nil {
			b = scalar{found: true, last: e.last, level: e.level}
		}
		ttl, write := stepOne(&d, p.low, r.Limits[0], cost, r.Peek, us, &b)
		switch {
		case !write && again:
			// A hot subject denied (or peeked at): its checks that write
			// nothing may go without the lock from now on.
			s.publish(sh, sp, k, e)
		case !write:
		case e != nil && ep == p:
			e.last, e.level, e.expires = b.last, b.level, s.expiry(clock, ttl)
			sh.last = sp
		default:
			bands := [1]tokenbucket.Band{{Limit: r.Limits[0], Level: b.level}}
			st := tokenbucket.State{Last: b.last, Bands: bands[:]}
			s.store(sh, sp, prefix, subject, st, p, e, s.expiry(clock, ttl))
		}
	} else {
		var bands [tokenbucket.MaxLimits]tokenbucket.Band
		st, e := sh.load(sp, subject, &bands)
		var ttl time.Duration
		var write bool
		d, ttl, write = st.Step(r, us)
		if write {
			s.store(sh, sp, prefix, subject, st, p, e, s.expiry(clock, ttl))
		}
	}
	sh.unlock()
	if swept {
		s.sweepOther(clock)
	}
	return d, nil
}

// find returns the entry of subject's bucket in sp (which may be nil), or
// nil when there is none.
func (sp *space) find(subject string) *entry {
	switch {
	case sp == nil:
		return nil
	case len(subject) <= maxShort:
		k0, k1 := shortWords(subject)
		return sp.short.get(hashShort(&sp.short.seed, k0, k1), k0, k1)
	case len(subject) <= maxMid:
		return sp.mid.get(midKey(subject))
	default:
		return sp.long.get(subject)
	}
}

// load reads the bucket of subject in sp (which may be nil) into a State
// whose Bands use bands, and returns its entry, or nil when there is none.
func (sh *shard) load(sp *space, subject string, bands *[tokenbucket.MaxLimits]tokenbucket.Band) (tokenbucket.State, *entry) {
	e := sp.find(subject)
	if e == nil {
		return tokenbucket.State{Bands: bands[:0]}, nil
	}
	p := sh.pols[e.pol].p
	limits := p.limits
	bands[0] = tokenbucket.Band{Limit: limits[0], Level: e.level}
	var m more
	if !p.one {
		switch {
		case len(subject) <= maxShort:
			m = sp.short.extra[shortKey(subject)]
		case len(subject) <= maxMid:
			m = sp.mid.extra[midKey(subject)]
		default:
			m = sp.long.extra[subject]
		}
		for i := 1; i < len(limits); i++ {
			bands[i] = tokenbucket.Band{Limit: limits[i], Level: m.levels[i-1]}
		}
	}
	return tokenbucket.State{Last: e.last, Bands: bands[:len(limits)], Quotas: m.quotas}, e
}

// store writes st, decided under policy p, as the bucket of subject in sp,
// making the space when sp is nil. e is the entry load returned: the bucket
// is updated in place, or added when e is nil.
func (s *Store) store(sh *shard, sp *space, prefix, subject string, st tokenbucket.State, p *policy, e *entry, expires uint32) {
	if sp == nil {
		sp = &space{prefix: strings.Clone(prefix), short: shortTable{seed: s.kseed}}
		sh.spaces[sp.prefix] = sp
		sh.peak = max(sh.peak, len(sh.spaces))
	}
	sh.last = sp
	multi := !p.one
	var more more
	for i := 1; i < len(st.Bands); i++ {
		more.levels[i-1] = st.Bands[i].Level
	}
	if len(st.Quotas) > 0 {
		more.quotas = append([]tokenbucket.QuotaBand(nil), st.Quotas...)
	}
	if e != nil {
		wasMulti := !sh.pols[e.pol].p.one
		if sh.pols[e.pol].p != p {
			pol := s.ref(sh, p)
			s.unref(sh, e.pol)
			e.pol = pol
		}
		e.last, e.level, e.expires = st.Last, st.Bands[0].Level, expires
		if multi || wasMulti {
			switch {
			case len(subject) <= maxShort:
				k0, k1 := shortWords(subject)
				sp.short.setExtra(k0, k1, &more, multi)
			case len(subject) <= maxMid:
				sp.mid.setExtra(midKey(subject), &more, multi)
			default:
				sp.long.setExtra(subject, &more, multi)
			}
		}
		return
	}
	n := entry{last: st.Last, level: st.Bands[0].Level, pol: s.ref(sh, p), expires: expires}
	switch {
	case len(subject) <= maxShort:
		k0, k1 := shortWords(subject)
		sp.short.insert(hashShort(&sp.short.seed, k0, k1), k0, k1, n)
		sp.short.setExtra(k0, k1, &more, multi)
	case len(subject) <= maxMid:
		k := midKey(subject)
		sp.mid.insert(k, n)
		sp.mid.setExtra(k, &more, multi)
	default:
		k := strings.Clone(subject)
		sp.long.insert(k, n)
		sp.long.setExtra(k, &more, multi)
	}
	sp.n++
	sh.n++
	sh.forget() // the table may have moved its entries
}

// now returns the store's clock in µs since the Unix epoch. The default
// clock reads only the monotonic clock (time.Since of a time with a
// monotonic reading does), which is the cheaper half of time.Now.
func (s *Store) now() int64 {
	clock, _ := s.nowNs()
	return clock
}

// nowNs is now, and with the default clock the ns it read (0 otherwise).
func (s *Store) nowNs() (clock int64, ns time.Duration) {
	if s.clock != nil {
		return s.clock().UnixMicro(), 0
	}
	ns = time.Since(s.start)
	return s.base + int64(ns/time.Microsecond), ns
}

// seconds returns the whole seconds from base to clock (µs), rounded down.
func (s *Store) seconds(clock int64) uint32 {
	d := (clock - s.base) / 1e6
	return uint32(min(max(d, 0), math.MaxUint32))
}

// linger is how long, in seconds, the checks' sweeps keep a bucket after it
// is full again: a full bucket is the same as a missing one, and keeping it a
// little spares a subject that comes back soon (a steady client under a
// generous limit, whose bucket refills between its checks) the work of
// dropping and remaking its bucket each time.
const linger = 1

// cutoff returns the second after base up to which the checks' sweeps drop
// the buckets that have expired: linger seconds before clock (µs).
func (s *Store) cutoff(clock int64) uint32 {
	return s.seconds(clock - linger*1e6)
}

// expiry returns the second after base at which a bucket written at clock
// with ttl is full: rounded up, so it is never dropped early.
func (s *Store) expiry(clock int64, ttl time.Duration) uint32 {
	at := clock - s.base + ttl.Microseconds()
	sec := (at + 1e6 - 1) / 1e6
	return uint32(min(max(sec, 0), math.MaxUint32))
}
