// Package clock holds the library's few uses of real time: the one real
// sleep its waiting code uses, so that every package injects the same thing
// in tests, and the bound of a call by a timeout.
package clock

import (
	"context"
	"time"
)

// Sleep waits for d, or until ctx ends, and then returns ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Bound returns ctx bounded by d from now, with its cancel function; or ctx
// itself, with a cancel that does nothing, when d <= 0 or when ctx's own
// deadline comes within d, so that no timer is set that could never fire
// first (a gRPC call's deadline, say, is usually the sooner).
func Bound(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 || Within(ctx, d) {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// Within reports whether ctx ends within d from now: a timer of d on it
// would never fire first.
func Within(ctx context.Context, d time.Duration) bool {
	dl, ok := ctx.Deadline()
	return ok && time.Until(dl) <= d
}
