package memstore

import (
	"math"
	"slices"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// policyKey is a policy in comparable form: its limits, zero beyond n, and
// its quotas, zero beyond nq.
type policyKey struct {
	n, nq int
	l     [tokenbucket.MaxLimits]ratelimit.Limit
	q     [tokenbucket.MaxLimits]ratelimit.Quota
}

// policy is a validated policy, kept once per store and shared by the
// buckets it wrote.
type policy struct {
	key    policyKey
	limits []ratelimit.Limit // key.l[:key.n]
	quotas []ratelimit.Quota // key.q[:key.nq], nil without
	minCap int64
	one    bool   // a policy of one limit and no quota
	low    lowest // its first limit in lowest terms
	shards int    // shards that refer to it; guarded by Store.polMu
}

// polRef is a policy some of a shard's buckets were written by.
type polRef struct {
	p    *policy
	refs int // buckets of the shard written by p
}

// policyIn returns the store's copy of limits and quotas, or nil when they
// are not a valid policy. sh, locked, remembers the latest one.
func (s *Store) policyIn(sh *shard, limits []ratelimit.Limit, quotas []ratelimit.Quota) *policy {
	if p := sh.recent; p != nil && slices.Equal(p.limits, limits) && slices.Equal(p.quotas, quotas) {
		return p
	}
	var p *policy
	if i, ok := sh.find(limits, quotas); ok {
		p = sh.pols[i].p
	} else if p = s.policyFor(limits, quotas); p == nil {
		return nil
	}
	sh.recent = p
	return p
}

// find returns the index in sh.pols of the policy of limits and quotas, if
// the shard has it. It looks in the shard alone, under its lock, and
// touches no memory another shard writes.
func (sh *shard) find(limits []ratelimit.Limit, quotas []ratelimit.Quota) (uint32, bool) {
	if len(limits) == 1 && len(quotas) == 0 {
		i, ok := sh.one[limits[0]]
		return i, ok
	}
	k, ok := keyOfPolicy(limits, quotas)
	if !ok {
		return 0, false
	}
	i, ok := sh.many[k]
	return i, ok
}

// keyOfPolicy returns the policyKey of limits and quotas, or false when
// they are more than a policy holds.
func keyOfPolicy(limits []ratelimit.Limit, quotas []ratelimit.Quota) (policyKey, bool) {
	if len(limits) == 0 || len(limits)+len(quotas) > tokenbucket.MaxLimits {
		return policyKey{}, false
	}
	k := policyKey{n: len(limits), nq: len(quotas)}
	copy(k.l[:], limits)
	copy(k.q[:], quotas)
	return k, true
}

// policyFor returns the store's copy of limits, or nil when they are not a
// valid policy. The policy stays in the store's index while a shard refers
// to it; a policy found but not yet referred to may be dropped from the index
// meanwhile, and is then still good to use.
func (s *Store) policyFor(limits []ratelimit.Limit, quotas []ratelimit.Quota) *policy {
	k, ok := keyOfPolicy(limits, quotas)
	if !ok {
		return nil
	}
	s.polMu.RLock()
	p := s.policies[k]
	s.polMu.RUnlock()
	if p != nil {
		return p
	}
	if (ratelimit.Request{Limits: limits, Quotas: quotas, Peek: true}).Validate() != nil {
		return nil
	}
	s.polMu.Lock()
	defer s.polMu.Unlock()
	if p := s.policies[k]; p != nil {
		return p
	}
	p = &policy{key: k, minCap: math.MaxInt64}
	p.limits = p.key.l[:k.n:k.n]
	if k.nq > 0 {
		p.quotas = p.key.q[:k.nq:k.nq]
	}
	for _, l := range p.limits {
		p.minCap = min(p.minCap, l.Capacity)
	}
	for _, q := range p.quotas {
		p.minCap = min(p.minCap, q.Allowance)
	}
	p.one, p.low = len(p.limits) == 1 && len(p.quotas) == 0, lowestOf(p.limits[0])
	s.policies[k] = p
	s.polPeak = max(s.polPeak, len(s.policies))
	if len(s.policies) > s.pruneAt {
		// Policies looked up but never written with (peeks at missing
		// buckets, say) are dropped once the index has doubled: a constant
		// amortized cost per new policy.
		s.prune(p)
		s.pruneAt = 2*len(s.policies) + 64
	}
	return p
}

// prune drops from the index the policies no shard refers to, but keep.
// s.polMu must be held.
func (s *Store) prune(keep *policy) {
	for k, p := range s.policies {
		if p.shards == 0 && p != keep {
			delete(s.policies, k)
		}
	}
	s.shrinkPolicies()
}

// shrinkPolicies copies the index into a smaller map once it holds less
// than a quarter of its most: a Go map never gives back its memory by itself.
// s.polMu must be held.
func (s *Store) shrinkPolicies() { s.policies, s.polPeak = shrunk(s.policies, s.polPeak) }

// ref counts one more bucket of sh written by p and returns p's index in
// sh.pols.
func (s *Store) ref(sh *shard, p *policy) uint32 {
	if i, ok := sh.find(p.limits, p.quotas); ok {
		// p itself, or an equal policy made after p left the index.
		sh.pols[i].refs++
		return i
	}
	s.polMu.Lock()
	p.shards++
	if s.policies[p.key] == nil {
		// Dropped from the index meanwhile (its last bucket elsewhere went):
		// it is in use again.
		s.policies[p.key] = p
		s.polPeak = max(s.polPeak, len(s.policies))
	}
	s.polMu.Unlock()
	var i uint32
	if n := len(sh.free); n > 0 {
		i, sh.free = sh.free[n-1], sh.free[:n-1]
	} else {
		i = uint32(len(sh.pols))
		sh.pols = append(sh.pols, polRef{})
	}
	sh.pols[i] = polRef{p: p, refs: 1}
	if p.one {
		sh.one[p.limits[0]] = i
	} else {
		sh.many[p.key] = i
	}
	return i
}

// unref counts one bucket of sh fewer written by the policy at index i, and
// lets the policy go once no bucket of the store uses it.
func (s *Store) unref(sh *shard, i uint32) {
	ref := &sh.pols[i]
	if ref.refs--; ref.refs > 0 {
		return
	}
	p := ref.p
	*ref = polRef{}
	if p.one {
		delete(sh.one, p.limits[0])
	} else {
		delete(sh.many, p.key)
	}
	sh.free = append(sh.free, i)
	if len(sh.free) == len(sh.pols) {
		sh.pols, sh.free = sh.pols[:0], sh.free[:0]
		if cap(sh.pols) > 64 {
			// Give back the memory of the policies the shard held.
			sh.pols, sh.free = nil, nil
			sh.one = make(map[ratelimit.Limit]uint32)
			sh.many = make(map[policyKey]uint32)
		}
	}
	if sh.recent == p {
		sh.recent = nil
	}
	s.polMu.Lock()
	if p.shards--; p.shards == 0 && s.policies[p.key] == p {
		delete(s.policies, p.key)
		s.shrinkPolicies()
	}
	s.polMu.Unlock()
}
