package ratelimit_test

import (
	"context"
	"sync/atomic"

	"github.com/exactlimit/ratelimit"
)

// failingStore is a Store whose every call fails with Err: a store that
// cannot be reached.
type failingStore struct{ Err error }

// Apply returns f.Err.
func (f failingStore) Apply(context.Context, string, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, f.Err
}

// Reset returns f.Err.
func (f failingStore) Reset(context.Context, string) error { return f.Err }

// countingStore wraps a Store and counts the calls that reach it. It hides
// the wrapped store's optional methods, as a plain Store.
type countingStore struct {
	ratelimit.Store
	Applies atomic.Int64
	Resets  atomic.Int64
}

// Apply counts the call and passes it on.
func (c *countingStore) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	c.Applies.Add(1)
	return c.Store.Apply(ctx, key, r)
}

// Reset counts the call and passes it on.
func (c *countingStore) Reset(ctx context.Context, key string) error {
	c.Resets.Add(1)
	return c.Store.Reset(ctx, key)
}
