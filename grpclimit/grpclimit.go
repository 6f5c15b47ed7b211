package grpclimit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/internal/clientkey"
	"github.com/exactlimit/ratelimit/internal/ratelimitheader"
)

// Limiter is what the interceptors check calls with: httplimit's, which
// *ratelimit.Limiter[string] implements (TryAcquireN, and Limits for the
// ratelimit-policy metadata).
type Limiter = httplimit.Limiter

// CostFunc returns the number of tokens a call costs. req is the request
// message of a unary call, and nil for a stream, which is charged once, when
// it opens. An error is answered codes.InvalidArgument with its message, as
// is a cost outside 1..capacity.
type CostFunc func(ctx context.Context, method string, req any) (int64, error)

// DefaultPolicyName names the default policy in the ratelimit-policy and
// ratelimit metadata unless WithPolicyName sets another.
const DefaultPolicyName = "default"

// DefaultTimeout bounds each check unless WithTimeout sets another bound: a
// store that has not answered by then is treated as failed, and the call is
// answered codes.Unavailable.
const DefaultTimeout = httplimit.DefaultTimeout

// Interceptor limits the calls of a gRPC server. Build it with New and
// install both of its interceptors:
//
//	grpc.NewServer(grpc.ChainUnaryInterceptor(in.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(in.StreamServerInterceptor()))
//
// It is safe for simultaneous use by multiple goroutines.
type Interceptor struct {
	def       *policy            // nil: methods not listed are not limited
	methods   map[string]*policy // by full method name, or service prefix "/pkg.Service/"
	key       KeyFunc
	cost      CostFunc
	timeout   time.Duration
	passNoKey bool
	noHeader  bool
	clock     func() time.Time
	onError   func(ctx context.Context, method string, err error) error
	opts      clientkey.Options
}

// policy is one limiter of the interceptor, with its name in the metadata.
type policy struct {
	lim  Limiter
	name string
}

// Option configures an Interceptor.
type Option func(*Interceptor)

// WithKey sets the function that keys calls (default PeerIP).
func WithKey(key KeyFunc) Option { return func(in *Interceptor) { in.key = key } }

// WithCost sets the function that prices calls (default: one token each).
func WithCost(cost CostFunc) Option { return func(in *Interceptor) { in.cost = cost } }

// WithPolicyName sets the name of the default limiter's policy in the
// ratelimit-policy and ratelimit metadata. The default is the limiter's
// namespace when it has a Namespace method (as *ratelimit.Limiter has), else
// "default". It must be 1 to 64 printable ASCII characters. It names the
// limiter given to New, and is an error when that is nil; the limiters of
// WithMethod are named by their namespaces.
func WithPolicyName(name string) Option {
	return func(in *Interceptor) {
		if in.def == nil {
			in.opts.Fail("WithPolicyName names the limiter given to New, which is nil")
			return
		}
		in.opts.PolicyName(name)
		in.def.name = name
	}
}

// WithMethod limits the calls of method with lim instead of the default
// limiter. method is a full method name, "/package.Service/Method", or a
// service, "/package.Service/", for all of its methods; a method's own entry
// wins over its service's. A nil lim leaves those calls unlimited (a health
// check, say). The policy is named by lim's namespace, as in WithPolicyName.
func WithMethod(method string, lim Limiter) Option {
	return func(in *Interceptor) {
		if !strings.HasPrefix(method, "/") || strings.Count(method, "/") != 2 {
			in.opts.Fail("method %q must be \"/package.Service/Method\" or \"/package.Service/\"", method)
			return
		}
		if in.methods == nil {
			in.methods = make(map[string]*policy)
		}
		if lim == nil {
			in.methods[method] = nil
			return
		}
		in.methods[method] = in.newPolicy(lim)
	}
}

// WithErrorHandler sets the function that answers a call whose check
// failed (the Limiter's store returned an error): it returns the error the
// client gets (a status error, or any error, which gRPC sends as
// codes.Unknown), or nil to let the call through unlimited. Without one,
// such a call gets codes.Unavailable.
func WithErrorHandler(h func(ctx context.Context, method string, err error) error) Option {
	return func(in *Interceptor) { in.onError = h }
}

// WithTimeout bounds each check to d (default DefaultTimeout, 500 ms), or to
// the call's deadline when that comes first. A check that runs out of time
// is answered as any store error is. d = 0 sets no bound of the
// interceptor's own: the call's deadline only. d must not be negative.
func WithTimeout(d time.Duration) Option {
	return func(in *Interceptor) { in.timeout = in.opts.Timeout(d) }
}

// PassMissingKey makes a call without a key pass to the handler unlimited,
// instead of being answered codes.InvalidArgument.
func PassMissingKey() Option { return func(in *Interceptor) { in.passNoKey = true } }

// WithoutHeaders stops the interceptors from sending the rate-limit fields
// as header metadata on calls they admit. Denials still carry them as
// trailers.
func WithoutHeaders() Option { return func(in *Interceptor) { in.noHeader = true } }

// WithClock sets the clock x-ratelimit-reset is computed from (default
// time.Now). The decisions themselves take their time from the Limiter.
func WithClock(clock func() time.Time) Option { return func(in *Interceptor) { in.clock = clock } }

// New returns an Interceptor that limits calls with lim, and with the
// limiters of WithMethod for their methods. lim may be nil when WithMethod is
// given: the methods it does not list are then not limited. The error wraps
// ratelimit.ErrInvalidArgument and reports a nil limiter, a nil function
// given to an option, a negative timeout, a malformed method name, or a
// policy name that cannot be sent in metadata.
func New(lim Limiter, opts ...Option) (*Interceptor, error) {
	in := &Interceptor{
		key:     PeerIP,
		cost:    func(context.Context, string, any) (int64, error) { return 1, nil },
		timeout: DefaultTimeout,
		clock:   time.Now,
		onError: func(context.Context, string, error) error { return unavailable() },
		opts:    clientkey.NewOptions("grpclimit"),
	}
	if lim != nil {
		in.def = in.newPolicy(lim)
	}
	for _, o := range opts {
		o(in)
	}
	if lim == nil && len(in.methods) == 0 {
		in.opts.Fail("limiter must not be nil (or give WithMethod)")
	}
	in.opts.Require("key function, cost function, error handler, clock",
		in.key != nil, in.cost != nil, in.onError != nil, in.clock != nil)
	if err := in.opts.Err(); err != nil {
		return nil, err
	}
	return in, nil
}

// newPolicy returns the policy of lim, named by its namespace.
func (in *Interceptor) newPolicy(lim Limiter) *policy {
	name := DefaultPolicyName
	if n, ok := lim.(interface{ Namespace() string }); ok && n.Namespace() != "" {
		name = n.Namespace()
	}
	in.opts.PolicyName(name)
	return &policy{lim: lim, name: name}
}

// policyFor returns the policy of method: its own, its service's, or the
// default; nil when the call is not limited.
func (in *Interceptor) policyFor(method string) *policy {
	if in.methods != nil {
		if p, ok := in.methods[method]; ok {
			return p
		}
		if i := strings.LastIndexByte(method, '/'); i > 0 {
			if p, ok := in.methods[method[:i+1]]; ok {
				return p
			}
		}
	}
	return in.def
}

// UnaryServerInterceptor returns the interceptor for unary calls. An
// admitted call reaches the handler with the rate-limit fields set as header
// metadata; a denied one gets codes.ResourceExhausted and the handler is not
// called.
func (in *Interceptor) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, err := in.check(ctx, info.FullMethod, req)
		if err != nil {
			if md != nil {
				grpc.SetTrailer(ctx, md) //nolint:errcheck // only fails outside a server call
			}
			return nil, err
		}
		if md != nil {
			grpc.SetHeader(ctx, md) //nolint:errcheck // the handler may have sent its headers: nothing to do
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor returns the interceptor for streams. A stream is
// checked once, when it opens, before the handler sees it: admitted, it
// carries the rate-limit fields as header metadata; denied, it ends with
// codes.ResourceExhausted before any message. The messages of an admitted
// stream are not limited.
func (in *Interceptor) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, err := in.check(ss.Context(), info.FullMethod, nil)
		if err != nil {
			if md != nil {
				ss.SetTrailer(md)
			}
			return err
		}
		if md != nil {
			ss.SetHeader(md) //nolint:errcheck // nothing sent yet; an error means the stream is gone
		}
		return handler(srv, ss)
	}
}

// check decides a call. It returns the rate-limit metadata to send (a
// header when err is nil, a trailer otherwise; nil for none) and the status
// error to answer with, nil to call the handler.
func (in *Interceptor) check(ctx context.Context, method string, req any) (metadata.MD, error) {
	p := in.policyFor(method)
	if p == nil {
		return nil, nil
	}
	key, err := clientkey.Key(in.key(ctx, method))
	if errors.Is(err, ErrKeyTooLong) {
		return nil, status.Error(codes.InvalidArgument, "rate limit: "+err.Error())
	}
	if err != nil {
		if in.passNoKey {
			return nil, nil
		}
		return nil, status.Error(codes.InvalidArgument, "rate limit: "+err.Error())
	}
	cost, err := in.cost(ctx, method, req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "rate limit: call cost: "+err.Error())
	}
	cctx, cancel := clientkey.WithTimeout(ctx, in.timeout)
	d, err := p.lim.TryAcquireN(cctx, key, cost)
	cancel()
	if err != nil {
		switch f, msg := clientkey.Classify(ctx, err); {
		case f == clientkey.Invalid:
			return nil, status.Error(codes.InvalidArgument, "rate limit: "+msg)
		case f == clientkey.Gone:
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, in.onError(ctx, method, err)
	}
	if !d.Enforced() {
		if d.Allowed {
			return nil, nil
		}
		return nil, unavailable()
	}
	if d.Allowed && in.noHeader {
		return nil, nil
	}
	md := fields(p.name, p.lim.Limits(), ratelimitheader.QuotasOf(p.lim), d, in.clock())
	if d.Allowed {
		return md, nil
	}
	return md, denied(d.RetryAfter)
}

// Fields returns the rate-limit fields of decision d, made under the policy
// limits named name, at time now, as gRPC metadata: the headers
// httplimit.SetHeaders sets, with the same values, under lower-case keys
// (ratelimit-policy, ratelimit, x-ratelimit-limit, x-ratelimit-remaining,
// x-ratelimit-reset), and, when d is a denial, retry-after in whole seconds
// rounded up (at least 1).
func Fields(name string, limits []ratelimit.Limit, d ratelimit.Decision, now time.Time) metadata.MD {
	return fields(name, limits, nil, d, now)
}

// fields is Fields for a policy with quotas.
func fields(name string, limits []ratelimit.Limit, quotas []ratelimit.Quota, d ratelimit.Decision, now time.Time) metadata.MD {
	md := make(metadata.MD, 6)
	if f, ok := ratelimitheader.OfPolicy(name, limits, quotas, d, now); ok {
		f.Each(now, func(k, v string) { md[strings.ToLower(k)] = []string{v} })
	}
	if !d.Allowed {
		md["retry-after"] = []string{strconv.FormatInt(ratelimitheader.RetryAfter(d.RetryAfter), 10)}
	}
	return md
}

// denied returns the status of a denial: codes.ResourceExhausted with a
// google.rpc.RetryInfo detail carrying the exact wait.
func denied(wait time.Duration) error {
	return withRetry(codes.ResourceExhausted, "rate limit exceeded: retry in "+wait.String(), wait)
}

// unavailable returns the status of a check that could not be made:
// codes.Unavailable, with a RetryInfo of one second (httplimit's
// Retry-After: 1).
func unavailable() error {
	return withRetry(codes.Unavailable, "rate limit unavailable: retry in 1s", time.Second)
}

func withRetry(c codes.Code, msg string, wait time.Duration) error {
	st := status.New(c, msg)
	if ds, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(max(wait, 0))}); err == nil {
		st = ds
	}
	return st.Err()
}

// RetryDelay returns the wait of the google.rpc.RetryInfo detail of err's
// status, and whether it has one. It reads the denials of these
// interceptors, and those of any server that sends RetryInfo.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}
