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
// PeerIP keys by the connection's peer address (an IPv6 client by its /64,
// as httplimit and the ratelimit service do) and believes no metadata.
// Behind proxies (an Envoy, a load balancer), list them in a TrustedProxies
// and key with its PeerIP method: x-forwarded-for is read only when the peer
// is one of them, from the right, up to the first address that is not, so a
// client cannot choose its key by sending the metadata itself. Metadata keys
// by a metadata value such as an API key, its exact bytes hashed (SHA-256)
// so that the store never holds a credential; RawMetadata keeps the value.
// Method keys by the full method name, and Join and PerMethod combine keys.
//
// A call for which the key function fails (or returns "") gets
// codes.InvalidArgument, or is passed to the handler unlimited with
// PassMissingKey. So does a cost the CostFunc refuses, or one outside
// 1..capacity. A key longer than MaxKeyBytes (1,024 bytes, as httplimit's)
// is answered codes.InvalidArgument, with or without PassMissingKey, and
// never reaches the store.
//
// # Policies per method
//
// WithMethod gives a method, or every method of a service, its own limiter,
// named in the metadata by its namespace; a nil limiter leaves it unlimited.
// Other methods use the limiter given to New, or are not limited when it is
// nil.
//
// # Timeouts and store errors
//
// Each check is bounded by WithTimeout (DefaultTimeout, 500 ms; 0 leaves the
// call's own deadline as the only bound), so a store that hangs cannot hold
// every call. When the Limiter returns an error that is not the call's own
// (not an invalid cost, not the client going away), the call gets
// codes.Unavailable, "rate limit unavailable", with a RetryInfo of one
// second, or the answer of the function of WithErrorHandler. A Decision that
// was not enforced (ratelimit.Decision.Enforced is false) is passed without
// metadata when allowed, and answered codes.Unavailable when denied. A
// client that went away gets the status of its context's error
// (codes.Canceled or codes.DeadlineExceeded).
//
// What to do while the store is down (fail open, fail closed, decide in
// this process) is the store's choice, not the interceptors': wrap it with
// package fallback, whose answers reach them as decisions.
//
//	store, err := fallback.New(redisstore.New(rdb),
//		fallback.WithOutage(fallback.LocalFallback), fallback.WithFleetShare(replicas))
//
// # Clients
//
// UnaryClientInterceptor retries a unary call refused with a RetryInfo
// detail after the delay it names, a bounded number of times, never for
// longer than WithMaxRetryDelay (30 s by default) a try and never past the
// call's deadline.
//
// The interceptors never panic on a store error or a missing key. They are
// safe for simultaneous use by multiple goroutines and start no goroutine.
package grpclimit
