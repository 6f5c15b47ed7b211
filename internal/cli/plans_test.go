package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// plansYAML offers testkit.Plans (free, 3 a minute; pro, 50 a minute and
// 1,000 a day) in namespace api, beside plain, of a limit of its own.
const plansYAML = testkit.Plans + `namespaces:
  - name: api
    plans: [free, pro]
    default_plan: free
  - name: plain
    rate_limit: {unit: second, requests_per_unit: 5}
`

// run runs the command line args and returns its exit status, stdout and
// stderr.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Main(context.Background(), args, Env{Stdout: &out, Stderr: &errOut})
	return code, out.String(), errOut.String()
}

func TestAssignAndUsage(t *testing.T) {
	srv := redistest.StartServer(t)
	cfg := filepath.Join(t.TempDir(), "plans.yaml")
	testkit.WriteFile(t, cfg, plansYAML)
	common := []string{"--redis", "redis://" + srv.Addr(), "--config", cfg, "--namespace", "api"}
	with := func(args ...string) []string { return append(append([]string(nil), args...), common...) }

	code, out, errOut := run(t, with("usage", "--subject", "acme")...)
	if code != 0 || out != "plan: free\nrate_limit: 3 of 3 left, full in 0s\n" {
		t.Fatalf("usage before: %d %q %q", code, out, errOut)
	}
	code, out, errOut = run(t, with("assign", "--subject", "acme", "--plan", "pro")...)
	if code != 0 || out != "assigned: \"acme\" in namespace \"api\": pro (was none)\n" {
		t.Fatalf("assign: %d %q %q", code, out, errOut)
	}
	code, out, _ = run(t, with("acquire", "acme", "--json")...)
	var d map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &d) != nil || d["plan"] != "pro" || d["remaining"] != float64(49) {
		t.Fatalf("acquire under pro: %d %s", code, out)
	}
	code, out, _ = run(t, with("usage", "--subject", "acme")...)
	// (Redis's clock runs between the calls: the waits are bounded, not
	// exact.)
	if want := regexp.MustCompile(`^plan: pro\nrate_limit: 49 of 50 left, full in 1(\.[0-9]+)?s\nquota of a day in UTC, of requests: 999 of 1000 left, the window ends in [0-9hms.]+\n$`); code != 0 || !want.MatchString(out) {
		t.Fatalf("usage after: %d %q, want %v", code, out, want)
	}
	code, out, _ = run(t, with("usage", "--subject", "acme", "--json")...)
	if code != 0 || json.Unmarshal([]byte(out), &d) != nil || d["plan"] != "pro" || len(d["limits"].([]any)) != 2 {
		t.Fatalf("usage --json: %d %s", code, out)
	}
	code, out, _ = run(t, with("assign", "--subject", "acme", "--plan", "", "--json")...)
	if want := `{"namespace":"api","subject":"acme","plan":"","previous":"pro"}` + "\n"; code != 0 || out != want {
		t.Fatalf("removal: %d %q, want %q", code, out, want)
	}
	if _, out, _ = run(t, with("usage", "--subject", "acme")...); !strings.HasPrefix(out, "plan: free\n") {
		t.Errorf("usage after the removal: %q", out)
	}
}

func TestAssignAndUsageRefuse(t *testing.T) {
	srv := redistest.StartServer(t)
	cfg := filepath.Join(t.TempDir(), "plans.yaml")
	testkit.WriteFile(t, cfg, plansYAML)
	redis := "redis://" + srv.Addr()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"an unknown plan, naming the plans on offer", []string{"assign", "--redis", redis, "--config", cfg, "--namespace", "api", "--subject", "acme", "--plan", "gold"}, `unknown plan "gold": the plans on offer are free, pro`},
		{"a namespace without plans", []string{"assign", "--redis", redis, "--config", cfg, "--namespace", "plain", "--subject", "acme", "--plan", "pro"}, `namespace "plain" offers no plans`},
		{"no plan", []string{"assign", "--redis", redis, "--config", cfg, "--namespace", "api", "--subject", "acme"}, "--plan is required"},
		{"no subject", []string{"usage", "--redis", redis, "--config", cfg, "--namespace", "api"}, "--subject is required"},
		{"no config", []string{"usage", "--redis", redis, "--namespace", "api", "--subject", "acme"}, "--config FILE is required"},
		{"an unknown namespace", []string{"usage", "--redis", redis, "--config", cfg, "--namespace", "nope", "--subject", "acme"}, `unknown namespace "nope"`},
		{"a positional argument", []string{"usage", "--redis", redis, "--config", cfg, "--namespace", "api", "acme"}, "no arguments expected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := run(t, tc.args...)
			if code != 2 || !strings.Contains(errOut, tc.want) {
				t.Errorf("%v: exit %d, %q; want 2 with %q", tc.args, code, errOut, tc.want)
			}
		})
	}
	// Nothing was assigned.
	if _, out, _ := run(t, "usage", "--redis", redis, "--config", cfg, "--namespace", "api", "--subject", "acme"); !strings.HasPrefix(out, "plan: free\n") {
		t.Errorf("after the refusals: %q", out)
	}
}
