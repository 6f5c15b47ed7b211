package grpclimit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// wantFields checks the rate-limit metadata of a call.
func wantFields(t *testing.T, what string, md metadata.MD, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := strings.Join(md.Get(k), ","); got != v {
			t.Errorf("%s: %s = %q, want %q", what, k, got, v)
		}
	}
}

// wantStatus checks a call's error: its code and, when wait >= 0, its
// RetryInfo.
func wantStatus(t *testing.T, what string, err error, code codes.Code, wait time.Duration) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Fatalf("%s: %v, want code %v", what, err, code)
	}
	if wait < 0 {
		return
	}
	got, ok := RetryDelay(err)
	if !ok || got != wait {
		t.Fatalf("%s: RetryInfo %v (present %v), want %v", what, got, ok, wait)
	}
}

func TestUnaryAndStreamOnEveryStore(t *testing.T) {
	for _, st := range stores(t) {
		t.Run(st.name, func(t *testing.T) {
			clock := testkit.NewClock(testkit.Start)
			store := st.new(t, clock)
			lim := newLimiter(t, store, clock, "api", ratelimit.PerMinute(2))
			client := serve(t, newInterceptor(t, lim, WithClock(clock.Now)))
			ctx := context.Background()
			reset := testkit.Start.Unix()

			hdr, _, err := check(client, ctx)
			if err != nil {
				t.Fatalf("first call: %v", err)
			}
			wantFields(t, "first call", hdr, map[string]string{
				"ratelimit-policy": `"api";q=2;w=60`, "ratelimit": `"api";r=1;t=30`,
				"x-ratelimit-limit": "2", "x-ratelimit-remaining": "1", "retry-after": "",
				"x-ratelimit-reset": itoa(reset + 30),
			})
			if _, _, err := check(client, ctx); err != nil {
				t.Fatalf("second call: %v", err)
			}
			hdr, trl, err := check(client, ctx)
			wantStatus(t, "third call", err, codes.ResourceExhausted, 30*time.Second)
			wantFields(t, "third call's trailer", trl, map[string]string{
				"ratelimit-policy": `"api";q=2;w=60`, "ratelimit": `"api";r=0;t=60`,
				"x-ratelimit-limit": "2", "x-ratelimit-remaining": "0", "retry-after": "30",
				"x-ratelimit-reset": itoa(reset + 60),
			})
			if len(hdr.Get("ratelimit")) != 0 {
				t.Errorf("a denial sent the fields as headers too: %v", hdr)
			}

			// A stream is charged when it opens: denied now, before any message.
			stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatal(err)
			}
			_, err = stream.Recv()
			wantStatus(t, "a stream opened on an empty bucket", err, codes.ResourceExhausted, 30*time.Second)
			wantFields(t, "the denied stream's trailer", stream.Trailer(), map[string]string{"retry-after": "30", "x-ratelimit-remaining": "0"})

			// Half a minute later one token is back: the stream opens.
			clock.Add(30 * time.Second)
			sctx, cancel := context.WithCancel(ctx)
			defer cancel()
			stream, err = client.Watch(sctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("a stream opened after the refill: %v, %v", resp, err)
			}
			hdr, err = stream.Header()
			if err != nil {
				t.Fatal(err)
			}
			wantFields(t, "the admitted stream's header", hdr, map[string]string{"x-ratelimit-remaining": "0", "ratelimit": `"api";r=0;t=60`})
			// Its messages are not charged: the stream keeps running while
			// unary calls are denied.
			_, _, err = check(client, ctx)
			wantStatus(t, "a call while the stream runs", err, codes.ResourceExhausted, 30*time.Second)
		})
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestPerMethodPolicies(t *testing.T) {
	clock := testkit.NewClock(testkit.Start)
	for _, st := range stores(t)[:1] {
		store := st.new(t, clock)
		def := newLimiter(t, store, clock, "default-ns", ratelimit.PerMinute(5))
		strict := newLimiter(t, store, clock, "check", ratelimit.PerMinute(1))
		in := newInterceptor(t, def, WithClock(clock.Now),
			WithMethod(checkMethod, strict),
			WithMethod("/grpc.health.v1.Health/", def),
			WithMethod(listMethod, nil))
		client := serve(t, in)
		ctx := context.Background()

		hdr, _, err := check(client, ctx)
		if err != nil {
			t.Fatal(err)
		}
		wantFields(t, "Check, under its own policy", hdr, map[string]string{"ratelimit-policy": `"check";q=1;w=60`})
		_, trl, err := check(client, ctx)
		wantStatus(t, "a second Check", err, codes.ResourceExhausted, time.Minute)
		wantFields(t, "a second Check", trl, map[string]string{"ratelimit": `"check";r=0;t=60`})

		for i := range 10 {
			if _, err := client.List(ctx, &healthpb.HealthListRequest{}); err != nil {
				t.Fatalf("List %d, exempt: %v", i, err)
			}
		}
		sctx, cancel := context.WithCancel(ctx)
		stream, err := client.Watch(sctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatalf("Watch, under the service's policy: %v", err)
		}
		whdr, err := stream.Header()
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		wantFields(t, "Watch, under the service's policy", whdr, map[string]string{"ratelimit-policy": `"default-ns";q=5;w=60`, "x-ratelimit-remaining": "4"})
	}
}

func TestOnlyListedMethodsAreLimitedWithoutADefault(t *testing.T) {
	clock := testkit.NewClock(testkit.Start)
	store := stores(t)[0].new(t, clock)
	in := newInterceptor(t, nil, WithMethod(checkMethod, newLimiter(t, store, clock, "check", ratelimit.PerMinute(1))))
	client := serve(t, in)
	ctx := context.Background()
	check(client, ctx)
	_, _, err := check(client, ctx)
	wantStatus(t, "a second Check", err, codes.ResourceExhausted, time.Minute)
	for range 3 {
		if _, err := client.List(ctx, &healthpb.HealthListRequest{}); err != nil {
			t.Fatalf("List, not listed: %v", err)
		}
	}
}

func TestOutages(t *testing.T) {
	ok := func(t *testing.T, what string, err error, hdr metadata.MD, fields bool) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v, want the call through", what, err)
		}
		if got := len(hdr.Get("ratelimit")) > 0; got != fields {
			t.Fatalf("%s: rate-limit headers present = %v, want %v (%v)", what, got, fields, hdr)
		}
	}
	clock := testkit.NewClock(testkit.Start)
	unenforced := func(o fallback.Outage) Limiter {
		fb, err := fallback.New(failing{}, fallback.WithOutage(o), fallback.WithClock(clock.Now))
		if err != nil {
			t.Fatal(err)
		}
		return newLimiter(t, fb, clock, "api", ratelimit.PerMinute(2))
	}
	down := func() Limiter { return newLimiter(t, failing{}, clock, "api", ratelimit.PerMinute(2)) }
	tests := []struct {
		name string
		lim  func() Limiter
		opts []Option
		run  func(t *testing.T, client healthpb.HealthClient)
	}{
		{"a store error is Unavailable with a RetryInfo of 1s and no fields", down, nil,
			func(t *testing.T, client healthpb.HealthClient) {
				_, trl, err := check(client, context.Background())
				wantStatus(t, "check", err, codes.Unavailable, time.Second)
				if len(trl.Get("ratelimit")) != 0 || len(trl.Get("ratelimit-policy")) != 0 {
					t.Fatalf("an outage answer claims a bucket: %v", trl)
				}
			}},
		{"the error handler's error is the answer", down,
			[]Option{WithErrorHandler(func(_ context.Context, method string, err error) error {
				return status.Errorf(codes.Aborted, "%s: %v", method, err)
			})},
			func(t *testing.T, client healthpb.HealthClient) {
				_, _, err := check(client, context.Background())
				wantStatus(t, "check", err, codes.Aborted, -1)
				if !strings.Contains(err.Error(), checkMethod+": ") || !strings.Contains(err.Error(), "connection refused") {
					t.Fatalf("the handler's message was lost: %v", err)
				}
			}},
		{"a nil from the error handler lets the call through", down,
			[]Option{WithErrorHandler(func(context.Context, string, error) error { return nil })},
			func(t *testing.T, client healthpb.HealthClient) {
				hdr, _, err := check(client, context.Background())
				ok(t, "check", err, hdr, false)
			}},
		{"a fallback store's return-error is Unavailable", func() Limiter { return unenforced(fallback.ReturnError) }, nil,
			func(t *testing.T, client healthpb.HealthClient) {
				_, _, err := check(client, context.Background())
				wantStatus(t, "check", err, codes.Unavailable, time.Second)
			}},
		{"a fallback store's fail-closed denial is Unavailable, not ResourceExhausted", func() Limiter { return unenforced(fallback.FailClosed) }, nil,
			func(t *testing.T, client healthpb.HealthClient) {
				_, _, err := check(client, context.Background())
				wantStatus(t, "check", err, codes.Unavailable, time.Second)
			}},
		{"a fallback store's fail-open admission passes without fields", func() Limiter { return unenforced(fallback.FailOpen) }, nil,
			func(t *testing.T, client healthpb.HealthClient) {
				for range 3 {
					hdr, _, err := check(client, context.Background())
					ok(t, "check", err, hdr, false)
				}
			}},
		{"a fallback store's local buckets decide with the same policy", func() Limiter { return unenforced(fallback.LocalFallback) }, nil,
			func(t *testing.T, client healthpb.HealthClient) {
				for i := range 2 {
					hdr, _, err := check(client, context.Background())
					ok(t, "check "+itoa(int64(i)), err, hdr, true)
				}
				_, _, err := check(client, context.Background())
				wantStatus(t, "third check", err, codes.ResourceExhausted, -1)
			}},
		{"streams get the same answer", down, nil,
			func(t *testing.T, client healthpb.HealthClient) {
				stream, err := client.Watch(context.Background(), &healthpb.HealthCheckRequest{})
				if err != nil {
					t.Fatal(err)
				}
				_, err = stream.Recv()
				wantStatus(t, "watch", err, codes.Unavailable, time.Second)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.run(t, serve(t, newInterceptor(t, tt.lim(), tt.opts...)))
		})
	}
}

func TestCheckTimeout(t *testing.T) {
	t.Run("the default bound is 500ms", func(t *testing.T) {
		b := &blocking{}
		lim := newLimiter(t, b, testkit.NewClock(testkit.Start), "api", ratelimit.PerMinute(2))
		in := newInterceptor(t, lim)
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the store's context ends at once; only its deadline is looked at
		start := time.Now()
		in.check(loopbackPeer(ctx), checkMethod, nil)
		if len(b.deadlines) != 1 {
			t.Fatalf("the store saw %d checks, want 1", len(b.deadlines))
		}
		if d := b.deadlines[0].Sub(start); d < DefaultTimeout || testkit.Timed(t) && d > DefaultTimeout+100*time.Millisecond {
			t.Fatalf("the store's deadline was %v after the call began, want %v (DefaultTimeout)", d, DefaultTimeout)
		}
	})
	t.Run("a store that does not answer in time is an outage", func(t *testing.T) {
		b := &blocking{}
		lim := newLimiter(t, b, testkit.NewClock(testkit.Start), "api", ratelimit.PerMinute(2))
		client := serve(t, newInterceptor(t, lim, WithTimeout(20*time.Millisecond)))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _, err := check(client, ctx)
		wantStatus(t, "check", err, codes.Unavailable, time.Second)
	})
	t.Run("without a bound the call's deadline is the bound", func(t *testing.T) {
		b := &blocking{}
		lim := newLimiter(t, b, testkit.NewClock(testkit.Start), "api", ratelimit.PerMinute(2))
		in := newInterceptor(t, lim, WithTimeout(0))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := in.check(loopbackPeer(ctx), checkMethod, nil)
		if len(b.deadlines) != 1 || !b.deadlines[0].IsZero() {
			t.Fatalf("the store saw deadlines %v, want none", b.deadlines)
		}
		// The caller's own cancellation is not an outage.
		wantStatus(t, "a cancelled call", err, codes.Canceled, -1)
	})
}

func TestKeysCostsAndBadInput(t *testing.T) {
	rec := &recording{}
	cost := func(_ context.Context, _ string, req any) (int64, error) {
		r, ok := req.(*healthpb.HealthCheckRequest)
		if !ok {
			return 1, nil
		}
		switch r.GetService() {
		case "bad":
			return 0, errors.New("no price for bad")
		case "":
			return 1, nil
		}
		return int64(len(r.GetService())), nil
	}
	client := serve(t, newInterceptor(t, rec, WithKey(PerMethod(Metadata("x-api-key"))), WithCost(cost)))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k1")

	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "abc"}); status.Code(err) != codes.NotFound {
		t.Fatalf("Check of an unknown service: %v (want NotFound from the handler)", err)
	}
	// "k1" hashed: the first 16 bytes of its SHA-256 in unpadded base64url.
	if s, c := rec.last(); s != "28:/grpc.health.v1.Health/Check|29:sha256:arnx6499M4j0-dWG9m6Z_Q" || c != 3 {
		t.Fatalf("the limiter saw %q cost %d, want the method and key joined, cost 3", s, c)
	}
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "bad"})
	wantStatus(t, "a cost function error", err, codes.InvalidArgument, -1)
	if !strings.Contains(err.Error(), "no price for bad") {
		t.Errorf("the cost error is not in the message: %v", err)
	}
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	wantStatus(t, "a call without the key", err, codes.InvalidArgument, -1)
	if !strings.Contains(err.Error(), "missing x-api-key metadata") {
		t.Errorf("the missing key is not named: %v", err)
	}

	// A key longer than MaxKeyBytes is refused, from Metadata (before it
	// is hashed) as from a KeyFunc of the caller's, and reaches no limiter.
	long := strings.Repeat("t", MaxKeyBytes+1)
	lctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", long)
	n := rec.count()
	_, err = client.Check(lctx, &healthpb.HealthCheckRequest{})
	wantStatus(t, "a key over MaxKeyBytes", err, codes.InvalidArgument, -1)
	for _, opts := range [][]Option{{WithKey(RawMetadata("x-api-key"))}, {WithKey(RawMetadata("x-api-key")), PassMissingKey()}} {
		_, err = serve(t, newInterceptor(t, rec, opts...)).Check(lctx, &healthpb.HealthCheckRequest{})
		wantStatus(t, "a raw key over MaxKeyBytes", err, codes.InvalidArgument, -1)
	}
	if !strings.Contains(err.Error(), "longer than 1024 bytes") || rec.count() != n {
		t.Fatalf("%v after %d checks; want the bound named and no check", err, rec.count()-n)
	}
	if _, err := client.Check(metadata.AppendToOutgoingContext(context.Background(), "x-api-key", long[1:]), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("a key of MaxKeyBytes: %v", err)
	}

	// The limiter's own refusal of a cost is InvalidArgument, not an outage.
	clock := testkit.NewClock(testkit.Start)
	lim := newLimiter(t, stores(t)[0].new(t, clock), clock, "api", ratelimit.PerMinute(2))
	client = serve(t, newInterceptor(t, lim, WithCost(cost)))
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "abc"})
	wantStatus(t, "a cost above the capacity", err, codes.InvalidArgument, -1)
	if !strings.Contains(err.Error(), "cost must not exceed capacity") {
		t.Errorf("the rule is not named: %v", err)
	}

	// PassMissingKey lets a call without a key through unlimited.
	client = serve(t, newInterceptor(t, lim, WithKey(Metadata("x-api-key")), PassMissingKey()))
	for range 3 {
		hdr, _, err := check(client, context.Background())
		if err != nil || len(hdr.Get("ratelimit")) != 0 {
			t.Fatalf("a keyless call with PassMissingKey: %v, %v", err, hdr)
		}
	}
}

func TestWithoutHeaders(t *testing.T) {
	clock := testkit.NewClock(testkit.Start)
	lim := newLimiter(t, stores(t)[0].new(t, clock), clock, "api", ratelimit.PerMinute(1))
	client := serve(t, newInterceptor(t, lim, WithoutHeaders()))
	hdr, _, err := check(client, context.Background())
	if err != nil || len(hdr.Get("ratelimit")) != 0 {
		t.Fatalf("an admitted call with WithoutHeaders: %v, %v", err, hdr)
	}
	_, trl, err := check(client, context.Background())
	wantStatus(t, "a denied call", err, codes.ResourceExhausted, time.Minute)
	wantFields(t, "a denied call's trailer", trl, map[string]string{"retry-after": "60"})
}

func TestNewRefusesBadOptions(t *testing.T) {
	lim := &recording{}
	tests := []struct {
		name string
		lim  Limiter
		opts []Option
		want string
	}{
		{"no limiter and no method", nil, nil, "limiter must not be nil"},
		{"a nil key function", lim, []Option{WithKey(nil)}, "key function must not be nil"},
		{"a nil clock", lim, []Option{WithClock(nil)}, "clock must not be nil"},
		{"a nil cost function", lim, []Option{WithCost(nil)}, "cost function must not be nil"},
		{"a nil error handler", lim, []Option{WithErrorHandler(nil)}, "error handler must not be nil"},
		{"a policy name without a limiter to name", nil, []Option{WithMethod(checkMethod, lim), WithPolicyName("x")}, "WithPolicyName names the limiter given to New"},
		{"a negative timeout", lim, []Option{WithTimeout(-time.Second)}, "timeout must not be negative"},
		{"a method without its service", lim, []Option{WithMethod("Check", lim)}, `method "Check" must be`},
		{"a method with too many parts", lim, []Option{WithMethod("/a/b/c", lim)}, `method "/a/b/c" must be`},
		{"a policy name with a newline", lim, []Option{WithPolicyName("a\nb")}, "policy name"},
		{"an empty policy name", lim, []Option{WithPolicyName("")}, "policy name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.lim, tt.opts...)
			if !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), "grpclimit: "+tt.want) {
				t.Fatalf("New: %v, want ErrInvalidArgument saying %q", err, tt.want)
			}
		})
	}
}
