package service

import (
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// newHTTPServer returns a server with timeouts against slow clients:
// readTimeout bounds reading a request, headers and body (0: no bound, for
// a proxy that streams long uploads).
func newHTTPServer(h http.Handler, log *slog.Logger, proxy bool, readTimeout time.Duration) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       readTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if proxy {
		srv.MaxHeaderBytes = 1 << 20
	}
	return srv
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
