package service

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPromSinkMapsThePeersNames: the statsd names the peer flushes become
// the series of its default statsd_exporter mapping: two levels of a key as
// key1 (key2 empty), three or more as key1 and key2, the call errors by
// err_type, requests by grpc_method, and an unmapped name with its dots as
// '_'.
func TestPromSinkMapsThePeersNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newPromSink(reg, false)
	for name, v := range map[string]uint64{
		"ratelimit.service.rate_limit.edge.remote_address.total_hits": 2,
		"ratelimit.service.rate_limit.rl.foo_x.bar_y.baz.over_limit":  5,
		"ratelimit.service.call.should_rate_limit.redis_error":        1,
		"ratelimit_server.ShouldRateLimit.total_requests":             7,
		"ratelimit.service.config_load_success":                       1,
		"ratelimit.service.global_shadow_mode":                        4,
	} {
		s.FlushCounter(name, v)
	}
	s.FlushCounter("ratelimit.service.rate_limit.edge.remote_address.total_hits", 1) // a later flush adds
	want := `
# HELP ratelimit_service_config_load_success envoyproxy/ratelimit's ratelimit.service.config_load_success.
# TYPE ratelimit_service_config_load_success counter
ratelimit_service_config_load_success 1
# HELP ratelimit_service_global_shadow_mode envoyproxy/ratelimit's ratelimit.service.global_shadow_mode.
# TYPE ratelimit_service_global_shadow_mode counter
ratelimit_service_global_shadow_mode 4
# HELP ratelimit_service_rate_limit_over_limit envoyproxy/ratelimit's over_limit of a rule, by domain and the first two levels of its key.
# TYPE ratelimit_service_rate_limit_over_limit counter
ratelimit_service_rate_limit_over_limit{domain="rl",key1="foo_x",key2="bar_y"} 5
# HELP ratelimit_service_rate_limit_total_hits envoyproxy/ratelimit's total_hits of a rule, by domain and the first two levels of its key.
# TYPE ratelimit_service_rate_limit_total_hits counter
ratelimit_service_rate_limit_total_hits{domain="edge",key1="remote_address",key2=""} 3
# HELP ratelimit_service_should_rate_limit_error ShouldRateLimit calls that failed, by the peer's err_type (redis_error: the store; service_error: the request).
# TYPE ratelimit_service_should_rate_limit_error counter
ratelimit_service_should_rate_limit_error{err_type="redis_error"} 1
# HELP ratelimit_service_total_requests Calls, by gRPC method.
# TYPE ratelimit_service_total_requests counter
ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"ratelimit_service_config_load_success", "ratelimit_service_global_shadow_mode", "ratelimit_service_rate_limit_over_limit",
		"ratelimit_service_rate_limit_total_hits", "ratelimit_service_should_rate_limit_error", "ratelimit_service_total_requests"); err != nil {
		t.Error(err)
	}
}

// TestPromSinkObservesResponseTime: the peer's response_time, flushed as
// whole milliseconds, is the histogram ratelimit_service_response_time_seconds
// of its mapping, by grpc_method, in prometheus.DefBuckets, scaled to
// seconds; with PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS it keeps the
// milliseconds and the name, as the peer's mapping does without its scale.
func TestPromSinkObservesResponseTime(t *testing.T) {
	for _, tc := range []struct {
		name     string
		asMillis bool
		help     string
		counts   []int // of 0, 3 and 20 ms, in the buckets .005 .01 .025 .05 .1 .25 .5 1 2.5 5 10
		sum      string
	}{
		{"seconds", false, "in seconds", []int{2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3}, "0.023"},
		{"milliseconds", true, "in milliseconds despite the name", []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2}, "23"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s := newPromSink(reg, tc.asMillis)
			for _, ms := range []float64{0, 3, 20} {
				s.FlushTimer("ratelimit_server.ShouldRateLimit.response_time", ms)
			}
			s.FlushTimer("ratelimit_server.ShouldRateLimit.other", 1) // no timer of the peer's
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			var help string
			for _, mf := range mfs {
				if mf.GetName() == "ratelimit_service_response_time_seconds" {
					help = mf.GetHelp()
				}
			}
			if !strings.Contains(help, tc.help) {
				t.Errorf("help %q, want it to say %q", help, tc.help)
			}
			var want strings.Builder
			fmt.Fprintf(&want, "# HELP ratelimit_service_response_time_seconds %s\n# TYPE ratelimit_service_response_time_seconds histogram\n", help)
			for i, le := range prometheus.DefBuckets {
				fmt.Fprintf(&want, "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"%g\"} %d\n", le, tc.counts[i])
			}
			fmt.Fprintf(&want, "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"+Inf\"} 3\n"+
				"ratelimit_service_response_time_seconds_sum{grpc_method=\"ShouldRateLimit\"} %s\n"+
				"ratelimit_service_response_time_seconds_count{grpc_method=\"ShouldRateLimit\"} 3\n", tc.sum)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want.String()), "ratelimit_service_response_time_seconds"); err != nil {
				t.Error(err)
			}
			if n := testing.AllocsPerRun(1000, func() { s.FlushTimer("ratelimit_server.ShouldRateLimit.response_time", 3) }); n != 0 {
				t.Errorf("observing a call allocates %v times, want none", n)
			}
		})
	}
}
