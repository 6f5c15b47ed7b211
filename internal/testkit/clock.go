package testkit

import (
	"context"
	"sync"
	"time"
)

// Start is the time the tests' clocks start at.
var Start = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// Clock is a settable clock for ratelimit.WithClock and the like. It is
// safe for simultaneous use by multiple goroutines.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock that reads t until moved.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Add moves the clock by d, backwards when d is negative.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Sleeper is a sleep function for ratelimit.WithSleep and the like that
// does not sleep: Sleep records each duration and, when Clock is set,
// advances Clock by it. Before, when set, runs first and may end the sleep
// with its error. Set the fields before the first Sleep; Sleep and Slept
// are safe for simultaneous use.
type Sleeper struct {
	Clock  *Clock
	Before func(ctx context.Context) error

	mu    sync.Mutex
	slept []time.Duration
}

// Sleep records d and advances Clock by it, after Before.
func (s *Sleeper) Sleep(ctx context.Context, d time.Duration) error {
	if s.Before != nil {
		if err := s.Before(ctx); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.slept = append(s.slept, d)
	s.mu.Unlock()
	if s.Clock != nil {
		s.Clock.Add(d)
	}
	return nil
}

// Slept returns the durations of the sleeps so far, in order.
func (s *Sleeper) Slept() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.slept...)
}
