package ratelimit

import "time"

// State is a bucket as a store keeps it between checks. The zero State is a
// missing bucket, which is full.
type State struct {
	// Last is the time, in microseconds since the Unix epoch, up to which
	// the bucket has been refilled.
	Last int64
	// Bands holds one entry per limit of the policy that last wrote the
	// bucket, in the policy's order.
	Bands []Band
}

// Band is one limit's part of a bucket.
type Band struct {
	// Limit is the limit that wrote this band.
	Limit Limit
	// Level is the band's content in units of 1/P of a token, where P is
	// the limit's refill period in microseconds: Level/P whole tokens plus a
	// remainder of Level%P. It is between 0 and Capacity*P.
	Level int64
}

// Step is the token-bucket arithmetic, a pure function of the bucket's state,
// the request and the time now in microseconds since the Unix epoch: it
// updates *st and returns the Decision. Every store decides with it or with
// its twin, the Redis script, which gives the same result for every input.
// r must be valid (see Request.Validate); st must hold a state that Step
// produced.
//
// The rules, in order:
//
//   - A bucket that would be full by now under the limits that wrote it is
//     the same as a missing one, and a missing bucket is full.
//   - A clock behind the bucket's Last credits nothing: the check is decided
//     at Last and the difference is added to RetryAfter, ResetAfter and ttl.
//   - A band whose limit is in the request is refilled by the time elapsed,
//     exactly, capped at its capacity.
//   - A limit of the request that has no band (the policy changed) takes
//     over the first band that no limit of the request matched, in order,
//     and starts at the lesser of that band's whole tokens and its own
//     capacity, with no remainder and no refill for the time before the
//     change. With no such band left it starts at the bucket's fewest whole
//     tokens, capped the same way.
//   - The request is allowed when every band holds cost tokens (for a peek,
//     one); then, unless peeking, cost is taken from every band.
//
// ttl is how long the store should keep the new state: until the bucket would
// be full again, and at least a millisecond. write is false when nothing needs
// to be stored (a peek at a missing bucket).
func (st *State) Step(r Request, now int64) (d Decision, ttl time.Duration, write bool) {
	limits := r.Limits
	cost := r.Cost
	if r.Peek {
		cost = 1
	}
	exists := len(st.Bands) > 0
	t0, back := now, int64(0)
	if exists {
		if st.Last > now {
			t0, back = st.Last, st.Last-now
		} else if st.fullBy(now) {
			exists = false
		}
	}

	var levels [MaxLimits]int64
	if !exists {
		for i, l := range limits {
			levels[i] = l.Capacity * l.periodMicros()
		}
	} else {
		elapsed := t0 - st.Last
		fewest := int64(-1)
		for _, b := range st.Bands {
			if tok := b.Level / b.Limit.periodMicros(); fewest < 0 || tok < fewest {
				fewest = tok
			}
		}
		// First each limit takes the band it wrote, then each limit left
		// takes the next band left: a changed limit carries over the band it
		// replaces, at no more than its own capacity. A limit with no band
		// left takes the bucket's fewest whole tokens.
		var used [MaxLimits]bool
		var match [MaxLimits]int
		for i, l := range limits {
			match[i] = -1
			for k, b := range st.Bands {
				if !used[k] && b.Limit == l {
					match[i], used[k] = k, true
					break
				}
			}
		}
		next := 0
		for i, l := range limits {
			if match[i] >= 0 {
				levels[i] = refill(l, st.Bands[match[i]].Level, elapsed)
				continue
			}
			tok := fewest
			for next < len(st.Bands) && used[next] {
				next++
			}
			if next < len(st.Bands) {
				b := st.Bands[next]
				tok, used[next] = b.Level/b.Limit.periodMicros(), true
			}
			levels[i] = min(tok, l.Capacity) * l.periodMicros()
		}
	}

	allowed := true
	for i, l := range limits {
		if levels[i] < cost*l.periodMicros() {
			allowed = false
			break
		}
	}
	var bound int
	var retry, reset int64
	if allowed {
		d.Remaining = -1
		for i, l := range limits {
			p := l.periodMicros()
			if !r.Peek {
				levels[i] -= cost * p
			}
			if tok := levels[i] / p; d.Remaining < 0 || tok < d.Remaining {
				d.Remaining, bound = tok, i
			}
		}
	} else {
		retry = -1
		d.Remaining = -1
		for i, l := range limits {
			p := l.periodMicros()
			d.Remaining = minTokens(d.Remaining, levels[i]/p)
			if need := cost * p; levels[i] < need {
				if w := ceilDiv(need-levels[i], l.RefillTokens); w > retry {
					retry, bound = w, i
				}
			}
		}
		retry += back
	}
	for i, l := range limits {
		reset = max(reset, ceilDiv(l.Capacity*l.periodMicros()-levels[i], l.RefillTokens))
	}
	ttlMillis := max(1, ceilDiv(reset, 1000)+ceilDiv(back, 1000))
	reset += back

	d.Allowed = allowed
	d.RetryAfter = time.Duration(retry) * time.Microsecond
	d.ResetAfter = time.Duration(reset) * time.Microsecond
	d.Limit = limits[bound]

	write = exists || !r.Peek
	if write {
		if cap(st.Bands) < len(limits) {
			st.Bands = make([]Band, len(limits))
		}
		st.Bands = st.Bands[:len(limits)]
		for i, l := range limits {
			st.Bands[i] = Band{Limit: l, Level: levels[i]}
		}
		st.Last = t0
	}
	return d, time.Duration(ttlMillis) * time.Millisecond, write
}

// fullBy reports whether every band would be full at now (not before Last).
func (st *State) fullBy(now int64) bool {
	elapsed := now - st.Last
	for _, b := range st.Bands {
		l := b.Limit
		if elapsed < ceilDiv(l.Capacity*l.periodMicros()-b.Level, l.RefillTokens) {
			return false
		}
	}
	return true
}

// refill returns level after elapsed microseconds at l's rate, capped at
// capacity. It never forms a product above the capacity, so it stays exact.
func refill(l Limit, level, elapsed int64) int64 {
	full := l.Capacity * l.periodMicros()
	missing := full - level
	if missing <= 0 || elapsed >= ceilDiv(missing, l.RefillTokens) {
		return full
	}
	return level + elapsed*l.RefillTokens
}

// ceilDiv returns ⌈a/b⌉ for a >= 0 and b >= 1 (and 0 for a <= 0).
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

func minTokens(cur, tok int64) int64 {
	if cur < 0 || tok < cur {
		return tok
	}
	return cur
}
