package service

import (
	"log/slog"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/internal/config"
	"github.com/exactlimit/ratelimit/internal/envoyrls"
)

// Config is everything a Service is built from: what the flags and the
// environment of 'ratelimit serve' say. The zero value of a field is its
// default where one is named.
type Config struct {
	// Listen is the address of the HTTP listener (host:port; port 0 picks
	// a free one): the API, or the reverse proxy with Proxy.
	Listen string
	// AdminListen is, with Proxy, the address of the API, /healthz and
	// /metrics.
	AdminListen string
	// Debug, when set, is the address of the debug listener (the peer's
	// DEBUG_HOST:DEBUG_PORT): /rlconfig, /stats and /debug/pprof/. It
	// takes no token: keep it where only operators reach it.
	Debug string
	// MaxConns bounds the connections open at once on each listener; more
	// wait (0: no bound).
	MaxConns int
	// ReadTimeout bounds reading each request, headers and body, and a gRPC
	// connection's handshake (0: none).
	ReadTimeout time.Duration
	// Timeout bounds each check against the store (default
	// DefaultTimeout).
	Timeout time.Duration

	// Redis, when set, is the Redis deployment (redisstore.ClientOptions
	// applied); nil keeps the buckets in this process.
	Redis *redis.UniversalOptions
	// Outage is what a check of the API does while Redis is unreachable.
	Outage fallback.Outage
	// FleetSize is, with fallback.LocalFallback, the number of replicas
	// sharing the policy (0 or 1: one).
	FleetSize int

	// ConfigFile is the YAML file of namespaces (package config); ""
	// serves config.Default(). Reload reads it again.
	ConfigFile string
	// PlanRefresh is how often each namespace of plans asks the store for
	// the changes of its assignments (1 ms to 1 s; 0:
	// the library's default, 500 ms): another process's
	// assignment applies here within it and one round trip.
	PlanRefresh time.Duration
	// Token is the API's bearer token when TokenFile is not set (the
	// RATELIMIT_TOKEN variable); "" with no TokenFile: no token.
	Token string
	// TokenFile holds the API's bearer token; Reload reads it again.
	TokenFile string
	// MetricsTokenFile holds a bearer token /metrics accepts besides the
	// API's; Reload reads it again.
	MetricsTokenFile string
	// Watch is how often ConfigFile, TokenFile and MetricsTokenFile are
	// looked at for changes, each reloaded once it holds still that long
	// (0: only on Reload). The Envoy config has its own, Envoy.Watch.
	Watch time.Duration
	// AllowedHosts are the names (or name:port) the API answers to besides
	// its listen address while it has no token.
	AllowedHosts []string
	// TopDenied lists the most denied subjects on the operator page.
	TopDenied bool

	// Proxy, when set, makes the Listen listener a rate-limiting reverse
	// proxy and moves the API to AdminListen.
	Proxy *Proxy
	// Envoy, when set, serves Envoy's rate limit service.
	Envoy *Envoy

	// Logger receives the service's log lines (default: discard).
	Logger *slog.Logger
	// Version is the build's version, for ratelimit_build_info.
	Version string
}

// Proxy is the reverse proxy of Config.Proxy.
type Proxy struct {
	// Upstream receives the allowed requests.
	Upstream *url.URL
	// Namespace limits the proxied requests (default
	// config.DefaultNamespace).
	Namespace string
	// Key keys a request (default: the client's IP, by Trusted).
	Key httplimit.KeyFunc
	// Trusted are the proxies whose forwarding header is believed.
	Trusted httplimit.TrustedProxies
	// JSON makes the limiter's own responses JSON instead of text.
	JSON bool
}

// Envoy is Envoy's rate limit service of Config.Envoy: gRPC on its own
// listener, POST /json and GET /healthcheck beside the API.
type Envoy struct {
	// Listen is the gRPC listener's address.
	Listen string
	// ConfigPath is envoyproxy/ratelimit's config: a YAML file, or a
	// directory of them. Reload reads it again.
	ConfigPath string
	// Load says how a directory is read.
	Load envoyrls.LoadOptions
	// Watch is how often ConfigPath is looked at for changes (0: only on
	// Reload).
	Watch time.Duration
	// Outage is what ShouldRateLimit does while Redis is unreachable.
	// Unless it is Config.Outage, it takes a second fallback store over the
	// same Redis client, with a breaker of its own.
	Outage fallback.Outage
	// Headers are the response headers to ask Envoy to add.
	Headers envoyrls.Headers
	// NearLimitRatio is the peer's NEAR_LIMIT_RATIO (0: its default).
	NearLimitRatio float64
	// ShadowMode and DynamicMetadata are the peer's SHADOW_MODE and
	// RESPONSE_DYNAMIC_METADATA.
	ShadowMode, DynamicMetadata bool
	// TLS names the PEM files of the listener's TLS; all empty: plaintext.
	TLS TLSFiles
	// KeyPrefix begins every key of the Envoy service's buckets (the
	// peer's CACHE_KEY_PREFIX): two deployments on one Redis with different
	// prefixes never share a bucket. The HTTP API's keys are its
	// namespaces', shared with the library's Limiters, and take no prefix.
	KeyPrefix string
	// Stats, when set, sends the peer's statistics (PeerStats).
	Stats *PeerStats
}

// TLSFiles name the PEM files of a listener's TLS: its certificate chain and
// key, and for mutual TLS the CA that client certificates must chain to.
type TLSFiles struct {
	Cert, Key, ClientCA string
}

// defaults fills in c's defaults.
func (c *Config) defaults() {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.FleetSize < 1 {
		c.FleetSize = 1
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Proxy != nil && c.Proxy.Namespace == "" {
		c.Proxy.Namespace = config.DefaultNamespace
	}
}

// DefaultTimeout bounds each check when Config.Timeout is zero.
const DefaultTimeout = 500 * time.Millisecond
