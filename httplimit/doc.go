// Package httplimit is net/http middleware that rate-limits requests with a
// ratelimit.Limiter: each request is keyed by a function of the request (the
// client IP by default), charged a cost (one token by default), and either
// passed to the wrapped handler or answered 429 Too Many Requests.
//
//	lim, _ := ratelimit.New[string](store, ratelimit.PerSecond(10), ratelimit.WithNamespace("api"))
//	mw, _ := httplimit.New(lim, httplimit.WithKey(httplimit.Header("X-API-Key")))
//	http.ListenAndServe(addr, mw.Handler(mux))
//
// Middleware.Handler has the type func(http.Handler) http.Handler, so it plugs
// into chi, gorilla/mux and every router that takes that shape.
//
// # Responses
//
// Allowed and denied (429) responses carry the same headers, set from the
// Decision (see SetHeaders); the middleware's other responses (400, 431,
// 503) and requests passed without an enforced decision (fail-open,
// skipped) carry none:
//
//	RateLimit-Policy: "api";q=10;w=1
//	RateLimit: "api";r=9;t=1
//	X-RateLimit-Limit: 10
//	X-RateLimit-Remaining: 9
//	X-RateLimit-Reset: 1767225601
//
// RateLimit-Policy and RateLimit follow the IETF httpapi draft "RateLimit
// header fields for HTTP": q is the policy's capacity and w the seconds an empty
// bucket takes to fill; r is the tokens left and t the seconds, rounded up,
// until the bucket is full. X-RateLimit-Reset is that moment as Unix seconds,
// as GitHub's API sends it. A denied request is answered 429 with Retry-After,
// the whole seconds (rounded up) until its cost is available, and a short
// plain-text body, or JSON with WithJSON. A denial consumes nothing, and the
// wrapped handler is not called.
//
// # Keys
//
// ClientIP keys by the connection's peer address (an IPv6 client by its
// /64) and believes no header. Behind reverse proxies, list them in a
// TrustedProxies and key with its ClientIP method: X-Forwarded-For (or RFC
// 7239 Forwarded) is read only when the peer is one of them, from the
// right, up to the first address that is not, so a client cannot choose its
// key by sending the header itself. Header keys by a request header such as
// an API key, hashed (SHA-256), so that the store never holds a credential;
// RawHeader keeps the value. Join and PerRoute combine keys, for example a
// limit per client and per route; Route finds the route pattern whether the
// middleware wraps a handler registered on an http.ServeMux or the mux
// itself.
//
// A request for which the key function fails (or returns "") gets 400 Bad
// Request, or is passed to the handler unlimited with PassMissingKey. A key
// longer than MaxKeyBytes (1,024 bytes, as the service's subjects and
// grpclimit's keys) is answered 431 Request Header Fields Too Large, with
// or without PassMissingKey, and never reaches the store. Keys are used byte
// for byte. WithSkip exempts requests (health checks, OPTIONS) from the
// limit.
//
// # Several limits
//
// To hold a route to several limits (2 per second and 100 per minute, say),
// give one middleware a Limiter built with ratelimit.NewMulti: one check of
// all of them, all-or-nothing, so a request denied by one limit spends no
// token of the others, and the headers list every limit. Stacking two
// middlewares is not the same: the outer one takes its token before the
// inner one checks, a request the inner one denies has still spent the outer
// token, and the inner middleware's headers replace the outer's.
//
// # Timeouts and store errors
//
// Each check is bounded by WithTimeout (DefaultTimeout, 500 ms, unless set;
// 0 leaves the request's own deadline as the only bound): a store that
// hangs costs a request that long at most. The middleware does not bound
// the handler or the connection; set the http.Server's timeouts.
//
// When the Limiter returns an error that is not the request's own (not an
// invalid cost, not the client going away), the request is answered 503
// Service Unavailable with Retry-After: 1 and a one-line body, or handed to
// the function of WithErrorHandler. A Decision that was not enforced
// (ratelimit.Decision.Enforced is false) is passed without headers when
// allowed, and answered 503 when denied.
//
// What to do while the store is down (fail open, fail closed, decide in
// this process) is the store's choice, not the middleware's: wrap it with
// package fallback, whose answers reach the middleware as decisions.
//
//	store, err := fallback.New(redisstore.New(rdb),
//		fallback.WithOutage(fallback.LocalFallback), fallback.WithFleetShare(replicas))
//
// The middleware never panics on a store error or a missing key. It is safe
// for simultaneous use by multiple goroutines and starts no goroutine.
package httplimit
