// Package grpclimit rate-limits the calls of a gRPC server with a
// ratelimit.Limiter, as package httplimit does for net/http: each call is
// keyed by a function of the call (the peer's IP address by default),
// charged a cost (one token by default), and either passed to the handler or
// answered codes.ResourceExhausted.
//
//	lim, _ := ratelimit.New[string](store, ratelimit.PerSecond(10), ratelimit.WithNamespace("api"))
//	in, _ := grpclimit.New(lim, grpclimit.WithKey(grpclimit.Metadata("x-api-key")))
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(in.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(in.StreamServerInterceptor()))
//
// A stream is checked once, when it opens, before its handler runs; its
// messages are not charged.
//
// # Answers
//
// A denial is a status with codes.ResourceExhausted, the message "rate limit
// exceeded: retry in <wait>", and a google.rpc.RetryInfo detail whose
// retry_delay is the exact wait until the cost is available (RetryDelay reads
// it). Its trailer metadata carries the rate-limit fields of httplimit's
// headers, with the same values, under lower-case keys, and retry-after in
// whole seconds (see Fields):
//
//	ratelimit-policy: "api";q=10;w=1
//	ratelimit: "api";r=0;t=1
//	x-ratelimit-limit: 10
//	x-ratelimit-remaining: 0
//	x-ratelimit-reset: 1767225601
//	retry-after: 1
//
// An admitted call carries the same fields (without retry-after) as header
// metadata, unless WithoutHeaders. A denial consumes nothing, and the handler
// is not called.
//
// # Keys
//
// PeerIP keys by the connection's peer address and believes no metadata.
// Behind proxies (an Envoy, a load balancer), list them in a TrustedProxies
// and key with its PeerIP method: x-forwarded-for is read only when the peer
// is one of them, from the right, up to the first address that is not, so a
// client cannot choose its key by sending the metadata itself. Metadata keys
// by a metadata value such as an API key, Method by the full method name, and
// Join and PerMethod combine keys. A subject longer than MaxKeyBytes is
// hashed (see MaxKeyBytes).
//
// A call for which the key function fails (or returns "") gets
// codes.InvalidArgument, or is passed to the handler unlimited with
// PassMissingKey. So does a cost the CostFunc refuses, or one outside
// 1..capacity.
//
// # Policies per method
//
// WithMethod gives a method, or every method of a service, its own limiter,
// named in the metadata by its namespace; a nil limiter leaves it unlimited.
// Other methods use the limiter given to New, or are not limited when it is
// nil.
//
// # Outages
//
// Each check is bounded by WithTimeout (DefaultTimeout, 500 ms), so a store
// that hangs cannot hold every call. When the Limiter returns an error that
// is not the call's own (not an invalid cost, not the client going away),
// the interceptors apply one of the behaviours named by fallback.Outage
// (WithOutage):
//
//   - FailClosed (the default): codes.Unavailable, "rate limit unavailable",
//     with a RetryInfo of one second.
//   - FailOpen: the call is passed to the handler, without rate-limit
//     metadata.
//   - LocalFallback: the call is decided by a bucket in this process with the
//     same policy, per key, as long as the store keeps failing. Each call
//     still tries the store first; for a breaker with a probe, build the
//     Limiter's store with package fallback.
//   - ReturnError: the function of WithErrorHandler returns the answer (nil
//     lets the call through); codes.Unavailable without one.
//
// A Decision that was not enforced (as package fallback returns under
// FailOpen and FailClosed) is treated the same way: passed without metadata
// when allowed, codes.Unavailable when denied. A client that went away gets
// the status of its context's error (codes.Canceled or
// codes.DeadlineExceeded).
//
// # Clients
//
// UnaryClientInterceptor retries a unary call refused with a RetryInfo
// detail after the delay it names, a bounded number of times and never past
// the call's deadline.
//
// The interceptors never panic on a store error or a missing key. They are
// safe for simultaneous use by multiple goroutines and start no goroutine.
package grpclimit
