package memstore

import (
	"testing"
	"unsafe"
)

// TestShardLayout holds what a check writes under a shard's lock to the
// first cache line of its shardState, which starts a line of its own.
func TestShardLayout(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is laid out for 64-bit platforms")
	}
	var s Store
	if off := unsafe.Offsetof(s.shards) + unsafe.Offsetof(s.shards[0].shardState); off%64 != 0 {
		t.Errorf("a shard's state starts %d bytes into the store, not at a cache line", off)
	}
	if n := unsafe.Sizeof(shard{}); n%64 != 0 {
		t.Errorf("a shard takes %d bytes, not whole cache lines", n)
	}
	if end := unsafe.Offsetof(shardState{}.hit) + unsafe.Sizeof(hit{}); end > 64 {
		t.Errorf("the lock, counters and hit end %d bytes into the shard's state, beyond its first cache line", end)
	}
}
