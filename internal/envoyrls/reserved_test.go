package envoyrls

import (
	"errors"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/config"
)

// TestRuleNamespacesAreReserved checks that every rule's namespace, in
// every example of envoyproxy/ratelimit's README, begins with
// config.ReservedPrefix, which the HTTP service refuses: no namespace of
// its config can share an Envoy rule's buckets.
func TestRuleNamespacesAreReserved(t *testing.T) {
	n := 0
	for _, ex := range readmeExamples {
		cfg, err := ParseConfig(ex.name+".yaml", []byte(ex.yaml))
		if err != nil {
			t.Fatalf("%s: %v", ex.name, err)
		}
		cfg.eachRule(func(r *Rule) {
			n++
			if !strings.HasPrefix(r.namespace, config.ReservedPrefix) {
				t.Errorf("%s: rule namespace %q does not begin with %q", ex.name, r.namespace, config.ReservedPrefix)
			}
			// Names longer than 64 bytes are refused anyway; cut them to
			// the longest a config may hold, which keeps the prefix.
			name := r.namespace[:min(len(r.namespace), 64)]
			if err := config.CheckName(name); !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Errorf("%s: config.CheckName(%q) = %v, want it reserved", ex.name, name, err)
			}
		})
	}
	if n == 0 {
		t.Fatal("no rule in the examples")
	}
}
