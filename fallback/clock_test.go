package fallback

import (
	"testing"
	"time"
)

func TestDefaultClockAdvancesByTheMonotonicClock(t *testing.T) {
	before := time.Now()
	clock := monotonicClock()
	a := clock()
	b := clock()
	after := time.Now()
	if b.Before(a) {
		t.Fatalf("the clock went back: %v then %v", a, b)
	}
	// The reading is start + monotonic elapsed: its wall time lies between
	// the wall times read around it (no system clock step happens here).
	if a.Before(before.Round(0)) || b.After(after.Round(0).Add(time.Millisecond)) {
		t.Fatalf("readings %v, %v outside [%v, %v]", a, b, before, after)
	}
}
