package envoyrls

import (
	"fmt"
	"github.com/exactlimit/ratelimit/internal/units"
	"log/slog"
	"math/big"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// TestRatesThePeerAccepts: requests_per_unit the peer takes are taken;
// where the exact rate is beyond the 2^53 bound the refill rate is rounded
// down, by less than one part in 10^9, never up, and the capacity is exact.
// Where no rate within 10^-9 below fits (possible only for a capacity above
// 2^53/10^9, and there for some rates only), the rule is refused with the
// reason.
func TestRatesThePeerAccepts(t *testing.T) {
	for _, tc := range []struct {
		rpu     int64
		unit    string
		burst   int64 // 0: none
		rounded bool
		refused bool
	}{
		{123457, "day", 0, true, false},
		{1001, "year", 0, true, false},
		{4294967295, "minute", 0, true, false},
		{4294967295, "year", 0, false, true},
		{100000001, "day", 0, false, true}, // 1/864 per µs and a hair: nothing fits within 1e-9
		{9007199, "day", 0, true, false},
		{4294967295, "second", 0, false, false},
		{4294967291, "month", 0, true, false},
		{7, "week", 1 << 40, false, true},
		{1, "second", 0, false, false},
		{1_000_000, "day", 0, false, false},
		{86400, "day", 0, false, false},
	} {
		t.Run(fmt.Sprintf("%d per %s burst %d", tc.rpu, tc.unit, tc.burst), func(t *testing.T) {
			yaml := fmt.Sprintf("domain: d\ndescriptors:\n  - key: k\n    quota_mode: false\n    rate_limit: {unit: %s, requests_per_unit: %d", tc.unit, tc.rpu)
			if tc.burst > 0 {
				yaml += fmt.Sprintf(", burst: %d", tc.burst)
			}
			cfg, err := ParseConfig("r.yaml", []byte(yaml+"}\n"))
			if tc.refused {
				if err == nil || !strings.Contains(err.Error(), "cannot be kept") {
					t.Fatalf("got %v, want a refusal saying it cannot be kept", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var r *Rule
			cfg.eachRule(func(x *Rule) { r = x })
			capacity := tc.rpu
			if tc.burst > 0 {
				capacity = tc.burst
			}
			if r.limit.Capacity != capacity {
				t.Errorf("capacity %d, want %d exactly", r.limit.Capacity, capacity)
			}
			if err := r.limit.Validate(); err != nil {
				t.Fatalf("the kept limit is invalid: %v", err)
			}
			if r.Rounded != tc.rounded {
				t.Errorf("rounded %v, want %v (limit %+v)", r.Rounded, tc.rounded, r.limit)
			}
			// kept/exact = (tokens/period) / (rpu/unit), as exact fractions.
			kept := new(big.Rat).SetFrac(big.NewInt(r.limit.RefillTokens), big.NewInt(r.limit.RefillPeriod.Microseconds()))
			exact := new(big.Rat).SetFrac(big.NewInt(tc.rpu), big.NewInt(units.Durations[tc.unit].Microseconds()))
			ratio := new(big.Rat).Quo(kept, exact)
			if ratio.Cmp(big.NewRat(1, 1)) > 0 {
				t.Errorf("rounded up: %v per %v is more than %d per %s", r.limit.RefillTokens, r.limit.RefillPeriod, tc.rpu, tc.unit)
			}
			if !tc.rounded && ratio.Cmp(big.NewRat(1, 1)) != 0 {
				t.Errorf("an exact rate changed: %v per %v", r.limit.RefillTokens, r.limit.RefillPeriod)
			}
			floor := new(big.Rat).Sub(big.NewRat(1, 1), big.NewRat(1, 1_000_000_000))
			if ratio.Cmp(floor) < 0 {
				f, _ := ratio.Float64()
				t.Errorf("rounded down by more than 1e-9: ratio %.15f", f)
			}
		})
	}
}

func TestLowerApprox(t *testing.T) {
	for _, tc := range []struct{ n, p, maxQ, a, q int64 }{
		{1, 3, 10, 1, 3},
		{2, 3, 2, 1, 2},          // 1/2 < 2/3; 1/1 is above
		{355, 113, 100, 311, 99}, // the best below 355/113 with q <= 100
		{7, 10, 3, 2, 3},
		{10, 1, 5, 10, 1},
	} {
		a, q := lowerApprox(tc.n, tc.p, tc.maxQ)
		if a != tc.a || q != tc.q {
			t.Errorf("lowerApprox(%d/%d, q <= %d) = %d/%d, want %d/%d", tc.n, tc.p, tc.maxQ, a, q, tc.a, tc.q)
		}
	}
}

func TestRoundedRatesAreLogged(t *testing.T) {
	cfg, err := ParseConfig("r.yaml", []byte("domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: day, requests_per_unit: 123457}}\n  - {key: e, rate_limit: {unit: day, requests_per_unit: 100}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var log testkit.Buffer
	if _, err := New(Options{Store: memstore.New(), Config: cfg, Logger: slog.New(slog.NewTextHandler(&log, nil))}); err != nil {
		t.Fatal(err)
	}
	out := log.String()
	if !strings.Contains(out, "rounded down") || !strings.Contains(out, "rule=d.k") || strings.Contains(out, "rule=d.e") {
		t.Errorf("the load log does not name the rounded rule alone:\n%s", out)
	}
}
