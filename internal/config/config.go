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
// nothing. The
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

// Policy is the limits of a namespace: its rate_limit, and its token_limit
// when it has one.
type Policy struct {
	// Requests is the rate_limit.
	Requests ratelimit.Limit
	// Tokens is the token_limit; the zero Limit when there is none.
	Tokens ratelimit.Limit
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

// MaxCost is the largest cost that every limit of p can hold: a check of
// more could never be allowed.
func (p Policy) MaxCost() int64 {
	if p.HasTokens() {
		return min(p.Requests.Capacity, p.Tokens.Capacity)
	}
	return p.Requests.Capacity
}

// String describes p, "capacity 60, refill 60 per 1m", followed by
// " and tokens: capacity 90000, refill 90000 per 1m" when p has a
// token_limit.
func (p Policy) String() string {
	if p.HasTokens() {
		return fmt.Sprintf("%v and tokens: %v", p.Requests, p.Tokens)
	}
	return p.Requests.String()
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
	Namespaces []namespace `yaml:"namespaces"`
}

type namespace struct {
	Name       string      `yaml:"name"`
	RateLimit  *rateLimit  `yaml:"rate_limit"`
	TokenLimit *tokenLimit `yaml:"token_limit"`
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
		pol, err := ns.policy()
		if err != nil {
			return nil, fmt.Errorf("namespace %q: %w", ns.Name, err)
		}
		p[ns.Name] = pol
	}
	return p, nil
}

func (ns namespace) policy() (Policy, error) {
	rl := ns.RateLimit
	if rl == nil {
		return Policy{}, errors.New("rate_limit is missing")
	}
	req, err := limitOf("rate_limit", rl.Unit, "requests_per_unit", rl.RequestsPerUnit, rl.Burst)
	if err != nil {
		return Policy{}, err
	}
	p := Policy{Requests: req}
	if tl := ns.TokenLimit; tl != nil {
		if p.Tokens, err = limitOf("token_limit", tl.Unit, "tokens_per_unit", tl.TokensPerUnit, tl.Burst); err != nil {
			return Policy{}, err
		}
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
	"config.namespace", "a namespace (name, rate_limit and token_limit)",
	"config.rateLimit", "a rate_limit (unit, requests_per_unit, burst)",
	"config.tokenLimit", "a token_limit (unit, tokens_per_unit, burst)",
	"config.file", "a document with namespaces:",
	"in type ", "in ",
)

// plainYAMLError returns err's message without the "yaml: " prefix and
// with the Go types replaced by the fields they stand for.
func plainYAMLError(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	return goTypes.Replace(msg)
}
