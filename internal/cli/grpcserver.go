package cli

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

// grpcTLS names the PEM files of the gRPC listener's TLS: its certificate
// chain and key, and for mutual TLS the CA that client certificates must
// chain to. All empty: plaintext. The flags --grpc-tls-cert, --grpc-tls-key
// and --grpc-tls-client-ca fill it; so may envoyproxy/ratelimit's
// environment settings.
type grpcTLS struct {
	cert, key, clientCA string
}

func (t *grpcTLS) register(fs *flagSet) {
	fs.StringVar(&t.cert, "grpc-tls-cert", "", "with --grpc-listen, serve TLS with the PEM certificate chain in `FILE` (needs --grpc-tls-key)")
	fs.StringVar(&t.key, "grpc-tls-key", "", "with --grpc-tls-cert, the PEM private key in `FILE`")
	fs.StringVar(&t.clientCA, "grpc-tls-client-ca", "", "with --grpc-tls-cert, mutual TLS: require client certificates issued by the PEM CAs in `FILE`")
}

// withPeer returns t with the peer's settings p (GRPC_SERVER_USE_TLS=true
// and its files) in the fields t leaves empty. A field set by a flag (or by
// its RATELIMIT_GRPC_TLS_* variable) wins over the peer's, and the log says
// so; a field only the peer's settings name is kept, so that a client CA of
// GRPC_CLIENT_TLS_CACERT is never dropped for a certificate given by a flag.
// Without GRPC_SERVER_USE_TLS=true it returns t. With it, a combination
// without a certificate and a key is a usage error: never served as
// plaintext.
func (t grpcTLS) withPeer(p peerTLS, log *slog.Logger) (grpcTLS, error) {
	if !p.use {
		return t, nil
	}
	for _, f := range []struct {
		flag, env   string
		dst         *string
		peerSetting string
	}{
		{"--grpc-tls-cert", "GRPC_SERVER_TLS_CERT", &t.cert, p.cert},
		{"--grpc-tls-key", "GRPC_SERVER_TLS_KEY", &t.key, p.key},
		{"--grpc-tls-client-ca", "GRPC_CLIENT_TLS_CACERT", &t.clientCA, p.clientCA},
	} {
		switch {
		case f.peerSetting == "":
		case *f.dst == "":
			*f.dst = f.peerSetting
		default:
			log.Warn("the gRPC listener's TLS: a flag wins over the peer's setting", "flag", f.flag, "overrides", f.env, "file", *f.dst)
		}
	}
	if t.cert == "" || t.key == "" {
		return t, usagef("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (or --grpc-tls-cert and --grpc-tls-key)")
	}
	return t, nil
}

// enabled reports whether TLS is asked for.
func (t grpcTLS) enabled() bool { return t.cert != "" || t.key != "" || t.clientCA != "" }

// config loads the files into a TLS configuration, or returns nil for
// plaintext. A partial set (a key without its certificate, a client CA
// without a certificate) is a usage error.
func (t grpcTLS) config() (*tls.Config, error) {
	if !t.enabled() {
		return nil, nil
	}
	if t.cert == "" || t.key == "" {
		return nil, usagef("--grpc-tls-cert and --grpc-tls-key go together (--grpc-tls-client-ca needs both)")
	}
	pair, err := tls.LoadX509KeyPair(t.cert, t.key)
	if err != nil {
		return nil, fmt.Errorf("--grpc-tls-cert, --grpc-tls-key: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if t.clientCA != "" {
		pem, err := os.ReadFile(t.clientCA)
		if err != nil {
			return nil, fmt.Errorf("--grpc-tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--grpc-tls-client-ca %s: no PEM certificate in it", t.clientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// grpcServerConfig is what newGRPCServer builds a server from.
type grpcServerConfig struct {
	tls grpcTLS
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
