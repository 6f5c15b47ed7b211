package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

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

// authErrorPrefixes begin the Redis errors that mean the credentials or
// the ACL are wrong: a configuration error, which waiting will not mend.
var authErrorPrefixes = []string{"WRONGPASS", "NOAUTH", "NOPERM"}

// isAuthError reports whether err is a Redis authentication or permission
// error.
func isAuthError(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	for _, p := range authErrorPrefixes {
		if strings.HasPrefix(msg, p) || strings.Contains(msg, ": "+p) {
			return true
		}
	}
	return false
}

// checkCredentials pings Redis and peeks at a bucket that does not exist (a
// read the service's ACL must allow), and returns an error when Redis
// refuses the credentials or the permissions. An unreachable Redis is not
// an error here: the outage behaviour serves until it answers.
func (s *stores) checkCredentials(ctx context.Context, timeout time.Duration) error {
	if s.redis == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, max(timeout, time.Second))
	defer cancel()
	err := s.redis.Ping(ctx).Err()
	if err == nil {
		lim, lerr := ratelimit.New[string](redisstore.New(s.redis), ratelimit.PerSecond(1))
		if lerr == nil {
			_, err = lim.Peek(ctx, "ratelimit-startup-check")
		}
	}
	if isAuthError(err) {
		return fmt.Errorf("%s refuses this service: %v (a configuration error: check the user, the password and the ACL)", s.name, err)
	}
	return nil
}

// warnExposure logs a warning for a set-up that lets others act on the
// service: the API listening beyond loopback without a token, and trusted
// proxies that cover every address.
func warnExposure(log *slog.Logger, api net.Addr, token string, trusted []netip.Prefix) {
	if beyondLoopback(api) && token == "" {
		log.Warn("the API listens beyond loopback without a bearer token: anyone who reaches it can reset buckets; set --token-file or RATELIMIT_TOKEN",
			"addr", api.String())
	}
	for _, p := range trusted {
		if p.Bits() == 0 {
			log.Warn("--trusted-proxies trusts every address: any client can choose its key with a forwarding header", "prefix", p.String())
		}
	}
}

// beyondLoopback reports whether a listener at addr is reachable from
// other machines: a TCP address other than loopback (0.0.0.0 and [::]
// among them).
func beyondLoopback(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && !ta.IP.IsLoopback()
}

// limitListener accepts at most n connections at a time: Accept waits
// while n are open (the kernel's backlog holds the others), and returns
// net.ErrClosed once Close is called.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// limitConns returns ln limited to n simultaneous connections, or ln
// itself when n <= 0.
func limitConns(ln net.Listener, n int) net.Listener {
	if n <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// checkApplicable refuses flags that the other flags make meaningless,
// rather than ignoring them.
func checkApplicable(set map[string]bool, f *serveFlags) error {
	if f.upstream == "" {
		for _, name := range []string{"key", "body", "namespace", "admin-listen", "trusted-proxies", "forwarded-header", "ipv6-prefix"} {
			if set[name] {
				return usagef("--%s applies only with --upstream", name)
			}
		}
	}
	if f.key != "ip" {
		for _, name := range []string{"trusted-proxies", "forwarded-header", "ipv6-prefix"} {
			if set[name] {
				return usagef("--%s applies only to --key ip", name)
			}
		}
	}
	if !set["grpc-listen"] {
		for _, name := range []string{"grpc-tls-cert", "grpc-tls-key", "grpc-tls-client-ca"} {
			if set[name] {
				return usagef("--%s applies only with --grpc-listen", name)
			}
		}
	}
	if len(f.redis.urls) == 0 {
		for _, name := range []string{"outage", "fleet-size", "redis-password-file"} {
			if set[name] {
				return usagef("--%s applies only with --redis", name)
			}
		}
	}
	return nil
}
