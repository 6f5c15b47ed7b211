package storetest

import (
	"context"
	"sync/atomic"

	"github.com/exactlimit/ratelimit"
)

// Funcs is a Store made of functions, for tests that need a store to answer
// one way. A nil ApplyFunc admits every check with the zero Decision's other
// fields; a nil ResetFunc returns nil.
type Funcs struct {
	ApplyFunc func(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error)
	ResetFunc func(ctx context.Context, key string) error
}

// Apply calls f.ApplyFunc.
func (f Funcs) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if f.ApplyFunc == nil {
		return ratelimit.Decision{Allowed: true}, nil
	}
	return f.ApplyFunc(ctx, key, r)
}

// Reset calls f.ResetFunc.
func (f Funcs) Reset(ctx context.Context, key string) error {
	if f.ResetFunc == nil {
		return nil
	}
	return f.ResetFunc(ctx, key)
}

// Failing is a Store whose every call fails with Err: a store that cannot
// be reached.
type Failing struct{ Err error }

// Apply returns f.Err.
func (f Failing) Apply(context.Context, string, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, f.Err
}

// Reset returns f.Err.
func (f Failing) Reset(context.Context, string) error { return f.Err }

// Counting wraps a Store and counts the calls that reach it. It hides the
// wrapped store's optional methods, as a plain Store.
type Counting struct {
	ratelimit.Store
	Applies atomic.Int64
	Resets  atomic.Int64
}

// Apply counts the call and passes it on.
func (c *Counting) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	c.Applies.Add(1)
	return c.Store.Apply(ctx, key, r)
}

// Reset counts the call and passes it on.
func (c *Counting) Reset(ctx context.Context, key string) error {
	c.Resets.Add(1)
	return c.Store.Reset(ctx, key)
}
