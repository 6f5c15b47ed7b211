package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/exactlimit/ratelimit/internal/service"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

// stringList is a flag that may be repeated, and whose values may each hold
// several comma-separated items.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*l = append(*l, part)
		}
	}
	return nil
}

// redisFlags are the flags that choose a Redis deployment.
type redisFlags struct {
	urls         stringList
	cluster      bool
	passwordFile string
	getenv       func(string) string // RATELIMIT_REDIS_PASSWORD, REDISCLI_AUTH
}

func (f *redisFlags) register(fs *flagSet) {
	fs.Var(&f.urls, "redis", "Redis `URL`: redis://[user:password@]host:port[/db], or rediss:// for TLS; repeat it (or separate with commas) to list several Redis Cluster nodes")
	fs.BoolVar(&f.cluster, "cluster", false, "treat --redis as a Redis Cluster even when it names one node")
	fs.StringVar(&f.passwordFile, "redis-password-file", "", "read the Redis password from `FILE` (or set RATELIMIT_REDIS_PASSWORD or REDISCLI_AUTH) rather than put it in --redis, where ps shows it")
	f.getenv = fs.getenv
}

// options returns the go-redis options of the flags, with the settings a
// limiter needs (redisstore.ClientOptions), and a description without any
// password. It returns nil options when no --redis was given.
func (f *redisFlags) options() (*redis.UniversalOptions, string, error) {
	if len(f.urls) == 0 {
		if f.cluster {
			return nil, "", errors.New("--cluster needs --redis URL")
		}
		return nil, "", nil
	}
	for _, u := range f.urls {
		if err := checkScheme(u); err != nil {
			return nil, "", err
		}
	}
	var uo *redis.UniversalOptions
	switch {
	case len(f.urls) == 1 && !f.cluster:
		o, err := redis.ParseURL(f.urls[0])
		if err != nil {
			return nil, "", fmt.Errorf("--redis %s: %w", redact(f.urls[0]), err)
		}
		uo = fromOptions(o)
	case len(f.urls) == 1:
		co, err := redis.ParseClusterURL(f.urls[0])
		if err != nil {
			return nil, "", fmt.Errorf("--redis %s: %w", redact(f.urls[0]), err)
		}
		uo = &redis.UniversalOptions{
			Addrs: co.Addrs, Username: co.Username, Password: co.Password, TLSConfig: co.TLSConfig,
			ClientName: co.ClientName, Protocol: co.Protocol, DialTimeout: co.DialTimeout,
			ReadTimeout: co.ReadTimeout, WriteTimeout: co.WriteTimeout, PoolSize: co.PoolSize,
			PoolTimeout: co.PoolTimeout, MinIdleConns: co.MinIdleConns, MaxIdleConns: co.MaxIdleConns,
			ConnMaxIdleTime: co.ConnMaxIdleTime, ConnMaxLifetime: co.ConnMaxLifetime,
			IsClusterMode: true,
		}
	default:
		var first *redis.Options
		var firstURL *url.URL
		for _, s := range f.urls {
			o, err := redis.ParseURL(s)
			if err != nil {
				return nil, "", fmt.Errorf("--redis %s: %w", redact(s), err)
			}
			u, _ := url.Parse(s)
			if o.DB != 0 {
				return nil, "", fmt.Errorf("--redis %s: Redis Cluster has only database 0", redact(s))
			}
			if first == nil {
				first, firstURL = o, u
				uo = fromOptions(o)
				uo.IsClusterMode = true
				continue
			}
			if u.Scheme != firstURL.Scheme || o.Username != first.Username || o.Password != first.Password {
				return nil, "", fmt.Errorf("--redis %s: every cluster node must have the same scheme, user and password as %s", redact(s), redact(f.urls[0]))
			}
			uo.Addrs = append(uo.Addrs, o.Addr)
		}
	}
	if err := f.applyPassword(uo); err != nil {
		return nil, "", err
	}
	redisstore.ClientOptions(uo)
	return uo, service.DescribeRedis(uo), nil
}

// fromOptions copies the fields ParseURL sets into UniversalOptions.
func fromOptions(o *redis.Options) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs: []string{o.Addr}, Username: o.Username, Password: o.Password, DB: o.DB,
		TLSConfig: o.TLSConfig, ClientName: o.ClientName, Protocol: o.Protocol,
		DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
		PoolSize: o.PoolSize, PoolTimeout: o.PoolTimeout, MinIdleConns: o.MinIdleConns,
		MaxIdleConns: o.MaxIdleConns, ConnMaxIdleTime: o.ConnMaxIdleTime, ConnMaxLifetime: o.ConnMaxLifetime,
	}
}

func checkScheme(s string) error {
	if !strings.Contains(s, "://") {
		return fmt.Errorf("--redis %s: want a URL such as redis://%s", redact(s), redact(s))
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("--redis %s: not a URL", redact(s))
	}
	switch u.Scheme {
	case "redis", "rediss":
		return nil
	case "":
		return fmt.Errorf("--redis %s: want a URL such as redis://%s", redact(s), strings.TrimPrefix(redact(s), "://"))
	}
	return fmt.Errorf("--redis %s: scheme %q: want redis:// or rediss://", redact(s), u.Scheme)
}

// redact returns s with any password replaced by "xxxxx". Whatever comes
// before the last "@" of a string that is not a well-formed URL is
// replaced, user and all.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil || u.Scheme == "" {
		if i := strings.LastIndex(s, "@"); i >= 0 {
			prefix := ""
			if j := strings.Index(s[:i], "://"); j >= 0 {
				prefix = s[:j+3]
			}
			return prefix + "xxxxx@" + s[i+1:]
		}
		return s
	}
	return u.Redacted()
}

// newClient returns the client of o: a cluster client when o says so.
func newClient(o *redis.UniversalOptions) redis.UniversalClient {
	return redis.NewUniversalClient(o)
}

// redisLogger sends go-redis's own log lines (failed dials and the like,
// which the commands report through their errors anyway) to a slog logger
// at debug level, instead of its default of stderr.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if l.log != nil {
		l.log.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
	}
}

var setRedisLogger sync.Once

// quietRedis routes go-redis's global logger to log (nil: nowhere). The
// logger is process-wide; the first call wins.
func quietRedis(log *slog.Logger) {
	setRedisLogger.Do(func() { redis.SetLogger(redisLogger{log}) })
}

// redisPassword returns the Redis password of --redis-password-file, or of
// RATELIMIT_REDIS_PASSWORD, or of REDISCLI_AUTH (redis-cli's variable), or
// "" when none is given. Unlike a password in --redis URL, these do not
// show in ps.
func (f *redisFlags) password() (string, error) {
	if f.passwordFile != "" {
		b, err := os.ReadFile(f.passwordFile)
		if err != nil {
			return "", fmt.Errorf("--redis-password-file: %w", err)
		}
		pw := strings.TrimRight(string(b), "\r\n")
		if pw == "" {
			return "", fmt.Errorf("--redis-password-file %s is empty", f.passwordFile)
		}
		return pw, nil
	}
	if f.getenv == nil {
		return "", nil
	}
	if pw := f.getenv("RATELIMIT_REDIS_PASSWORD"); pw != "" {
		return pw, nil
	}
	return f.getenv("REDISCLI_AUTH"), nil
}

// applyPassword sets o's password from password(), refusing a second one
// beside the URL's.
func (f *redisFlags) applyPassword(o *redis.UniversalOptions) error {
	pw, err := f.password()
	if err != nil || pw == "" {
		return err
	}
	if o.Password != "" {
		return errors.New("--redis: the URL holds a password and one is also given by --redis-password-file or the environment; give it once")
	}
	o.Password = pw
	return nil
}

// peerRedisVars are the settings of envoyproxy/ratelimit that choose its
// Redis. Any of them set (or BACKEND_TYPE=redis) makes serve take its Redis
// from them when --redis is not given; the others keep the peer's defaults.
var peerRedisVars = []string{
	"REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_AUTH", "REDIS_SENTINEL_AUTH", "REDIS_POOL_SIZE",
	"REDIS_TIMEOUT", "REDIS_TLS", "REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY",
	"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
}

// peerRedis is the Redis of the peer's settings.
type peerRedis struct {
	opts *redis.UniversalOptions // redisstore.ClientOptions applied; nil: the settings name no Redis
	set  []string                // the variables of peerRedisVars that are set, for the log
	// warnings are settings the peer ignores too, said in the log.
	warnings []string
}

// readPeerRedis reads the Redis of the peer's settings through getenv, as
// envoyproxy/ratelimit dials it: REDIS_SOCKET_TYPE tcp or unix (default
// unix), REDIS_TYPE single, cluster or sentinel in any case (default
// single), REDIS_URL host:port, a socket's path, host:port,host:port for a
// cluster, or mastername,host:port,... for a sentinel (default
// /var/run/nutcracker/ratelimit.sock), REDIS_AUTH and REDIS_SENTINEL_AUTH
// password or user:password, REDIS_TLS with its PEM files, REDIS_POOL_SIZE
// and REDIS_TIMEOUT (the dial timeout: --timeout bounds each check). A value
// that is not valid is a usage error naming its variable. When overridden
// (--redis is given), it only lists the settings that are set, for the
// log: a Redis they describe is not used, so neither is its shape checked
// (a platform's REDIS_URL beside --redis is no error). REDIS_PERSECOND=true
// and BACKEND_TYPE=memcache are refused either way.
func readPeerRedis(getenv func(string) string, overridden bool) (peerRedis, error) {
	var p peerRedis
	get := func(name, def string) string {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			return v
		}
		return def
	}
	for _, name := range peerRedisVars {
		if get(name, "") != "" {
			p.set = append(p.set, name)
		}
	}
	switch backend := get("BACKEND_TYPE", ""); {
	case backend == "":
	case strings.EqualFold(backend, "redis"):
		p.set = append(p.set, "BACKEND_TYPE")
	case strings.EqualFold(backend, "memcache"):
		return p, usagef("BACKEND_TYPE=memcache is not supported: this service keeps its buckets in Redis (REDIS_URL) or, with no Redis setting, in this process")
	default:
		return p, usagef("BACKEND_TYPE=%q: want redis", backend)
	}
	if on, err := peerBool(getenv, "REDIS_PERSECOND"); err != nil {
		return p, err
	} else if on {
		return p, usagef("REDIS_PERSECOND=true is not supported: per-second rules share the one Redis of REDIS_URL (see docs/envoy.md)")
	}
	if len(p.set) == 0 || overridden {
		return p, nil
	}

	socket := strings.ToLower(get("REDIS_SOCKET_TYPE", "unix"))
	if socket != "tcp" && socket != "unix" {
		return p, usagef("REDIS_SOCKET_TYPE=%q: want tcp or unix", get("REDIS_SOCKET_TYPE", ""))
	}
	typ := strings.ToLower(get("REDIS_TYPE", "single"))
	addr := get("REDIS_URL", "/var/run/nutcracker/ratelimit.sock")
	if strings.Contains(addr, "://") {
		// Some platforms set REDIS_URL to a URL of their own.
		return p, usagef("REDIS_URL=%q: a URL, where the peer takes host:port (REDIS_SOCKET_TYPE=tcp) or a socket's path; give a URL as --redis", redact(addr))
	}
	o := &redis.UniversalOptions{}
	switch typ {
	case "single":
		o.Addrs = []string{addr}
	case "cluster":
		o.Addrs, o.IsClusterMode = strings.Split(addr, ","), true
	case "sentinel":
		parts := strings.Split(addr, ",")
		if len(parts) < 2 || parts[0] == "" {
			return p, usagef("REDIS_URL=%q: with REDIS_TYPE=sentinel, want mastername,host:port[,host:port...]", redact(addr))
		}
		o.MasterName, o.Addrs = parts[0], parts[1:]
	default:
		return p, usagef("REDIS_TYPE=%q: want single, cluster or sentinel", get("REDIS_TYPE", ""))
	}
	if socket == "unix" {
		if typ != "single" {
			return p, usagef("REDIS_SOCKET_TYPE=unix needs REDIS_TYPE=single (got %s)", typ)
		}
		if _, _, err := net.SplitHostPort(addr); err == nil && !strings.Contains(addr, "/") {
			return p, usagef("REDIS_URL=%q is host:port, but REDIS_SOCKET_TYPE is unix (the peer's default): set REDIS_SOCKET_TYPE=tcp", redact(addr))
		}
		path := addr
		o.Dialer = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	} else {
		for _, a := range o.Addrs {
			if _, _, err := net.SplitHostPort(a); err != nil || strings.Contains(a, "/") {
				return p, usagef("REDIS_URL=%q: with REDIS_SOCKET_TYPE=tcp, want host:port (%s is not one)", redact(addr), redact(a))
			}
		}
	}
	if auth := get("REDIS_AUTH", ""); auth != "" {
		o.Username, o.Password = splitAuth(auth)
	}
	if auth := get("REDIS_SENTINEL_AUTH", ""); auth != "" {
		if typ != "sentinel" {
			p.warnings = append(p.warnings, "REDIS_SENTINEL_AUTH applies only to REDIS_TYPE=sentinel")
		}
		o.SentinelUsername, o.SentinelPassword = splitAuth(auth)
	}
	if v := get("REDIS_POOL_SIZE", ""); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return p, usagef("REDIS_POOL_SIZE=%q: want a whole number of connections, at least 1", v)
		}
		o.PoolSize = n
	}
	if v := get("REDIS_TIMEOUT", ""); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return p, usagef("REDIS_TIMEOUT=%q: want a positive duration such as 10s", v)
		}
		o.DialTimeout = d
	}
	tlsOn, err := peerBool(getenv, "REDIS_TLS")
	if err != nil {
		return p, err
	}
	if tlsOn {
		if socket == "unix" {
			return p, usagef("REDIS_TLS=true with REDIS_SOCKET_TYPE=unix is not supported")
		}
		if o.TLSConfig, err = peerRedisTLS(getenv); err != nil {
			return p, err
		}
	} else {
		for _, name := range []string{"REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"} {
			if get(name, "") != "" {
				p.warnings = append(p.warnings, name+" applies only with REDIS_TLS=true")
			}
		}
	}
	p.opts = redisstore.ClientOptions(o)
	return p, nil
}

// splitAuth reads the peer's "password" or "user:password".
func splitAuth(auth string) (user, password string) {
	if u, pw, ok := strings.Cut(auth, ":"); ok {
		return u, pw
	}
	return "", auth
}

// peerRedisTLS returns the TLS client configuration of REDIS_TLS_CACERT (the
// CAs the server's certificate must chain to; default the system's),
// REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY (a client certificate, both
// or neither) and REDIS_TLS_SKIP_HOSTNAME_VERIFICATION (check the chain but
// not the name).
func peerRedisTLS(getenv func(string) string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if path := strings.TrimSpace(getenv("REDIS_TLS_CACERT")); path != "" {
		pem, err := os.ReadFile(path)
		if err != nil {
			return nil, usagef("REDIS_TLS_CACERT: %v", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, usagef("REDIS_TLS_CACERT %s: no PEM certificate in it", path)
		}
	}
	cert, key := strings.TrimSpace(getenv("REDIS_TLS_CLIENT_CERT")), strings.TrimSpace(getenv("REDIS_TLS_CLIENT_KEY"))
	switch {
	case cert != "" && key != "":
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, usagef("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY: %v", err)
		}
		c.Certificates = []tls.Certificate{pair}
	case cert != "" || key != "":
		return nil, usagef("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together: give both or neither")
	}
	skip, err := peerBool(getenv, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	if err != nil {
		return nil, err
	}
	if skip {
		// Verify the chain as the handshake would, without the name.
		roots := c.RootCAs
		c.InsecureSkipVerify = true
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("redis TLS: the server sent no certificate")
			}
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
			for _, ic := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		}
	}
	return c, nil
}

// peerBool reads the boolean setting name (strconv.ParseBool, as the peer
// reads it); unset is false. A value that is not a boolean is a usage error
// naming the variable.
func peerBool(getenv func(string) string, name string) (bool, error) {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, usagef("%s=%q: want true or false", name, v)
	}
	return b, nil
}
