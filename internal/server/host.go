package server

import (
	"fmt"
	"net"
	"net/http"

	"github.com/exactlimit/ratelimit/internal/access"
)

// AllowHosts makes the API refuse, while it has no token, a request whose
// Host header is neither the listener's address nor one of names: 421 with
// a JSON error (see access.Checker.AllowHosts for the names allowed). A web
// page whose domain an attacker points at this machine (DNS rebinding)
// sends its own name as the Host, and is refused; with a token it could not
// act anyway. Without a call the API checks no Host. The error reports a
// name that is not a host or host:port; the previous set stays.
func (s *Service) AllowHosts(listen net.Addr, names []string) error {
	return s.access.AllowHosts(listen, names)
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
	refused, allowed := s.access.Misdirected(r)
	if !refused {
		return false
	}
	pattern := route()
	s.authLog.log(s.log, "refused a request to the API", "path", pattern, "remote", r.RemoteAddr, "reason", "host not allowed", "host", access.HostForLog(r.Host))
	s.fail(w, pattern, http.StatusMisdirectedRequest, fmt.Sprintf("misdirected request: Host %q is not this service's address (%s); without a token the API answers only its own address, against DNS rebinding: use that address, or start the service with --allowed-host NAME",
		access.HostForLog(r.Host), allowed))
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
