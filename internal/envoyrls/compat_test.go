//go:build envoycompat

package envoyrls

// The side-by-side test: envoyproxy/ratelimit's binary (its path in
// ENVOY_RATELIMIT_PEER) and this service, each on its own redis-server,
// answer the same requests on the same configuration files; every answer is
// compared and each case classed as equal, legitimately different (a
// difference docs/envoy.md explains, named by the case) or incompatible.
// Here this service runs in the test's process; in compat_env_test.go's
// cases both run as processes started from one environment.
//
//	ENVOY_RATELIMIT_PEER=/path/to/ratelimit go test -tags envoycompat -run TestCompat -v ./internal/envoyrls/

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/redisstore"
)

// compatCase is one configuration and the requests sent to both services,
// in order. legit names the difference of docs/envoy.md's "What differs"
// that may show in the answers; "" means they must be equal (but for the
// reset, which always differs: a window's end against a bucket's refill).
type compatCase struct {
	name  string
	group string            // the settings: a key of compatGroups
	files map[string]string // path under the config directory: content
	reqs  []*rlsv3.RateLimitRequest
	legit string
}

// compatGroups are the peer's settings of each group, which this service
// reads from the same variables.
var compatGroups = map[string]map[string]string{
	"default":  {},
	"headers":  {"LIMIT_RESPONSE_HEADERS_ENABLED": "true"},
	"shadow":   {"SHADOW_MODE": "true"},
	"metadata": {"RESPONSE_DYNAMIC_METADATA": "true"},
	"merge":    {"MERGE_DOMAIN_CONFIG": "true"},
	"collide":  {},
}

func d(pairs ...string) *rlv3.RateLimitDescriptor { return desc(pairs...) }

func dh(hits uint64, pairs ...string) *rlv3.RateLimitDescriptor {
	x := desc(pairs...)
	x.HitsAddend = wrapperspb.UInt64(hits)
	return x
}

func req(domain string, hits uint32, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits}
}

func times(n int, r *rlsv3.RateLimitRequest) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, n)
	for i := range out {
		out[i] = r
	}
	return out
}

func one(domain, body string) map[string]string {
	return map[string]string{domain + ".yaml": "domain: " + domain + "\ndescriptors:\n" + body}
}

func compatCases() []compatCase {
	override := d("user=u1")
	override.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
	long := strings.Repeat("p", 6000)
	overrideMult := d("user=u2")
	overrideMult.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(5)}
	cs := []compatCase{
		{name: "per key, 3 an hour", files: one("c1", "  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"),
			reqs: times(5, req("c1", 0, d("remote_address=10.0.0.1")))},
		{name: "nested descriptors (the peer's example 2)", files: one("c2", "  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit: {unit: day, requests_per_unit: 2}\n  - key: to_number\n    rate_limit: {unit: day, requests_per_unit: 10}\n"),
			reqs: times(3, req("c2", 0, d("message_type=marketing", "to_number=2061111111"), d("to_number=2061111111"))), legit: "all-or-nothing"},
		{name: "a value beats the key; rpu 0 denies", files: one("c3", "  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit: {unit: hour, requests_per_unit: 0}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c3", 0, d("remote_address=50.0.0.5")), req("c3", 0, d("remote_address=50.0.0.6"))}},
		{name: "hits_addend 0 on rpu 0", files: one("c3b", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 0}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c3b", 0, dh(0, "a=1")), req("c3b", 0, dh(0, "a=1"), dh(0, "a=2"))}},
		{name: "hits_addend 0 on rpu 0 after a denial (the peer counted it)", files: one("c3c", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 0}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c3c", 0, d("a=1")), req("c3c", 0, dh(0, "a=1"))}, legit: "all-or-nothing"},
		{name: "unlimited", files: one("c4", "  - key: ldap\n    rate_limit: {unlimited: true}\n"),
			reqs: times(2, req("c4", 7, d("ldap=x")))},
		{name: "an unlimited rule named and replaced", files: one("c5", "  - key: free\n    rate_limit: {unlimited: true, name: free}\n  - key: paid\n    rate_limit: {unit: hour, requests_per_unit: 5, replaces: [{name: free}]}\n"),
			reqs: times(2, req("c5", 0, d("free=a"), d("paid=a")))},
		{name: "replaces (the peer's example 7)", files: one("c6", "  - key: key_1\n    value: value_1\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit: {name: specific_limit, unit: hour, requests_per_unit: 5}\n  - key: key_2\n    value: value_2\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          replaces: [{name: specific_limit}]\n          unit: hour\n          requests_per_unit: 10\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c6", 0, d("key_1=value_1", "user=bkthomps"), d("key_2=value_2", "user=bkthomps")), req("c6", 0, d("key_1=value_1", "user=bkthomps"))}},
		{name: "a wildcard with share_threshold", files: one("c7", "  - key: files\n    value: files/*\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c7", 0, d("files=files/a")), req("c7", 0, d("files=files/b")), req("c7", 0, d("files=files/c")), req("c7", 0, d("files=other"))}},
		{name: "a wildcard in the middle, its own bucket per value", files: one("c8", "  - key: path\n    value: /api/*/action\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c8", 0, d("path=/api/1/action")), req("c8", 0, d("path=/api/2/action")), req("c8", 0, d("path=/api/1/action")), req("c8", 0, d("path=/api/1/other"))}},
		{name: "too deep and too shallow match nothing", files: one("c9", "  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: hour, requests_per_unit: 1}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c9", 0, d("a=1")), req("c9", 0, d("a=1", "b=2", "c=3")), req("c9", 0, d("a=1", "b=2"))}},
		{name: "an unknown domain", files: one("c10", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("nowhere", 0, d("a=1"))}},
		{name: "request hits_addend", files: one("c11", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c11", 2, d("a=1")), req("c11", 3, d("a=1")), req("c11", 1, d("a=1"))}},
		{name: "descriptor hits_addend 0 on an empty bucket", files: one("c12", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c12", 0, d("a=1")), req("c12", 0, dh(0, "a=1")), req("c12", 0, dh(0, "a=1"), d("a=2"))}},
		{name: "5 hits on 3 an hour, then 1", files: one("c13", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c13", 5, d("a=1")), req("c13", 0, dh(1<<32+1, "a=2"))}},
		{name: "5 hits on 3 an hour, then 1 (the denial charged nothing)", files: one("c13b", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c13b", 5, d("a=1")), req("c13b", 1, d("a=1"))}, legit: "all-or-nothing"},
		{name: "the same descriptor twice on 1 an hour", files: one("c14", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c14", 0, d("a=1"), d("a=1"))}},
		{name: "one descriptor over: the other is not charged", files: one("c15", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c15", 0, d("a=1")), req("c15", 0, d("a=1"), d("b=1")), req("c15", 0, d("b=1"))}, legit: "all-or-nothing"},
		{name: "shadow_mode on a rule", files: one("c16", "  - key: a\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"),
			reqs: times(3, req("c16", 0, d("a=1")))},
		{name: "a descriptor's own limit", files: one("c17", "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"),
			reqs: times(3, req("c17", 0, override))},
		{name: "a value over 4 KiB", files: one("c18", "  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"),
			reqs: times(2, req("c18", 0, d("path="+long)))},
		{name: "rates beyond 2^53 exactly: 123457/day, 1001/year, 4294967295/minute", files: one("c19", "  - key: d\n    rate_limit: {unit: day, requests_per_unit: 123457}\n  - key: y\n    rate_limit: {unit: year, requests_per_unit: 1001}\n  - key: m\n    rate_limit: {unit: minute, requests_per_unit: 4294967295}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c19", 0, d("d=1")), req("c19", 0, d("y=1")), req("c19", 0, d("m=1"))}},
		{name: "quota_mode: false, and units in capitals", files: one("c20", "  - key: a\n    quota_mode: false\n    rate_limit: {unit: HOUR, requests_per_unit: 2}\n"),
			reqs: times(3, req("c20", 0, d("a=1")))},
		{name: "a directory: a subdirectory, a dot file, extra.conf", files: map[string]string{
			"sub/c21.yaml": "domain: c21\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
			".c22.yaml":    "domain: c22\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
			"extra.conf":   "domain: c23\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
		}, reqs: []*rlsv3.RateLimitRequest{req("c21", 0, d("a=1")), req("c22", 0, d("a=1")), req("c23", 0, d("a=1")), req("c23", 0, d("a=1"))}},
		{name: "a minute rule, 2 a minute", files: one("c24", "  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"),
			reqs: times(3, req("c24", 0, d("a=1")))},
		{name: "10 a second refills within the second", files: one("c25", "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 10}\n"),
			reqs: times(12, req("c25", 0, d("a=1"))), legit: "refill"},
		{name: "an empty domain", files: one("c26", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("", 0, d("a=1"))}, legit: "invalid-argument"},
		{name: "no descriptors", files: one("c27", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c27", 0)}, legit: "invalid-argument"},
		{name: "is_negative_hits", files: one("c28", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c28", 0, d("a=1")), {Domain: "c28", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: d("a=1").Entries, IsNegativeHits: true}}}}, legit: "refund"},
		{name: "keys a=b_c and a_b=c (the peer refuses the file)", group: "collide", files: one("c29", "  - key: a\n    value: b_c\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: a_b\n    value: c\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("c29", 0, d("a=b_c")), req("c29", 0, d("a_b=c"))}, legit: "separate-keys"},

		{name: "the peer's example 1: two values of one key", files: one("e1", "  - key: database\n    value: users\n    rate_limit: {unit: second, requests_per_unit: 500}\n  - key: database\n    value: default\n    rate_limit: {unit: second, requests_per_unit: 500}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("e1", 0, d("database=users")), req("e1", 0, d("database=default")), req("e1", 0, d("database=other"))}},
		{name: "the peer's example 4: the request deeper than the rule", files: one("e4", "  - key: key\n    value: value\n    rate_limit: {unit: hour, requests_per_unit: 300}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("e4", 0, d("key=value", "subkey=subvalue")), req("e4", 0, d("key=value"))}},
		{name: "the peer's example 4: the nested rule", files: one("e4b", "  - key: key\n    value: value\n    descriptors:\n      - key: subkey\n        rate_limit: {unit: hour, requests_per_unit: 300}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("e4b", 0, d("key=value", "subkey=subvalue")), req("e4b", 0, d("key=value", "subkey=other"))}},
		{name: "week and month units", files: one("e5", "  - key: w\n    rate_limit: {unit: week, requests_per_unit: 2}\n  - key: mo\n    rate_limit: {unit: month, requests_per_unit: 2}\n"),
			reqs: times(3, req("e5", 0, d("w=1"), d("mo=1"))), legit: "all-or-nothing"},
		{name: "4294967295 a second", files: one("e6", "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967295}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("e6", 1000, d("a=1"))}},
		{name: "a descriptor's own limit with unit_multiplier", files: one("e7", "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"),
			reqs: times(3, req("e7", 0, overrideMult)), legit: "unit-multiplier"},
		{name: "a value-specific shadow rule beside an enforced one", files: one("e8", "  - key: service\n    descriptors:\n      - key: user\n        value: a\n        shadow_mode: true\n        rate_limit: {unit: hour, requests_per_unit: 1}\n      - key: user\n        rate_limit: {unit: hour, requests_per_unit: 3}\n"),
			reqs: times(3, req("e8", 0, d("service=s", "user=a"), d("service=s", "user=b")))},
		{name: "many descriptors on many rules", files: one("e9", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 4}\n  - key: b\n    rate_limit: {unit: day, requests_per_unit: 6}\n  - key: c\n    rate_limit: {unlimited: true}\n"),
			reqs: times(3, req("e9", 2, d("a=1"), d("b=1"), d("c=1"), d("zzz=1")))},

		{name: "headers: the closest to its limit", group: "headers", files: one("h1", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"),
			reqs: times(2, req("h1", 0, d("a=1"), d("b=1")))},
		{name: "headers: two over, the last", group: "headers", files: one("h2", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("h2", 0, d("a=1")), req("h2", 2, d("b=1")), req("h2", 0, d("a=1"), d("b=1"))}},
		{name: "headers: a denial", group: "headers", files: one("h3", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("h3", 5, d("a=1"))}},

		{name: "SHADOW_MODE", group: "shadow", files: one("s1", "  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"),
			reqs: times(3, req("s1", 0, d("a=1")))},

		{name: "RESPONSE_DYNAMIC_METADATA", group: "metadata", files: one("m1", "  - key: a\n    metadata: {team: edge, owner: {name: ops}}\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: b\n    metadata: {tier: gold}\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"),
			reqs: []*rlsv3.RateLimitRequest{req("m1", 0, d("a=1"), d("b=1")), req("m1", 0, d("a=1"), dh(2, "b=1")), req("m1", 4, d("b=2"))}},

		{name: "MERGE_DOMAIN_CONFIG: one domain in two files", group: "merge", files: map[string]string{
			"g1-a.yaml": "domain: g1\ndescriptors:\n  - {key: a, rate_limit: {unit: hour, requests_per_unit: 1}}\n",
			"g1-b.yaml": "domain: g1\ndescriptors:\n  - {key: b, rate_limit: {unit: hour, requests_per_unit: 2}}\n",
		}, reqs: []*rlsv3.RateLimitRequest{req("g1", 0, d("a=1")), req("g1", 0, d("b=1"))}},
	}
	for i := range cs {
		if cs[i].group == "" {
			cs[i].group = "default"
		}
	}
	return cs
}

// compatRow is a case's result: its differences, their kinds (see compare),
// and its class.
type compatRow struct {
	name, class, legit string
	diffs              []string
	kinds              map[string]bool
}

// add records the differences of one comparison, each prefixed by where.
func (r *compatRow) add(where string, diffs []string, kinds map[string]bool) {
	for _, x := range diffs {
		r.diffs = append(r.diffs, where+x)
	}
	for k := range kinds {
		r.kinds[k] = true
	}
}

// classify sets the class: equal without differences; legitimately
// different when every difference is of a kind always legitimate (reset,
// extra-header), named by those kinds, or when the case names the
// difference of docs/envoy.md it shows; else incompatible.
func (r compatRow) classify() compatRow {
	switch {
	case len(r.diffs) == 0:
		r.class = "equal"
	case !r.kinds["answer"]:
		r.class, r.legit = "legit", strings.Join(slices.Sorted(maps.Keys(r.kinds)), "+")
	case r.legit != "":
		r.class = "legit"
	default:
		r.class = "incompatible"
	}
	return r
}

// clearOfMinuteEnd waits for the next minute when the second of the
// minute is past after: the peer counts in fixed windows, and its minute
// and second windows would roll over mid-case.
func clearOfMinuteEnd(after int) {
	if s := time.Now().Second(); s > after {
		time.Sleep(time.Duration(61-s) * time.Second)
	}
}

// answer is one side's answer to a request.
type answer struct {
	resp *rlsv3.RateLimitResponse
	err  error
}

// compare lists how ours differs from the peer's, each difference with its
// kind: "reset" for the reset values (always legitimate), "extra-header" for
// the headers only this service adds, and "answer" for everything else.
func compare(peer, ours answer) (diffs []string, kinds map[string]bool) {
	kinds = map[string]bool{}
	add := func(kind, format string, args ...any) {
		kinds[kind] = true
		diffs = append(diffs, kind+": "+fmt.Sprintf(format, args...))
	}
	if peer.err != nil || ours.err != nil {
		if status.Code(peer.err) != status.Code(ours.err) {
			add("answer", "error: peer %v, ours %v", peer.err, ours.err)
		}
		return diffs, kinds
	}
	p, o := peer.resp, ours.resp
	if p.OverallCode != o.OverallCode {
		add("answer", "overall: peer %v, ours %v", p.OverallCode, o.OverallCode)
	}
	if len(p.Statuses) != len(o.Statuses) {
		add("answer", "%d statuses against %d", len(p.Statuses), len(o.Statuses))
		return diffs, kinds
	}
	for i := range p.Statuses {
		ps, os := p.Statuses[i], o.Statuses[i]
		if ps.Code != os.Code || ps.LimitRemaining != os.LimitRemaining {
			add("answer", "status %d: peer %v remaining %d, ours %v remaining %d", i, ps.Code, ps.LimitRemaining, os.Code, os.LimitRemaining)
		}
		if !proto.Equal(ps.CurrentLimit, os.CurrentLimit) {
			add("answer", "status %d: current_limit peer %v, ours %v", i, ps.CurrentLimit, os.CurrentLimit)
		}
		pr, or := ps.DurationUntilReset.AsDuration(), os.DurationUntilReset.AsDuration()
		switch {
		case os.Code == rlsv3.RateLimitResponse_OVER_LIMIT && or <= 0:
			add("answer", "status %d: over with a reset of %v", i, or)
		case pr != or:
			add("reset", "status %d: peer %v, ours %v", i, pr, or)
		}
	}
	ph, oh := headers(p), headers(o)
	for k, v := range ph {
		switch {
		case oh[k] == v:
		case strings.EqualFold(k, "RateLimit-Reset"):
			add("reset", "header %s: peer %s, ours %s", k, v, oh[k])
		default:
			add("answer", "header %s: peer %q, ours %q", k, v, oh[k])
		}
	}
	for k := range oh {
		if _, there := ph[k]; !there {
			add("extra-header", "%s", k)
		}
	}
	if !proto.Equal(p.DynamicMetadata, o.DynamicMetadata) {
		add("answer", "dynamic_metadata: peer %v, ours %v", p.DynamicMetadata, o.DynamicMetadata)
	}
	return diffs, kinds
}

func headers(r *rlsv3.RateLimitResponse) map[string]string {
	out := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		out[h.Key] = h.Value
	}
	return out
}

func freePort(t *testing.T) int {
	t.Helper()
	ln := testkit.Listen(t)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startPeer runs the peer on a redis-server of its own with the config in
// root/ratelimit/config, and returns a client once it answers.
func startPeer(t *testing.T, bin, root string, settings map[string]string) rlsv3.RateLimitServiceClient {
	t.Helper()
	srv := redistest.StartServer(t)
	grpcPort, httpPort, debugPort := freePort(t), freePort(t), freePort(t)
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"PORT=" + strconv.Itoa(httpPort), "GRPC_PORT=" + strconv.Itoa(grpcPort), "DEBUG_PORT=" + strconv.Itoa(debugPort),
		"USE_STATSD=false", "LOG_LEVEL=warn", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + srv.Addr(),
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
	}
	for k, v := range settings {
		env = append(env, k+"="+v)
	}
	cmd := exec.Command(bin)
	cmd.Env = env
	logf, err := os.Create(filepath.Join(t.TempDir(), "peer.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); logf.Close() })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthcheck", httpPort))
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("the peer did not become healthy: %s", b)
		}
	}
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// startOurs runs this service on a redis-server of its own with the same
// configuration and settings.
func startOurs(t *testing.T, dir string, settings map[string]string) rlsv3.RateLimitServiceClient {
	t.Helper()
	on := func(k string) bool { b, _ := strconv.ParseBool(settings[k]); return b }
	load := LoadOptions{MergeDomains: on("MERGE_DOMAIN_CONFIG"), IgnoreDotFiles: on("RUNTIME_IGNOREDOTFILES")}
	cfg, err := load.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.StartServer(t)
	client := redistest.Client(t, srv.Addr())
	svc, err := New(Options{
		Store: redisstore.New(client), Config: cfg, Load: load,
		Headers:    HeadersFromEnv(func(k string) string { return settings[k] }),
		ShadowMode: on("SHADOW_MODE"), DynamicMetadata: on("RESPONSE_DYNAMIC_METADATA"),
	})
	if err != nil {
		t.Fatal(err)
	}
	return dial(t, svc)
}

func TestCompat(t *testing.T) {
	bin := os.Getenv("ENVOY_RATELIMIT_PEER")
	if bin == "" {
		t.Fatal("ENVOY_RATELIMIT_PEER must name envoyproxy/ratelimit's binary (the envoycompat tag runs this test)")
	}
	ours := buildOurs(t)
	cases := compatCases()
	clearOfMinuteEnd(45)
	var rows []compatRow
	groups := make([]string, 0, len(compatGroups))
	for g := range compatGroups {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	for _, g := range groups {
		root := t.TempDir()
		dir := filepath.Join(root, "ratelimit", "config")
		var mine []compatCase
		for _, c := range cases {
			if c.group != g {
				continue
			}
			mine = append(mine, c)
			for name, content := range c.files {
				testkit.WriteFile(t, filepath.Join(dir, name), content)
			}
		}
		if len(mine) == 0 {
			continue
		}
		peer := startPeer(t, bin, root, compatGroups[g])
		in := startOurs(t, dir, compatGroups[g])
		for _, c := range mine {
			r := compatRow{name: c.name, legit: c.legit, kinds: map[string]bool{}}
			for i, rq := range c.reqs {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				var p, o answer
				p.resp, p.err = peer.ShouldRateLimit(ctx, rq)
				o.resp, o.err = in.ShouldRateLimit(ctx, rq)
				cancel()
				ds, ks := compare(p, o)
				r.add(fmt.Sprintf("request %d: ", i+1), ds, ks)
			}
			rows = append(rows, r.classify())
		}
	}
	envFrom := len(rows)
	for _, c := range envCases(t) {
		t.Run(c.name, func(t *testing.T) { rows = append(rows, runEnvCase(t, bin, ours, c).classify()) })
	}
	counts, envCounts := map[string]int{}, map[string]int{}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-70s %-13s %s\n", "case", "class", "why")
	for i, r := range rows {
		counts[r.class]++
		if i >= envFrom {
			envCounts[r.class]++
		}
		fmt.Fprintf(&b, "%-70.70s %-13s %s\n", r.name, r.class, r.legit)
		if r.class != "equal" && testing.Verbose() {
			for _, x := range r.diffs {
				fmt.Fprintf(&b, "      %s\n", x)
			}
		}
	}
	resetOnly := 0
	for _, r := range rows {
		if r.class == "legit" && r.legit == "reset" {
			resetOnly++
		}
	}
	fmt.Fprintf(&b, "\ncases compared %d, equal %d, legitimately different %d (%d only in the reset), incompatible %d\n",
		len(rows), counts["equal"], counts["legit"], resetOnly, counts["incompatible"])
	fmt.Fprintf(&b, "of which started as processes from one environment %d: equal %d, legitimately different %d, incompatible %d\n",
		len(rows)-envFrom, envCounts["equal"], envCounts["legit"], envCounts["incompatible"])
	t.Log(b.String())
	if counts["incompatible"] > 0 {
		t.Errorf("%d incompatible cases", counts["incompatible"])
	}
}
