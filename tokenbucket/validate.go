package tokenbucket

import (
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
)

// ValidateAll starts a ratelimit.BatchStore's ApplyAll: it clears each
// item's Decision and Err, the outputs ApplyAll fills in, and reports whether
// the items can be decided as one: each request is valid (see
// ratelimit.Request.Validate), no key is empty, all are decided at the same
// time (equal Now), and no key appears twice. The error wraps
// ratelimit.ErrInvalidArgument and names the item. It allocates nothing for
// up to 16 items.
func ValidateAll(items []ratelimit.BatchItem) error {
	for i := range items {
		items[i].Decision, items[i].Err = ratelimit.Decision{}, nil
	}
	for i := range items {
		r := &items[i].Request
		if err := r.Validate(); err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
		if items[i].Key == "" {
			return invalid("item %d: key must not be empty", i)
		}
		if !r.Now.Equal(items[0].Request.Now) {
			return invalid("item %d: every item must be decided at the same time", i)
		}
	}
	if len(items) <= 16 {
		for i := range items {
			for j := i + 1; j < len(items); j++ {
				if items[i].Key == items[j].Key {
					return invalid("items %d and %d have the same key", i, j)
				}
			}
		}
		return nil
	}
	seen := make(map[string]int, len(items))
	for j, it := range items {
		if i, ok := seen[it.Key]; ok {
			return invalid("items %d and %d have the same key", i, j)
		}
		seen[it.Key] = j
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ratelimit.ErrInvalidArgument}, args...)...)
}

// ValidateReserve reports whether a store can reserve r as reservation id
// for ttl: r is valid and not a peek, id is not empty, and ttl is at least a
// millisecond. The error wraps ratelimit.ErrInvalidArgument.
func ValidateReserve(id string, r ratelimit.Request, ttl time.Duration) error {
	switch {
	case r.Peek:
		return invalid("a reservation cannot be a peek")
	case id == "":
		return invalid("reservation id must not be empty")
	case ttl < time.Millisecond:
		return invalid("reservation lifetime must be at least 1ms (got %v)", ttl)
	}
	return r.Validate()
}

// ValidateSettle reports whether a store can settle reservation id on r's
// limits and quotas with actual, the tokens used: r's policy and time are
// valid, id is not empty, and actual has one count per limit and quota,
// each between 0 and MaxExact. The error wraps ratelimit.ErrInvalidArgument.
func ValidateSettle(id string, r ratelimit.Request, actual []int64) error {
	if id == "" {
		return invalid("reservation id must not be empty")
	}
	if len(actual) != len(r.Limits)+len(r.Quotas) {
		if len(r.Quotas) == 0 {
			return invalid("settle must give the tokens used of each limit (got %d for %d limits)", len(actual), len(r.Limits))
		}
		return invalid("settle must give the tokens used of each limit and quota (got %d for %d limits and %d quotas)", len(actual), len(r.Limits), len(r.Quotas))
	}
	for i, a := range actual {
		if a < 0 || a > MaxExact {
			return invalid("tokens used of limit %d must be between 0 and 2^53 (got %d)", i, a)
		}
	}
	r.Cost, r.Costs, r.Peek = 0, nil, true
	return r.Validate()
}

// ValidateRefund reports whether a store can give r's cost back: r is valid
// and not a peek. The error wraps ratelimit.ErrInvalidArgument.
func ValidateRefund(r ratelimit.Request) error {
	if r.Peek {
		return invalid("a refund cannot be a peek")
	}
	return r.Validate()
}

// Refund gives r's cost (or costs) back to the bucket at now, capped at each
// limit's capacity, and to each quota's current window: Settle of a
// reservation of that cost, taken in the current windows, that used nothing.
func (st *State) Refund(r ratelimit.Request, now int64) (d ratelimit.Decision, ttl time.Duration, write bool) {
	return st.Settle(r, Held(r, max(now, st.Last)), make([]int64, len(r.Limits)+len(r.Quotas)), now)
}
