package service

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/tap"

	"github.com/exactlimit/ratelimit/internal/clock"
	"github.com/exactlimit/ratelimit/internal/envoyrls"
)

// The gRPC listener's bounds, near the HTTP listener's (newHTTPServer).
const (
	// grpcMaxHeaderListSize bounds the metadata of one call, as
	// MaxHeaderBytes bounds an HTTP request's headers.
	grpcMaxHeaderListSize = 64 << 10
	// grpcMaxConcurrentStreams bounds the calls in flight on one
	// connection (HTTP/2's recommended minimum); a client such as Envoy
	// opens another connection for more.
	grpcMaxConcurrentStreams = 100
	// grpcMaxConnectionIdle closes a connection with no call for this long,
	// as IdleTimeout does for HTTP, so that idle clients cannot hold
	// --max-connections.
	grpcMaxConnectionIdle = 2 * time.Minute
	// grpcKeepaliveMinTime is the shortest interval between a client's
	// pings that the server accepts; a client pinging more often is sent
	// GOAWAY. Pings on a connection with no call are allowed (Envoy's
	// connection keepalive sends them).
	grpcKeepaliveMinTime = 10 * time.Second
	// grpcHandshakeTimeout bounds a connection's TLS and HTTP/2 handshake
	// when --read-timeout is 0.
	grpcHandshakeTimeout = 10 * time.Second
)

// enabled reports whether TLS is asked for.
func (t TLSFiles) enabled() bool { return t.Cert != "" || t.Key != "" || t.ClientCA != "" }

// config loads the files into a TLS configuration, or returns nil for
// plaintext. A partial set (a key without its certificate, a client CA
// without a certificate) is a *ConfigError.
func (t TLSFiles) config() (*tls.Config, error) {
	if !t.enabled() {
		return nil, nil
	}
	if t.Cert == "" || t.Key == "" {
		return nil, configErrorf("--grpc-tls-cert and --grpc-tls-key go together (--grpc-tls-client-ca needs both)")
	}
	pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("--grpc-tls-cert, --grpc-tls-key: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if t.ClientCA != "" {
		pem, err := os.ReadFile(t.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("--grpc-tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--grpc-tls-client-ca %s: no PEM certificate in it", t.ClientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// grpcServerConfig is what newGRPCServer builds a server from.
type grpcServerConfig struct {
	tls TLSFiles
	// callTimeout bounds a call from its request message to its answer:
	// --timeout. A call that runs past it ends with DEADLINE_EXCEEDED.
	callTimeout time.Duration
	// readTimeout (--read-timeout; 0: none) bounds the handshake of a
	// connection, and how long a call may take to send its request
	// message after its headers (plus callTimeout to be answered).
	readTimeout time.Duration
	// idle is MaxConnectionIdle (0: grpcMaxConnectionIdle); tests shorten
	// it.
	idle time.Duration
}

// newGRPCServer returns the gRPC server of the listener at addr, with the
// Envoy service's message bounds (envoyrls.ServerOptions) and the
// listener's: keepalive enforcement, idle connections closed, a bound on
// the metadata and the streams of a connection, a deadline on each call,
// and TLS when c.tls asks for it. It logs a warning when addr is beyond
// loopback without TLS. The connection limit is the listener's
// (limitConns).
func newGRPCServer(addr net.Addr, c grpcServerConfig, log *slog.Logger) (*grpc.Server, error) {
	tlsConfig, err := c.tls.config()
	if err != nil {
		return nil, err
	}
	idle := c.idle
	if idle <= 0 {
		idle = grpcMaxConnectionIdle
	}
	handshake := c.readTimeout
	if handshake <= 0 {
		handshake = grpcHandshakeTimeout
	}
	opts := append(envoyrls.ServerOptions(),
		grpc.MaxHeaderListSize(grpcMaxHeaderListSize),
		grpc.MaxConcurrentStreams(grpcMaxConcurrentStreams),
		grpc.ConnectionTimeout(handshake),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: grpcKeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idle, Time: 2 * time.Minute, Timeout: 20 * time.Second}),
		grpc.UnaryInterceptor(callDeadline(c.callTimeout)),
	)
	if c.readTimeout > 0 {
		opts = append(opts, grpc.InTapHandle(readDeadline(c.readTimeout+c.callTimeout)))
	}
	if tlsConfig != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsConfig)))
	} else if beyondLoopback(addr) {
		log.Warn("the gRPC listener listens beyond loopback without TLS: anyone who reaches it can spend every Envoy rule's buckets; set --grpc-tls-cert and --grpc-tls-key (and --grpc-tls-client-ca for mutual TLS)",
			"grpc", addr.String())
	}
	return grpc.NewServer(opts...), nil
}

// streamCancelKey holds, in a call's context, the cancel function of
// readDeadline's deadline.
type streamCancelKey struct{}

// readDeadline returns the tap that gives each stream a deadline d after its
// headers: a call whose request message does not arrive in time ends with
// DEADLINE_EXCEEDED, instead of holding its stream (and its metadata) for
// as long as the client keeps the connection. The transport reads the
// request under this context, which an interceptor cannot bound. A stream
// whose own deadline (the client's grpc-timeout) comes first keeps it alone.
func readDeadline(d time.Duration) tap.ServerInHandle {
	return func(ctx context.Context, _ *tap.Info) (context.Context, error) {
		if clock.Within(ctx, d) {
			return ctx, nil
		}
		ctx, cancel := context.WithTimeout(ctx, d)
		// callDeadline cancels it when the call ends; a stream that never
		// reaches it (its message never came) is released by the timer.
		return context.WithValue(ctx, streamCancelKey{}, cancel), nil
	}
}

// callDeadline returns the interceptor that bounds each call's handling by
// d (none when d <= 0; a call whose deadline comes first keeps it alone) and
// releases readDeadline's timer when it ends.
func callDeadline(d time.Duration) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if cancel, ok := ctx.Value(streamCancelKey{}).(context.CancelFunc); ok {
			defer cancel()
		}
		ctx, cancel := clock.Bound(ctx, d)
		defer cancel()
		return handler(ctx, req)
	}
}
