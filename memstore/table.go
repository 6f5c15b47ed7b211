package memstore

import (
	"math/bits"

	"github.com/exactlimit/ratelimit/tokenbucket"
)

// table holds buckets by subject: a map from the subject to an index in a
// slice of entries, so that a check finds its bucket with one map lookup and
// updates it in place, and a bucket dropped leaves its entry to the next
// subject without an allocation.
type table[K comparable] struct {
	at   map[K]uint32 // the index in ents of each subject's entry
	ents []entry
	free []uint32 // indexes of ents that no subject uses
	// extra holds the levels of the second and later limits of buckets
	// written by a policy of several limits, and their quotas' counts.
	extra map[K]more
}

// more is what a bucket of a policy of several limits, or with quotas,
// holds beyond its entry: the levels of its second and later limits, and
// its quota bands.
type more struct {
	levels [tokenbucket.MaxLimits - 1]int64
	quotas []tokenbucket.QuotaBand
}

// entry is one bucket: 24 bytes.
type entry struct {
	last    int64  // µs, the State's Last
	level   int64  // the first limit's level
	pol     uint32 // the index in its shard's pols of the policy that wrote the bucket
	expires uint32 // whole seconds after base, rounded up, on the store's clock
}

// get returns k's entry, or nil. The pointer is good until the next insert
// or compact.
func (t *table[K]) get(k K) *entry {
	if i, ok := t.at[k]; ok {
		return &t.ents[i]
	}
	return nil
}

// insert adds k's entry; k must not have one.
func (t *table[K]) insert(k K, e entry) {
	if t.at == nil {
		t.at = make(map[K]uint32)
	}
	var i uint32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
		t.ents[i] = e
	} else {
		i = uint32(len(t.ents))
		t.ents = append(t.ents, e)
	}
	t.at[k] = i
}

// setExtra stores what k's bucket holds beyond its entry when multi, and
// deletes it otherwise.
func (t *table[K]) setExtra(k K, m *more, multi bool) {
	if multi {
		if t.extra == nil {
			t.extra = make(map[K]more)
		}
		t.extra[k] = *m
	} else if t.extra != nil {
		delete(t.extra, k)
	}
}

// remove deletes k's bucket and returns its entry.
func (t *table[K]) remove(k K) (entry, bool) {
	i, ok := t.at[k]
	if !ok {
		return entry{}, false
	}
	e := t.ents[i]
	t.drop(k, i)
	return e, true
}

// drop deletes k's bucket, at index i.
func (t *table[K]) drop(k K, i uint32) {
	delete(t.at, k)
	if t.extra != nil {
		delete(t.extra, k)
	}
	t.ents[i] = entry{}
	t.free = append(t.free, i)
}

// sweep visits at most n buckets, from a random place, calls gone with the
// entry of each one that expired by the second upTo and drops it. It returns
// what is left of n.
func (t *table[K]) sweep(upTo uint32, n int, gone func(entry)) int {
	if len(t.at) == 0 {
		return n
	}
	for k, i := range t.at {
		if n <= 0 {
			break
		}
		n--
		if e := t.ents[i]; e.expires <= upTo {
			t.drop(k, i)
			gone(e)
		}
	}
	return n
}

// compact copies the table into smaller maps and slices once it holds less
// than a quarter of the entries it has room for: a Go map never gives back
// its memory by itself. It reports whether it did, and so invalidated the
// pointers get returned.
func (t *table[K]) compact() bool {
	if len(t.ents) < 64 || len(t.at) >= len(t.ents)/4 {
		return false
	}
	if len(t.at) == 0 {
		*t = table[K]{}
		return true
	}
	at := make(map[K]uint32, len(t.at))
	ents := make([]entry, 0, len(t.at))
	for k, i := range t.at {
		at[k] = uint32(len(ents))
		ents = append(ents, t.ents[i])
	}
	t.at, t.ents, t.free = at, ents, nil
	if t.extra != nil {
		t.extra = maps(t.extra)
	}
	return true
}

// shrunk returns m and peak, the most entries m has held, as they are; or,
// once m holds less than a quarter of a peak of at least 64, a copy of m sized
// for its contents (never nil) and its size as the new peak: a Go map never
// gives back its memory by itself.
func shrunk[K comparable, V any](m map[K]V, peak int) (map[K]V, int) {
	if peak < 64 || len(m) >= peak/4 {
		return m, peak
	}
	if c := maps(m); c != nil {
		return c, len(c)
	}
	return make(map[K]V), 0
}

// maps returns a copy of m sized for its contents, nil when it is empty.
func maps[K comparable, V any](m map[K]V) map[K]V {
	if len(m) == 0 {
		return nil
	}
	c := make(map[K]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// shortTable holds the buckets of short subjects by open addressing with
// linear probing: each slot holds a subject's key and its entry side by
// side, so that a check of a subject not in any cache finds its key and its
// bucket's state in the one or two cache lines of its slot, where a map of
// indexes into a slice of entries has it read three (the map's control word,
// its slot, then the entry) one after the other. A slot is 40 bytes, and the
// table is kept between half and three quarters full: 53 to 80 bytes a
// subject.
type shortTable struct {
	seed  [2]uint64 // the store's, for hashShort
	slots []slot
	n     int    // slots in use
	sweep uint32 // the slot the next sweep starts at
	// extra holds what buckets of a policy of several limits, or with
	// quotas, hold beyond their entry.
	extra map[short]more
}

// slot is one subject's key and bucket. k1 of a slot in use has usedBit set,
// which no short's second word has (its low byte is a length of at most 15):
// an empty slot is all zero.
type slot struct {
	k0, k1 uint64
	e      entry
}

const usedBit = 0x10

// hashShort returns the hash of the short of the words a and b under seed:
// two rounds of a 64×64→128-bit multiply folded, as wyhash mixes, so that
// subjects whose slots collide cannot be chosen without the seed.
func hashShort(seed *[2]uint64, a, b uint64) uint64 {
	hi, lo := bits.Mul64(a^seed[0], b^seed[1])
	hi, lo = bits.Mul64(lo^0xa0761d6478bd642f, hi^seed[0])
	return hi ^ lo
}

// home returns the slot a key of hash h is looked for from, in a table of n
// slots. The top bits of h pick the shard (see Store.shardIndex); the rest
// pick the slot.
func home(h uint64, n int) int {
	hi, _ := bits.Mul64(h<<shardBits, uint64(n))
	return int(hi)
}

// get returns the entry of the subject of the words k0 and k1, whose hash is
// h, or nil. The pointer is good until the next insert or remove.
func (t *shortTable) get(h, k0, k1 uint64) *entry {
	if i := t.index(h, k0, k1); i >= 0 {
		return &t.slots[i].e
	}
	return nil
}

// index returns the slot of the subject of the words k0 and k1, whose hash
// is h, or -1.
func (t *shortTable) index(h, k0, k1 uint64) int {
	n := len(t.slots)
	if n == 0 {
		return -1
	}
	k1 |= usedBit
	for i := home(h, n); ; {
		s := &t.slots[i]
		if s.k0 == k0 && s.k1 == k1 {
			return i
		}
		if s.k1 == 0 {
			return -1
		}
		if i++; i == n {
			i = 0
		}
	}
}

// insert adds the entry of the subject of the words k0 and k1, whose hash is
// h; it must not have one. It returns the entry's place, good until the next
// insert or remove.
func (t *shortTable) insert(h, k0, k1 uint64, e entry) *entry {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.resize(max(4, len(t.slots)+len(t.slots)/2))
	}
	n := len(t.slots)
	i := home(h, n)
	for t.slots[i].k1 != 0 {
		if i++; i == n {
			i = 0
		}
	}
	t.slots[i] = slot{k0: k0, k1: k1 | usedBit, e: e}
	t.n++
	return &t.slots[i].e
}

// resize moves the table into n slots.
func (t *shortTable) resize(n int) {
	old := t.slots
	t.slots = make([]slot, n)
	for i := range old {
		if s := &old[i]; s.k1 != 0 {
			j := home(hashShort(&t.seed, s.k0, s.k1&^usedBit), n)
			for t.slots[j].k1 != 0 {
				if j++; j == n {
					j = 0
				}
			}
			t.slots[j] = *s
		}
	}
	t.sweep = 0
}

// remove deletes the bucket of the subject of the words k0 and k1 and
// returns its entry.
func (t *shortTable) remove(k0, k1 uint64) (entry, bool) {
	i := t.index(hashShort(&t.seed, k0, k1), k0, k1)
	if i < 0 {
		return entry{}, false
	}
	e := t.slots[i].e
	t.drop(i)
	return e, true
}

// drop empties slot i, and moves back into it the slots after it that
// probed past it, so that no lookup meets an empty slot before its key (a
// deletion without tombstones).
func (t *shortTable) drop(i int) {
	s := &t.slots[i]
	if t.extra != nil {
		delete(t.extra, keyOf(s.k0, s.k1&^usedBit))
	}
	n := len(t.slots)
	for j := i; ; {
		if j++; j == n {
			j = 0
		}
		m := &t.slots[j]
		if m.k1 == 0 {
			break
		}
		// m may move to i when its home is not in (i, j], cyclically.
		h := home(hashShort(&t.seed, m.k0, m.k1&^usedBit), n)
		if i <= j && (h <= i || h > j) || i > j && h <= i && h > j {
			t.slots[i] = *m
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
}

// setExtra stores what the bucket of the subject of the words k0 and k1
// holds beyond its entry when multi, and deletes it otherwise.
func (t *shortTable) setExtra(k0, k1 uint64, m *more, multi bool) {
	if multi {
		if t.extra == nil {
			t.extra = make(map[short]more)
		}
		t.extra[keyOf(k0, k1)] = *m
	} else if t.extra != nil {
		delete(t.extra, keyOf(k0, k1))
	}
}

// sweepSome visits at most n buckets, from where the last sweep stopped,
// calls gone with the entry of each one that expired by the second upTo and
// drops it. It returns what is left of n.
func (t *shortTable) sweepSome(upTo uint32, n int, gone func(entry)) int {
	size := len(t.slots)
	if t.n == 0 {
		return n
	}
	i := int(t.sweep) % size
	// Visit each slot once: a slot dropped takes in one after it, which is
	// then visited in its place.
	for left := size; left > 0 && n > 0; {
		if s := &t.slots[i]; s.k1 != 0 {
			n--
			if s.e.expires <= upTo {
				e := s.e
				t.drop(i)
				gone(e)
				if t.slots[i].k1 != 0 {
					continue
				}
			}
		}
		left--
		if i++; i == size {
			i = 0
		}
	}
	t.sweep = uint32(i)
	return n
}

// compact moves the table into fewer slots once it is less than a quarter
// full. It reports whether it did, and so invalidated the pointers get
// returned.
func (t *shortTable) compact() bool {
	if len(t.slots) < 64 || 4*t.n >= len(t.slots) {
		return false
	}
	if t.n == 0 {
		*t = shortTable{seed: t.seed}
		return true
	}
	t.resize(max(4, 2*t.n))
	if t.extra != nil {
		t.extra = maps(t.extra)
	}
	return true
}
