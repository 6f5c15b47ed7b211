package main_test

import (
	"context"
	"path/filepath"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// envoyConfig writes a config in envoyproxy/ratelimit's format: 10 a minute
// per client address, 100 a minute per user.
func envoyConfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "edge.yaml")
	const cfg = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
`
	testkit.WriteFile(t, path, cfg)
	return path
}

// rlsClient dials the gRPC address of a serve process.
func rlsClient(t *testing.T, p *proc) rlsv3.RateLimitServiceClient {
	t.Helper()
	if p.grpc == "" {
		t.Fatalf("serve has no gRPC listener:\n%s", p.Log())
	}
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func descriptor(k, v string) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
}

// twoProcessesShareBuckets runs two serve processes on the Redis of args
// and checks that they share one bucket, all or nothing.
func twoProcessesShareBuckets(t *testing.T, args []string) {
	cfg := envoyConfig(t)
	var clients []rlsv3.RateLimitServiceClient
	var procs []*proc
	for range 2 {
		p := serve(t, nil, append([]string{"--grpc-listen", "127.0.0.1:0", "--envoy-config", cfg}, args...)...)
		procs = append(procs, p)
		clients = append(clients, rlsClient(t, p))
	}
	allowed := 0
	for i := range 30 {
		resp, err := clients[i%2].ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*rlv3.RateLimitDescriptor{descriptor("remote_address", "10.0.0.1"), descriptor("user", "ann")}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OK {
			allowed++
		}
	}
	if allowed != 10 {
		t.Errorf("two processes, one 10-a-minute bucket: %d allowed, want 10", allowed)
	}
	resp, err := clients[1].ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*rlv3.RateLimitDescriptor{descriptor("user", "ann")}})
	if err != nil {
		t.Fatal(err)
	}
	// The 20 denied requests charged user=ann nothing: 100 - 10 - this one.
	if got := resp.Statuses[0].LimitRemaining; got != 89 {
		t.Errorf("user ann: %d left, want 89 (charged only by the 10 admitted requests and this one)", got)
	}
	for _, p := range procs {
		p.stop(t)
	}
}

func TestServeEnvoyTwoProcessesOneRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	twoProcessesShareBuckets(t, []string{"--redis", "redis://" + srv.Addr()})
}

func TestServeEnvoyTwoProcessesCluster(t *testing.T) {
	t.Parallel()
	_, args := startCluster(t, 3, 0)
	twoProcessesShareBuckets(t, args)
}
