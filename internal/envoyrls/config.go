package envoyrls

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/units"
	"google.golang.org/protobuf/types/known/structpb"
)

// ErrConfig is wrapped by every error of LoadConfig and ParseConfig: a file
// that cannot be read, or whose content is not a valid configuration.
var ErrConfig = errors.New("envoyrls: invalid config")

// maxDepth bounds the nesting of descriptors in a file, and so the number of
// entries of a request's descriptor that can ever match a rule.
const maxDepth = 32

// Config is a compiled configuration: the domains of one file or of a
// directory of files, each a tree of descriptors. A Config is immutable and
// safe for simultaneous use by multiple goroutines.
type Config struct {
	domains map[string]*node
	rules   int
}

// Domains returns the configured domains in sorted order.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// RulesOf returns the number of rules of domain.
func (c *Config) RulesOf(domain string) int {
	n := 0
	c.eachRuleOf(c.domains[domain], func(*Rule) { n++ })
	return n
}

// QuotaModeRules returns the statistics keys (Rule.Path) of the rules with
// quota_mode: true, sorted.
func (c *Config) QuotaModeRules() []string {
	var out []string
	c.eachRule(func(r *Rule) {
		if r.QuotaMode {
			out = append(out, r.Path)
		}
	})
	slices.Sort(out)
	return out
}

// Rules returns the number of rate_limit blocks in the configuration.
func (c *Config) Rules() int { return c.rules }

// String describes the configuration for a log line: its domains and the
// number of rules.
func (c *Config) String() string {
	return fmt.Sprintf("domains=%s rules=%d", strings.Join(c.Domains(), ","), c.rules)
}

// node is one descriptor of the tree, or a domain's root.
type node struct {
	key, value string // value is "" for a descriptor without one
	wildcard   []string
	// exact holds the children with a value, by key then value.
	exact map[string]map[string]*node
	// byKey holds the children without a value, by key.
	byKey map[string]*node
	// wildcards holds the children whose value has a '*', in file order.
	wildcards []*node
	rule      *Rule
	// share, on a wildcard descriptor, makes every matching value share one
	// bucket (share_threshold).
	share bool
	// detailed and valueToMetric shape the metric key (detailed_metric,
	// value_to_metric).
	detailed, valueToMetric bool
}

func (n *node) hasChildren() bool {
	return len(n.exact) > 0 || len(n.byKey) > 0 || len(n.wildcards) > 0
}

// Rule is one rate_limit block: a token bucket of Capacity tokens that
// refills RequestsPerUnit every Unit.
type Rule struct {
	// Domain is the rule's domain.
	Domain string
	// Path is the peer's name for the rule in its statistics:
	// "domain.key_value.key" (the value is left out where the descriptor
	// has none).
	Path string
	// Name and Replaces are the rate_limit block's name and replaces.
	Name     string
	Replaces []string
	// Unit and RequestsPerUnit are as written; Unit is one of units.Durations' keys.
	Unit            string
	RequestsPerUnit uint32
	// Capacity is burst when set, else RequestsPerUnit.
	Capacity int64
	// Rounded is true when the refill rate could not be kept exactly
	// within the arithmetic's 2^53 bound and was rounded down, by at most
	// one part in 10^9 (see bucketLimit); the capacity stays exact.
	Rounded bool
	// Unlimited rules are never limited; ShadowMode rules answer OK and
	// count what they would have denied.
	Unlimited, ShadowMode bool
	// QuotaMode is the descriptor's quota_mode. It is loaded, shown by
	// Dump and warned of (Service.SetConfig), and the rule is decided as
	// any other: a descriptor over its limit makes the request OVER_LIMIT,
	// where the peer answers OK while another quota_mode descriptor of the
	// request is within its limit and no other descriptor is over.
	QuotaMode bool
	// limit is the bucket; zero when Unlimited or RequestsPerUnit is 0.
	limit ratelimit.Limit
	// namespace keeps the rule's keys apart from every other rule's.
	namespace string
	detailed  bool
	// metadata is the descriptor's metadata, nil when it has none.
	metadata *structpb.Struct
	// override marks the rule of a descriptor's own limit.
	override bool
}

// overrideSuffix ends the statistics key of a descriptor's own limit:
// the domain and the entries' keys, then this.
const overrideSuffix = "#override"

type builder struct {
	domain string
	c      *Config
}

// step is one level of a rule's path: the descriptor's key and value as
// written.
type step struct{ key, value string }

func (b *builder) load(parent *node, ds []yamlDescriptor, path []step, depth int) error {
	if len(ds) > 0 && depth > maxDepth {
		return fmt.Errorf("descriptors nested deeper than %d levels", maxDepth)
	}
	for i := range ds {
		d := &ds[i]
		here := append(slices.Clip(path), step{d.Key, d.Value})
		where := describe(here)
		if d.Key == "" {
			return fmt.Errorf("descriptor %s: the key must not be empty", where)
		}
		n := &node{key: d.Key, value: d.Value, detailed: d.DetailedMetric, valueToMetric: d.ValueToMetric, share: d.ShareThreshold}
		isWild := strings.Contains(d.Value, "*")
		if d.ShareThreshold && !isWild {
			return fmt.Errorf("descriptor %s: share_threshold needs a wildcard value (one with '*')", where)
		}
		switch {
		case isWild:
			for _, w := range parent.wildcards {
				if w.key == d.Key && w.value == d.Value {
					return fmt.Errorf("descriptor %s: duplicate descriptor", where)
				}
			}
			n.wildcard = strings.Split(d.Value, "*")
			parent.wildcards = append(parent.wildcards, n)
		case d.Value != "":
			if parent.exact == nil {
				parent.exact = map[string]map[string]*node{}
			}
			if parent.exact[d.Key] == nil {
				parent.exact[d.Key] = map[string]*node{}
			}
			if _, dup := parent.exact[d.Key][d.Value]; dup {
				return fmt.Errorf("descriptor %s: duplicate descriptor", where)
			}
			parent.exact[d.Key][d.Value] = n
		default:
			if parent.byKey == nil {
				parent.byKey = map[string]*node{}
			}
			if _, dup := parent.byKey[d.Key]; dup {
				return fmt.Errorf("descriptor %s: duplicate descriptor", where)
			}
			parent.byKey[d.Key] = n
		}
		if d.RateLimit != nil {
			r, err := b.rule(d, here)
			if err != nil {
				return fmt.Errorf("descriptor %s: %v", where, err)
			}
			n.rule = r
			b.c.rules++
		}
		if err := b.load(n, d.Descriptors, here, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// rule compiles a rate_limit block.
func (b *builder) rule(d *yamlDescriptor, path []step) (*Rule, error) {
	y := d.RateLimit
	r := &Rule{
		Domain:     b.domain,
		Path:       statPath(b.domain, path),
		Name:       y.Name,
		Unlimited:  y.Unlimited,
		ShadowMode: d.ShadowMode,
		QuotaMode:  d.QuotaMode,
		detailed:   d.DetailedMetric,
		namespace:  namespaceOf(b.domain, path),
	}
	if len(d.Metadata) > 0 {
		md, err := structpb.NewStruct(d.Metadata)
		if err != nil {
			return nil, fmt.Errorf("metadata: %v", err)
		}
		r.metadata = md
	}
	for _, rep := range y.Replaces {
		switch {
		case rep.Name == "":
			return nil, errors.New("a replaces entry has an empty name")
		case rep.Name == y.Name:
			return nil, fmt.Errorf("replaces names the rule's own name %q", y.Name)
		}
		r.Replaces = append(r.Replaces, rep.Name)
	}
	unit := strings.ToLower(y.Unit)
	per, known := units.Durations[unit]
	if y.Unlimited {
		switch {
		case y.Unit != "":
			return nil, errors.New("an unlimited rate_limit must not have a unit")
		case y.Burst != nil:
			return nil, errors.New("an unlimited rate_limit must not have a burst")
		}
		return r, nil
	}
	switch {
	case y.Unit == "":
		return nil, errors.New("rate_limit needs a unit (second, minute, hour, day, week, month or year)")
	case !known:
		return nil, fmt.Errorf("invalid rate limit unit %q (want second, minute, hour, day, week, month or year)", y.Unit)
	case y.RequestsPerUnit == nil:
		return nil, errors.New("rate_limit needs requests_per_unit (0 denies every request)")
	}
	r.Unit, r.RequestsPerUnit = unit, uint32(*y.RequestsPerUnit)
	r.Capacity = int64(r.RequestsPerUnit)
	if y.Burst != nil {
		switch {
		case *y.Burst < 1:
			return nil, fmt.Errorf("burst must be at least 1 (got %d)", *y.Burst)
		case r.RequestsPerUnit == 0:
			return nil, errors.New("burst needs requests_per_unit of at least 1")
		}
		r.Capacity = *y.Burst
	}
	if r.RequestsPerUnit == 0 {
		return r, nil // denies every request; no bucket
	}
	l, rounded, err := bucketLimit(r.Capacity, int64(r.RequestsPerUnit), per)
	if err != nil {
		return nil, err
	}
	r.limit, r.Rounded = l, rounded
	return r, nil
}

// describe names a descriptor by its path for an error message:
// "key=value/key".
func describe(path []step) string {
	var b strings.Builder
	for i, s := range path {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(s.key)
		if s.value != "" {
			b.WriteByte('=')
			b.WriteString(s.value)
		}
	}
	return fmt.Sprintf("%q", b.String())
}

// statPath is the peer's statistics key of a rule: the domain, then each
// level as key or key_value, joined by dots.
func statPath(domain string, path []step) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, s := range path {
		b.WriteByte('.')
		b.WriteString(s.key)
		if s.value != "" {
			b.WriteByte('_')
			b.WriteString(s.value)
		}
	}
	return b.String()
}

// namespaceOf is the namespace of a rule's buckets: every part of its path
// framed by its length, so that no two rules of any domains share one.
func namespaceOf(domain string, path []step) string {
	var b strings.Builder
	b.WriteString("envoy")
	frame(&b, domain)
	for _, s := range path {
		frame(&b, s.key)
		frame(&b, s.value)
	}
	return b.String()
}

// frame appends ":len:s" to b.
func frame(b *strings.Builder, s string) {
	var n [20]byte
	b.WriteByte(':')
	b.Write(strconv.AppendInt(n[:0], int64(len(s)), 10))
	b.WriteByte(':')
	b.WriteString(s)
}

// maxUint32 is the remaining the peer reports for an unlimited descriptor.
const maxUint32 = math.MaxUint32

// eachRule calls f with every rule of c.
func (c *Config) eachRule(f func(*Rule)) {
	for _, root := range c.domains {
		c.eachRuleOf(root, f)
	}
}

// eachRuleOf calls f with every rule under root (none when root is nil).
func (c *Config) eachRuleOf(root *node, f func(*Rule)) {
	if root == nil {
		return
	}
	var walk func(n *node)
	walk = func(n *node) {
		if n.rule != nil {
			f(n.rule)
		}
		for _, m := range n.exact {
			for _, k := range m {
				walk(k)
			}
		}
		for _, k := range n.byKey {
			walk(k)
		}
		for _, k := range n.wildcards {
			walk(k)
		}
	}
	walk(root)
}
