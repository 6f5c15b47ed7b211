package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"

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
