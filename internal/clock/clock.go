// Package clock holds the one real sleep the library's waiting code uses,
// so that every package injects the same thing in tests.
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
