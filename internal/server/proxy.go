package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"

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
	// the body format. The policy name and the outage behaviour are set
	// from the service.
	Middleware []httplimit.Option
}

// Proxy returns a reverse proxy to o.Upstream that limits every request
// with the httplimit middleware, under the policy of o.Namespace as it is
// at the time of each request. Requests pass to the upstream with
// X-Forwarded-For, -Host and -Proto set; an unreachable upstream is 502.
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
	outage := s.outage
	if outage == ratelimit.ReturnError {
		outage = ratelimit.FailClosed
	}
	opts := append([]httplimit.Option{httplimit.WithPolicyName(ns), httplimit.WithOutage(outage)}, o.Middleware...)
	if s.clock != nil {
		opts = append(opts, httplimit.WithClock(s.clock))
	}
	mw, err := httplimit.New(nsLimiter{s, ns}, opts...)
	if err != nil {
		return nil, err
	}
	up := o.Upstream
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			// Keep the chain of proxies before us, then append the peer.
			pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return
			}
			s.errLog.log(s.log, "upstream unreachable", "upstream", up.Redacted(), "err", err)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintln(w, "upstream unreachable")
		},
	}
	return mw.Handler(rp), nil
}

// nsLimiter is the httplimit.Limiter of one namespace: it looks the policy
// up at each check, so reloads apply to the proxy too, and its checks are
// counted in the service's metrics like those of the API.
type nsLimiter struct {
	s  *Service
	ns string
}

func (l nsLimiter) TryAcquireN(ctx context.Context, subject string, cost int64) (ratelimit.Decision, error) {
	d, _, err := l.s.check(ctx, opAcquire, l.ns, subject, cost)
	return d, err
}

func (l nsLimiter) Limits() []ratelimit.Limit {
	if lim := l.s.policies.Load().limiters[l.ns]; lim != nil {
		return lim.Limits()
	}
	return nil
}
