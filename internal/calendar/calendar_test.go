package calendar

import (
	"sync"
	"testing"
	"time"
)

// TestMemoIsAPureFunction: Window gives what compute gives, for anchors
// that take turns in the memo's slots and from goroutines at once (run
// with -race), at times on both sides of each window's edges.
func TestMemoIsAPureFunction(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	var anchors []time.Time
	for i := range 600 { // more anchors than slots
		anchors = append(anchors, time.Date(2026, 1, 1+i%31, i%24, 0, 0, 0, paris))
	}
	base := time.Date(2027, 3, 27, 0, 0, 0, 0, time.UTC).UnixMicro() // around a daylight-saving change
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, a := range anchors {
				period := uint8(1 + (i+g)%4)
				for _, t0 := range []int64{base, base + 3_600_000_000*int64(g+1), base + 86_400_000_000*int64(i%40)} {
					s, e := Window(period, a, t0)
					ws, we := compute(period, a, a.Location(), t0)
					if s != ws || e != we || s > t0 || t0 >= e {
						t.Errorf("Window(%d, %v, %d) = [%d, %d), compute [%d, %d)", period, a, t0, s, e, ws, we)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}
