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
	// Quotas are a namespace's quotas, where Tokens may be.
	Quotas []QuotaJSON `json:"quotas,omitempty"`
	// Plans are a namespace's plans, where Tokens may be: the fields
	// above are then its default plan's (DefaultPlan), the limits of a
	// subject without an assignment. TrustPlan is its trust_plan.
	Plans       []PlanJSON `json:"plans,omitempty"`
	DefaultPlan string     `json:"default_plan,omitempty"`
	TrustPlan   bool       `json:"trust_plan,omitempty"`
}

// PlanJSON is the JSON form of a plan: its name and its limits.
type PlanJSON struct {
	Name string `json:"name"`
	PolicyJSON
}

// QuotaJSON is the JSON form of a namespace's quota, in the fields of its
// YAML: start is absent for the calendar's windows.
type QuotaJSON struct {
	Period    string `json:"period"`
	Allowance int64  `json:"allowance"`
	TimeZone  string `json:"time_zone"`
	Start     string `json:"start,omitempty"`
	Counts    string `json:"counts"`
}

// LimitJSON returns the JSON form of l.
func LimitJSON(l ratelimit.Limit) PolicyJSON {
	return PolicyJSON{Capacity: l.Capacity, RefillTokens: l.RefillTokens, RefillPeriod: units.Format(l.RefillPeriod)}
}

// JSON returns the JSON form of p: its rate_limit, with its token_limit as
// Tokens; for a namespace of plans, its default plan's, with the plans.
func (p Policy) JSON() PolicyJSON {
	if p.HasPlans() {
		def, _ := p.Plan(p.DefaultPlan)
		out := def.JSON()
		for _, pl := range p.Plans {
			out.Plans = append(out.Plans, PlanJSON{Name: pl.Name, PolicyJSON: pl.Policy.JSON()})
		}
		out.DefaultPlan, out.TrustPlan = p.DefaultPlan, p.TrustPlan
		return out
	}
	out := LimitJSON(p.Requests)
	if p.HasTokens() {
		t := LimitJSON(p.Tokens)
		out.Tokens = &t
	}
	for _, q := range p.Quotas {
		loc := q.Start.Location()
		j := QuotaJSON{Period: q.Period.String(), Allowance: q.Allowance, TimeZone: loc.String(), Counts: "requests"}
		if q.Start != ratelimit.CalendarQuota(q.Allowance, q.Period, loc).Start {
			j.Start = q.Start.In(loc).Format("2006-01-02T15:04:05")
		}
		if q.Tokens {
			j.Counts = "tokens"
		}
		out.Quotas = append(out.Quotas, j)
	}
	return out
}
