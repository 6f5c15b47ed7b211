package service

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/envoyrls"
	"github.com/exactlimit/ratelimit/internal/rlstest"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// grpcTestServer is the Envoy service on a real listener at 127.0.0.1,
// built by newGRPCServer from c, at most maxConns connections at once.
type grpcTestServer struct {
	addr string
	logs *testkit.Buffer
}

func startGRPC(t *testing.T, c grpcServerConfig, store ratelimit.Store, storeTimeout time.Duration, maxConns int) grpcTestServer {
	t.Helper()
	cfg, err := envoyrls.ParseConfig("edge.yaml", []byte(edgeConfig(1000)))
	if err != nil {
		t.Fatal(err)
	}
	if store == nil {
		store = memstore.New()
	}
	logs := &testkit.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	svc, err := envoyrls.New(envoyrls.Options{Store: store, Config: cfg, Timeout: storeTimeout, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ln := testkit.Listen(t)
	srv, err := newGRPCServer(ln.Addr(), c, log)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	svc.Register(srv)
	done := make(chan struct{})
	go func() { srv.Serve(limitConns(ln, maxConns)); close(done) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return grpcTestServer{addr: ln.Addr().String(), logs: logs}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestGRPCIdleConnectionClosed checks that a connection with no call is
// closed after MaxConnectionIdle, which frees its place under
// --max-connections for another client.
func TestGRPCIdleConnectionClosed(t *testing.T) {
	ctx := testContext(t)
	s := startGRPC(t, grpcServerConfig{idle: 300 * time.Millisecond, callTimeout: time.Second}, nil, 0, 1)
	idle := rlstest.Dial(t, s.addr, insecure.NewCredentials())
	if _, err := rlstest.AskEdge(ctx, idle, "10.0.0.1"); err != nil {
		t.Fatal(err)
	}
	// The server closes it: the client's connection leaves READY.
	for st := idle.GetState(); st == connectivity.Ready; st = idle.GetState() {
		if !idle.WaitForStateChange(ctx, st) {
			t.Fatalf("the idle connection is still %v after 20 s", st)
		}
	}
	// The one place of --max-connections 1 is free: another client is
	// served.
	other := rlstest.Dial(t, s.addr, insecure.NewCredentials())
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := rlstest.AskEdge(cctx, other, "10.0.0.2"); err != nil {
		t.Fatalf("a second client after the first went idle: %v", err)
	}
}

// TestGRPCMetadataBound checks that a call whose metadata exceeds the
// 64 KiB bound is refused, and one within it is served on the same
// connection.
func TestGRPCMetadataBound(t *testing.T) {
	ctx := testContext(t)
	s := startGRPC(t, grpcServerConfig{callTimeout: time.Second}, nil, 0, 0)
	conn := rlstest.Dial(t, s.addr, insecure.NewCredentials())
	for _, tc := range []struct {
		name string
		size int
		ok   bool
	}{
		{"8 KiB", 8 << 10, true},
		{"100 KiB", 100 << 10, false},
		{"1 MiB", 1 << 20, false},
		{"after them, 1 KiB", 1 << 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mctx := metadata.AppendToOutgoingContext(ctx, "x-padding", strings.Repeat("p", tc.size))
			_, err := rlstest.AskEdge(mctx, conn, "10.0.0.3")
			if (err == nil) != tc.ok {
				t.Fatalf("%d bytes of metadata: err %v, want ok %v", tc.size, err, tc.ok)
			}
		})
	}
}

// TestGRPCStalledCallEnds checks that a call that sends its headers and
// never its request message ends with DEADLINE_EXCEEDED once
// --read-timeout (plus --timeout) passes, instead of holding its stream.
func TestGRPCStalledCallEnds(t *testing.T) {
	ctx := testContext(t)
	s := startGRPC(t, grpcServerConfig{readTimeout: 200 * time.Millisecond, callTimeout: 100 * time.Millisecond}, nil, 0, 0)
	conn := rlstest.Dial(t, s.addr, insecure.NewCredentials())
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
		"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var resp rlsv3.RateLimitResponse
	err = stream.RecvMsg(&resp)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call with no message: %v after %v, want DeadlineExceeded", err, time.Since(start))
	}
	if ctx.Err() != nil {
		t.Fatal("the client's own deadline ended the call, not the server's")
	}
}

// blockingStore answers no check until its context ends.
type blockingStore struct{}

func (blockingStore) Apply(ctx context.Context, _ string, _ ratelimit.Request) (ratelimit.Decision, error) {
	<-ctx.Done()
	return ratelimit.Decision{}, ctx.Err()
}

func (blockingStore) Reset(ctx context.Context, _ string) error { <-ctx.Done(); return ctx.Err() }

// TestGRPCCallDeadline checks that a call still running when the per-call
// deadline (--timeout) passes ends, even when the service's own bound on
// the store is longer and the client sets no deadline.
func TestGRPCCallDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := startGRPC(t, grpcServerConfig{callTimeout: 150 * time.Millisecond}, blockingStore{}, time.Hour, 0)
	conn := rlstest.Dial(t, s.addr, insecure.NewCredentials())
	resp, err := rlstest.AskEdge(ctx, conn, "10.0.0.4")
	if ctx.Err() != nil {
		t.Fatalf("the call ran until the client's own deadline (10 s): %v", err)
	}
	// The service answers a store error as envoyproxy/ratelimit does (an
	// error or its failure mode); either way the call ended.
	t.Logf("after the deadline: %v %v", resp.GetOverallCode(), err)
}

// TestGRPCTLS checks the gRPC listener's TLS: a TLS client is served and a
// plaintext one is refused; with a client CA (mutual TLS) a client without
// a certificate is refused and one with a certificate of the CA is served.
func TestGRPCTLS(t *testing.T) {
	p := testkit.NewPKI(t)
	short := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	for _, tc := range []struct {
		name   string
		tls    TLSFiles
		client func(t *testing.T) credentials.TransportCredentials
		ok     bool
	}{
		{"TLS, a TLS client", TLSFiles{Cert: p.ServerCert, Key: p.ServerKey}, func(t *testing.T) credentials.TransportCredentials { return credentials.NewTLS(p.ClientTLS(t, false)) }, true},
		{"TLS, a plaintext client", TLSFiles{Cert: p.ServerCert, Key: p.ServerKey}, func(*testing.T) credentials.TransportCredentials { return insecure.NewCredentials() }, false},
		{"mutual TLS, a client with a certificate", TLSFiles{Cert: p.ServerCert, Key: p.ServerKey, ClientCA: p.ClientCA}, func(t *testing.T) credentials.TransportCredentials { return credentials.NewTLS(p.ClientTLS(t, true)) }, true},
		{"mutual TLS, a client without a certificate", TLSFiles{Cert: p.ServerCert, Key: p.ServerKey, ClientCA: p.ClientCA}, func(t *testing.T) credentials.TransportCredentials { return credentials.NewTLS(p.ClientTLS(t, false)) }, false},
		{"mutual TLS, a client of another CA", TLSFiles{Cert: p.ServerCert, Key: p.ServerKey, ClientCA: p.OtherCA}, func(t *testing.T) credentials.TransportCredentials { return credentials.NewTLS(p.ClientTLS(t, true)) }, false},
		{"mutual TLS, a plaintext client", TLSFiles{Cert: p.ServerCert, Key: p.ServerKey, ClientCA: p.ClientCA}, func(*testing.T) credentials.TransportCredentials { return insecure.NewCredentials() }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startGRPC(t, grpcServerConfig{tls: tc.tls, callTimeout: time.Second}, nil, 0, 0)
			resp, err := rlstest.AskEdge(short(t), rlstest.Dial(t, s.addr, tc.client(t)), "10.0.0.5")
			if tc.ok && (err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK) {
				t.Fatalf("refused: %v %v", resp, err)
			}
			if !tc.ok && (err == nil || status.Code(err) == codes.DeadlineExceeded) {
				t.Fatalf("served, or not refused at once: %v %v", resp, err)
			}
		})
	}
}

// TestGRPCTLSConfigErrors checks that a partial or unreadable TLS set-up is
// an error before the server starts.
func TestGRPCTLSConfigErrors(t *testing.T) {
	p := testkit.NewPKI(t)
	missing := filepath.Join(p.Dir, "missing.pem")
	for _, tc := range []struct {
		name string
		tls  TLSFiles
		want string
	}{
		{"a key without its certificate", TLSFiles{Key: p.ServerKey}, "go together"},
		{"a certificate without its key", TLSFiles{Cert: p.ServerCert}, "go together"},
		{"a client CA alone", TLSFiles{ClientCA: p.ClientCA}, "go together"},
		{"a missing certificate", TLSFiles{Cert: missing, Key: p.ServerKey}, "missing.pem"},
		{"a key that is not the certificate's", TLSFiles{Cert: p.ServerCert, Key: p.ClientKey}, "--grpc-tls-key"},
		{"a client CA file without a certificate", TLSFiles{Cert: p.ServerCert, Key: p.ServerKey, ClientCA: p.ServerKey}, "no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newGRPCServer(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, grpcServerConfig{tls: tc.tls}, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one holding %q", err, tc.want)
			}
		})
	}
}

// TestGRPCWarnsBeyondLoopback checks the warning of a gRPC listener that
// listens beyond loopback without TLS, and its absence on loopback or with
// TLS.
func TestGRPCWarnsBeyondLoopback(t *testing.T) {
	p := testkit.NewPKI(t)
	withTLS := TLSFiles{Cert: p.ServerCert, Key: p.ServerKey}
	for _, tc := range []struct {
		addr net.Addr
		tls  TLSFiles
		warn bool
	}{
		{&net.TCPAddr{IP: net.IPv4zero, Port: 8081}, TLSFiles{}, true},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 8081}, TLSFiles{}, true},
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 8081}, TLSFiles{}, true},
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8081}, TLSFiles{}, false},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 8081}, TLSFiles{}, false},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 8081}, withTLS, false},
	} {
		var logs strings.Builder
		srv, err := newGRPCServer(tc.addr, grpcServerConfig{tls: tc.tls}, slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		srv.Stop()
		warned := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "beyond loopback without TLS")
		if warned != tc.warn {
			t.Errorf("%v TLS %v: log %q, want a warning %v", tc.addr, tc.tls.enabled(), logs.String(), tc.warn)
		}
	}
}
