package cli

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
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
	cfg, err := envoyrls.ParseConfig("edge.yaml", []byte(strings.ReplaceAll(envoyTestConfig, "%d", "1000")))
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

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// askEdge sends one ShouldRateLimit of domain edge.
func askEdge(ctx context.Context, conn *grpc.ClientConn, ip string) (*rlsv3.RateLimitResponse, error) {
	return rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}}},
	}})
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
	idle := dial(t, s.addr, insecure.NewCredentials())
	if _, err := askEdge(ctx, idle, "10.0.0.1"); err != nil {
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
	other := dial(t, s.addr, insecure.NewCredentials())
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := askEdge(cctx, other, "10.0.0.2"); err != nil {
		t.Fatalf("a second client after the first went idle: %v", err)
	}
}

// TestGRPCMetadataBound checks that a call whose metadata exceeds the
// 64 KiB bound is refused, and one within it is served on the same
// connection.
func TestGRPCMetadataBound(t *testing.T) {
	ctx := testContext(t)
	s := startGRPC(t, grpcServerConfig{callTimeout: time.Second}, nil, 0, 0)
	conn := dial(t, s.addr, insecure.NewCredentials())
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
			_, err := askEdge(mctx, conn, "10.0.0.3")
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
	conn := dial(t, s.addr, insecure.NewCredentials())
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
	conn := dial(t, s.addr, insecure.NewCredentials())
	resp, err := askEdge(ctx, conn, "10.0.0.4")
	if ctx.Err() != nil {
		t.Fatalf("the call ran until the client's own deadline (10 s): %v", err)
	}
	// The service answers a store error as envoyproxy/ratelimit does (an
	// error or its failure mode); either way the call ended.
	t.Logf("after the deadline: %v %v", resp.GetOverallCode(), err)
}

// testPKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, as PEM files in a temporary directory.
type testPKI struct {
	dir                                                    string
	caPool                                                 *x509.CertPool
	serverCert, serverKey, clientCA, clientCert, clientKey string
	otherCA                                                string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	p := testPKI{dir: dir, caPool: x509.NewCertPool()}
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		testkit.WriteFile(t, path, string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})))
		return path
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	serial := int64(1)
	now := time.Now()
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, string) {
		key := newKey()
		serial++
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		cert, _ := x509.ParseCertificate(der)
		return cert, key, write(name+".pem", "CERTIFICATE", der)
	}
	ca, caKey, caPath := newCA("test-ca")
	p.caPool.AddCert(ca)
	p.clientCA = caPath
	_, _, p.otherCA = newCA("other-ca")
	leaf := func(name string, usage x509.ExtKeyUsage, ips []net.IP) (string, string) {
		key := newKey()
		serial++
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: ips,
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p.serverCert, p.serverKey = leaf("server", x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	p.clientCert, p.clientKey = leaf("client", x509.ExtKeyUsageClientAuth, nil)
	return p
}

// clientTLS returns a client's credentials trusting the test CA, with the
// client certificate when withCert.
func (p testPKI) clientTLS(t *testing.T, withCert bool) credentials.TransportCredentials {
	cfg := &tls.Config{RootCAs: p.caPool, MinVersion: tls.VersionTLS12}
	if withCert {
		pair, err := tls.LoadX509KeyPair(p.clientCert, p.clientKey)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(cfg)
}

// TestGRPCTLS checks the gRPC listener's TLS: a TLS client is served and a
// plaintext one is refused; with a client CA (mutual TLS) a client without
// a certificate is refused and one with a certificate of the CA is served.
func TestGRPCTLS(t *testing.T) {
	p := newTestPKI(t)
	short := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	for _, tc := range []struct {
		name   string
		tls    grpcTLS
		client func(t *testing.T) credentials.TransportCredentials
		ok     bool
	}{
		{"TLS, a TLS client", grpcTLS{cert: p.serverCert, key: p.serverKey}, func(t *testing.T) credentials.TransportCredentials { return p.clientTLS(t, false) }, true},
		{"TLS, a plaintext client", grpcTLS{cert: p.serverCert, key: p.serverKey}, func(*testing.T) credentials.TransportCredentials { return insecure.NewCredentials() }, false},
		{"mutual TLS, a client with a certificate", grpcTLS{cert: p.serverCert, key: p.serverKey, clientCA: p.clientCA}, func(t *testing.T) credentials.TransportCredentials { return p.clientTLS(t, true) }, true},
		{"mutual TLS, a client without a certificate", grpcTLS{cert: p.serverCert, key: p.serverKey, clientCA: p.clientCA}, func(t *testing.T) credentials.TransportCredentials { return p.clientTLS(t, false) }, false},
		{"mutual TLS, a client of another CA", grpcTLS{cert: p.serverCert, key: p.serverKey, clientCA: p.otherCA}, func(t *testing.T) credentials.TransportCredentials { return p.clientTLS(t, true) }, false},
		{"mutual TLS, a plaintext client", grpcTLS{cert: p.serverCert, key: p.serverKey, clientCA: p.clientCA}, func(*testing.T) credentials.TransportCredentials { return insecure.NewCredentials() }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startGRPC(t, grpcServerConfig{tls: tc.tls, callTimeout: time.Second}, nil, 0, 0)
			resp, err := askEdge(short(t), dial(t, s.addr, tc.client(t)), "10.0.0.5")
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
	p := newTestPKI(t)
	missing := filepath.Join(p.dir, "missing.pem")
	for _, tc := range []struct {
		name string
		tls  grpcTLS
		want string
	}{
		{"a key without its certificate", grpcTLS{key: p.serverKey}, "go together"},
		{"a certificate without its key", grpcTLS{cert: p.serverCert}, "go together"},
		{"a client CA alone", grpcTLS{clientCA: p.clientCA}, "go together"},
		{"a missing certificate", grpcTLS{cert: missing, key: p.serverKey}, "missing.pem"},
		{"a key that is not the certificate's", grpcTLS{cert: p.serverCert, key: p.clientKey}, "--grpc-tls-key"},
		{"a client CA file without a certificate", grpcTLS{cert: p.serverCert, key: p.serverKey, clientCA: p.serverKey}, "no PEM certificate"},
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
	p := newTestPKI(t)
	withTLS := grpcTLS{cert: p.serverCert, key: p.serverKey}
	for _, tc := range []struct {
		addr net.Addr
		tls  grpcTLS
		warn bool
	}{
		{&net.TCPAddr{IP: net.IPv4zero, Port: 8081}, grpcTLS{}, true},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 8081}, grpcTLS{}, true},
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 8081}, grpcTLS{}, true},
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8081}, grpcTLS{}, false},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 8081}, grpcTLS{}, false},
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

// TestGRPCTLSFlags checks the flags through serve: they need --grpc-listen,
// and with it a TLS listener serves a TLS client.
func TestGRPCTLSFlags(t *testing.T) {
	p := newTestPKI(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "edge.yaml")
	writeEnvoyConfig(t, cfg, "5")
	var stdout, stderr testkit.Buffer
	env := Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
	if code := Main(context.Background(), []string{"serve", "--grpc-tls-cert", p.serverCert, "--grpc-tls-key", p.serverKey}, env); code != 2 ||
		!strings.Contains(stderr.String(), "--grpc-tls-cert applies only with --grpc-listen") {
		t.Errorf("TLS flags without --grpc-listen: exit %d, %s", code, stderr.String())
	}

	serveLog := serveMutualTLS(t, p, env, "--envoy-config", cfg,
		"--grpc-tls-cert", p.serverCert, "--grpc-tls-key", p.serverKey, "--grpc-tls-client-ca", p.clientCA)
	if strings.Contains(serveLog, "without TLS") {
		t.Errorf("a TLS listener on loopback warned: %s", serveLog)
	}
}

// serveMutualTLS runs serve with a gRPC listener on 127.0.0.1 and args,
// checks that it answers a client with p's certificate and refuses one
// without, stops it, and returns its log.
func serveMutualTLS(t *testing.T, p testPKI, env Env, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var serveLog testkit.Buffer
	env.Stderr = &serveLog
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"}, args...), env)
	}()
	grpcAddr := waitLog(t, &serveLog, done, regexp.MustCompile(`grpc=(\S+)`))[1]
	actx, acancel := context.WithTimeout(ctx, 5*time.Second)
	defer acancel()
	if resp, err := askEdge(actx, dial(t, grpcAddr, p.clientTLS(t, true)), "10.0.0.6"); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("mutual TLS client: %v %v", resp, err)
	}
	if _, err := askEdge(actx, dial(t, grpcAddr, p.clientTLS(t, false)), "10.0.0.6"); err == nil {
		t.Error("a client without a certificate was served")
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("serve exited %d: %s", code, serveLog.String())
	}
	return serveLog.String()
}

// TestGRPCTLSFromThePeersSettings: envoyproxy/ratelimit's GRPC_SERVER_USE_TLS,
// GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY and GRPC_CLIENT_TLS_CACERT turn on
// the same (mutual) TLS as the --grpc-tls-* flags.
func TestGRPCTLSFromThePeersSettings(t *testing.T) {
	p := newTestPKI(t)
	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	writeEnvoyConfig(t, cfg, "5")
	settings := map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": p.serverCert,
		"GRPC_SERVER_TLS_KEY": p.serverKey, "GRPC_CLIENT_TLS_CACERT": p.clientCA}
	var stdout testkit.Buffer
	env := Env{Stdout: &stdout, Getenv: func(k string) string { return settings[k] }}
	serveMutualTLS(t, p, env, "--envoy-config", cfg)
}

// TestGRPCTLSFlagsBesideThePeersSettings: the --grpc-tls-* flags (or their
// RATELIMIT_GRPC_TLS_* variables) and the peer's settings combine field by
// field, a flag winning for its own field and the log saying so: a client CA
// of the peer's is never dropped because the certificate came from a flag.
func TestGRPCTLSFlagsBesideThePeersSettings(t *testing.T) {
	p := newTestPKI(t)
	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	writeEnvoyConfig(t, cfg, "5")
	peer := map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": p.serverCert,
		"GRPC_SERVER_TLS_KEY": p.serverKey, "GRPC_CLIENT_TLS_CACERT": p.clientCA}
	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
		logs []string // what the log must say
	}{
		{"the certificate and key of flags, the client CA of the peer's settings", peer,
			[]string{"--grpc-tls-cert", p.serverCert, "--grpc-tls-key", p.serverKey},
			[]string{"flag=--grpc-tls-cert overrides=GRPC_SERVER_TLS_CERT", "flag=--grpc-tls-key overrides=GRPC_SERVER_TLS_KEY"}},
		{"the certificate and key of RATELIMIT_GRPC_TLS_*, the client CA of the peer's settings",
			map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_CLIENT_TLS_CACERT": p.clientCA,
				"RATELIMIT_GRPC_TLS_CERT": p.serverCert, "RATELIMIT_GRPC_TLS_KEY": p.serverKey}, nil, nil},
		{"a client CA flag wins over the peer's", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": p.serverCert,
			"GRPC_SERVER_TLS_KEY": p.serverKey, "GRPC_CLIENT_TLS_CACERT": p.otherCA},
			[]string{"--grpc-tls-client-ca", p.clientCA},
			[]string{"flag=--grpc-tls-client-ca overrides=GRPC_CLIENT_TLS_CACERT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout testkit.Buffer
			env := Env{Stdout: &stdout, Getenv: func(k string) string { return tc.vars[k] }}
			serveLog := serveMutualTLS(t, p, env, append([]string{"--envoy-config", cfg}, tc.args...)...)
			for _, want := range tc.logs {
				if !strings.Contains(serveLog, want) {
					t.Errorf("the log lacks %q:\n%s", want, serveLog)
				}
			}
		})
	}
}
