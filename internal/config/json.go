package config

import (
	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/units"
)

// PolicyJSON is the JSON form of a limit, and of a namespace's limits
// (Policy.JSON), as the service's API writes them: in a decision, in
// GET /v1/config and in the operator page's figures.
type PolicyJSON struct {
	Capacity     int64  `json:"capacity"`
	RefillTokens int64  `json:"refill_tokens"`
	RefillPeriod string `json:"refill_period"`
	// Tokens is a namespace's token_limit, in GET /v1/config and the
	// operator page's figures; nil elsewhere and without one.
	Tokens *PolicyJSON `json:"tokens,omitempty"`
}

// LimitJSON returns the JSON form of l.
func LimitJSON(l ratelimit.Limit) PolicyJSON {
	return PolicyJSON{Capacity: l.Capacity, RefillTokens: l.RefillTokens, RefillPeriod: units.Format(l.RefillPeriod)}
}

// JSON returns the JSON form of p: its rate_limit, with its token_limit as
// Tokens.
func (p Policy) JSON() PolicyJSON {
	out := LimitJSON(p.Requests)
	if p.HasTokens() {
		t := LimitJSON(p.Tokens)
		out.Tokens = &t
	}
	return out
}
