package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/exactlimit/ratelimit"
)

// check is one descriptor of a request, resolved.
type check struct {
	rule     *Rule // nil: no limit
	lim      *ratelimit.Limiter[string]
	subject  string
	metric   string
	hits     uint64
	replaced bool
	current  *rlsv3.RateLimitResponse_RateLimit // the rule's, or a descriptor's own limit
	refund   bool                               // is_negative_hits: hits go back (see refund)
	bucket   *bucket
	// own is the storage of bucket when this check is the first of the
	// request on its key (see buckets).
	own bucket
	// seen is the balance of the bucket this check was counted against,
	// after the checks before it in the request took their hits; fits
	// says whether its hits were there (see settle).
	seen int64
	fits bool
}

// bucket is one key of the request, with the checks that share it.
type bucket struct {
	key        string
	limit      ratelimit.Limit
	limits     []ratelimit.Limit // the Limiter's (see limitsOf), nil for rpu 0
	lim        *ratelimit.Limiter[string]
	subject    string
	cost       int64 // 0 peeks
	shadow     bool
	impossible bool // no bucket can ever hold the cost: rpu 0, or above capacity
	peeked     bool // decided by a look, not an acquire
	d          ratelimit.Decision
	charged    bool
	// left is what the checks counted so far left of the balance the
	// bucket had before the request, -1 once one did not fit (see settle).
	left int64
}

// limitsOf returns b's limits, read from its Limiter when first asked for:
// a bucket decided through its Limiter alone never needs them.
func (b *bucket) limitsOf() []ratelimit.Limit {
	if b.limits == nil && b.lim != nil {
		b.limits = b.lim.Limits()
	}
	return b.limits
}

// buckets appends to out the checks' buckets, one per key: descriptors
// that resolve to the same bucket add their hits. A check's bucket is kept
// in the first check on its key (check.own).
func (s *Service) buckets(checks []check, out []*bucket) []*bucket {
	for i := range checks {
		c := &checks[i]
		r := c.rule
		if r == nil || r.Unlimited || c.replaced || c.refund {
			continue
		}
		var key string
		switch {
		case c.lim != nil && len(checks) == 1:
			// One descriptor: decide through its Limiter (decide's
			// fast path), which builds no key on a store that takes
			// split keys.
		case c.lim != nil:
			key = c.lim.Key(c.subject)
		default:
			key = r.namespace + "\x00" + c.subject // rpu 0: never stored
		}
		var b *bucket
		for _, o := range out {
			if o.key == key {
				b = o
				break
			}
		}
		if b == nil {
			b = &c.own
			*b = bucket{key: key, lim: c.lim, subject: c.subject, limit: r.limit, shadow: r.ShadowMode}
			out = append(out, b)
		}
		c.bucket = b
		if r.RequestsPerUnit == 0 {
			b.impossible = b.impossible || c.hits > 0 // a look at rpu 0 is OK
			continue
		}
		if b.impossible {
			continue
		}
		if c.hits > uint64(r.Capacity) || uint64(b.cost)+c.hits > uint64(r.Capacity) {
			b.impossible = true
			continue
		}
		b.cost += int64(c.hits)
	}
	return out
}

// decide decides the buckets as one. A bucket in shadow mode never denies
// the others: when only shadow buckets lack their cost they are left out
// and the rest decided again. A bucket of cost 0 is only looked at and never
// denies the others. When an enforced bucket can never hold its cost, the
// request is over its limit and every bucket is only peeked, for the
// statuses.
func (s *Service) decide(ctx context.Context, buckets []*bucket) error {
	if len(buckets) == 0 {
		return nil
	}
	var now time.Time
	if s.clock != nil {
		now = s.clock()
	}
	if len(buckets) == 1 && !buckets[0].impossible {
		// One bucket: one Apply, no all-or-nothing to arrange.
		b := buckets[0]
		var err error
		switch {
		case b.lim == nil: // rpu 0, looked at: never a token, no store call
			b.d = ratelimit.Decision{}
		case b.cost == 0:
			b.peeked = true
			b.d, err = b.lim.Peek(ctx, b.subject)
		case s.observer != nil:
			// The observer's event names the key: it is built once,
			// here, and the store is given it whole. (Through
			// TryAcquireN, package fallback's wrapper of a Redis store
			// would join the key's parts, and observe would build the
			// key again.)
			var r ratelimit.Request
			if b.key, r, err = b.lim.Request(b.subject, b.cost); err == nil {
				b.d, err = s.store.Apply(ctx, b.key, r)
			}
		default:
			b.d, err = b.lim.TryAcquireN(ctx, b.subject, b.cost)
		}
		b.charged = err == nil && b.d.Allowed && b.cost > 0
		return err
	}
	active := make([]*bucket, 0, len(buckets))
	peekOnly := false
	for _, b := range buckets {
		if b.impossible && !b.shadow {
			peekOnly = true
		}
	}
	var peeks []*bucket
	for _, b := range buckets {
		switch {
		case peekOnly || b.impossible || b.cost == 0:
			// A look (hits 0) never denies the others: it is decided
			// apart, and only for its status.
			peeks = append(peeks, b)
		default:
			active = append(active, b)
		}
	}
	if len(peeks) > 0 {
		if err := s.run(ctx, peeks, now, true); err != nil {
			return err
		}
		for _, b := range peeks {
			b.peeked = true
			// A look says whether one token is there; the status says
			// whether the cost was.
			b.d.Allowed = b.d.Allowed && !b.impossible && b.d.Remaining >= max(b.cost, 1)
		}
	}
	for len(active) > 0 {
		if err := s.run(ctx, active, now, false); err != nil {
			return err
		}
		enforcedDenied, shadowDenied := false, false
		for _, b := range active {
			if !b.d.Allowed {
				if b.shadow {
					shadowDenied = true
				} else {
					enforcedDenied = true
				}
			}
		}
		if enforcedDenied || !shadowDenied {
			charged := !enforcedDenied
			for _, b := range active {
				b.charged = charged && b.cost > 0
			}
			return nil
		}
		kept := active[:0]
		for _, b := range active {
			if b.d.Allowed {
				kept = append(kept, b)
			}
		}
		active = kept
	}
	return nil
}

// run applies buckets through the store, all or nothing; peek asks for the
// standing only. A bucket with no limit (rpu 0) is denied without a store
// call.
func (s *Service) run(ctx context.Context, buckets []*bucket, now time.Time, peek bool) error {
	items := make([]ratelimit.BatchItem, 0, len(buckets))
	idx := make([]*bucket, 0, len(buckets))
	for _, b := range buckets {
		if b.limit == (ratelimit.Limit{}) {
			b.d = ratelimit.Decision{}
			continue
		}
		if b.key == "" {
			b.key = b.lim.Key(b.subject) // left for decide's fast path
		}
		r := ratelimit.Request{Limits: b.limitsOf(), Cost: b.cost, Peek: peek || b.cost == 0, Now: now}
		items = append(items, ratelimit.BatchItem{Key: b.key, Request: r})
		idx = append(idx, b)
	}
	if len(items) == 0 {
		return nil
	}
	if err := applyAll(ctx, s.store, items); err != nil {
		return err
	}
	for i, b := range idx {
		b.d = items[i].Decision
	}
	return nil
}

// settle counts each check against its bucket in request order, as the
// peer counts descriptors: a check fits when its hits are within what the
// bucket held before the request less the hits of the checks before it, and
// no check before it on the bucket failed. A look (hits 0) at an empty
// bucket fits. The request as a whole was decided by decide;
// settle only says which descriptors the statuses and metrics name.
func settle(checks []check, buckets []*bucket) {
	for _, b := range buckets {
		before := max(b.d.Remaining, 0)
		switch {
		case b.limit == (ratelimit.Limit{}):
			before = 0 // rpu 0: never a token
		case b.charged:
			before += b.cost
		}
		b.left = before
	}
	for i := range checks {
		c := &checks[i]
		b := c.bucket
		if b == nil {
			continue
		}
		c.seen = max(b.left, 0)
		c.fits = b.left >= 0 && c.hits <= uint64(b.left)
		if c.fits {
			b.left -= int64(c.hits)
		} else {
			b.left = -1 // overdrawn: every later check is over, a look too
		}
	}
}

// refund gives back the hits of each descriptor with is_negative_hits to its
// rule's bucket, after the other descriptors were decided (a request's refund
// does not admit its own hits), whatever they were decided: a refund is not
// a check, and its status is OK with the bucket's standing afterwards. The
// refund is capped at the bucket's capacity: never more than full. A refund
// to no bucket (no rule, an unlimited or replaced rule, requests_per_unit 0)
// does nothing, and one of 0 hits looks at the bucket.
func (s *Service) refund(ctx context.Context, checks []check) error {
	for i := range checks {
		c := &checks[i]
		if !c.refund || c.rule == nil || c.rule.Unlimited || c.replaced || c.lim == nil {
			continue
		}
		b := &bucket{key: c.lim.Key(c.subject), lim: c.lim, subject: c.subject, limit: c.rule.limit, shadow: c.rule.ShadowMode}
		c.bucket, c.fits = b, true
		var err error
		if c.hits == 0 {
			b.d, err = c.lim.Peek(ctx, c.subject)
		} else {
			rf, ok := s.store.(ratelimit.Refunder)
			if !ok {
				return fmt.Errorf("envoyrls: is_negative_hits needs a store that refunds: %w", errors.ErrUnsupported)
			}
			var r ratelimit.Request
			if _, r, err = c.lim.Request(c.subject, 1); err == nil {
				r.Cost = int64(min(c.hits, uint64(c.rule.limit.Capacity)))
				b.d, err = rf.Refund(ctx, b.key, r)
			}
		}
		if err != nil {
			return err
		}
		c.seen = b.d.Remaining
	}
	return nil
}

// observe tells the Observer about each bucket of a request, whose events
// are in namespace ns (ObservedNamespace of its domain), that decide decided
// (err nil) or could not decide, in latency.
func (s *Service) observe(ctx context.Context, ns string, buckets []*bucket, latency time.Duration, err error) {
	if s.observer == nil {
		return
	}
	for _, b := range buckets {
		if b.lim == nil {
			continue // requests_per_unit 0: no bucket
		}
		key := b.key
		if key == "" {
			key = b.lim.Key(b.subject)
		}
		if err != nil {
			op := "acquire"
			if b.cost == 0 {
				op = "peek"
			}
			s.observer.ObserveError(ctx, ratelimit.ErrorEvent{Namespace: ns, Key: key, Op: op, Cost: max(b.cost, 1), Err: err, Latency: latency})
			continue
		}
		e := ratelimit.DecisionEvent{Namespace: ns, Key: key, Cost: b.cost, Peek: b.peeked, Decision: b.d, Latency: latency}
		if b.peeked {
			e.Cost = 1
		} else {
			e.Decision.Allowed = b.charged
		}
		s.observer.ObserveDecision(ctx, e)
	}
}
