package server

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// hostCheck is the set of Host headers the API answers while it has no
// token (AllowHosts).
type hostCheck struct {
	port        string          // the listener's port
	exact       map[string]bool // "host:port", lower case
	names       map[string]bool // configured names without a port: any port
	anyIP       bool            // the listener is on every address: any IP literal at port
	description string          // for the error
}

// AllowHosts makes the API refuse, while it has no token, a request whose
// Host header is neither the listener's address nor one of names: 421 with
// a JSON error. A web page whose domain an attacker points at this
// machine (DNS rebinding) sends its own name as the Host, and is refused;
// with a token it could not act anyway. The address listen allows itself
// as host:port; on loopback also as localhost, 127.0.0.1 and [::1] at
// that port; on every address (0.0.0.0, [::]) as any IP literal and
// localhost at that port. A name is a host, allowed at any port, or a
// host:port. Without a call the API checks no Host. The error reports a
// name that is not a host or host:port; the previous set stays.
func (s *Service) AllowHosts(listen net.Addr, names []string) error {
	ta, ok := listen.(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("server: AllowHosts: %v is not a TCP address", listen)
	}
	port := strconv.Itoa(ta.Port)
	c := &hostCheck{port: port, exact: map[string]bool{}, names: map[string]bool{}}
	ip, _ := netip.AddrFromSlice(ta.IP)
	ip = ip.Unmap()
	add := func(host string) { c.exact[strings.ToLower(net.JoinHostPort(host, port))] = true }
	switch {
	case ip.IsUnspecified() || !ip.IsValid():
		c.anyIP = true
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
			c.exact[net.JoinHostPort(host, p)] = true
			continue
		}
		host := strings.TrimSuffix(strings.TrimPrefix(n, "["), "]")
		if _, err := netip.ParseAddr(host); host == "" || strings.ContainsAny(host, "/@ ") || strings.Contains(host, ":") && err != nil {
			return fmt.Errorf("allowed host %q: want a host name or host:port", n)
		}
		c.names[host] = true
	}
	c.description = listen.String()
	if len(names) > 0 {
		c.description += " or " + strings.Join(names, ", ")
	}
	s.hosts.Store(c)
	return nil
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n < 65536
}

// allowed reports whether r's Host is one AllowHosts allows. A request with no Host (HTTP/1.0) has no name to rebind and is allowed.
func (c *hostCheck) allowed(r *http.Request) bool {
	h := strings.ToLower(r.Host)
	if h == "" {
		return true
	}
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		host, port = h, "80"
		if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
			host = strings.Trim(host, "[]")
		}
	}
	host = strings.TrimSuffix(host, ".")
	if c.names[host] || c.exact[net.JoinHostPort(host, port)] {
		return true
	}
	if c.anyIP && port == c.port {
		if _, err := netip.ParseAddr(host); err == nil {
			return true
		}
	}
	return false
}

// checkHost wraps the API's handler with the Host check of AllowHosts.
// The refusal is counted under the route the request asked for.
func (s *Service) checkHost(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.misdirected(w, r, func() string {
			if _, pattern := mux.Handler(r); pattern != "" {
				return pattern
			}
			return "/"
		}) {
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// misdirected refuses r with 421, and returns true, when AllowHosts was
// called, there is no token, and r's Host is not one it allows. The refusal
// is logged and counted under the path route returns.
func (s *Service) misdirected(w http.ResponseWriter, r *http.Request, route func() string) bool {
	c := s.hosts.Load()
	if c == nil || len(*s.token.Load()) != 0 || c.allowed(r) {
		return false
	}
	pattern := route()
	s.authLog.log(s.log, "refused a request to the API", "path", pattern, "remote", r.RemoteAddr, "reason", "host not allowed", "host", hostForLog(r.Host))
	s.fail(w, pattern, http.StatusMisdirectedRequest, fmt.Sprintf("misdirected request: Host %q is not this service's address (%s); without a token the API answers only its own address, against DNS rebinding: use that address, or start the service with --allowed-host NAME",
		hostForLog(r.Host), c.description))
	return true
}

// Guard returns h behind the checks every POST of the API passes, for an
// endpoint served beside the API that acts on buckets (the Envoy service's
// POST /json): the Host check of AllowHosts while there is no token (421),
// then POST only (405), the bearer token when there is one (401), and the
// Content-Type application/json (415), which a web page cannot send without
// a CORS preflight. A refusal is answered, logged and counted as the API's
// are, under path.
func (s *Service) Guard(path string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.misdirected(w, r, func() string { return path }) || !s.begin(w, r, path) {
			return
		}
		h.ServeHTTP(w, r)
	})
}

// hostForLog cuts a Host header to a length a log line carries.
func hostForLog(h string) string {
	if len(h) > 100 {
		return h[:100] + "…"
	}
	return h
}
