package service

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit/internal/rlstest"
	"google.golang.org/grpc/credentials/insecure"
)

// TestDebugListener: the peer's debug endpoints on Config.Debug: the list of
// them, the Envoy configuration in force at /rlconfig, the Envoy service's
// counters at /stats after a call, and pprof.
func TestDebugListener(t *testing.T) {
	s, _ := start(t, Config{Debug: "127.0.0.1:0", Envoy: withEnvoy(t, 7)})
	debug := "http://" + s.Addrs().Debug.String()
	conn := rlstest.Dial(t, s.Addrs().GRPC.String(), insecure.NewCredentials())
	if _, err := rlstest.AskEdge(context.Background(), conn, "10.0.0.1"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{"/", "/rlconfig: print out the currently loaded configuration for debugging\n"},
		{"/rlconfig", "edge.remote_address: unit=MINUTE requests_per_unit=7, shadow_mode: false, quota_mode: false\n"},
		{"/stats", "ratelimit_envoy_hits_total{domain=\"edge\",key=\"edge.remote_address\"}: 1\n"},
		{"/stats", "ratelimit_envoy_requests_total{result=\"ok\"}: 1\n"},
		{"/stats", "memstats: {"},
		{"/debug/pprof/", "goroutine"},
	} {
		code, body := get(t, debug+tc.path)
		if code != http.StatusOK || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s: %d %q, want 200 with %q", tc.path, code, body, tc.want)
		}
	}
	if code, _ := get(t, debug+"/nothing"); code != http.StatusNotFound {
		t.Errorf("GET /nothing: %d, want 404", code)
	}
}

// TestNoDebugListenerByDefault: without Config.Debug there is none.
func TestNoDebugListenerByDefault(t *testing.T) {
	s, _ := start(t, Config{Envoy: withEnvoy(t, 7)})
	if a := s.Addrs().Debug; a != nil {
		t.Errorf("Addrs().Debug = %v, want nil", a)
	}
}
