package ratelimit

import (
	"errors"
	"github.com/exactlimit/ratelimit/internal/arith"
	"strings"
	"testing"
	"time"
)

func TestConstructors(t *testing.T) {
	tests := []struct {
		name string
		got  Limit
		want Limit
	}{
		{"PerSecond", PerSecond(100), Limit{100, 100, time.Second}},
		{"PerMinute", PerMinute(5000), Limit{5000, 5000, time.Minute}},
		{"PerHour", PerHour(7), Limit{7, 7, time.Hour}},
		{"PerDay", PerDay(1_000_000), Limit{1_000_000, 1_000_000, 24 * time.Hour}},
		{"NewLimit", NewLimit(100, time.Second, 200), Limit{200, 100, time.Second}},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %+v, want %+v", tt.name, tt.got, tt.want)
		}
		if err := tt.got.Validate(); err != nil {
			t.Errorf("%s.Validate() = %v, want nil", tt.name, err)
		}
	}
}

// invalidLimits lists a policy breaking each rule, with the words of the
// rule. The Redis script's twin test reuses it.
var invalidLimits = []struct {
	limit Limit
	rule  string
}{
	{Limit{0, 1, time.Second}, "capacity must be at least 1"},
	{Limit{-5, 1, time.Second}, "capacity must be at least 1"},
	{Limit{1, 0, time.Second}, "refill tokens must be at least 1"},
	{Limit{1, -1, time.Second}, "refill tokens must be at least 1"},
	{Limit{1, 1, 0}, "refill period must be at least 1µs"},
	{Limit{1, 1, 999 * time.Nanosecond}, "refill period must be at least 1µs"},
	{Limit{1, 1, -time.Second}, "refill period must be at least 1µs"},
	{Limit{1, 1, 1500 * time.Nanosecond}, "refill period must be a whole number of microseconds"},
	{Limit{1<<53 + 1, 1, time.Microsecond}, "capacity must be at most 2^53"},
	{Limit{1<<62 + 1, 1, time.Microsecond}, "capacity must be at most 2^53"},
	{Limit{1, 1<<53 + 1, time.Second}, "refill tokens must be at most 2^53"},
	{Limit{1, 1, (1<<53 + 1) * time.Microsecond}, "refill period in µs must be at most 2^53"},
	{Limit{1 << 52, 1, 3 * time.Microsecond}, "capacity * refill period in lowest terms must be at most 2^53"},
	{Limit{1 << 33, 1, time.Hour}, "capacity * refill period in lowest terms must be at most 2^53"},
	// 7 a day has no common divisor with a day in µs: 1,000,000 of
	// capacity times 86,400,000,000 µs is past 2^53.
	{Limit{1_000_000, 7, 24 * time.Hour}, "capacity * refill period in lowest terms must be at most 2^53"},
	{Limit{2, 1, 1 << 53 * time.Microsecond}, "capacity * refill period in lowest terms must be at most 2^53"},
}

func TestValidateNamesTheRule(t *testing.T) {
	for _, tt := range invalidLimits {
		err := tt.limit.Validate()
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%+v.Validate() = %v, want an error wrapping ErrInvalidArgument", tt.limit, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.rule) {
			t.Errorf("%+v.Validate() = %q, want it to name the rule %q", tt.limit, err, tt.rule)
		}
	}
}

func TestValidateAcceptsTheLargestExactValues(t *testing.T) {
	for _, l := range []Limit{
		{1 << 53, 1 << 53, time.Microsecond},
		{1 << 53, 1, time.Microsecond},
		{1, 1, 1 << 53 * time.Microsecond},
		{1 << 20, 1, 1 << 33 * time.Microsecond},
		// Daily and monthly quotas, read in lowest terms.
		{1_000_000, 1_000_000, 24 * time.Hour},
		{100_000, 100_000, 24 * time.Hour},
		{10_000_000, 10_000_000, time.Hour},
		{10_000_000, 10_000_000, 24 * time.Hour},
		{100_000, 100_000, 30 * 24 * time.Hour},
		{104_249, 7, 24 * time.Hour}, // any rate over a day: up to 104,249 of capacity
		{9_007_199_254, 1, time.Second},
	} {
		if err := l.Validate(); err != nil {
			t.Errorf("%+v.Validate() = %v, want nil", l, err)
		}
	}
}

func TestRequestValidate(t *testing.T) {
	ok := []Limit{PerSecond(10)}
	tests := []struct {
		name string
		r    Request
		rule string
	}{
		{"no limits", Request{Cost: 1}, "a policy needs at least one limit"},
		{"too many limits", Request{Limits: make([]Limit, arith.MaxLimits+1), Cost: 1}, "at most 8 limits"},
		{"cost zero", Request{Limits: ok, Cost: 0}, "cost must be at least 1"},
		{"cost negative", Request{Limits: ok, Cost: -3}, "cost must be at least 1"},
		{"cost above capacity", Request{Limits: ok, Cost: 11}, "cost must not exceed capacity"},
		{"cost above the smaller capacity", Request{Limits: []Limit{PerSecond(10), PerSecond(5)}, Cost: 6}, "cost must not exceed capacity"},
		{"second limit invalid", Request{Limits: []Limit{PerSecond(10), {}}, Cost: 1}, "limit 1: capacity must be at least 1"},
		{"costs of the wrong count", Request{Limits: []Limit{PerMinute(60), PerMinute(90000)}, Costs: []int64{1}}, "costs must give one cost per limit (got 1 for 2 limits)"},
		{"first cost zero", Request{Limits: []Limit{PerMinute(60), PerMinute(90000)}, Costs: []int64{0, 1}}, "limit 0's cost must be between 1 and its capacity 60 (got 0)"},
		{"second cost above its capacity", Request{Limits: []Limit{PerMinute(60), PerMinute(90000)}, Costs: []int64{1, 95000}}, "limit 1's cost must be between 1 and its capacity 90000 (got 95000)"},
		{"time before the epoch", Request{Limits: ok, Cost: 1, Now: time.Unix(-1, 0)}, "time must be between the Unix epoch and 2^52 µs after it"},
		{"time too late", Request{Limits: ok, Cost: 1, Now: time.UnixMicro(arith.MaxTime + 1)}, "time must be between the Unix epoch and 2^52 µs after it"},
	}
	for _, tt := range tests {
		err := tt.r.Validate()
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tt.rule) {
			t.Errorf("%s: Validate() = %v, want ErrInvalidArgument naming %q", tt.name, err, tt.rule)
		}
	}
	for _, r := range []Request{
		{Limits: ok, Cost: 10},
		{Limits: ok, Peek: true},
		{Limits: ok, Cost: 1, Now: time.UnixMicro(arith.MaxTime)},
		{Limits: ok, Cost: 1, Now: time.Unix(0, 0)},
	} {
		if err := r.Validate(); err != nil {
			t.Errorf("%+v.Validate() = %v, want nil", r, err)
		}
	}
}

func TestLimitStringNamesEachNumber(t *testing.T) {
	tests := []struct {
		limit Limit
		want  string
	}{
		{NewLimit(100, time.Second, 200), "capacity 200, refill 100 per 1s"},
		{PerMinute(5), "capacity 5, refill 5 per 1m"},
		{PerHour(7), "capacity 7, refill 7 per 1h"},
		{NewLimit(10, 24*time.Hour, 10), "capacity 10, refill 10 per 24h"},
		{NewLimit(3, 90*time.Second, 6), "capacity 6, refill 3 per 1m30s"},
		{NewLimit(1, 150*time.Minute, 1), "capacity 1, refill 1 per 2h30m"},
		{NewLimit(1, 1500*time.Millisecond, 2), "capacity 2, refill 1 per 1.5s"},
		{NewLimit(1, 250*time.Microsecond, 1), "capacity 1, refill 1 per 250µs"},
	}
	for _, tt := range tests {
		if got := tt.limit.String(); got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.limit, got, tt.want)
		}
	}
}
