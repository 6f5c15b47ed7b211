package ratelimit

import "time"

// Decision is the outcome of a check: an ordinary value for both an admitted
// and a denied request, never an error.
type Decision struct {
	// Allowed reports whether the request was admitted and its cost taken.
	Allowed bool
	// Remaining is the number of whole tokens left after the check. A denial
	// consumes nothing, so it reports the untouched balance. With several
	// limits, or quotas, it is the smallest balance among them.
	Remaining int64
	// RetryAfter is the wait until the bucket holds the requested cost
	// (for Peek, one token), and every quota's window has it left (for a
	// quota that has not, the wait until its window ends). It is zero when
	// the request was allowed.
	RetryAfter time.Duration
	// ResetAfter is the wait until the bucket is full again, and every
	// quota that has used anything has started a new window.
	ResetAfter time.Duration
	// Limit is the limit that bound the decision: the one that denied it, or,
	// when allowed, the one with the fewest tokens left. With a single limit
	// it is that limit. When a quota bound the decision it is the zero
	// Limit, and Binding says which quota.
	Limit Limit
	// Standings holds the standing of each limit and quota of a policy of
	// more than one (several limits, or quotas): one per limit, in the
	// policy's order, then one per quota. It is nil for a policy of one
	// limit, whose standing is Remaining and ResetAfter.
	Standings []Standing
	// Binding is the index, in the order of Standings, of the limit or
	// quota that bound the decision (see Limit): 0 for a policy of one
	// limit.
	Binding int
	// Source tells what made the decision: the store, a local bucket during
	// an outage, an outage behaviour, the denial cache or a lease. The zero
	// value, SourceStore, is the store the limiter was built on.
	Source Source
	// Converted reports that the bucket had been written by another policy
	// and this check converted it to its own (see tokenbucket's State.Step): a rolling deploy
	// that changes the policy does this once per subject, but two limiters
	// with different policies on one namespace do it on every check, and
	// their subjects get the smaller of the two allowances. Give each policy
	// its own namespace.
	Converted bool
}

// Enforced reports whether the decision was made against a token bucket: the
// store's, a local fallback's or a denial cache's. A decision made by an outage
// policy that admits or denies without a bucket is not enforced.
func (d Decision) Enforced() bool {
	return d.Source != SourceFailOpen && d.Source != SourceFailClosed
}

// Source tells what made a Decision.
type Source uint8

const (
	// SourceStore: the store the limiter was built on decided, against the
	// shared bucket when that store is shared.
	SourceStore Source = iota
	// SourceLocal: a process-local bucket decided because the shared store
	// was unreachable.
	SourceLocal
	// SourceFailOpen: the store was unreachable and the request was admitted
	// without a check.
	SourceFailOpen
	// SourceFailClosed: the store was unreachable and the request was denied
	// without a check.
	SourceFailClosed
	// SourceCache: a local cache of recent denials denied the request without
	// asking the store.
	SourceCache
	// SourceLease: this process admitted or denied the request from its
	// lease of the subject's tokens, without asking the store (see
	// WithLeases).
	SourceLease
)

// String returns the source's name: "store", "local", "fail-open",
// "fail-closed", "cache" or "lease".
func (s Source) String() string {
	switch s {
	case SourceStore:
		return "store"
	case SourceLocal:
		return "local"
	case SourceFailOpen:
		return "fail-open"
	case SourceFailClosed:
		return "fail-closed"
	case SourceCache:
		return "cache"
	case SourceLease:
		return "lease"
	}
	return "unknown"
}
