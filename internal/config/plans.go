package config

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/exactlimit/ratelimit"
)

// Plan is a plan of the file's plans: its name and its limits (a Policy
// without plans of its own).
type Plan struct {
	Name   string
	Policy Policy
}

// OwnPolicy returns the Policy of a subject's policy of its own (a
// ratelimit.Assignment of limits and quotas, which a Go program assigns),
// as a Limiter of it has them: its first limit as the rate_limit, its
// second as the token_limit when it has two, and its quotas, each counting
// requests.
func OwnPolicy(limits []ratelimit.Limit, quotas []ratelimit.Quota) Policy {
	var p Policy
	if len(limits) > 0 {
		p.Requests = limits[0]
	}
	if len(limits) == 2 {
		p.Tokens = limits[1]
	}
	for _, q := range quotas {
		p.Quotas = append(p.Quotas, Quota{Quota: q})
	}
	return p
}

// HasPlans reports whether p is a namespace of plans.
func (p Policy) HasPlans() bool { return len(p.Plans) > 0 }

// Plan returns the Policy of the plan named name that p offers; ok is
// false when p offers none of that name.
func (p Policy) Plan(name string) (pol Policy, ok bool) {
	for _, pl := range p.Plans {
		if pl.Name == name {
			return pl.Policy, true
		}
	}
	return Policy{}, false
}

// PlanNames returns the names of the plans p offers, in order, joined by
// ", ": for errors that name the plans on offer.
func (p Policy) PlanNames() string {
	names := make([]string, len(p.Plans))
	for i, pl := range p.Plans {
		names[i] = pl.Name
	}
	return strings.Join(names, ", ")
}

// LibraryPlans returns p's plans as ratelimit.NewPlans takes them.
func (p Policy) LibraryPlans() []ratelimit.Plan {
	out := make([]ratelimit.Plan, len(p.Plans))
	for i, pl := range p.Plans {
		out[i] = ratelimit.Plan{Name: pl.Name, Limits: pl.Policy.Limits(), Quotas: pl.Policy.LimiterQuotas()}
	}
	return out
}

type plan struct {
	Name   string `yaml:"name"`
	limits `yaml:",inline"`
}

// parsePlans returns the policy of each of the file's plans, by name. A
// plan's name and policy are checked by ratelimit.NewPlans, the library's
// one rule; a name given twice is an error.
func parsePlans(plans []plan) (map[string]Policy, error) {
	out := make(map[string]Policy, len(plans))
	for i, pl := range plans {
		if _, ok := out[pl.Name]; ok {
			return nil, fmt.Errorf("plans[%d]: plan %q is defined twice", i, pl.Name)
		}
		pol, err := pl.policy()
		if err != nil {
			return nil, fmt.Errorf("plans[%d] (%q): %w", i, pl.Name, err)
		}
		lib := Policy{Plans: []Plan{{Name: pl.Name, Policy: pol}}}
		if _, err := ratelimit.NewPlans[string](noStore{}, lib.LibraryPlans(), pl.Name); err != nil {
			return nil, fmt.Errorf("plans[%d].name: %s", i, strings.TrimPrefix(err.Error(), ratelimit.ErrInvalidArgument.Error()+": "))
		}
		out[pl.Name] = pol
	}
	return out, nil
}

// noStore is the Store of the Plans that parsePlans checks a plan with: it
// is never called (NewPlans makes no store call, and starts no watcher on a
// store that is not a ratelimit.Assigner).
type noStore struct{}

func (noStore) Apply(context.Context, string, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, errors.ErrUnsupported
}

func (noStore) Reset(context.Context, string) error { return errors.ErrUnsupported }

// definedNames lists the names of the file's plans, "none" when there are
// none.
func definedNames(plans []plan) string {
	if len(plans) == 0 {
		return "none: define them under plans:"
	}
	names := make([]string, len(plans))
	for i, pl := range plans {
		names[i] = pl.Name
	}
	return strings.Join(names, ", ")
}
