package memstore

import "github.com/exactlimit/ratelimit/tokenbucket"

// table holds buckets by subject: a map from the subject to an index in a
// slice of entries, so that a check finds its bucket with one map lookup and
// updates it in place, and a bucket dropped leaves its entry to the next
// subject without an allocation.
type table[K comparable] struct {
	at   map[K]uint32 // the index in ents of each subject's entry
	ents []entry
	free []uint32 // indexes of ents that no subject uses
	// extra holds the levels of the second and later limits of buckets
	// written by a policy of several limits.
	extra map[K][tokenbucket.MaxLimits - 1]int64
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

// setExtra stores k's levels beyond the first when multi, and deletes them
// otherwise.
func (t *table[K]) setExtra(k K, more *[tokenbucket.MaxLimits - 1]int64, multi bool) {
	if multi {
		if t.extra == nil {
			t.extra = make(map[K][tokenbucket.MaxLimits - 1]int64)
		}
		t.extra[k] = *more
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
