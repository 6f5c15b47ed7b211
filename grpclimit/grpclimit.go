package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/memstore"
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
// store that has not answered by then is treated as down (see the package
// documentation on outages).
const DefaultTimeout = 500 * time.Millisecond

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
	outage    fallback.Outage
	timeout   time.Duration
	passNoKey bool
	noHeader  bool
	clock     func() time.Time
	onError   func(ctx context.Context, method string, err error) error
	local     *memstore.Store
	policyN   int // policies made, for their local key prefixes
	err       error
}

// policy is one limiter of the interceptor, with its name in the metadata
// and its prefix in the local fallback store.
type policy struct {
	lim   Limiter
	name  string
	local string // key prefix in the LocalFallback store
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
// "default". It must be 1 to 64 printable ASCII characters. It names only the
// limiter given to New (none when that is nil); the limiters of WithMethod
// are named by their namespaces.
func WithPolicyName(name string) Option {
	return func(in *Interceptor) {
		if in.def != nil {
			in.def.name = name
		}
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
			in.fail("method %q must be \"/package.Service/Method\" or \"/package.Service/\"", method)
			return
		}
		if in.methods == nil {
			in.methods = make(map[string]*policy)
		}
		if lim == nil {
			in.methods[method] = nil
			return
		}
		in.policyN++
		in.methods[method] = newPolicy(lim, in.policyN)
	}
}

// WithOutage sets what happens when the Limiter cannot decide (default
// fallback.FailClosed); see the package documentation.
func WithOutage(o fallback.Outage) Option { return func(in *Interceptor) { in.outage = o } }

// WithErrorHandler sets the function that answers a call whose check failed,
// under fallback.ReturnError: it returns the error the client gets (a
// status error, or any error, which gRPC sends as codes.Unknown), or nil to
// let the call through unlimited. Without one, such a call gets
// codes.Unavailable as under FailClosed.
func WithErrorHandler(h func(ctx context.Context, method string, err error) error) Option {
	return func(in *Interceptor) { in.onError = h }
}

// WithTimeout bounds each check to d (default DefaultTimeout, 500 ms), or to
// the call's deadline when that comes first. A check that runs out of time
// is an outage, answered by WithOutage's behaviour. d = 0 sets no bound but
// the call's own deadline; d must not be negative.
func WithTimeout(d time.Duration) Option {
	return func(in *Interceptor) {
		if d < 0 {
			in.fail("timeout must not be negative (got %v)", d)
			return
		}
		in.timeout = d
	}
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
// ratelimit.ErrInvalidArgument and reports a nil limiter or key function, an
// unknown outage behaviour, a negative timeout, a malformed method name, or
// a policy name that cannot be sent in metadata.
func New(lim Limiter, opts ...Option) (*Interceptor, error) {
	in := &Interceptor{
		key:     PeerIP,
		outage:  fallback.FailClosed,
		timeout: DefaultTimeout,
		clock:   time.Now,
	}
	if lim != nil {
		in.def = newPolicy(lim, 0)
	}
	for _, o := range opts {
		o(in)
	}
	switch {
	case in.err != nil:
		return nil, in.err
	case lim == nil && len(in.methods) == 0:
		return nil, invalid("limiter must not be nil (or give WithMethod)")
	case in.key == nil:
		return nil, invalid("key function must not be nil")
	case in.clock == nil:
		return nil, invalid("clock must not be nil")
	case in.outage > fallback.LocalFallback:
		return nil, invalid("unknown outage behaviour %d", in.outage)
	}
	for _, p := range in.policies() {
		if !validName(p.name) {
			return nil, invalid("policy name %q must be 1 to 64 printable ASCII characters", p.name)
		}
	}
	if in.outage == fallback.LocalFallback {
		in.local = memstore.New()
	}
	return in, nil
}

func newPolicy(lim Limiter, index int) *policy {
	name := DefaultPolicyName
	if n, ok := lim.(interface{ Namespace() string }); ok && n.Namespace() != "" {
		name = n.Namespace()
	}
	return &policy{lim: lim, name: name, local: strconv.Itoa(index) + ":"}
}

func (in *Interceptor) policies() []*policy {
	var ps []*policy
	if in.def != nil {
		ps = append(ps, in.def)
	}
	for _, p := range in.methods {
		if p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

func (in *Interceptor) fail(format string, args ...any) {
	if in.err == nil {
		in.err = invalid(format, args...)
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: grpclimit: "+format, append([]any{ratelimit.ErrInvalidArgument}, args...)...)
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
	key, err := in.key(ctx, method)
	if err == nil && key == "" {
		err = ErrNoKey
	}
	if err != nil {
		if in.passNoKey {
			return nil, nil
		}
		return nil, status.Error(codes.InvalidArgument, "rate limit: "+err.Error())
	}
	key = capKey(key)
	cost := int64(1)
	if in.cost != nil {
		if cost, err = in.cost(ctx, method, req); err != nil {
			return nil, status.Error(codes.InvalidArgument, "rate limit: call cost: "+err.Error())
		}
	}
	cctx := ctx
	if in.timeout > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, in.timeout)
		defer cancel()
	}
	d, err := p.lim.TryAcquireN(cctx, key, cost)
	if err != nil {
		switch {
		case errors.Is(err, ratelimit.ErrInvalidArgument):
			msg := strings.TrimPrefix(err.Error(), ratelimit.ErrInvalidArgument.Error()+": ")
			return nil, status.Error(codes.InvalidArgument, "rate limit: "+msg)
		case ctx.Err() != nil:
			// The client is gone or its deadline passed: not an outage.
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		switch in.outage {
		case fallback.FailOpen:
			return nil, nil
		case fallback.ReturnError:
			if in.onError != nil {
				return nil, in.onError(ctx, method, err)
			}
			return nil, unavailable()
		case fallback.LocalFallback:
			d, err = in.local.Apply(ctx, p.local+key, ratelimit.Request{Limits: p.lim.Limits(), Cost: cost})
			if err != nil {
				return nil, unavailable()
			}
			d.Source = ratelimit.SourceLocal
		default:
			return nil, unavailable()
		}
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
	md := Fields(p.name, p.lim.Limits(), d, in.clock())
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
	h := make(http.Header, 6)
	httplimit.SetHeaders(h, name, limits, d, now)
	md := make(metadata.MD, len(h)+1)
	for k, v := range h {
		md[strings.ToLower(k)] = v
	}
	if !d.Allowed {
		secs := max(1, int64((d.RetryAfter+time.Second-1)/time.Second))
		md["retry-after"] = []string{strconv.FormatInt(secs, 10)}
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

// validName reports whether s can be a policy name: 1 to 64 printable ASCII
// characters.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
