package tokenbucket

import (
	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/calendar"
)

// loadQuotas is load's part for the quotas, once t0 is known: each quota's
// window at t0, and what the quota band of that window used (the first not
// taken, in order), or nothing. A bucket that load found missing (full, and
// no quota band in use) has used nothing.
func (b *bucket) loadQuotas(st *State, quotas []ratelimit.Quota) {
	b.quotas = quotas
	var taken [MaxLimits]bool
	for j, q := range quotas {
		s, e := calendar.Window(uint8(q.Period), q.Start, b.t0)
		b.windows[j] = [2]int64{s, e}
		b.used[j] = 0
		for k, qb := range st.Quotas {
			if !taken[k] && qb.Start == s && qb.End == e {
				taken[k], b.used[j] = true, qb.Used
				break
			}
		}
	}
}

// quotaHolds reports whether quota j's window has need tokens left.
func (b *bucket) quotaHolds(j int, need int64) bool {
	return need <= b.quotas[j].Allowance-b.used[j]
}

// quotaLive reports whether a quota band has used something in a window
// that holds t: a bucket with one is not the same as a missing one.
func quotaLive(qs []QuotaBand, t int64) bool {
	for _, qb := range qs {
		if qb.Used > 0 && qb.Start <= t && t < qb.End {
			return true
		}
	}
	return false
}
