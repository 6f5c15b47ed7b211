// Package access decides who may use the decision service's API: the
// bearer tokens of the API and of /metrics, and, while the API has no
// token, the Host check against DNS rebinding. It answers nothing itself:
// the API (package server) refuses what a Checker does not allow. A Checker
// is safe for simultaneous use by multiple goroutines; its settings may be
// replaced while requests are checked.
package access

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
)

// Checker holds the tokens and the allowed hosts. The zero value requires
// no token and checks no Host.
type Checker struct {
	token        atomic.Pointer[[]byte]
	metricsToken atomic.Pointer[[]byte]
	hosts        atomic.Pointer[hostSet] // AllowHosts; nil: no check
}

// SetToken replaces the bearer token the API requires ("" for none).
// Requests already authorized are not affected.
func (c *Checker) SetToken(token string) {
	b := []byte(token)
	c.token.Store(&b)
}

// SetMetricsToken replaces the bearer token /metrics accepts besides the
// API's ("" for none).
func (c *Checker) SetMetricsToken(token string) {
	b := []byte(token)
	c.metricsToken.Store(&b)
}

// load returns the token held in p, nil for none.
func load(p *atomic.Pointer[[]byte]) []byte {
	if b := p.Load(); b != nil {
		return *b
	}
	return nil
}

// HasToken reports whether the API requires a token.
func (c *Checker) HasToken() bool { return len(load(&c.token)) != 0 }

// Authorized reports whether r may use the API: with the token, when there
// is one.
func (c *Checker) Authorized(r *http.Request) bool {
	token := load(&c.token)
	return len(token) == 0 || bearerIs(r, token)
}

// MetricsAuthorized reports whether r may read /metrics: with the metrics
// token or the API's, when either is set.
func (c *Checker) MetricsAuthorized(r *http.Request) bool {
	token, mt := load(&c.token), load(&c.metricsToken)
	if len(token) == 0 && len(mt) == 0 {
		return true
	}
	return len(mt) > 0 && bearerIs(r, mt) || len(token) > 0 && bearerIs(r, token)
}

// bearerIs reports whether r carries "Authorization: Bearer token", in a
// time that does not depend on how much of the token matches.
func bearerIs(r *http.Request, token []byte) bool {
	h := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(h) < len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(h[len(prefix):])), token) == 1
}

// hostSet is the set of Host headers the API answers while it has no
// token (AllowHosts).
type hostSet struct {
	port        string          // the listener's port
	exact       map[string]bool // "host:port", lower case
	names       map[string]bool // configured names without a port: any port
	anyIP       bool            // the listener is on every address: any IP literal at port
	description string          // for the refusal
}

// AllowHosts makes Misdirected refuse, while there is no token, a request
// whose Host header is neither the listener's address nor one of names. A
// web page whose domain an attacker points at this machine (DNS rebinding)
// sends its own name as the Host, and is refused; with a token it could not
// act anyway. The address listen allows itself as host:port; on loopback
// also as localhost, 127.0.0.1 and [::1] at that port; on every address
// (0.0.0.0, [::]) as any IP literal and localhost at that port. A name is a
// host, allowed at any port, or a host:port. Without a call no Host is
// checked. The error reports a name that is not a host or host:port; the
// previous set stays.
func (c *Checker) AllowHosts(listen net.Addr, names []string) error {
	ta, ok := listen.(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("access: AllowHosts: %v is not a TCP address", listen)
	}
	port := strconv.Itoa(ta.Port)
	h := &hostSet{port: port, exact: map[string]bool{}, names: map[string]bool{}}
	ip, _ := netip.AddrFromSlice(ta.IP)
	ip = ip.Unmap()
	add := func(host string) { h.exact[strings.ToLower(net.JoinHostPort(host, port))] = true }
	switch {
	case ip.IsUnspecified() || !ip.IsValid():
		h.anyIP = true
		add("localhost")
	case ip.IsLoopback():
		add("localhost")
		add("127.0.0.1")
		add("::1")
		add(ip.String())
	default:
		add(ip.String())
	}
	for _, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		if host, p, err := net.SplitHostPort(n); err == nil {
			if host == "" || !validPort(p) {
				return fmt.Errorf("allowed host %q: want a host name or host:port", n)
			}
			h.exact[net.JoinHostPort(host, p)] = true
			continue
		}
		host := strings.TrimSuffix(strings.TrimPrefix(n, "["), "]")
		if _, err := netip.ParseAddr(host); host == "" || strings.ContainsAny(host, "/@ ") || strings.Contains(host, ":") && err != nil {
			return fmt.Errorf("allowed host %q: want a host name or host:port", n)
		}
		h.names[host] = true
	}
	h.description = listen.String()
	if len(names) > 0 {
		h.description += " or " + strings.Join(names, ", ")
	}
	c.hosts.Store(h)
	return nil
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n < 65536
}

// Misdirected reports whether r must be refused for its Host: AllowHosts
// was called, there is no token, and r's Host is not one it allows. allowed
// then describes the addresses that are, for the refusal.
func (c *Checker) Misdirected(r *http.Request) (refused bool, allowed string) {
	h := c.hosts.Load()
	if h == nil || c.HasToken() || h.allowed(r) {
		return false, ""
	}
	return true, h.description
}

// allowed reports whether r's Host is in h. A request with no Host
// (HTTP/1.0) has no name to rebind and is allowed.
func (h *hostSet) allowed(r *http.Request) bool {
	host := strings.ToLower(r.Host)
	if host == "" {
		return true
	}
	name, port, err := net.SplitHostPort(host)
	if err != nil {
		name, port = host, "80"
		if strings.HasPrefix(name, "[") && strings.HasSuffix(name, "]") {
			name = strings.Trim(name, "[]")
		}
	}
	name = strings.TrimSuffix(name, ".")
	if h.names[name] || h.exact[net.JoinHostPort(name, port)] {
		return true
	}
	if h.anyIP && port == h.port {
		if _, err := netip.ParseAddr(name); err == nil {
			return true
		}
	}
	return false
}

// HostForLog cuts a Host header to a length a log line carries.
func HostForLog(h string) string {
	if len(h) > 100 {
		return h[:100] + "…"
	}
	return h
}
