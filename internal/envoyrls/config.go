package envoyrls

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/units"
	"go.yaml.in/yaml/v3"
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

// yamlFile, yamlDescriptor and yamlRateLimit are the peer's format, plus
// burst. Decoding refuses any other field.
type yamlFile struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit"`
	Descriptors    []yamlDescriptor `yaml:"descriptors"`
	ShadowMode     bool             `yaml:"shadow_mode"`
	DetailedMetric bool             `yaml:"detailed_metric"`
	ValueToMetric  bool             `yaml:"value_to_metric"`
	ShareThreshold bool             `yaml:"share_threshold"`
	// QuotaMode is kept on the rule, which is decided as any other
	// (see Rule.QuotaMode).
	QuotaMode bool `yaml:"quota_mode"`
	// Metadata goes into the response's dynamic metadata when the rule's
	// descriptor passes (Options.DynamicMetadata).
	Metadata map[string]any `yaml:"metadata"`
}

type yamlRateLimit struct {
	Unit            string         `yaml:"unit"`
	RequestsPerUnit *wholeUint32   `yaml:"requests_per_unit"`
	Unlimited       bool           `yaml:"unlimited"`
	Name            string         `yaml:"name"`
	Replaces        []yamlReplaces `yaml:"replaces"`
	// Burst is this service's extension: the bucket's capacity.
	Burst *int64 `yaml:"burst"`
}

type yamlReplaces struct {
	Name string `yaml:"name"`
}

// LoadOptions say how LoadConfig reads a directory, as the peer's
// RUNTIME_IGNOREDOTFILES and MERGE_DOMAIN_CONFIG settings do.
type LoadOptions struct {
	// IgnoreDotFiles leaves out files and directories whose name starts
	// with a dot. Directories whose name starts with ".." (Kubernetes'
	// ..data and its timestamped directories) are always left out: their
	// files are the ones the directory's own symbolic links point to.
	IgnoreDotFiles bool
	// MergeDomains lets several files configure one domain: their
	// descriptors are loaded into one tree (a descriptor written twice is
	// still an error). Without it a domain in two files is an error.
	MergeDomains bool
}

// LoadConfig reads the configuration at path with the default LoadOptions
// (see LoadOptions.Load).
func LoadConfig(path string) (*Config, error) { return LoadOptions{}.Load(path) }

// Load reads the configuration at path: one YAML file, or a directory whose
// every regular file, in subdirectories too (as the peer's runtime loader
// reads them), holds one domain; a symbolic link to a file is read, one to
// a directory is not followed. Every error wraps ErrConfig and names the
// file and the reason; nothing of a configuration with an error is used.
func (o LoadOptions) Load(path string) (*Config, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	files := []string{path}
	if fi.IsDir() {
		if files, err = o.list(path); err != nil {
			return nil, err
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%w: %s: no files in the directory", ErrConfig, path)
		}
	}
	srcs := make(map[string][]byte, len(files))
	for _, f := range files {
		data, err := readFile(f)
		if err != nil {
			return nil, err
		}
		srcs[f] = data
	}
	return compile(files, srcs, o.MergeDomains)
}

// list returns the files of directory root that Load reads, in lexical
// order of their paths.
func (o LoadOptions) list(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
		name := d.Name()
		dot := path != root && strings.HasPrefix(name, ".")
		switch {
		case d.IsDir() && dot && (o.IgnoreDotFiles || strings.HasPrefix(name, "..")):
			return filepath.SkipDir
		case d.IsDir() || (dot && o.IgnoreDotFiles):
			return nil
		case d.Type()&fs.ModeSymlink != 0:
			fi, err := os.Stat(path)
			if err != nil {
				return fmt.Errorf("%w: %v", ErrConfig, err)
			}
			if !fi.Mode().IsRegular() {
				return nil // a link to a directory is not followed
			}
		case !d.Type().IsRegular():
			return nil
		}
		files = append(files, path)
		return nil
	})
	return files, err
}

// ParseConfig compiles one file's content; name appears in its errors.
func ParseConfig(name string, data []byte) (*Config, error) {
	return compile([]string{name}, map[string][]byte{name: data}, false)
}

func readFile(path string) ([]byte, error) {
	data, err := units.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return data, nil
}

func compile(files []string, srcs map[string][]byte, merge bool) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	owner := map[string]string{}
	for _, name := range files {
		y, err := decode(srcs[name])
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrConfig, name, err)
		}
		if y.Domain == "" {
			return nil, fmt.Errorf("%w: %s: the domain must not be empty", ErrConfig, name)
		}
		root := &node{}
		if prev, dup := owner[y.Domain]; dup {
			if !merge {
				return nil, fmt.Errorf("%w: %s: domain %q is also in %s (one file per domain, or set MERGE_DOMAIN_CONFIG=true)", ErrConfig, name, y.Domain, prev)
			}
			root = c.domains[y.Domain]
		}
		owner[y.Domain] = name
		b := builder{domain: y.Domain, c: c}
		if err := b.load(root, y.Descriptors, nil, 1); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrConfig, name, err)
		}
		c.domains[y.Domain] = root
	}
	return c, nil
}

// decode reads one YAML document strictly: unknown fields and a second
// document are errors.
func decode(data []byte) (yamlFile, error) {
	var y yamlFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&y); err != nil {
		if errors.Is(err, io.EOF) {
			return y, errors.New("the file is empty")
		}
		return y, errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return y, errors.New("the file holds more than one YAML document")
	}
	return y, nil
}

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

// wholeUint32 is requests_per_unit: a YAML integer from 0 to 2^32-1. A
// number with a fraction (5.5) is refused, as the peer refuses it, where a
// plain uint32 field would take its integer part.
type wholeUint32 uint32

func (w *wholeUint32) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		return fmt.Errorf("line %d: requests_per_unit must be a whole number from 0 to 4294967295 (got %q)", n.Line, n.Value)
	}
	var u uint32
	if err := n.Decode(&u); err != nil {
		return err
	}
	*w = wholeUint32(u)
	return nil
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
