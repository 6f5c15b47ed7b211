package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/credentials"

	"github.com/exactlimit/ratelimit/internal/rlstest"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// TestGRPCTLSFlags checks the flags through serve: they need --grpc-listen,
// and with it a TLS listener serves a TLS client.
func TestGRPCTLSFlags(t *testing.T) {
	p := testkit.NewPKI(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "edge.yaml")
	writeEnvoyConfig(t, cfg, "5")
	var stdout, stderr testkit.Buffer
	env := Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
	if code := Main(context.Background(), []string{"serve", "--grpc-tls-cert", p.ServerCert, "--grpc-tls-key", p.ServerKey}, env); code != 2 ||
		!strings.Contains(stderr.String(), "--grpc-tls-cert applies only with --grpc-listen") {
		t.Errorf("TLS flags without --grpc-listen: exit %d, %s", code, stderr.String())
	}

	serveLog := serveMutualTLS(t, p, nil, "--envoy-config", cfg,
		"--grpc-tls-cert", p.ServerCert, "--grpc-tls-key", p.ServerKey, "--grpc-tls-client-ca", p.ClientCA)
	if strings.Contains(serveLog, "without TLS") {
		t.Errorf("a TLS listener on loopback warned: %s", serveLog)
	}
}

// serveMutualTLS runs serve with a gRPC listener on 127.0.0.1 and args,
// checks that it answers a client with p's certificate and refuses one
// without, stops it, and returns its log.
func serveMutualTLS(t *testing.T, p testkit.PKI, vars map[string]string, args ...string) string {
	t.Helper()
	s := startServe(t, vars, append([]string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"}, args...)...)
	grpcAddr := s.svc.Addrs().GRPC.String()
	actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer acancel()
	if resp, err := rlstest.AskEdge(actx, rlstest.Dial(t, grpcAddr, credentials.NewTLS(p.ClientTLS(t, true))), "10.0.0.6"); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("mutual TLS client: %v %v", resp, err)
	}
	if _, err := rlstest.AskEdge(actx, rlstest.Dial(t, grpcAddr, credentials.NewTLS(p.ClientTLS(t, false))), "10.0.0.6"); err == nil {
		t.Error("a client without a certificate was served")
	}
	s.stop()
	if code := <-s.done; code != 0 {
		t.Errorf("serve exited %d: %s", code, s.stderr.String())
	}
	s.done <- 0
	return s.stderr.String()
}

// TestGRPCTLSFromThePeersSettings: envoyproxy/ratelimit's GRPC_SERVER_USE_TLS,
// GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY and GRPC_CLIENT_TLS_CACERT turn on
// the same (mutual) TLS as the --grpc-tls-* flags.
func TestGRPCTLSFromThePeersSettings(t *testing.T) {
	p := testkit.NewPKI(t)
	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	writeEnvoyConfig(t, cfg, "5")
	settings := map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": p.ServerCert,
		"GRPC_SERVER_TLS_KEY": p.ServerKey, "GRPC_CLIENT_TLS_CACERT": p.ClientCA}
	serveMutualTLS(t, p, settings, "--envoy-config", cfg)
}

// TestGRPCTLSFlagsBesideThePeersSettings: the --grpc-tls-* flags (or their
// RATELIMIT_GRPC_TLS_* variables) and the peer's settings combine field by
// field, a flag winning for its own field and the log saying so: a client CA
// of the peer's is never dropped because the certificate came from a flag.
func TestGRPCTLSFlagsBesideThePeersSettings(t *testing.T) {
	p := testkit.NewPKI(t)
	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	writeEnvoyConfig(t, cfg, "5")
	peer := map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": p.ServerCert,
		"GRPC_SERVER_TLS_KEY": p.ServerKey, "GRPC_CLIENT_TLS_CACERT": p.ClientCA}
	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
		logs []string // what the log must say
	}{
		{"the certificate and key of flags, the client CA of the peer's settings", peer,
			[]string{"--grpc-tls-cert", p.ServerCert, "--grpc-tls-key", p.ServerKey},
			[]string{"flag=--grpc-tls-cert overrides=GRPC_SERVER_TLS_CERT", "flag=--grpc-tls-key overrides=GRPC_SERVER_TLS_KEY"}},
		{"the certificate and key of RATELIMIT_GRPC_TLS_*, the client CA of the peer's settings",
			map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_CLIENT_TLS_CACERT": p.ClientCA,
				"RATELIMIT_GRPC_TLS_CERT": p.ServerCert, "RATELIMIT_GRPC_TLS_KEY": p.ServerKey}, nil, nil},
		{"a client CA flag wins over the peer's", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": p.ServerCert,
			"GRPC_SERVER_TLS_KEY": p.ServerKey, "GRPC_CLIENT_TLS_CACERT": p.OtherCA},
			[]string{"--grpc-tls-client-ca", p.ClientCA},
			[]string{"flag=--grpc-tls-client-ca overrides=GRPC_CLIENT_TLS_CACERT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serveLog := serveMutualTLS(t, p, tc.vars, append([]string{"--envoy-config", cfg}, tc.args...)...)
			for _, want := range tc.logs {
				if !strings.Contains(serveLog, want) {
					t.Errorf("the log lacks %q:\n%s", want, serveLog)
				}
			}
		})
	}
}
