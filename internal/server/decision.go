package server

import (
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/config"
)

// APIRequest is the body of POST /v1/acquire, /v1/peek and /v1/reset; its
// fields' JSON names are those of fields.
type APIRequest struct {
	// Namespace names the policy; empty means config.DefaultNamespace.
	Namespace string
	// Subject is whose bucket to use: a user, an API key, an IP address.
	Subject string
	// Cost is the tokens acquire takes (default 1), from each of the
	// namespace's limits. When set it must be 1 up to the namespace's
	// capacity (the smaller one, with a token_limit) for every operation;
	// peek and reset ignore its value.
	Cost *int64
	// Plan, in a namespace of plans that trusts it (trust_plan), is the
	// plan the check is decided under instead of the subject's
	// assignment; elsewhere it must be empty.
	Plan string
}

// fields are the body's fields: "namespace", "subject", "cost" and "plan".
func (r *APIRequest) fields() []field {
	return []field{{"namespace", &r.Namespace}, {"subject", &r.Subject}, {"cost", &r.Cost}, {"plan", &r.Plan}}
}

// Decision is the JSON form of a ratelimit.Decision.
type Decision struct {
	Allowed   bool   `json:"allowed"`
	Namespace string `json:"namespace"`
	// Subject is absent from a settle's answer: the token names it.
	Subject string `json:"subject,omitempty"`
	// Plan is, in a namespace of plans, the plan the decision was made
	// under; absent elsewhere, and for a subject with a policy of its own.
	Plan string `json:"plan,omitempty"`
	Cost int64  `json:"cost,omitempty"`
	// Remaining is the whole tokens left after the check.
	Remaining int64 `json:"remaining"`
	// Limit is the capacity of the policy that bound the decision.
	Limit int64 `json:"limit"`
	// RetryAfterMs is the wait until the cost is available, rounded up to
	// milliseconds; 0 when allowed.
	RetryAfterMs int64 `json:"retry_after_ms"`
	// ResetAfterMs is the wait until the bucket is full, rounded up.
	ResetAfterMs int64 `json:"reset_after_ms"`
	// Source is what decided: "store", "local", "fail-open",
	// "fail-closed" or "cache".
	Source string             `json:"source"`
	Policy *config.PolicyJSON `json:"policy,omitempty"`
	// Limits is the standing of each limit and quota of the namespace, in
	// the order of its rate_limit, token_limit and quotas; absent from a
	// decision that was not enforced.
	Limits []Standing `json:"limits,omitempty"`
	// Costs is a reserve's estimate when it gives one cost per limit.
	Costs []int64 `json:"costs,omitempty"`
	// Token is the reservation of an allowed /v1/reserve, to settle, and
	// TTLMs its lifetime in milliseconds.
	Token string `json:"token,omitempty"`
	TTLMs int64  `json:"ttl_ms,omitempty"`
	// Error is set when the decision was not enforced and the request was
	// denied: the store could not be reached.
	Error string `json:"error,omitempty"`
}

// Standing is the JSON form of one limit's or quota's standing after a
// decision.
type Standing struct {
	// Kind is "rate_limit", "token_limit" or "quota".
	Kind string `json:"kind"`
	// Limit is the limit's capacity, or the quota's allowance.
	Limit int64 `json:"limit"`
	// Remaining is the whole tokens left: of a quota, its allowance less
	// what its window used.
	Remaining int64 `json:"remaining"`
	// ResetAfterMs is the wait until the limit's bucket is full, or until
	// the quota's window ends, rounded up to the millisecond.
	ResetAfterMs int64 `json:"reset_after_ms"`
	// Period, TimeZone and Counts describe a quota: its period (day,
	// week, month or year), its time zone, and what it counts (requests
	// or tokens).
	Period   string `json:"period,omitempty"`
	TimeZone string `json:"time_zone,omitempty"`
	Counts   string `json:"counts,omitempty"`
}

// standings returns the JSON form of the standing of each limit and quota
// of pol after d: d.Standings, or for a policy of one limit d's own
// figures. A decision that was not enforced has none.
func standings(pol config.Policy, d ratelimit.Decision) []Standing {
	if !d.Enforced() {
		return nil
	}
	limits := pol.Limits()
	n := len(limits) + len(pol.Quotas)
	if n == 1 || len(d.Standings) != n {
		if n > 1 {
			return nil // a decision of the denial cache or a lease: the bound one alone is known
		}
		return []Standing{{Kind: "rate_limit", Limit: limits[0].Capacity, Remaining: max(d.Remaining, 0), ResetAfterMs: ceilMillis(d.ResetAfter)}}
	}
	out := make([]Standing, n)
	for i, st := range d.Standings {
		out[i] = Standing{Remaining: max(st.Remaining, 0), ResetAfterMs: ceilMillis(st.ResetAfter)}
		switch {
		case i == 0:
			out[i].Kind, out[i].Limit = "rate_limit", limits[0].Capacity
		case i < len(limits):
			out[i].Kind, out[i].Limit = "token_limit", limits[i].Capacity
		default:
			q := pol.Quotas[i-len(limits)]
			out[i].Kind, out[i].Limit, out[i].Period, out[i].TimeZone = "quota", q.Allowance, q.Period.String(), q.Start.Location().String()
			out[i].Counts = "requests"
			if q.Tokens {
				out[i].Counts = "tokens"
			}
		}
	}
	return out
}

// NewDecision returns the JSON form of d for subject in namespace ns, of
// policy pol.
func NewDecision(ns, subject string, cost int64, d ratelimit.Decision, pol config.Policy) Decision {
	out := Decision{
		Allowed:      d.Allowed,
		Namespace:    ns,
		Subject:      subject,
		Cost:         cost,
		Remaining:    max(d.Remaining, 0),
		Limit:        d.Limit.Capacity,
		RetryAfterMs: ceilMillis(d.RetryAfter),
		ResetAfterMs: ceilMillis(d.ResetAfter),
		Source:       d.Source.String(),
		Limits:       standings(pol, d),
	}
	if d.Binding >= len(pol.Limits()) {
		// A quota bound the decision: Limit is its allowance.
		out.Limit = pol.Quotas[d.Binding-len(pol.Limits())].Allowance
	}
	if d.Limit.Validate() == nil {
		p := config.LimitJSON(d.Limit)
		out.Policy = &p
	}
	return out
}

func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
