package ratelimit

import (
	"context"
	"errors"
	"time"

	"github.com/exactlimit/ratelimit/internal/arith"
)

// Store keeps token buckets by key and decides checks against them. Package
// memstore keeps them in this process and package redisstore in Redis; a
// Store may also wrap another, as package fallback does.
//
// A store's whole contract is this interface, the Request it decides, the
// optional capabilities a store may add, each found by a type assertion
// (BatchStore, Reserver, Refunder, Pinger, Assigner), and two errors: a Store
// validates what it is given and refuses what is invalid, before touching
// any bucket, with an error wrapping ErrInvalidArgument; a store that could
// not be reached or did not answer in time returns an error wrapping
// ErrUnavailable.
//
// A Store must be safe for simultaneous use by multiple goroutines, and must
// not retain key or r.Limits after a call returns. Package storetest is the
// behaviour suite a Store passes; a store written elsewhere runs it from its
// tests.
type Store interface {
	// Apply brings the bucket at key up to date and decides r against it, in
	// one atomic step: when r.Peek is false and every limit's bucket holds
	// its cost (r.Cost, or its own of r.Costs), it takes them; otherwise it
	// takes nothing. A missing bucket is full. The result is the one
	// tokenbucket's State.Step gives. An invalid r (see Request.Validate) is
	// refused with an error wrapping ErrInvalidArgument.
	Apply(ctx context.Context, key string, r Request) (Decision, error)
	// Reset deletes the bucket at key, so that its next check starts full.
	Reset(ctx context.Context, key string) error
}

// ErrUnavailable is wrapped by the error of a store that could not be
// reached or did not answer in time: a refused, reset or lost connection, a
// network timeout, a server that says it cannot serve the key right now. The
// store did not decide, though a call it sent may have been applied, its
// reply lost. A store wraps it around the failures it recognises (redisstore
// around go-redis's), and package fallback marks a store down on it, and
// wraps it around the answer of its ReturnError behaviour. An answer that
// would be the same again (an invalid argument, a corrupt bucket, a refused
// credential) does not wrap it, nor does the caller's own cancellation.
var ErrUnavailable = errors.New("ratelimit: store unavailable")

// Request is one check as a Store receives it.
type Request struct {
	// Limits is the policy: one Limit, or several that must all admit the
	// request (a check takes Cost from each of them or from none).
	Limits []Limit
	// Quotas are the policy's calendar quotas (see Quota), decided with
	// its limits: the request is admitted only when each of their current
	// windows has its cost left as well.
	Quotas []Quota
	// Cost is the number of tokens to take from every limit and quota.
	// Peek ignores it.
	Cost int64
	// Costs, when not nil, gives each limit its own cost, in the order of
	// Limits and then of Quotas, in place of Cost: a check of a
	// requests-per-minute and a tokens-per-minute limit takes 1 from the
	// first and the tokens from the second, all or nothing. Peek ignores
	// it.
	Costs []int64
	// Peek asks for the standing without consuming: Allowed while at least
	// one token is there, else Denied with the wait until one is.
	Peek bool
	// Now is the time of the check. The zero Time means the store's own
	// clock (for Redis, the server's TIME).
	Now time.Time

	policy *policy // the Limiter's, which made the request: see Validate
}

// Validate reports whether a store can decide r: its limits and quotas are
// valid (at most 8 in all, and at least one limit), Cost is between 1 and
// every limit's capacity and every quota's allowance (or, with Costs, each
// cost between 1 and its own limit's capacity or quota's allowance) unless
// Peek, and Now, when set, is
// between the Unix epoch and MaxTime (2^52 µs after it). The error wraps
// ErrInvalidArgument.
//
// A Request made by a Limiter carries its policy, which New validated once:
// while Limits still equal that policy, Validate does not check its rules
// again, only the cost and the time. So a request passed through several
// stores (package fallback, then its primary) is not validated at each.
func (r Request) Validate() error {
	if !r.policy.holds(r.Limits, r.Quotas) {
		if err := validatePolicy(r.Limits, r.Quotas); err != nil {
			return err
		}
	}
	switch {
	case r.Peek:
	case r.Costs != nil:
		if err := validateCosts(r.Limits, r.Quotas, r.Costs); err != nil {
			return err
		}
	default:
		if err := validateCost(r.Limits, r.Quotas, r.Cost); err != nil {
			return err
		}
	}
	if !r.Now.IsZero() {
		if _, rule := arith.Micros(r.Now); rule != "" {
			return invalid("%s", rule)
		}
	}
	return nil
}

// BatchStore is a Store that can decide many checks in one call. It is the
// one optional capability of a Store: Limiter.TryAcquireMany uses ApplyBatch
// when the store has it (and calls Apply once per item otherwise), and
// services that charge one request to several buckets use ApplyAll. A store
// that wraps another should have both methods when the store it wraps does,
// and pass them through.
type BatchStore interface {
	Store
	// ApplyBatch decides every item as Apply would, filling in its Decision
	// or Err. The items are independent decisions, not a transaction: some
	// may be decided while others fail. Items on one key are decided in
	// order, each seeing what the ones before it took.
	ApplyBatch(ctx context.Context, items []BatchItem)
	// ApplyAll decides items together, all or nothing: a request limited by
	// several buckets at once (per client and per route, say) is charged by
	// all of them or by none. When every item's bucket holds its cost, each
	// cost is taken and every Decision is Allowed. Otherwise nothing is
	// taken from any bucket; each Decision then reports its own bucket
	// (Allowed when that bucket alone held its cost, with Remaining the
	// untouched balance), and at least one is not Allowed. A peek item
	// takes nothing either way and is Allowed while one token is there.
	// Each item must be valid (see Request.Validate), have a distinct key,
	// and be decided at the same time (equal Now). An error returned before
	// the store was asked (an invalid item, a done context) means nothing
	// was decided and nothing taken; one that meets the store's failure or
	// the caller's deadline after the items were sent may follow a decision
	// that was made, as with Apply. Item Errs are not used.
	//
	// What is atomic is the store's to say. memstore and Redis on one
	// server decide all the keys in one step, atomically with respect to
	// every other call on them; so does Redis Cluster when every key hashes
	// to one slot. redisstore's doc says what happens across slots.
	ApplyAll(ctx context.Context, items []BatchItem) error
}

// BatchItem is one check of a batch: its key and request in, its decision or
// error out.
type BatchItem struct {
	Key      string
	Request  Request
	Decision Decision
	Err      error
}

// Reserver is a Store that holds reservations (see Limiter.Reserve):
// memstore, redisstore and package fallback are Reservers.
//
// Reserve decides r against the bucket at key as Apply does and, when it is
// allowed, records reservation id for ttl, beside the bucket: what each limit
// took (tokenbucket's Held), and key. An id names one reservation of the
// store, whatever its bucket: Limiter.Reserve makes 128 random bits and the
// bucket's Redis Cluster slot, so that a store on Cluster can keep the record
// in the bucket's slot, under a key made of the slot and the id alone.
//
// Settle settles reservation id on r's limits with actual, the tokens each
// used (tokenbucket's State.Settle), reading and deleting the record in the
// same atomic step, so that of any number of settles of one reservation, from
// any processes, one finds it. key is the bucket's key, whose reservation id
// must be (a record of another bucket is not found); or, for a settle that
// knows only the id (Limiter.Settle, by token), a namespace's prefix alone
// ("3:api:", the key of the empty subject) or "" for any namespace: the store
// then settles the bucket the record names, when its key starts with key, in
// the same atomic step. Without such a record it changes nothing, and its
// error wraps ErrNotReserved beside the bucket's standing (a zero Decision
// when key is a prefix).
//
// Both check their arguments first, and refuse invalid ones with an error
// wrapping ErrInvalidArgument: Reserve that r is valid and not a peek, id is
// not empty and ttl is at least a millisecond (tokenbucket's
// ValidateReserve); Settle that id is not empty, r's limits and time are
// valid, and actual has one count per limit, each between 0 and 2^53
// (tokenbucket's ValidateSettle).
type Reserver interface {
	Store
	Reserve(ctx context.Context, key, id string, r Request, ttl time.Duration) (Decision, error)
	Settle(ctx context.Context, key, id string, r Request, actual []int64) (Decision, error)
}

// Refunder is a Store that can give a cost back without a reservation, for
// a protocol that refunds so (Envoy's negative hits): memstore, redisstore
// and package fallback are Refunders. Refund gives r's cost (or costs) back
// to the bucket at key, capped at each limit's capacity, as the settle of a
// reservation of that cost that used nothing would (tokenbucket's
// State.Refund). It refuses a peek, or an invalid r, with an error wrapping
// ErrInvalidArgument (tokenbucket's ValidateRefund).
type Refunder interface {
	Store
	Refund(ctx context.Context, key string, r Request) (Decision, error)
}

// Pinger is a Store that can tell whether it can be reached without deciding
// anything or touching a bucket (for Redis, a PING): redisstore is a Pinger.
// Package fallback's probe pings a primary that is one, and otherwise peeks
// at a key no Limiter uses. Ping returns nil when the store answered within
// ctx.
type Pinger interface {
	Store
	Ping(ctx context.Context) error
}

// Assigner is a Store that keeps each subject's assignment (see Plans): a
// short string per subject of a namespace, with a log of its changes, so
// that every process sharing the store learns of a change by asking for the
// changes since the last ones it saw. memstore, redisstore and package
// fallback are Assigners. The store does not read assignments when it
// decides a check: a Plans reads them and chooses the policy it sends.
//
// A store that wraps another is an Assigner when the store it wraps is, and
// otherwise returns an error wrapping errors.ErrUnsupported. Each method
// refuses an empty namespace (and Assign and Assigned an empty subject) with
// an error wrapping ErrInvalidArgument before touching the store; a store
// that could not be reached returns an error wrapping ErrUnavailable.
type Assigner interface {
	Store
	// Assign sets subject's assignment in namespace to value, or removes it
	// when value is "", and records the change in the namespace's log, in
	// one atomic step; it returns the value it replaced ("" when none). A
	// value equal to the one held changes nothing and logs nothing.
	Assign(ctx context.Context, namespace, subject, value string) (old string, err error)
	// Assigned returns subject's assignment in namespace, "" when none.
	Assigned(ctx context.Context, namespace, subject string) (string, error)
	// AssignmentsSince returns what changed in namespace's assignments
	// after cursor, as subject → value ("" for a removal; of several
	// changes of one subject, the last), and the cursor to pass next.
	// When cursor is "", was not given by this store for namespace, or
	// names a change the log no longer keeps (a bounded log, or a store
	// that lost its data), full is true and changes is the whole set of
	// assignments: the caller replaces its view rather than applying
	// changes. A full listing of a namespace without assignments may
	// return the cursor "", so that the next call lists again.
	AssignmentsSince(ctx context.Context, namespace, cursor string) (changes map[string]string, next string, full bool, err error)
}
