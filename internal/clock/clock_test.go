package clock

import (
	"context"
	"testing"
	"time"
)

func TestBound(t *testing.T) {
	soon, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		d      time.Duration
		same   bool // Bound returns ctx itself
		within bool
	}{
		{"no bound", context.Background(), 0, true, false},
		{"a negative bound", context.Background(), -time.Second, true, false},
		{"no deadline of its own", context.Background(), time.Minute, false, false},
		{"its deadline first", soon, time.Hour, true, true},
		{"the bound first", soon, time.Second, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Within(tc.ctx, tc.d); got != tc.within {
				t.Errorf("Within = %v, want %v", got, tc.within)
			}
			ctx, cancel := Bound(tc.ctx, tc.d)
			defer cancel()
			if (ctx == tc.ctx) != tc.same {
				t.Fatalf("Bound returned ctx itself: %v, want %v", ctx == tc.ctx, tc.same)
			}
			if tc.same {
				return
			}
			dl, ok := ctx.Deadline()
			if left := time.Until(dl); !ok || left > tc.d || left <= 0 {
				t.Errorf("deadline in %v (set: %v), want within %v", left, ok, tc.d)
			}
			cancel()
			if ctx.Err() == nil {
				t.Error("cancel left the bound context running")
			}
		})
	}
}
