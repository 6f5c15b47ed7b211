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
}

// fields are the body's fields: "namespace", "subject" and "cost".
func (r *APIRequest) fields() []field {
	return []field{{"namespace", &r.Namespace}, {"subject", &r.Subject}, {"cost", &r.Cost}}
}

// Decision is the JSON form of a ratelimit.Decision.
type Decision struct {
	Allowed   bool   `json:"allowed"`
	Namespace string `json:"namespace"`
	// Subject is absent from a settle's answer: the token names it.
	Subject string `json:"subject,omitempty"`
	Cost    int64  `json:"cost,omitempty"`
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

// NewDecision returns the JSON form of d for subject in namespace ns.
func NewDecision(ns, subject string, cost int64, d ratelimit.Decision) Decision {
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
