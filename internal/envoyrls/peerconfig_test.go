package envoyrls

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// TestThePeersShippedConfigsLoad: every configuration file envoyproxy/ratelimit
// ships (testdata/peer: its examples/ratelimit/config and its integration
// tests' runtime directory) loads, each directory as the peer reads it,
// with the rules and domains they hold; quota_mode: true among them.
func TestThePeersShippedConfigsLoad(t *testing.T) {
	for _, tc := range []struct {
		dir     string
		domains string
		rules   int
		dump    []string
	}{
		{"examples", "mongo_cps,rl", 19, []string{
			"mongo_cps.database_users: unit=SECOND requests_per_unit=500, shadow_mode: false, quota_mode: false\n",
			"rl.service_service_1: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: true\n",
			"rl.foo.baz_shady: unit=MINUTE requests_per_unit=3, shadow_mode: true, quota_mode: false\n",
			"rl.qux: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n",
		}},
		{"integration", "another,basic,share-threshold-test", 11, []string{
			"basic.one_per_minute: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false\n",
		}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			cfg, err := LoadConfig(filepath.Join("testdata", "peer", tc.dir))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(cfg.Domains(), ","); got != tc.domains {
				t.Errorf("domains %s, want %s", got, tc.domains)
			}
			if cfg.Rules() != tc.rules {
				t.Errorf("%d rules, want %d", cfg.Rules(), tc.rules)
			}
			dump := cfg.Dump()
			for _, line := range tc.dump {
				if !strings.Contains(dump, line) {
					t.Errorf("Dump lacks %q:\n%s", line, dump)
				}
			}
		})
	}
}

// TestQuotaModeIsWarnedOfAndDecidedAsAnyRule: a rule with quota_mode: true
// loads with a warning naming it, and is decided as an ordinary rule: the
// second call on a rule of 1 a minute is OVER_LIMIT.
func TestQuotaModeIsWarnedOfAndDecidedAsAnyRule(t *testing.T) {
	cfg, err := LoadConfig(filepath.Join("testdata", "peer", "examples", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.QuotaModeRules(), ","); got != "rl.service_service_1,rl.service_service_2" {
		t.Errorf("QuotaModeRules: %s", got)
	}
	var logs testkit.Buffer
	svc, err := New(Options{Store: memstore.New(), Config: cfg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if want := `level=WARN msg="envoy rules with quota_mode: true are decided as ordinary rules`; !strings.Contains(logs.String(), want) ||
		!strings.Contains(logs.String(), "rules=rl.service_service_1,rl.service_service_2") {
		t.Errorf("the log lacks the warning naming the rules:\n%s", logs.String())
	}
	var codes []string
	for range 2 {
		r, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "rl",
			Descriptors: []*rlv3.RateLimitDescriptor{entry("service", "service_1")}})
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, r.OverallCode.String())
	}
	if got := strings.Join(codes, " "); got != "OK OVER_LIMIT" {
		t.Errorf("two calls on a quota_mode rule of 1 a minute: %s, want OK OVER_LIMIT", got)
	}
}
