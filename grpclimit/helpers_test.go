package grpclimit

import (
	"context"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
)

const (
	checkMethod = "/grpc.health.v1.Health/Check"
	watchMethod = "/grpc.health.v1.Health/Watch"
	listMethod  = "/grpc.health.v1.Health/List"
)

// serve starts a gRPC server with grpc's health service on 127.0.0.1 behind
// in's interceptors, and returns a client of it. Both stop with the test.
func serve(t *testing.T, in *Interceptor, dialOpts ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	return serveWith(t, []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(in.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(in.StreamServerInterceptor())}, dialOpts...)
}

// serveWith is serve for a server built with srvOpts.
func serveWith(t *testing.T, srvOpts []grpc.ServerOption, dialOpts ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	ln := testkit.Listen(t)
	srv := grpc.NewServer(srvOpts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }() //nolint:errcheck // ends with Stop
	conn, err := grpc.NewClient(ln.Addr().String(),
		append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dialOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-done
	})
	return healthpb.NewHealthClient(conn)
}

// stores returns the stores every end-to-end test runs on: memstore, and a
// real redis-server started on loopback, each on clock.
func stores(t *testing.T) []struct {
	name string
	new  func(t *testing.T, clock *testkit.Clock) ratelimit.Store
} {
	return []struct {
		name string
		new  func(t *testing.T, clock *testkit.Clock) ratelimit.Store
	}{
		{"memstore", func(t *testing.T, clock *testkit.Clock) ratelimit.Store {
			return memstore.New(memstore.WithClock(clock.Now))
		}},
		{"redis", func(t *testing.T, _ *testkit.Clock) ratelimit.Store {
			srv := redistest.StartServer(t)
			client := redistest.Client(t, srv.Addr())
			return redisstore.New(client)
		}},
	}
}

// newLimiter returns a limiter of limit in namespace ns on store, on clock.
func newLimiter(t *testing.T, store ratelimit.Store, clock *testkit.Clock, ns string, limit ratelimit.Limit) *ratelimit.Limiter[string] {
	t.Helper()
	l, err := ratelimit.New[string](store, limit, ratelimit.WithNamespace(ns), ratelimit.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func newInterceptor(t *testing.T, lim Limiter, opts ...Option) *Interceptor {
	t.Helper()
	in, err := New(lim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// check makes one Check call, returning its header and trailer metadata.
func check(client healthpb.HealthClient, ctx context.Context, md ...string) (hdr, trl metadata.MD, err error) {
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr), grpc.Trailer(&trl))
	return hdr, trl, err
}

// failing is a Store that cannot be reached: its error is a refused
// connection, which package fallback takes for an outage.
type failing struct{}

var errRefused = fmt.Errorf("connection refused: %w", syscall.ECONNREFUSED)

func (failing) Apply(context.Context, string, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, errRefused
}
func (failing) Reset(context.Context, string) error { return errRefused }

// loopbackPeer returns ctx with the peer of a client on 127.0.0.1.
func loopbackPeer(ctx context.Context) context.Context {
	return peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5555}})
}

// blocking is a Store that answers only when the check's context ends, and
// records that context's deadline.
type blocking struct {
	mu        sync.Mutex
	deadlines []time.Time // zero: none
}

func (b *blocking) Apply(ctx context.Context, _ string, _ ratelimit.Request) (ratelimit.Decision, error) {
	dl, _ := ctx.Deadline()
	b.mu.Lock()
	b.deadlines = append(b.deadlines, dl)
	b.mu.Unlock()
	<-ctx.Done()
	return ratelimit.Decision{}, ctx.Err()
}
func (b *blocking) Reset(context.Context, string) error { return nil }

// recording is a Limiter that records the subjects and costs it is asked
// for, and admits them all.
type recording struct {
	mu       sync.Mutex
	subjects []string
	costs    []int64
}

func (r *recording) TryAcquireN(_ context.Context, subject string, cost int64) (ratelimit.Decision, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.subjects = append(r.subjects, subject)
	r.costs = append(r.costs, cost)
	return ratelimit.Decision{Allowed: true, Remaining: 9, Limit: ratelimit.PerSecond(10)}, nil
}
func (r *recording) Limits() []ratelimit.Limit { return []ratelimit.Limit{ratelimit.PerSecond(10)} }

func (r *recording) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.subjects)
}

func (r *recording) last() (string, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.subjects) == 0 {
		return "", 0
	}
	return r.subjects[len(r.subjects)-1], r.costs[len(r.costs)-1]
}
