// Package config reads the policies of the ratelimit service from YAML, in
// the shape users of Envoy's ratelimit service know:
//
//	namespaces:
//	  - name: default
//	    rate_limit: {unit: second, requests_per_unit: 10}
//	  - name: login
//	    rate_limit:
//	      unit: minute
//	      requests_per_unit: 5
//	      burst: 10
//
// Each namespace has a token-bucket limit of requests: requests_per_unit
// tokens are added every unit (second, minute, hour, day, week, month of 30
// days or year of 365 days, as envoyproxy/ratelimit counts them), and the
// bucket holds burst tokens (default requests_per_unit; when set, at least
// 1). A namespace may add a token_limit, of tokens_per_unit per unit with
// its own burst, for work measured in tokens (a language model's):
//
//   - name: chat
//     rate_limit: {unit: minute, requests_per_unit: 60}
//     token_limit: {unit: minute, tokens_per_unit: 90000}
//
// Its two limits are one policy on one bucket per subject, decided as one
// (ratelimit.NewMulti): a request takes one request and its tokens, or
// nothing. A namespace may add calendar quotas (ratelimit.Quota), decided
// with its limits:
//
//   - name: api
//     rate_limit: {unit: second, requests_per_unit: 10}
//     quotas:
//   - {period: month, allowance: 100000, time_zone: Europe/Paris}
//   - {period: day, allowance: 5000, start: "2026-01-01T09:00"}
//
// A quota's period is day, week, month or year; its time_zone an IANA name
// (default UTC); its start, a local date and time in that zone
// ("2006-01-02T15:04" or with seconds), anchors its windows (a month from
// the 15th at 09:00: "2026-01-15T09:00"; by default the calendar's: days
// from midnight, weeks from Monday, months from the 1st). A quota counts
// requests, or, with counts: tokens in a namespace with a token_limit, the
// tokens.
//
// A file may define plans, each a name and the limit keys a namespace
// takes, and a namespace may offer some of them instead of limits of its
// own (see ratelimit.Plans): each subject is checked under its plan, the
// one assigned to it or default_plan, and with trust_plan: true under the
// plan a request names:
//
//	plans:
//	  - name: free
//	    rate_limit: {unit: minute, requests_per_unit: 3}
//	  - name: pro
//	    rate_limit: {unit: minute, requests_per_unit: 50}
//	namespaces:
//	  - name: api
//	    plans: [free, pro]
//	    default_plan: free
//
// A plan defined and offered by no namespace is allowed. The
// namespace "default" is always there: a file may change its limit, and without a file it allows 10 per
// second per subject, bursting to 10. A file must define at least one
// namespace: an empty one is refused, so that a truncated file reloaded on
// SIGHUP cannot remove every namespace. Unknown fields, duplicate names and
// limits the library cannot enforce exactly are errors that name the
// namespace and the field.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/units"
	"go.yaml.in/yaml/v3"
)

// DefaultNamespace is the namespace of requests that name none.
const DefaultNamespace = "default"

// DefaultLimit is the limit of DefaultNamespace unless a file sets another:
// 10 per second per subject, bursting to 10.
var DefaultLimit = ratelimit.PerSecond(10)

// Policies maps namespace names to their limits. It always holds
// DefaultNamespace.
type Policies map[string]Policy

// Policy is the limits of a namespace: its rate_limit, its token_limit
// when it has one, and its quotas; or, for a namespace of plans, the plans
// it offers (then Requests, Tokens and Quotas are zero: each subject is
// checked under its plan's Policy, see Plan).
type Policy struct {
	// Requests is the rate_limit.
	Requests ratelimit.Limit
	// Tokens is the token_limit; the zero Limit when there is none.
	Tokens ratelimit.Limit
	// Quotas are the quotas, in the file's order.
	Quotas []Quota
	// Plans are the plans the namespace offers (its plans:), in the
	// file's order; nil for a namespace of limits of its own.
	Plans []Plan
	// DefaultPlan names the plan of a subject without an assignment (its
	// default_plan:), one of Plans.
	DefaultPlan string
	// TrustPlan is the namespace's trust_plan: a request may name the
	// plan it is checked under, rather than the subject's assignment.
	TrustPlan bool
}

// Options returns the Limiter options of p beyond its limits: its quotas.
func (p Policy) Options() []ratelimit.Option {
	if len(p.Quotas) == 0 {
		return nil
	}
	return []ratelimit.Option{ratelimit.WithQuotas(p.LimiterQuotas()...)}
}

// Costs returns the costs, one per limit and quota in the order of a
// Limiter of p, of a request of requests requests and tokens tokens: a
// limit or quota that counts tokens takes tokens, the others requests. It
// returns nil for a policy of one limit (the cost is then requests).
func (p Policy) Costs(requests, tokens int64) []int64 {
	if !p.HasTokens() && len(p.Quotas) == 0 {
		return nil
	}
	costs := []int64{requests}
	if p.HasTokens() {
		costs = append(costs, tokens)
	}
	for _, q := range p.Quotas {
		if q.Tokens {
			costs = append(costs, tokens)
		} else {
			costs = append(costs, requests)
		}
	}
	return costs
}

// HasTokens reports whether p has a token_limit.
func (p Policy) HasTokens() bool { return p.Tokens != ratelimit.Limit{} }

// Limits returns p's limits in the order a Limiter of p takes costs in:
// requests, then tokens when p has a token_limit.
func (p Policy) Limits() []ratelimit.Limit {
	if p.HasTokens() {
		return []ratelimit.Limit{p.Requests, p.Tokens}
	}
	return []ratelimit.Limit{p.Requests}
}

// MaxCost is the largest cost that every limit and quota of p can hold: a
// check of more could never be allowed.
func (p Policy) MaxCost() int64 {
	most := p.Requests.Capacity
	if p.HasTokens() {
		most = min(most, p.Tokens.Capacity)
	}
	for _, q := range p.Quotas {
		most = min(most, q.Allowance)
	}
	return most
}

// String describes p, "capacity 60, refill 60 per 1m", followed by
// " and tokens: capacity 90000, refill 90000 per 1m" when p has a
// token_limit, and each quota (" and 100000 a month in Europe/Paris"); a
// namespace of plans as "plans free (capacity 3, refill 3 per 1m), pro
// (...), default free", and ", trust_plan" when it trusts requests' plans.
func (p Policy) String() string {
	if p.HasPlans() {
		var b strings.Builder
		b.WriteString("plans ")
		for i, pl := range p.Plans {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s (%v)", pl.Name, pl.Policy)
		}
		b.WriteString(", default " + p.DefaultPlan)
		if p.TrustPlan {
			b.WriteString(", trust_plan")
		}
		return b.String()
	}
	s := p.Requests.String()
	if p.HasTokens() {
		s = fmt.Sprintf("%v and tokens: %v", p.Requests, p.Tokens)
	}
	for _, q := range p.Quotas {
		s += " and " + q.String()
		if q.Tokens {
			s += " of tokens"
		}
	}
	return s
}

// Equal reports whether p and o are the same policy.
func (p Policy) Equal(o Policy) bool {
	return p.Requests == o.Requests && p.Tokens == o.Tokens && slices.Equal(p.Quotas, o.Quotas) &&
		p.DefaultPlan == o.DefaultPlan && p.TrustPlan == o.TrustPlan &&
		slices.EqualFunc(p.Plans, o.Plans, func(a, b Plan) bool { return a.Name == b.Name && a.Policy.Equal(b.Policy) })
}

// Default returns the built-in policies: DefaultNamespace with DefaultLimit.
func Default() Policies { return Policies{DefaultNamespace: {Requests: DefaultLimit}} }

// Names returns the namespaces in sorted order.
func (p Policies) Names() []string {
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// String lists the namespaces with their limits, "default: capacity 10,
// refill 10 per 1s; login: capacity 10, refill 5 per 1m", for log lines.
func (p Policies) String() string {
	var b strings.Builder
	for i, n := range p.Names() {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %v", n, p[n])
	}
	return b.String()
}

type file struct {
	Plans      []plan      `yaml:"plans"`
	Namespaces []namespace `yaml:"namespaces"`
}

// limits are the limit keys of a namespace and of a plan.
type limits struct {
	RateLimit  *rateLimit  `yaml:"rate_limit"`
	TokenLimit *tokenLimit `yaml:"token_limit"`
	Quotas     []quota     `yaml:"quotas"`
}

type namespace struct {
	Name        string `yaml:"name"`
	limits      `yaml:",inline"`
	Plans       []string `yaml:"plans"`
	DefaultPlan string   `yaml:"default_plan"`
	TrustPlan   bool     `yaml:"trust_plan"`
}

type rateLimit struct {
	Unit            string `yaml:"unit"`
	RequestsPerUnit int64  `yaml:"requests_per_unit"`
	Burst           *int64 `yaml:"burst"`
}

type tokenLimit struct {
	Unit          string `yaml:"unit"`
	TokensPerUnit int64  `yaml:"tokens_per_unit"`
	Burst         *int64 `yaml:"burst"`
}

// Load reads and parses the file at path. The error starts with the path.
func Load(path string) (Policies, error) {
	data, err := units.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// Parse parses a config document. A document that defines no namespace
// (an empty file among them) is an error, as is any YAML or field error;
// the messages name the YAML fields, never Go types.
func Parse(data []byte) (Policies, error) {
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, errors.New(plainYAMLError(err))
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one YAML document")
	}
	if len(f.Namespaces) == 0 {
		// An empty or truncated file would otherwise leave only the
		// default namespace, and every other one would answer 404.
		return nil, errors.New("the file defines no namespace: list them under namespaces:")
	}
	plans, err := parsePlans(f.Plans)
	if err != nil {
		return nil, err
	}
	p := Default()
	seen := map[string]bool{}
	for i, ns := range f.Namespaces {
		if err := CheckName(ns.Name); err != nil {
			return nil, fmt.Errorf("namespaces[%d]: %w", i, err)
		}
		if seen[ns.Name] {
			return nil, fmt.Errorf("namespace %q is defined twice", ns.Name)
		}
		seen[ns.Name] = true
		pol, err := ns.policy(f.Plans, plans)
		if err != nil {
			return nil, fmt.Errorf("namespace %q: %w", ns.Name, err)
		}
		p[ns.Name] = pol
	}
	return p, nil
}

// policy is the namespace's Policy: its limits, or the plans it offers
// among defined (the file's plans, in order, and their policies by name).
func (ns namespace) policy(defined []plan, plans map[string]Policy) (Policy, error) {
	if ns.Plans == nil {
		switch {
		case ns.DefaultPlan != "":
			return Policy{}, errors.New("default_plan needs plans: the plans the namespace offers")
		case ns.TrustPlan:
			return Policy{}, errors.New("trust_plan needs plans: the plans the namespace offers")
		}
		return ns.limits.policy()
	}
	switch {
	case ns.RateLimit != nil:
		return Policy{}, errors.New("rate_limit: a namespace with plans has no limits of its own (its plans' apply); remove rate_limit or plans")
	case ns.TokenLimit != nil:
		return Policy{}, errors.New("token_limit: a namespace with plans has no limits of its own (its plans' apply); remove token_limit or plans")
	case ns.Quotas != nil:
		return Policy{}, errors.New("quotas: a namespace with plans has no limits of its own (its plans' apply); remove quotas or plans")
	case len(ns.Plans) == 0:
		return Policy{}, errors.New("plans is empty: list the plans the namespace offers, or remove plans")
	}
	p := Policy{TrustPlan: ns.TrustPlan}
	for i, name := range ns.Plans {
		pol, ok := plans[name]
		if !ok {
			return Policy{}, fmt.Errorf("plans[%d]: unknown plan %q (the plans defined: %s)", i, name, definedNames(defined))
		}
		if _, twice := p.Plan(name); twice {
			return Policy{}, fmt.Errorf("plans[%d]: plan %q is listed twice", i, name)
		}
		p.Plans = append(p.Plans, Plan{Name: name, Policy: pol})
	}
	switch _, ok := p.Plan(ns.DefaultPlan); {
	case ns.DefaultPlan == "":
		return Policy{}, fmt.Errorf("default_plan is missing: name the plan of a subject without an assignment, one of %s", p.PlanNames())
	case !ok:
		return Policy{}, fmt.Errorf("default_plan %q is not one of the namespace's plans (%s)", ns.DefaultPlan, p.PlanNames())
	}
	p.DefaultPlan = ns.DefaultPlan
	return p, nil
}

// policy is the Policy of the limit keys l: a namespace's or a plan's.
func (l limits) policy() (Policy, error) {
	rl := l.RateLimit
	if rl == nil {
		return Policy{}, errors.New("rate_limit is missing")
	}
	req, err := limitOf("rate_limit", rl.Unit, "requests_per_unit", rl.RequestsPerUnit, rl.Burst)
	if err != nil {
		return Policy{}, err
	}
	p := Policy{Requests: req}
	if tl := l.TokenLimit; tl != nil {
		if p.Tokens, err = limitOf("token_limit", tl.Unit, "tokens_per_unit", tl.TokensPerUnit, tl.Burst); err != nil {
			return Policy{}, err
		}
	}
	for i, q := range l.Quotas {
		c, err := q.quota(p.HasTokens())
		if err != nil {
			return Policy{}, fmt.Errorf("quotas[%d].%w", i, err)
		}
		p.Quotas = append(p.Quotas, c)
	}
	limits := 1 + len(p.Quotas)
	if p.HasTokens() {
		limits++
	}
	if limits > 8 {
		return Policy{}, fmt.Errorf("quotas: a namespace combines at most 8 limits and quotas (got %d)", limits)
	}
	return p, nil
}

// limitOf is the limit of perUnit per unit bursting to burst (default
// perUnit), the fields of the block named field.
func limitOf(field, unit, perName string, perUnit int64, burst *int64) (ratelimit.Limit, error) {
	per, ok := units.Parse(unit)
	if !ok {
		return ratelimit.Limit{}, fmt.Errorf("%s.unit %q: want %s", field, unit, units.Names)
	}
	if perUnit < 1 {
		return ratelimit.Limit{}, fmt.Errorf("%s.%s must be at least 1 (got %d)", field, perName, perUnit)
	}
	capacity := perUnit
	if burst != nil {
		if capacity = *burst; capacity < 1 {
			return ratelimit.Limit{}, fmt.Errorf("%s.burst must be at least 1 when set (got %d)", field, capacity)
		}
	}
	l := ratelimit.NewLimit(perUnit, per, capacity)
	if err := l.Validate(); err != nil {
		return ratelimit.Limit{}, fmt.Errorf("%s: %s", field, strings.TrimPrefix(err.Error(), ratelimit.ErrInvalidArgument.Error()+": "))
	}
	return l, nil
}

// ReservedPrefix begins the namespaces of the Envoy rate limit service's
// rules ("envoy:4:edge:14:remote_address:0:"): no namespace of a file may
// be named so, in any case, lest a reset of it reset an Envoy rule's
// buckets.
const ReservedPrefix = "envoy:"

// ReservedError is the error of a name that begins with ReservedPrefix. It
// wraps ratelimit.ErrInvalidArgument.
type ReservedError struct{ Name string }

func (e *ReservedError) Error() string {
	return fmt.Sprintf("name %q: names beginning with %q are reserved for the Envoy rate limit service's rules", e.Name, ReservedPrefix)
}

// Unwrap returns ratelimit.ErrInvalidArgument.
func (e *ReservedError) Unwrap() error { return ratelimit.ErrInvalidArgument }

// CheckName reports whether name can name a namespace: 1 to 64 characters
// among letters, digits and "._-:", not beginning with ReservedPrefix (a
// *ReservedError). The characters are those a header, a metric label and a
// log line carry without escaping.
func CheckName(name string) error {
	if name == "" {
		return errors.New("name is missing")
	}
	if len(name) > 64 {
		return fmt.Errorf("name %q is longer than 64 characters", name)
	}
	if len(name) >= len(ReservedPrefix) && strings.EqualFold(name[:len(ReservedPrefix)], ReservedPrefix) {
		return &ReservedError{Name: name}
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._-:", c)) {
			return fmt.Errorf("name %q: only letters, digits and . _ - : are allowed", name)
		}
	}
	return nil
}

// goTypes are the Go types of the document, as yaml's errors name them, and
// what to call them instead.
var goTypes = strings.NewReplacer(
	"[]config.namespace", "a list of namespaces",
	"config.namespace", "a namespace (name, rate_limit, token_limit, quotas, plans, default_plan, trust_plan)",
	"[]config.plan", "a list of plans",
	"config.plan", "a plan (name, rate_limit, token_limit, quotas)",
	"config.rateLimit", "a rate_limit (unit, requests_per_unit, burst)",
	"config.tokenLimit", "a token_limit (unit, tokens_per_unit, burst)",
	"[]config.quota", "a list of quotas",
	"config.quota", "a quota (period, allowance, time_zone, start, counts)",
	"config.file", "a document with namespaces:",
	"in type ", "in ",
)

// plainYAMLError returns err's message without the "yaml: " prefix and
// with the Go types replaced by the fields they stand for.
func plainYAMLError(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	return goTypes.Replace(msg)
}
