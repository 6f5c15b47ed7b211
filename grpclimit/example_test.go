package grpclimit_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/grpclimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// serveHealth serves grpc's health service with srv on a loopback port,
// until srv stops, and returns its address.
func serveHealth(srv *grpc.Server) string {
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
	return ln.Addr().String()
}

func Example() {
	now := func() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }
	lim, err := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(2),
		ratelimit.WithNamespace("api"), ratelimit.WithClock(now))
	if err != nil {
		log.Fatal(err)
	}
	in, err := grpclimit.New(lim,
		grpclimit.WithKey(grpclimit.Metadata("x-api-key")),
		grpclimit.WithMethod("/grpc.health.v1.Health/List", nil), // not limited
		grpclimit.WithClock(now))
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(in.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(in.StreamServerInterceptor()))
	addr := serveHealth(srv)
	defer srv.Stop()

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k1")
	for range 3 {
		var hdr, trl metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr), grpc.Trailer(&trl))
		if err != nil {
			wait, _ := grpclimit.RetryDelay(err)
			fmt.Printf("%v, retry in %v; ratelimit: %s\n", status.Code(err), wait, trl.Get("ratelimit")[0])
			continue
		}
		fmt.Printf("OK; ratelimit: %s\n", hdr.Get("ratelimit")[0])
	}
	// Output:
	// OK; ratelimit: "api";r=1;t=30
	// OK; ratelimit: "api";r=0;t=60
	// ResourceExhausted, retry in 30s; ratelimit: "api";r=0;t=60
}

// A client that waits out the denials it gets, at most twice per call, and
// never longer than 10 s a wait: a server that asks for a minute is
// answered at once.
func ExampleUnaryClientInterceptor() {
	lim, err := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(1))
	if err != nil {
		log.Fatal(err)
	}
	in, err := grpclimit.New(lim)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(in.UnaryServerInterceptor()))
	addr := serveHealth(srv)
	defer srv.Stop()

	retry, err := grpclimit.UnaryClientInterceptor(grpclimit.WithRetries(2), grpclimit.WithMaxRetryDelay(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(retry))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for range 2 {
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		wait, _ := grpclimit.RetryDelay(err)
		fmt.Println(status.Code(err), wait.Round(time.Minute))
	}
	// Output:
	// OK 0s
	// ResourceExhausted 1m0s
}
