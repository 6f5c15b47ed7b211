package memstore

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestKeysTellSubjectsApart holds the fixed-size keys of short and mid-length
// subjects one to one with the subjects: every short subject of up to 3 bytes
// over an alphabet with the zero byte, and longer ones that differ by one byte
// anywhere, by a trailing zero byte or by their length.
func TestKeysTellSubjectsApart(t *testing.T) {
	var subjects []string
	alphabet := []string{"\x00", "\x01", "s", "\xff"}
	var grow func(s string)
	grow = func(s string) {
		subjects = append(subjects, s)
		if len(s) < 3 {
			for _, c := range alphabet {
				grow(s + c)
			}
		}
	}
	grow("")
	rng := rand.New(rand.NewPCG(7, 8))
	for n := 4; n <= maxMid; n++ {
		base := []byte(strings.Repeat("s", n))
		subjects = append(subjects, string(base), string(base)+"\x00", "\x00"+string(base))
		for range 20 {
			b := append([]byte(nil), base...)
			b[rng.IntN(n)] = byte(rng.IntN(256))
			subjects = append(subjects, string(b))
		}
		for i := range n {
			b := append([]byte(nil), base...)
			b[i] = 0
			subjects = append(subjects, string(b))
		}
	}
	shorts := map[short]string{}
	mids := map[[40]byte]string{}
	for _, s := range subjects {
		switch {
		case len(s) <= maxShort:
			if o, ok := shorts[shortKey(s)]; ok && o != s {
				t.Fatalf("%q and %q have the same short key", o, s)
			}
			shorts[shortKey(s)] = s
		case len(s) <= maxMid:
			if o, ok := mids[midKey(s)]; ok && o != s {
				t.Fatalf("%q and %q have the same key", o, s)
			}
			mids[midKey(s)] = s
		}
	}
	if len(shorts) < 400 || len(mids) < 1000 {
		t.Fatalf("%d short and %d mid-length subjects: too few to tell", len(shorts), len(mids))
	}
}
