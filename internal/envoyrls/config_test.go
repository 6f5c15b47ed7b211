package envoyrls

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// readmeExamples are the configurations of envoyproxy/ratelimit's README
// (examples 1 to 11, as written there), with the rules each must compile to.
var readmeExamples = []struct {
	name  string
	yaml  string
	rules int
}{
	{"example 1", `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`, 2},
	{"example 2", `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`, 2},
	{"example 3", `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`, 2},
	{"example 4", `
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
`, 1},
	{"example 5", `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`, 2},
	{"example 6", `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`, 2},
	{"example 7", `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`, 2},
	{"example 8", `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
`, 2},
	{"example 9", `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
`, 3},
	{"example 10", `
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
`, 1},
	{"example 11", `
domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
`, 2},
	{"every unit, and burst", `
domain: units
descriptors:
  - {key: s, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: m, rate_limit: {unit: MINUTE, requests_per_unit: 1}}
  - {key: h, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: d, rate_limit: {unit: day, requests_per_unit: 1000000}}
  - {key: w, rate_limit: {unit: week, requests_per_unit: 1}}
  - {key: mo, rate_limit: {unit: month, requests_per_unit: 1}}
  - {key: y, rate_limit: {unit: year, requests_per_unit: 1}}
  - {key: b, rate_limit: {unit: second, requests_per_unit: 10, burst: 100}}
  - {key: meta, metadata: {team: edge, tags: [a, b]}, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: x, rate_limit: {unit: second, requests_per_unit: 4294967295}}
`, 10},
}

func TestParseConfigReadmeExamples(t *testing.T) {
	for _, tc := range readmeExamples {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig(tc.name+".yaml", []byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Rules() != tc.rules {
				t.Errorf("got %d rules, want %d", cfg.Rules(), tc.rules)
			}
		})
	}
}

func TestParseConfigLimits(t *testing.T) {
	cfg, err := ParseConfig("units.yaml", []byte(readmeExamples[len(readmeExamples)-1].yaml))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]ratelimit.Limit{
		"units.s":  {Capacity: 1, RefillTokens: 1, RefillPeriod: time.Second},
		"units.m":  {Capacity: 1, RefillTokens: 1, RefillPeriod: time.Minute},
		"units.w":  {Capacity: 1, RefillTokens: 1, RefillPeriod: 7 * 24 * time.Hour},
		"units.mo": {Capacity: 1, RefillTokens: 1, RefillPeriod: 30 * 24 * time.Hour},
		"units.y":  {Capacity: 1, RefillTokens: 1, RefillPeriod: 365 * 24 * time.Hour},
		"units.d":  {Capacity: 1_000_000, RefillTokens: 1_000_000, RefillPeriod: 24 * time.Hour},
		"units.b":  {Capacity: 100, RefillTokens: 10, RefillPeriod: time.Second},
		"units.x":  {Capacity: 4294967295, RefillTokens: 4294967295, RefillPeriod: time.Second},
	}
	got := map[string]ratelimit.Limit{}
	cfg.eachRule(func(r *Rule) { got[r.Path] = r.limit })
	for path, l := range want {
		if got[path] != l {
			t.Errorf("%s: got %v, want %v", path, got[path], l)
		}
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"an unknown field", "domain: d\ndescriptors:\n  - key: a\n    rate_limits: {unit: second, requests_per_unit: 1}\n", "field rate_limits not found"},
		{"an unknown field in rate_limit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, per: 2}\n", "field per not found"},
		{"an empty file", "", "the file is empty"},
		{"no domain", "descriptors:\n  - key: a\n", "the domain must not be empty"},
		{"an empty key", "domain: d\ndescriptors:\n  - value: v\n", "the key must not be empty"},
		{"a bad unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", `invalid rate limit unit "fortnight"`},
		{"no unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}\n", "rate_limit needs a unit"},
		{"no requests_per_unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}\n", "needs requests_per_unit"},
		{"a negative requests_per_unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "cannot unmarshal"},
		{"requests_per_unit above uint32", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n", "cannot unmarshal"},
		{"unlimited with a unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n", "must not have a unit"},
		{"a duplicate descriptor", "domain: d\ndescriptors:\n  - key: a\n  - key: a\n", "duplicate descriptor"},
		{"a duplicate wildcard", "domain: d\ndescriptors:\n  - {key: a, value: 'x*'}\n  - {key: a, value: 'x*'}\n", "duplicate descriptor"},
		{"an empty replaces", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n", "empty name"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: n, unit: second, requests_per_unit: 1, replaces: [{name: n}]}\n", "own name"},
		{"share_threshold without a wildcard", "domain: d\ndescriptors:\n  - {key: a, value: v, share_threshold: true}\n", "needs a wildcard"},
		{"a fraction", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5.5}\n", "must be a whole number"},
		{"a string", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: '5'}\n", "must be a whole number"},
		{"burst 0", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 0}\n", "burst must be at least 1"},
		{"burst on a deny rule", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 0, burst: 3}\n", "burst needs requests_per_unit"},
		{"a burst beyond 2^53", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: year, requests_per_unit: 1, burst: 9007199254740993}\n", "cannot be kept"},
		{"two documents", "domain: d\n---\ndomain: e\n", "more than one YAML document"},
		{"not a mapping", "- a\n- b\n", "cannot unmarshal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig("bad.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("got no error, want one with %q", tc.want)
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "bad.yaml") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an ErrConfig naming bad.yaml with %q", err, tc.want)
			}
		})
	}
}

func TestLoadConfigDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		testkit.WriteFile(t, filepath.Join(dir, name), content)
	}
	rule := func(domain string) string {
		return "domain: " + domain + "\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n"
	}
	// The peer reads every file, in subdirectories too, dot files unless
	// RUNTIME_IGNOREDOTFILES.
	write("a.yaml", rule("a"))
	write("b.yml", rule("b"))
	write("extra.conf", rule("c"))
	write("sub/d.yaml", rule("d"))
	write(".hidden.yaml", rule("e"))
	write(".dotdir/f.yaml", rule("f"))
	// Kubernetes' atomic writer: the files are links into ..data, a link
	// to a timestamped directory; that directory is never read itself.
	write("..2026_01_01/g.yaml", rule("g"))
	if err := os.Symlink("..2026_01_01", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/g.yaml", filepath.Join(dir, "g.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub", filepath.Join(dir, "linked-dir")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		opts LoadOptions
		want string
	}{
		{LoadOptions{}, "a,b,c,d,e,f,g"},
		{LoadOptions{IgnoreDotFiles: true}, "a,b,c,d,g"},
	} {
		cfg, err := tc.opts.Load(dir)
		if err != nil {
			t.Fatalf("%+v: %v", tc.opts, err)
		}
		if got := strings.Join(cfg.Domains(), ","); got != tc.want {
			t.Errorf("%+v: got domains %s, want %s", tc.opts, got, tc.want)
		}
	}
	write("z.yaml", "domain: a\ndescriptors:\n  - {key: other, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	_, err := LoadConfig(dir)
	if err == nil || !strings.Contains(err.Error(), "z.yaml") || !strings.Contains(err.Error(), "a.yaml") || !strings.Contains(err.Error(), "MERGE_DOMAIN_CONFIG") {
		t.Errorf("a domain in two files: got %v, want an error naming both and MERGE_DOMAIN_CONFIG", err)
	}
	cfg, err := LoadOptions{MergeDomains: true}.Load(dir)
	if err != nil {
		t.Fatalf("merged: %v", err)
	}
	if cfg.Rules() != 8 {
		t.Errorf("merged: got %d rules, want 8", cfg.Rules())
	}
	write("zz.yaml", "domain: a\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	if _, err := (LoadOptions{MergeDomains: true}).Load(dir); err == nil || !strings.Contains(err.Error(), "duplicate descriptor") {
		t.Errorf("merged, a descriptor written twice: got %v, want duplicate descriptor", err)
	}
	if _, err := LoadConfig(t.TempDir()); err == nil {
		t.Error("an empty directory: got no error")
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml")); !errors.Is(err, ErrConfig) {
		t.Errorf("a missing file: got %v, want ErrConfig", err)
	}
}

func TestNamespacesDoNotCollide(t *testing.T) {
	// key "a_b" with no value and key "a" with value "b" are the same
	// statistics key in the peer; their buckets must still be apart, as
	// must two domains' rules of the same path.
	cfg, err := ParseConfig("x.yaml", []byte("domain: d\ndescriptors:\n  - {key: a_b, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: a, value: b, rate_limit: {unit: second, requests_per_unit: 1}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg2, err := ParseConfig("y.yaml", []byte("domain: d.a\ndescriptors:\n  - {key: b, rate_limit: {unit: second, requests_per_unit: 1}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range []*Config{cfg, cfg2} {
		c.eachRule(func(r *Rule) {
			if seen[r.namespace] {
				t.Errorf("namespace %q used twice", r.namespace)
			}
			seen[r.namespace] = true
		})
	}
}

func TestGlobMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, value string
		want           bool
	}{
		{"value*", "value", true},
		{"value*", "valueXYZ", true},
		{"value*", "valu", false},
		{"*", "", true},
		{"/api/*/action", "/api/123/action", true},
		{"/api/*/action", "/api//action", true},
		{"/api/*/action", "/api/123/other", false},
		{"/api/*/resource/*/action", "/api/v1/resource/123/action", true},
		{"/api/*/resource/*/action", "/api/v1/resourc/123/action", false},
		{"ab*b", "ab", false},
		{"a*a*a", "aa", false},
		{"a*a*a", "aaa", true},
		{"*x*", "abxcd", true},
	} {
		if got := globMatch(strings.Split(tc.pattern, "*"), tc.value); got != tc.want {
			t.Errorf("globMatch(%q, %q): got %v, want %v", tc.pattern, tc.value, got, tc.want)
		}
	}
}

func TestMetricKeys(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		entries    []string
		want       string
	}{
		{"a rule's path, the value left out where the file has none", readmeExamples[1].yaml, []string{"message_type=marketing", "to_number=206"}, "messaging.message_type_marketing.to_number"},
		{"detailed_metric puts the request's value in", readmeExamples[7].yaml, []string{"key1=unspecified_value"}, "example8.key1_unspecified_value"},
		{"an explicit value", readmeExamples[7].yaml, []string{"key1=value1"}, "example8.key1_value1"},
		{"value_to_metric at the levels that ask", readmeExamples[9].yaml, []string{"route=api", "http_method=GET", "subject_id=123"}, "example10.route_api.http_method_GET.subject_id"},
		{"a wildcard keeps its pattern", readmeExamples[8].yaml, []string{"key1=value7"}, "example9.key1_value*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig("m.yaml", []byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			d := desc(tc.entries...)
			domain := cfg.Domains()[0]
			m, ok := lookup(cfg.domains[domain], domain, d.Entries)
			if !ok {
				t.Fatal("no match")
			}
			if m.metric != tc.want {
				t.Errorf("got %q, want %q", m.metric, tc.want)
			}
		})
	}
}
