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
// Each namespace has one token-bucket limit: requests_per_unit tokens are
// added every unit (second, minute, hour, day, week, month of 30 days or
// year of 365 days, as envoyproxy/ratelimit counts them), and the bucket
// holds burst tokens (default requests_per_unit; when set, at least 1). The
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
type Policies map[string]ratelimit.Limit

// Default returns the built-in policies: DefaultNamespace with DefaultLimit.
func Default() Policies { return Policies{DefaultNamespace: DefaultLimit} }

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
	Name      string     `yaml:"name"`
	RateLimit *rateLimit `yaml:"rate_limit"`
}

type rateLimit struct {
	Unit            string `yaml:"unit"`
	RequestsPerUnit int64  `yaml:"requests_per_unit"`
	Burst           *int64 `yaml:"burst"`
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
		l, err := ns.limit()
		if err != nil {
			return nil, fmt.Errorf("namespace %q: %w", ns.Name, err)
		}
		p[ns.Name] = l
	}
	return p, nil
}

func (ns namespace) limit() (ratelimit.Limit, error) {
	rl := ns.RateLimit
	if rl == nil {
		return ratelimit.Limit{}, errors.New("rate_limit is missing")
	}
	per, ok := units.Parse(rl.Unit)
	if !ok {
		return ratelimit.Limit{}, fmt.Errorf("rate_limit.unit %q: want %s", rl.Unit, units.Names)
	}
	if rl.RequestsPerUnit < 1 {
		return ratelimit.Limit{}, fmt.Errorf("rate_limit.requests_per_unit must be at least 1 (got %d)", rl.RequestsPerUnit)
	}
	burst := rl.RequestsPerUnit
	if rl.Burst != nil {
		if burst = *rl.Burst; burst < 1 {
			return ratelimit.Limit{}, fmt.Errorf("rate_limit.burst must be at least 1 when set (got %d)", burst)
		}
	}
	l := ratelimit.NewLimit(rl.RequestsPerUnit, per, burst)
	if err := l.Validate(); err != nil {
		return ratelimit.Limit{}, fmt.Errorf("rate_limit: %s", strings.TrimPrefix(err.Error(), ratelimit.ErrInvalidArgument.Error()+": "))
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
	"config.namespace", "a namespace (name and rate_limit)",
	"config.rateLimit", "a rate_limit (unit, requests_per_unit, burst)",
	"config.file", "a document with namespaces:",
	"in type ", "in ",
)

// plainYAMLError returns err's message without the "yaml: " prefix and
// with the Go types replaced by the fields they stand for.
func plainYAMLError(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	return goTypes.Replace(msg)
}
