package config

import "testing"

// FuzzParse: any bytes are a set of valid policies or an error, never a
// panic, and a config that parses holds only limits that validate. The seed
// corpus is in testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add([]byte("namespaces:\n  - name: login\n    rate_limit: {unit: minute, requests_per_unit: 5, burst: 10}\n"))
	f.Add([]byte(""))
	f.Add([]byte("plans:\n  - name: free\n    rate_limit: {unit: minute, requests_per_unit: 3}\nnamespaces:\n  - name: api\n    plans: [free]\n    default_plan: free\n"))
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
			pols := []Policy{pol}
			if pol.HasPlans() {
				pols = pols[:0]
				for _, pl := range pol.Plans {
					pols = append(pols, pl.Policy)
				}
				if _, ok := pol.Plan(pol.DefaultPlan); !ok {
					t.Fatalf("Parse(%q) gave %q: %v, whose default plan is not on offer", data, name, pol)
				}
			}
			for _, pol := range pols {
				for _, l := range pol.Limits() {
					if l.Validate() != nil {
						t.Fatalf("Parse(%q) gave %q: %v, which does not validate", data, name, pol)
					}
				}
			}
		}
	})
}
