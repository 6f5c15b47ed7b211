// Package obslabel is what the metric observers (promobserver,
// otelobserver) share: the label values of a decision and an error, and a
// per-namespace cache of the series a decision updates, built once per
// namespace so that an event costs no label lookup.
package obslabel

import (
	"context"
	"errors"
	"sync"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// Ops and Results are the label values of a decision's operation (by
// whether it peeked) and result (by whether it was allowed).
var (
	Ops     = [2]string{"acquire", "peek"}
	Results = [2]string{"denied", "allowed"}
)

// Sources is the number of ratelimit.Source values whose series are built
// once per namespace; another value is looked up on each event.
const Sources = int(ratelimit.SourceLease) + 1

// Reason returns the reason label of an error: "invalid_argument",
// "corrupt_state", "canceled", "deadline" or "store".
func Reason(err error) string {
	switch {
	case errors.Is(err, ratelimit.ErrInvalidArgument):
		return "invalid_argument"
	case errors.Is(err, tokenbucket.ErrCorruptState):
		return "corrupt_state"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	return "store"
}

// Series are one namespace's series: C a counter's, H a histogram's.
type Series[C, H any] struct {
	Decisions [2][2][Sources]C // [peek][allowed][source]
	Tokens    [2]C             // [allowed]
	Duration  [Sources]H       // [source]
}

// Builders make the series of a namespace from their label values.
type Builders[C, H any] struct {
	Decision func(ns, op, result, source string) C
	Tokens   func(ns, result string) C
	Duration func(ns, source string) H
}

// Cache holds each namespace's Series, built on first use. The zero Cache
// is not usable: set B. It is safe for simultaneous use.
type Cache[C, H any] struct {
	B Builders[C, H]
	m sync.Map // namespace -> *Series[C, H]
}

// Get returns ns's series.
func (c *Cache[C, H]) Get(ns string) *Series[C, H] {
	if s, ok := c.m.Load(ns); ok {
		return s.(*Series[C, H])
	}
	s := &Series[C, H]{}
	for peek := range 2 {
		for allowed := range 2 {
			for src := range Sources {
				s.Decisions[peek][allowed][src] = c.B.Decision(ns, Ops[peek], Results[allowed], ratelimit.Source(src).String())
			}
		}
	}
	for allowed := range 2 {
		s.Tokens[allowed] = c.B.Tokens(ns, Results[allowed])
	}
	for src := range Sources {
		s.Duration[src] = c.B.Duration(ns, ratelimit.Source(src).String())
	}
	actual, _ := c.m.LoadOrStore(ns, s)
	return actual.(*Series[C, H])
}

// Observe returns the series a decision updates: its decision counter, its
// tokens counter (ok false for a peek, which asks for none) and its
// duration histogram.
func (c *Cache[C, H]) Observe(e ratelimit.DecisionEvent) (decision C, tokens C, ok bool, duration H) {
	peek, allowed := index(e.Peek), index(e.Decision.Allowed)
	s := c.Get(e.Namespace)
	if src := int(e.Decision.Source); src < Sources {
		decision, duration = s.Decisions[peek][allowed][src], s.Duration[src]
	} else {
		name := e.Decision.Source.String()
		decision, duration = c.B.Decision(e.Namespace, Ops[peek], Results[allowed], name), c.B.Duration(e.Namespace, name)
	}
	return decision, s.Tokens[allowed], !e.Peek, duration
}

func index(b bool) int {
	if b {
		return 1
	}
	return 0
}
