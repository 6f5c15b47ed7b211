package ratelimit

import (
	"context"
	"fmt"
	"time"
)

// Store keeps token buckets by key and decides checks against them. Package
// memstore keeps them in this process and package redisstore in Redis; a
// Store may also wrap another, as package fallback does.
//
// A Store must be safe for simultaneous use by multiple goroutines, and must
// not retain key or r.Limits after a call returns.
type Store interface {
	// Apply brings the bucket at key up to date and decides r against it, in
	// one atomic step: when r.Peek is false and every limit's bucket holds
	// r.Cost tokens, it takes them; otherwise it takes nothing. A missing
	// bucket is full. The result is the same as Step's.
	Apply(ctx context.Context, key string, r Request) (Decision, error)
	// Reset deletes the bucket at key, so that its next check starts full.
	Reset(ctx context.Context, key string) error
}

// Request is one check as a Store receives it.
type Request struct {
	// Limits is the policy: one Limit, or several that must all admit the
	// request (a check takes Cost from each of them or from none).
	Limits []Limit
	// Cost is the number of tokens to take. Peek ignores it.
	Cost int64
	// Peek asks for the standing without consuming: Allowed while at least
	// one token is there, else Denied with the wait until one is.
	Peek bool
	// Now is the time of the check. The zero Time means the store's own
	// clock (for Redis, the server's TIME).
	Now time.Time
}

// Validate reports whether a store can decide r: its limits are valid, Cost
// is between 1 and every limit's capacity (unless Peek), and Now, when set, is
// between the Unix epoch and MaxTime (2^52 µs after it). The error wraps
// ErrInvalidArgument.
func (r Request) Validate() error {
	if err := validateLimits(r.Limits); err != nil {
		return err
	}
	if !r.Peek {
		if err := validateCost(r.Limits, r.Cost); err != nil {
			return err
		}
	}
	if !r.Now.IsZero() {
		if _, err := Micros(r.Now); err != nil {
			return err
		}
	}
	return nil
}

// Micros converts t to whole microseconds since the Unix epoch, the time unit
// of the bucket arithmetic. It fails, wrapping ErrInvalidArgument, for a time
// before the epoch or more than 2^52 microseconds (about 142 years) after it;
// for the zero time.Time the error says that it is the zero time, which is a
// programming error (an unset time), not a time from a clock.
func Micros(t time.Time) (int64, error) {
	if t.IsZero() {
		return 0, invalid("time is the zero time.Time: pass the time of the check, such as time.Now()")
	}
	us := t.UnixMicro()
	if us < 0 || us > MaxTime {
		return 0, invalid("time must be between the Unix epoch and 2^52 µs after it (got %v)", t)
	}
	return us, nil
}

// BatchStore is a Store that can decide many checks in one round trip.
// Limiter.TryAcquireMany uses it when the store has it, and calls Apply once
// per item otherwise.
type BatchStore interface {
	Store
	// ApplyBatch decides every item as Apply would, filling in its Decision
	// or Err. The items are independent decisions, not a transaction: some
	// may be decided while others fail.
	ApplyBatch(ctx context.Context, items []BatchItem)
}

// BatchItem is one check of a batch: its key and request in, its decision or
// error out.
type BatchItem struct {
	Key      string
	Request  Request
	Decision Decision
	Err      error
}

// SplitKeyStore is a Store that can take a key in two parts, prefix and
// subject, sparing the Limiter the allocation of joining them. It must decide
// exactly as Apply(ctx, prefix+subject, r) would. memstore has it.
type SplitKeyStore interface {
	Store
	ApplySplit(ctx context.Context, prefix, subject string, r Request) (Decision, error)
}

// AtomicStore is a Store that can decide checks on several keys as one, all
// or nothing: a request limited by several buckets at once (per client and
// per route, say) is charged by all of them or by none.
type AtomicStore interface {
	Store
	// ApplyAll decides items together, atomically with respect to every
	// other call on the same keys. When every item's bucket holds its cost,
	// each cost is taken and every Decision is Allowed. Otherwise nothing is
	// taken from any bucket; each Decision then reports its own bucket
	// (Allowed when that bucket alone held its cost, with Remaining the
	// untouched balance), and at least one is not Allowed. A peek item takes
	// nothing either way and is Allowed while one token is there. Each item
	// must be valid (see Request.Validate) and have a distinct key. The
	// error means nothing was decided and nothing taken; item Errs are not
	// used.
	ApplyAll(ctx context.Context, items []BatchItem) error
}

// ValidateAll reports whether an AtomicStore can decide items as one: each
// request is valid (see Request.Validate), no key is empty, all are decided
// at the same time (equal Now), and no key appears twice. The error wraps ErrInvalidArgument
// and names the item. It allocates nothing for up to 16 items.
func ValidateAll(items []BatchItem) error {
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
