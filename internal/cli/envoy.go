package cli

import (
	"log/slog"
	"time"

	"github.com/exactlimit/ratelimit/internal/envoyrls"
	"github.com/exactlimit/ratelimit/internal/service"
)

// envoyFlags are serve's flags of the Envoy rate limit service.
type envoyFlags struct {
	listen, config, outage string
	headers                bool
	watch                  time.Duration
	tls                    grpcTLS
}

// defaultEnvoyWatch is how often --envoy-config is looked at for changes.
const defaultEnvoyWatch = 2 * time.Second

func (f *envoyFlags) register(fs *flagSet) {
	fs.StringVar(&f.listen, "grpc-listen", "", "serve Envoy's rate limit service (envoy.service.ratelimit.v3) over gRPC on `ADDR`")
	fs.StringVar(&f.config, "envoy-config", "", "with --grpc-listen, envoyproxy/ratelimit's config: a YAML `PATH`, or a directory of them (one domain each); reloaded when it changes and on SIGHUP")
	fs.DurationVar(&f.watch, "envoy-config-watch", defaultEnvoyWatch, "with --envoy-config, how often to look for changes; a change is loaded once it holds still that long (0: only on SIGHUP)")
	fs.StringVar(&f.outage, "envoy-outage", "return-error", "with --grpc-listen and --redis, what ShouldRateLimit does while Redis is unreachable: return-error (gRPC UNAVAILABLE: Envoy's failure_mode_deny decides), fail-open, fail-closed or local-fallback")
	f.tls.register(fs)
	fs.BoolVar(&f.headers, "envoy-response-headers", false, "with --grpc-listen, ask Envoy to add RateLimit-Limit, -Remaining, -Reset, RateLimit-Policy and RateLimit to responses (or set LIMIT_RESPONSE_HEADERS_ENABLED=true; LIMIT_*_HEADER rename them)")
}

// service returns the Envoy rate limit service of the flags and of the
// peer's environment settings, or nil without --grpc-listen. container says
// serve runs as the peer's container (readPeerListen), where the peer's
// statistics go to statsd by default (readPeerStats). A flag that
// needs --grpc-listen without it, and a setting the service does not take,
// is a usage error.
func (f *envoyFlags) service(env Env, log *slog.Logger, container bool) (*service.Envoy, error) {
	if f.listen == "" {
		if f.config != "" || f.headers {
			return nil, usagef("--envoy-config and --envoy-response-headers need --grpc-listen")
		}
		return nil, nil
	}
	if f.config == "" {
		return nil, usagef("--grpc-listen needs --envoy-config (envoyproxy/ratelimit's YAML)")
	}
	if f.watch < 0 {
		return nil, usagef("--envoy-config-watch must not be negative")
	}
	outage, err := parseOutage(f.outage)
	if err != nil {
		return nil, usagef("--envoy-outage: %v", err)
	}
	pe, err := readPeerEnv(env.Getenv)
	if err != nil {
		return nil, err
	}
	tls, err := f.tls.withPeer(pe.tls, log)
	if err != nil {
		return nil, err
	}
	stats, err := readPeerStats(env.Getenv, container)
	if err != nil {
		return nil, err
	}
	headers := envoyrls.HeadersFromEnv(env.Getenv)
	headers.Enabled = headers.Enabled || f.headers
	return &service.Envoy{
		Listen: f.listen, ConfigPath: f.config, Watch: f.watch, Outage: outage, Headers: headers,
		Load:           envoyrls.LoadOptions{IgnoreDotFiles: pe.ignoreDotFiles, MergeDomains: pe.mergeDomains},
		NearLimitRatio: pe.nearLimitRatio, ShadowMode: pe.shadowMode, DynamicMetadata: pe.dynamicMetadata,
		TLS: service.TLSFiles{Cert: tls.cert, Key: tls.key, ClientCA: tls.clientCA}, KeyPrefix: pe.keyPrefix,
		Stats: stats,
	}, nil
}

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
