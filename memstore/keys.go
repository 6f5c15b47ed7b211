package memstore

import (
	"encoding/binary"
	"hash/maphash"
	"math/bits"
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
