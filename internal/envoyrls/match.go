package envoyrls

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// how a level of a descriptor matched the configuration.
type how uint8

const (
	byValue    how = iota // key and value written in the file
	byWildcard            // key, and a value pattern with '*'
	byKey                 // key only: any value
)

// match is a descriptor resolved against the configuration: its rule, the
// subject of its bucket within the rule's namespace, and its metric key.
type match struct {
	rule    *Rule
	subject string
	metric  string
}

// lookup resolves a descriptor's entries in domain root as the peer does:
// at each level the entry's key and value are tried first, then the
// wildcard values in file order, then the key alone; the rule applies only
// when the last entry lands on a descriptor with a rate_limit. ok is false
// when no rule applies.
func lookup(root *node, domain string, entries []*rlv3.RateLimitDescriptor_Entry) (m match, ok bool) {
	cur := root
	var path [maxDepth]*node
	var hows [maxDepth]how
	last := len(entries) - 1
	if last >= maxDepth {
		return m, false // deeper than any rule
	}
	for i, e := range entries {
		next, h := cur.exact[e.Key][e.Value], byValue
		if next == nil {
			for _, w := range cur.wildcards {
				if w.key == e.Key && globMatch(w.wildcard, e.Value) {
					next, h = w, byWildcard
					break
				}
			}
		}
		if next == nil {
			next, h = cur.byKey[e.Key], byKey
		}
		if next == nil {
			return m, false
		}
		path[i], hows[i] = next, h
		if i == last {
			if next.rule == nil {
				return m, false
			}
			m.rule = next.rule
			m.subject = subjectOf(entries, path[:i+1], hows[:i+1])
			m.metric = metricKey(domain, next.rule, entries, path[:i+1], hows[:i+1])
			return m, true
		}
		if !next.hasChildren() {
			return m, false // the request is deeper than the rule
		}
		cur = next
	}
	return m, false
}

// subjectOf is the bucket's subject within its rule's namespace: the
// request's value at every level whose value the rule leaves open (a
// descriptor with no value, or a wildcard without share_threshold), each
// framed by its length. Levels the rule fixes add an empty frame.
func subjectOf(entries []*rlv3.RateLimitDescriptor_Entry, path []*node, hows []how) string {
	var b strings.Builder
	size := 0
	for _, e := range entries {
		size += len(e.Value) + 8
	}
	b.Grow(size)
	for i, e := range entries {
		v := ""
		if hows[i] == byKey || (hows[i] == byWildcard && !path[i].share) {
			v = e.Value
		}
		frame(&b, v)
	}
	return shorten(b.String())
}

// maxSubjectBytes bounds a subject as the store keeps it: a longer one is
// kept as its SHA-256, which starts with '#' where a framed subject starts
// with ':', so the two forms never meet.
const maxSubjectBytes = 256

func shorten(subject string) string {
	if len(subject) <= maxSubjectBytes {
		return subject
	}
	sum := sha256.Sum256([]byte(subject))
	return "#" + hex.EncodeToString(sum[:])
}

// metricKey is the peer's statistics key for a matched descriptor: the
// rule's Path, or with detailed_metric every level's key and the request's
// value (a shared wildcard's pattern), or with value_to_metric the request's
// value at the levels that ask for it.
func metricKey(domain string, r *Rule, entries []*rlv3.RateLimitDescriptor_Entry, path []*node, hows []how) string {
	custom := r.detailed
	for _, n := range path {
		custom = custom || n.valueToMetric
	}
	if !custom {
		return r.Path
	}
	var b strings.Builder
	b.WriteString(domain)
	for i, e := range entries {
		n := path[i]
		v := ""
		switch {
		case hows[i] == byWildcard && n.share:
			v = n.value
		case r.detailed:
			v = e.Value
		case hows[i] == byValue:
			v = n.value
		case n.valueToMetric:
			v = e.Value
		case hows[i] == byWildcard:
			v = n.value
		}
		b.WriteByte('.')
		b.WriteString(e.Key)
		if v != "" {
			b.WriteByte('_')
			b.WriteString(v)
		}
	}
	return b.String()
}

// globMatch reports whether value matches the pattern split on '*': each
// '*' stands for zero or more bytes.
func globMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, lastPart := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(lastPart) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, lastPart) {
		return false
	}
	rest := value[len(first) : len(value)-len(lastPart)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}
