package service

import (
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
	s := newPromSink(reg)
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
