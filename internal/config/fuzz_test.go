package config

import "testing"

// FuzzParse: any bytes are a set of valid policies or an error, never a
// panic, and a config that parses holds only limits that validate. The seed
// corpus is in testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add([]byte("namespaces:\n  - name: login\n    rate_limit: {unit: minute, requests_per_unit: 5, burst: 10}\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("Parse(%q): an error with no message", data)
			}
			return
		}
		if len(p) == 0 {
			t.Fatalf("Parse(%q) gave no namespace and no error", data)
		}
		for name, pol := range p {
			if CheckName(name) != nil {
				t.Fatalf("Parse(%q) gave the name %q, which does not validate", data, name)
			}
			for _, l := range pol.Limits() {
				if l.Validate() != nil {
					t.Fatalf("Parse(%q) gave %q: %v, which does not validate", data, name, pol)
				}
			}
		}
	})
}
