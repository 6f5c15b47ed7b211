package service

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/rlstest"
	"github.com/exactlimit/ratelimit/redisstore"
)

// TestOneBreakerForBothAPIs: over Redis, the HTTP API and Envoy's service
// decide through one fallback store when their outage behaviours agree, so
// that an outage the API finds is Envoy's at once (UNAVAILABLE without a
// call to Redis of its own) and is logged once, not once per service.
func TestOneBreakerForBothAPIs(t *testing.T) {
	srv := redistest.StartServer(t)
	uo := &redis.UniversalOptions{Addrs: []string{srv.Addr()}}
	redisstore.ClientOptions(uo)
	envoy := withEnvoy(t, 100)
	s, logs := start(t, Config{Redis: uo, Timeout: 200 * time.Millisecond, Envoy: envoy})
	if s.envoy.fb != nil || s.envoy.svc == nil {
		t.Fatal("the Envoy service has a breaker of its own with the same outage behaviour")
	}
	conn := rlstest.Dial(t, s.Addrs().GRPC.String(), insecure.NewCredentials())
	ctx := testContext(t)
	if _, err := rlstest.AskEdge(ctx, conn, "10.0.0.1"); err != nil {
		t.Fatalf("with Redis up: %v", err)
	}

	srv.Kill()
	res, err := http.Post("http://"+s.Addrs().API().String()+"/v1/acquire", "application/json", strings.NewReader(`{"subject":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || s.store.fb.IsAlive() {
		t.Fatalf("the API with Redis down: %d, breaker alive %v; want 503 and the breaker open", res.StatusCode, s.store.fb.IsAlive())
	}
	_, err = rlstest.AskEdge(ctx, conn, "10.0.0.2")
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Envoy after the API found Redis down: %v, want UNAVAILABLE", err)
	}
	if n := strings.Count(logs.String(), "redis unreachable"); n != 1 {
		t.Errorf("the outage is logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestEnvoyOutageOfItsOwn: an Envoy outage behaviour other than the API's
// is applied by a second fallback store over the same client, which says so
// in its log lines.
func TestEnvoyOutageOfItsOwn(t *testing.T) {
	srv := redistest.StartServer(t)
	uo := &redis.UniversalOptions{Addrs: []string{srv.Addr()}}
	redisstore.ClientOptions(uo)
	envoy := withEnvoy(t, 100)
	envoy.Outage = fallback.FailOpen
	s, logs := start(t, Config{Redis: uo, Timeout: 200 * time.Millisecond, Envoy: envoy})
	if s.envoy.fb == nil || s.envoy.fb.Outage() != fallback.FailOpen || s.envoy.fb.Primary() != s.store.fb.Primary() {
		t.Fatal("the Envoy service does not have its own outage behaviour over the API's Redis store")
	}
	srv.Kill()
	conn := rlstest.Dial(t, s.Addrs().GRPC.String(), insecure.NewCredentials())
	resp, err := rlstest.AskEdge(testContext(t), conn, "10.0.0.3")
	if err != nil || resp.OverallCode.String() != "OK" {
		t.Fatalf("fail-open with Redis down: %v %v", resp, err)
	}
	if !strings.Contains(logs.String(), "service=envoy") {
		t.Errorf("Envoy's outage is not logged as its own:\n%s", logs.String())
	}
}
