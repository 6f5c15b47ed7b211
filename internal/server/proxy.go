package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/httplimit"
)

// ProxyOptions configure Proxy.
type ProxyOptions struct {
	// Upstream is the server requests are forwarded to.
	Upstream *url.URL
	// Namespace is the policy requests are limited by (default
	// config.DefaultNamespace). It is pinned: a reload cannot remove it.
	Namespace string
	// Middleware are further options of the httplimit middleware: the key,
	// the body format. The policy name and the check timeout are set from
	// the service; the outage behaviour is the service's store's.
	Middleware []httplimit.Option
	// Trusted are the proxies in front of this one whose forwarding header
	// is believed (none by default). The upstream receives only the chain
	// they vouch for (httplimit.TrustedProxies.Chain), never what a client
	// wrote in the header itself.
	Trusted httplimit.TrustedProxies
}

// Proxy returns a reverse proxy to o.Upstream that limits every request
// with the httplimit middleware, under the policy of o.Namespace as it is
// at the time of each request. Requests pass to the upstream with
// X-Forwarded-For (the chain o.Trusted vouches for, ending with the peer),
// -Host and -Proto set, and, when o.Trusted.Header is Forwarded, a Forwarded
// header of the same chain; an unreachable upstream is 502. Responses are
// counted in ratelimit_proxy_requests_total, 502s also in
// ratelimit_upstream_errors_total.
func (s *Service) Proxy(o ProxyOptions) (http.Handler, error) {
	if o.Upstream == nil || o.Upstream.Scheme == "" || o.Upstream.Host == "" {
		return nil, errors.New("upstream must be an absolute URL such as http://127.0.0.1:9000")
	}
	if o.Upstream.Scheme != "http" && o.Upstream.Scheme != "https" {
		return nil, fmt.Errorf("upstream scheme %q: want http or https", o.Upstream.Scheme)
	}
	ns := o.Namespace
	if ns == "" {
		ns = "default"
	}
	if err := s.Pin(ns); err != nil {
		return nil, err
	}
	// The outage behaviour is the store's (package fallback): a store error
	// that still reaches the middleware is 503.
	opts := append([]httplimit.Option{httplimit.WithPolicyName(ns), httplimit.WithTimeout(s.timeout)}, o.Middleware...)
	if s.clock != nil {
		opts = append(opts, httplimit.WithClock(s.clock))
	}
	mw, err := httplimit.New(nsLimiter{s, ns}, opts...)
	if err != nil {
		return nil, err
	}
	up := o.Upstream
	trusted := o.Trusted
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			forward(pr, trusted)
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return
			}
			s.metrics.upstream.Inc()
			s.errLog.log(s.log, "upstream unreachable", "upstream", up.Redacted(), "err", err)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintln(w, "upstream unreachable")
		},
	}
	return s.countProxied(mw.Handler(rp)), nil
}

// forward sets the forwarding headers of a proxied request: the chain that
// trusted vouches for, and nothing the client wrote itself.
func forward(pr *httputil.ProxyRequest, trusted httplimit.TrustedProxies) {
	pr.Out.Header.Del("Forwarded")
	chain, err := trusted.Chain(pr.In)
	if err != nil || len(chain) == 0 {
		pr.SetXForwarded()
		return
	}
	hops := make([]string, len(chain))
	fwd := make([]string, len(chain))
	for i, a := range chain {
		hops[i] = a.String()
		fwd[i] = "for=" + a.String()
		if a.Is6() {
			fwd[i] = `for="[` + a.String() + `]"`
		}
	}
	// SetXForwarded appends the peer, the chain's last address.
	if len(hops) > 1 {
		pr.Out.Header.Set("X-Forwarded-For", strings.Join(hops[:len(hops)-1], ", "))
	}
	pr.SetXForwarded()
	if strings.EqualFold(trusted.Header, "Forwarded") {
		pr.Out.Header.Set("Forwarded", strings.Join(fwd, ", "))
	}
}

// countProxied counts the responses of h by status code.
func (s *Service) countProxied(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		code := sw.code
		if code == 0 {
			if r.Context().Err() != nil {
				return // the client went away before an answer
			}
			code = http.StatusOK
		}
		s.metrics.proxied.WithLabelValues(strconv.Itoa(code)).Inc()
	})
}

// statusWriter records the status code written through it. Unwrap lets
// http.ResponseController (which ReverseProxy uses to flush) reach the
// underlying writer.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && code >= 200 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	http.NewResponseController(w.ResponseWriter).Flush() //nolint:errcheck // as ReverseProxy does
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// nsLimiter is the httplimit.Limiter of one namespace: it looks the policy
// up at each check, so reloads apply to the proxy too, and its checks are
// counted in the service's metrics like those of the API.
type nsLimiter struct {
	s  *Service
	ns string
}

func (l nsLimiter) TryAcquireN(ctx context.Context, subject string, cost int64) (ratelimit.Decision, error) {
	lim := l.s.policies.Load().limiters[l.ns]
	if lim == nil {
		return ratelimit.Decision{}, errUnknownNamespace
	}
	return l.s.check(ctx, opAcquire, lim, subject, cost)
}

func (l nsLimiter) Limits() []ratelimit.Limit {
	if lim := l.s.policies.Load().limiters[l.ns]; lim != nil {
		return lim.Limits()
	}
	return nil
}
