package tokenbucket

import (
	"fmt"

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
