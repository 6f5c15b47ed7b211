package memstore

import (
	"math/rand/v2"
	"testing"
)

// TestShortTableHoldsWhatAMapHolds runs random inserts, removes and sweeps
// on a shortTable and on a map beside it: every key the map holds is found
// with its entry, and no other, through growth, wrap-around at the end of
// the slots, deletions that move slots back and compaction.
func TestShortTableHoldsWhatAMapHolds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		tb := shortTable{seed: [2]uint64{rng.Uint64(), rng.Uint64()}}
		want := map[[2]uint64]entry{}
		keys := 1 + rng.IntN(300)
		key := func() (uint64, uint64) {
			i := uint64(rng.IntN(keys))
			if i%3 == 0 {
				return i, 0 // the words of a subject under 8 bytes: "" is 0, 0
			}
			return i * 0x9e3779b97f4a7c15, uint64(8+i%8) | i<<8
		}
		check := func(op string) {
			t.Helper()
			if tb.n != len(want) {
				t.Fatalf("round %d, after %s: the table holds %d, want %d", round, op, tb.n, len(want))
			}
			used := 0
			for i := range tb.slots {
				if tb.slots[i].k1 != 0 {
					used++
				}
			}
			if used != len(want) {
				t.Fatalf("round %d, after %s: %d slots in use, want %d", round, op, used, len(want))
			}
			for k, e := range want {
				if got := tb.get(hashShort(&tb.seed, k[0], k[1]), k[0], k[1]); got == nil || *got != e {
					t.Fatalf("round %d, after %s: key %x: got %v, want %+v", round, op, k, got, e)
				}
			}
		}
		for step := range 2000 {
			k0, k1 := key()
			switch r := rng.IntN(10); {
			case r < 5:
				e := entry{last: int64(step), level: rng.Int64N(1000), pol: uint32(rng.IntN(4)), expires: uint32(rng.IntN(100))}
				if p := tb.get(hashShort(&tb.seed, k0, k1), k0, k1); p != nil {
					*p = e
				} else {
					tb.insert(hashShort(&tb.seed, k0, k1), k0, k1, e)
				}
				want[[2]uint64{k0, k1}] = e
			case r < 8:
				e, ok := tb.remove(k0, k1)
				w, wok := want[[2]uint64{k0, k1}]
				if ok != wok || e != w {
					t.Fatalf("round %d: remove %x %x: %+v %v, want %+v %v", round, k0, k1, e, ok, w, wok)
				}
				delete(want, [2]uint64{k0, k1})
			case r < 9:
				upTo := uint32(rng.IntN(30))
				budget := 1 + rng.IntN(2*keys)
				tb.sweepSome(upTo, budget, func(e entry) {
					if e.expires > upTo {
						t.Fatalf("round %d: swept %+v, not expired by %d", round, e, upTo)
					}
					for k, w := range want {
						if w == e {
							delete(want, k)
							return
						}
					}
					t.Fatalf("round %d: swept %+v, which the table did not hold", round, e)
				})
			default:
				tb.compact()
			}
			check("step")
		}
		// A sweep without a bound drops every bucket expired.
		tb.sweepSome(50, 1<<30, func(entry) {})
		for _, e := range tb.slots {
			if e.k1 != 0 && e.e.expires <= 50 {
				t.Fatalf("round %d: a full sweep left %+v", round, e)
			}
		}
	}
}
