// Package rlstest holds what the tests of Envoy's rate limit service share:
// a gRPC client connection closed at the test's end, and the one request
// of domain edge the tests send.
package rlstest

import (
	"context"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Dial returns a client connection to addr with creds, closed when t ends.
func Dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// AskEdge sends one ShouldRateLimit of domain edge for the remote address
// ip.
func AskEdge(ctx context.Context, conn *grpc.ClientConn, ip string) (*rlsv3.RateLimitResponse, error) {
	return rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}}},
	}})
}
