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
	"encoding/binary"
	"hash/maphash"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
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

	storeHooks // applySplit, for the Limiter and package fallback
}

// storeHooks is what a Store offers the Limiter and package fallback and no
// user calls (see package storehook).
type storeHooks = storehook.Hooks[ratelimit.Request, ratelimit.Decision]

// policyKey is a policy in comparable form: its limits, zero beyond n.
type policyKey struct {
	n int
	l [tokenbucket.MaxLimits]ratelimit.Limit
}

// policy is a validated policy, kept once per store and shared by the
// buckets it wrote.
type policy struct {
	key    policyKey
	limits []ratelimit.Limit // key.l[:key.n]
	minCap int64
	one    bool   // a policy of one limit
	low    lowest // its first limit in lowest terms
	shards int    // shards that refer to it; guarded by Store.polMu
}

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

// polRef is a policy some of a shard's buckets were written by.
type polRef struct {
	p    *policy
	refs int // buckets of the shard written by p
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

// short is a subject of up to 15 bytes as two words, read with a few loads
// rather than copied byte by byte: from 8 bytes on, the first word is the
// first 8 bytes and the second the last 8, whose first byte (already in the
// first word) gives way to the length; below, the first word holds the bytes
// and the second the length. Each subject has its own. It is a byte array,
// not two uint64s, so that a map slot of it and a uint32 takes 20 bytes, not
// 24.
type short [16]byte

func shortKey(s string) short { return keyOf(shortWords(s)) }

// shortWords returns the two words of the short of s. A check compares
// them as words, rather than the short put together: a load of the whole
// array from the two stores just made would stall.
func shortWords(s string) (a, b uint64) {
	n := len(s)
	if n >= 8 {
		return le64(s), le64(s[n-8:])&^0xff | uint64(n)
	}
	for i := n - 1; i >= 0; i-- {
		a = a<<8 | uint64(s[i])
	}
	return a, uint64(n)
}

// keyOf returns the short of the words a and b.
func keyOf(a, b uint64) (k short) {
	binary.LittleEndian.PutUint64(k[:8], a)
	binary.LittleEndian.PutUint64(k[8:], b)
	return k
}

func midKey(s string) (k [40]byte) {
	copy(k[:maxMid], s)
	k[maxMid] = byte(len(s))
	return k
}

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
	p := s.policyIn(sh, r.Limits)
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
	if len(r.Limits) == 1 && (e == nil || ep == p || ep.one && ep.low == p.low) {
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

// sweepOther sweeps a bounded number of buckets of the next shard in turn,
// after a check swept its own, so that shards that see no checks are swept by
// the others. clock is the store's clock (µs).
func (s *Store) sweepOther(clock int64) {
	other := &s.shards[s.cursor.Add(1)%shardCount]
	other.mu.Lock()
	s.sweepSome(other, s.cutoff(clock), 256)
	other.unlock()
}

// shardOf returns the shard of the key prefix+subject.
func (s *Store) shardOf(prefix, subject string) *shard {
	return &s.shards[s.shardIndex(prefix, subject)]
}

// shardIndex returns the index of the shard of the key prefix+subject. The
// prefix counts, so that the same subject in many namespaces (a tenant's
// "admin", say) is spread over the shards too.
func (s *Store) shardIndex(prefix, subject string) int {
	if len(subject) <= maxShort {
		k0, k1 := shortWords(subject)
		return shortShard(prefix, hashShort(&s.kseed, k0, k1))
	}
	h := maphash.String(s.seed, subject) ^ mix(prefix)*0x9e3779b97f4a7c15
	return int(h >> (64 - shardBits))
}

// shortShard returns the index of the shard of the key prefix+subject for a
// short subject whose hashShort is h. Its top bits pick the shard, and the
// others the subject's slot in its table (see home).
func shortShard(prefix string, h uint64) int {
	return int((h ^ mix(prefix)*0x9e3779b97f4a7c15) >> (64 - shardBits))
}

// mix returns a cheap digest of a key prefix: its length, and its first and
// last 8 bytes. It need not resist anyone: prefixes are the namespaces the
// program chose, and the subject's part of the shard's hash is seeded.
func mix(prefix string) uint64 {
	n := len(prefix)
	if n < 8 {
		var h uint64
		for i := range n {
			h = h<<8 | uint64(prefix[i])
		}
		return h<<8 | uint64(n)
	}
	return le64(prefix[:8]) ^ bits.RotateLeft64(le64(prefix[n-8:]), 31) ^ uint64(n)
}

// le64 reads the first 8 bytes of s as a little-endian integer.
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
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
	limits := sh.pols[e.pol].p.limits
	bands[0] = tokenbucket.Band{Limit: limits[0], Level: e.level}
	if len(limits) > 1 {
		var more [tokenbucket.MaxLimits - 1]int64
		switch {
		case len(subject) <= maxShort:
			more = sp.short.extra[shortKey(subject)]
		case len(subject) <= maxMid:
			more = sp.mid.extra[midKey(subject)]
		default:
			more = sp.long.extra[subject]
		}
		for i := 1; i < len(limits); i++ {
			bands[i] = tokenbucket.Band{Limit: limits[i], Level: more[i-1]}
		}
	}
	return tokenbucket.State{Last: e.last, Bands: bands[:len(limits)]}, e
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
	multi := len(st.Bands) > 1
	var more [tokenbucket.MaxLimits - 1]int64
	for i := 1; i < len(st.Bands); i++ {
		more[i-1] = st.Bands[i].Level
	}
	if e != nil {
		wasMulti := len(sh.pols[e.pol].p.limits) > 1
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

// policyIn returns the store's copy of limits, or nil when they are not a
// valid policy. sh, locked, remembers the latest one.
func (s *Store) policyIn(sh *shard, limits []ratelimit.Limit) *policy {
	if p := sh.recent; p != nil && slices.Equal(p.limits, limits) {
		return p
	}
	var p *policy
	if i, ok := sh.find(limits); ok {
		p = sh.pols[i].p
	} else if p = s.policyFor(limits); p == nil {
		return nil
	}
	sh.recent = p
	return p
}

// find returns the index in sh.pols of the policy limits, if the shard has
// it. It looks in the shard alone, under its lock, and touches no memory
// another shard writes.
func (sh *shard) find(limits []ratelimit.Limit) (uint32, bool) {
	if len(limits) == 1 {
		i, ok := sh.one[limits[0]]
		return i, ok
	}
	if len(limits) == 0 || len(limits) > tokenbucket.MaxLimits {
		return 0, false
	}
	k := policyKey{n: len(limits)}
	copy(k.l[:], limits)
	i, ok := sh.many[k]
	return i, ok
}

// policyFor returns the store's copy of limits, or nil when they are not a
// valid policy. The policy stays in the store's index while a shard refers
// to it; a policy found but not yet referred to may be dropped from the index
// meanwhile, and is then still good to use.
func (s *Store) policyFor(limits []ratelimit.Limit) *policy {
	if len(limits) == 0 || len(limits) > tokenbucket.MaxLimits {
		return nil
	}
	k := policyKey{n: len(limits)}
	copy(k.l[:], limits)
	s.polMu.RLock()
	p := s.policies[k]
	s.polMu.RUnlock()
	if p != nil {
		return p
	}
	if (ratelimit.Request{Limits: limits, Peek: true}).Validate() != nil {
		return nil
	}
	s.polMu.Lock()
	defer s.polMu.Unlock()
	if p := s.policies[k]; p != nil {
		return p
	}
	p = &policy{key: k, minCap: math.MaxInt64}
	p.limits = p.key.l[:k.n:k.n]
	for _, l := range p.limits {
		p.minCap = min(p.minCap, l.Capacity)
	}
	p.one, p.low = len(p.limits) == 1, lowestOf(p.limits[0])
	s.policies[k] = p
	s.polPeak = max(s.polPeak, len(s.policies))
	if len(s.policies) > s.pruneAt {
		// Policies looked up but never written with (peeks at missing
		// buckets, say) are dropped once the index has doubled: a constant
		// amortized cost per new policy.
		s.prune(p)
		s.pruneAt = 2*len(s.policies) + 64
	}
	return p
}

// prune drops from the index the policies no shard refers to, but keep.
// s.polMu must be held.
func (s *Store) prune(keep *policy) {
	for k, p := range s.policies {
		if p.shards == 0 && p != keep {
			delete(s.policies, k)
		}
	}
	s.shrinkPolicies()
}

// shrinkPolicies copies the index into a smaller map once it holds less
// than a quarter of its most: a Go map never gives back its memory by itself.
// s.polMu must be held.
func (s *Store) shrinkPolicies() {
	if s.polPeak >= 64 && len(s.policies) < s.polPeak/4 {
		s.policies = maps(s.policies)
		if s.policies == nil {
			s.policies = make(map[policyKey]*policy)
		}
		s.polPeak = len(s.policies)
	}
}

// ref counts one more bucket of sh written by p and returns p's index in
// sh.pols.
func (s *Store) ref(sh *shard, p *policy) uint32 {
	if i, ok := sh.find(p.limits); ok {
		// p itself, or an equal policy made after p left the index.
		sh.pols[i].refs++
		return i
	}
	s.polMu.Lock()
	p.shards++
	if s.policies[p.key] == nil {
		// Dropped from the index meanwhile (its last bucket elsewhere went):
		// it is in use again.
		s.policies[p.key] = p
		s.polPeak = max(s.polPeak, len(s.policies))
	}
	s.polMu.Unlock()
	var i uint32
	if n := len(sh.free); n > 0 {
		i, sh.free = sh.free[n-1], sh.free[:n-1]
	} else {
		i = uint32(len(sh.pols))
		sh.pols = append(sh.pols, polRef{})
	}
	sh.pols[i] = polRef{p: p, refs: 1}
	if len(p.limits) == 1 {
		sh.one[p.limits[0]] = i
	} else {
		sh.many[p.key] = i
	}
	return i
}

// unref counts one bucket of sh fewer written by the policy at index i, and
// lets the policy go once no bucket of the store uses it.
func (s *Store) unref(sh *shard, i uint32) {
	ref := &sh.pols[i]
	if ref.refs--; ref.refs > 0 {
		return
	}
	p := ref.p
	*ref = polRef{}
	if len(p.limits) == 1 {
		delete(sh.one, p.limits[0])
	} else {
		delete(sh.many, p.key)
	}
	sh.free = append(sh.free, i)
	if len(sh.free) == len(sh.pols) {
		sh.pols, sh.free = sh.pols[:0], sh.free[:0]
		if cap(sh.pols) > 64 {
			// Give back the memory of the policies the shard held.
			sh.pols, sh.free = nil, nil
			sh.one = make(map[ratelimit.Limit]uint32)
			sh.many = make(map[policyKey]uint32)
		}
	}
	if sh.recent == p {
		sh.recent = nil
	}
	s.polMu.Lock()
	if p.shards--; p.shards == 0 && s.policies[p.key] == p {
		delete(s.policies, p.key)
		s.shrinkPolicies()
	}
	s.polMu.Unlock()
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

// Reset deletes the bucket at key, so that its next check starts full.
func (s *Store) Reset(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	prefix, subject := keyfmt.Split(key)
	sh := s.shardOf(prefix, subject)
	sh.mu.Lock()
	if sp := sh.spaces[prefix]; sp != nil {
		var e entry
		var found bool
		switch {
		case len(subject) <= maxShort:
			e, found = sp.short.remove(shortWords(subject))
		case len(subject) <= maxMid:
			e, found = sp.mid.remove(midKey(subject))
		default:
			e, found = sp.long.remove(subject)
		}
		if found {
			s.dropped(sh, sp, e)
			s.tidy(sh, sp)
			sh.shrink()
		}
	}
	sh.unlock()
	return nil
}

// dropped accounts for the bucket e, just deleted from sp.
func (s *Store) dropped(sh *shard, sp *space, e entry) {
	sp.n--
	sh.n--
	sh.forget()
	s.unref(sh, e.pol)
}

// tidy drops sp when it holds no bucket any more, and compacts its tables
// when they are mostly empty.
func (s *Store) tidy(sh *shard, sp *space) {
	if sp.n == 0 {
		delete(sh.spaces, sp.prefix)
		if sh.last == sp {
			sh.last = nil
		}
		sh.forget()
		return
	}
	// Compacting moves entries.
	short, mid, long := sp.short.compact(), sp.mid.compact(), sp.long.compact()
	if short || mid || long {
		sh.forget()
	}
}

// shrink copies the shard's map of spaces into a smaller one once it holds
// less than a quarter of its most.
func (sh *shard) shrink() {
	if sh.peak >= 64 && len(sh.spaces) < sh.peak/4 {
		sh.spaces = maps(sh.spaces)
		if sh.spaces == nil {
			sh.spaces = make(map[string]*space)
		}
		sh.peak = len(sh.spaces)
	}
}

// Len returns the number of buckets held: those not yet swept out.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// Sweep drops every bucket whose time has run out on the store's clock, with
// the namespaces and policies left without a bucket. Checks sweep on their
// own; Sweep is for a caller that wants memory back at once.
func (s *Store) Sweep() {
	now := s.seconds(s.now())
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		s.sweepSome(sh, now, math.MaxInt)
		sh.ops = 0
		sh.recent = nil
		sh.unlock()
	}
	s.polMu.Lock()
	s.prune(nil)
	s.polMu.Unlock()
}

// sweep drops the buckets of sh that expired linger seconds before clock (µs)
// once the shard has served twice as many checks as it holds buckets (at
// least 64), so that its cost per check is constant: half a bucket visited.
// It reports whether it swept.
func (s *Store) sweep(sh *shard, clock int64) bool {
	sh.ops++
	if sh.ops < max(64, 2*sh.n) {
		return false
	}
	sh.ops = 0
	s.sweepSome(sh, s.cutoff(clock), math.MaxInt)
	return true
}

// sweepSome visits at most n buckets of sh, from a random place, and drops
// those that expired by the second upTo, with the spaces left empty.
func (s *Store) sweepSome(sh *shard, upTo uint32, n int) {
	for _, sp := range sh.spaces {
		gone := func(e entry) { s.dropped(sh, sp, e) }
		n = sp.short.sweepSome(upTo, n, gone)
		n = sp.mid.sweep(upTo, n, gone)
		n = sp.long.sweep(upTo, n, gone)
		s.tidy(sh, sp)
		if n <= 0 {
			break
		}
	}
	sh.shrink()
}
