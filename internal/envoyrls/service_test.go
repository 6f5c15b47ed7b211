package envoyrls

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// e2eConfig is written in the peer's format, with every feature, plus burst.
const e2eConfig = `
domain: edge
descriptors:
  # README example 3: a generic per-IP limit, and a deny list.
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  # Example 2: nested descriptors.
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
  # Example 5: unlimited.
  - key: ldap
    rate_limit: {unlimited: true}
  # Example 6: shadow mode.
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 2}
      - key: user
        value: user-b
        rate_limit: {unit: second, requests_per_unit: 3}
  # Example 7: replaces.
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, unit: second, requests_per_unit: 5}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          unit: second
          requests_per_unit: 10
  # Examples 9 and 11: wildcards, shared or not.
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: files_no_share
    value: files_no_share/*
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    value: /api/*/action
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  # Our extension: a bucket of 5 refilling 60 a minute.
  - key: burst_key
    rate_limit: {unit: minute, requests_per_unit: 60, burst: 5}
`

type fixture struct {
	svc     *Service
	client  rlsv3.RateLimitServiceClient
	clock   *testkit.Clock
	metrics *Metrics
	addr    string
}

// serve starts the service on a real 127.0.0.1 listener over store and
// returns a gRPC client of it.
func serve(t *testing.T, store ratelimit.Store, config string, headers Headers) *fixture {
	t.Helper()
	cfg, err := ParseConfig("e2e.yaml", []byte(config))
	if err != nil {
		t.Fatal(err)
	}
	clock := testkit.NewClock(time.Unix(1_700_000_000, 0))
	m := NewMetrics(0)
	svc, err := New(Options{Store: store, Config: cfg, Clock: clock.Now, Headers: headers, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{svc: svc, client: dial(t, svc), clock: clock, metrics: m}
}

func dial(t *testing.T, svc *Service) rlsv3.RateLimitServiceClient {
	t.Helper()
	ln := testkit.Listen(t)
	srv := grpc.NewServer(ServerOptions()...)
	svc.Register(srv)
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// desc builds a descriptor from "key=value" pairs ("key" alone for an
// empty value).
func desc(pairs ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for _, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

func (f *fixture) ask(t *testing.T, hits uint32, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("got %d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// wantStatus checks a status's code and remaining, and its limit's
// requests_per_unit (-1: no current_limit).
// wantOverall fails the test unless r's overall code is code.
func wantOverall(t *testing.T, what string, r *rlsv3.RateLimitResponse, code rlsv3.RateLimitResponse_Code) {
	t.Helper()
	if r.OverallCode != code {
		t.Fatalf("%s: got overall %v, want %v", what, r.OverallCode, code)
	}
}

func wantStatus(t *testing.T, what string, st *rlsv3.RateLimitResponse_DescriptorStatus, code rlsv3.RateLimitResponse_Code, remaining uint32, rpu int64) {
	t.Helper()
	if st.Code != code || st.LimitRemaining != remaining {
		t.Errorf("%s: got code %v remaining %d, want %v remaining %d", what, st.Code, st.LimitRemaining, code, remaining)
	}
	switch {
	case rpu < 0 && st.CurrentLimit != nil:
		t.Errorf("%s: got current_limit %v, want none", what, st.CurrentLimit)
	case rpu >= 0 && st.CurrentLimit == nil:
		t.Errorf("%s: got no current_limit, want requests_per_unit %d", what, rpu)
	case rpu >= 0 && int64(st.CurrentLimit.RequestsPerUnit) != rpu:
		t.Errorf("%s: got requests_per_unit %d, want %d", what, st.CurrentLimit.RequestsPerUnit, rpu)
	}
}

func TestShouldRateLimitEndToEnd(t *testing.T) {
	endToEnd(t, func(*testing.T) ratelimit.Store { return memstore.New() })
}

// endToEnd runs every feature against the service on a real listener, each
// subtest on a store of newStore.
func endToEnd(t *testing.T, newStore func(*testing.T) ratelimit.Store) {
	t.Run("a per-IP rule admits its capacity, then refills smoothly", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		for i := range 10 {
			r := f.ask(t, 0, desc("remote_address=10.0.0.1"))
			wantOverall(t, fmt.Sprint("request ", i+1), r, ok)
			wantStatus(t, "allowed", r.Statuses[0], ok, uint32(9-i), 10)
		}
		r := f.ask(t, 0, desc("remote_address=10.0.0.1"))
		wantOverall(t, "11th", r, over)
		st := r.Statuses[0]
		wantStatus(t, "11th", st, over, 0, 10)
		if st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_SECOND {
			t.Errorf("got unit %v, want SECOND", st.CurrentLimit.Unit)
		}
		if got := st.DurationUntilReset.AsDuration(); got != time.Second {
			t.Errorf("duration_until_reset of an empty 10/s bucket: got %v, want 1s (until full)", got)
		}
		// Another IP has its own bucket.
		wantStatus(t, "other IP", f.ask(t, 0, desc("remote_address=10.0.0.2")).Statuses[0], ok, 9, 10)
		f.clock.Add(100 * time.Millisecond)
		wantStatus(t, "after 100ms, one token", f.ask(t, 0, desc("remote_address=10.0.0.1")).Statuses[0], ok, 0, 10)
		wantStatus(t, "and no more", f.ask(t, 0, desc("remote_address=10.0.0.1")).Statuses[0], over, 0, 10)
	})

	t.Run("the most specific match wins, and requests_per_unit 0 denies all", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		r := f.ask(t, 0, desc("remote_address=50.0.0.5"))
		wantOverall(t, "deny-listed IP", r, over)
		wantStatus(t, "deny-listed", r.Statuses[0], over, 0, 0)
	})

	t.Run("nested descriptors match at their depth only", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		r := f.ask(t, 0, desc("message_type=marketing", "to_number=2061111111"), desc("to_number=2061111111"))
		wantStatus(t, "marketing", r.Statuses[0], ok, 4, 5)
		wantStatus(t, "per number", r.Statuses[1], ok, 99, 100)
		if u := r.Statuses[0].CurrentLimit.Unit; u != rlsv3.RateLimitResponse_RateLimit_DAY {
			t.Errorf("got unit %v, want DAY", u)
		}
		// Example 4: a deeper request than the rule does not match.
		wantStatus(t, "too deep", f.ask(t, 0, desc("to_number=1", "extra=x")).Statuses[0], ok, 0, -1)
		// A shallower one neither: message_type=marketing has no rate_limit.
		wantStatus(t, "too shallow", f.ask(t, 0, desc("message_type=marketing")).Statuses[0], ok, 0, -1)
	})

	t.Run("an unknown domain or descriptor is OK with no limit", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*rlv3.RateLimitDescriptor{desc("a=b")}})
		if err != nil || resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("unknown domain: got %v, %v", resp, err)
		}
		wantStatus(t, "unknown descriptor", f.ask(t, 0, desc("nothing=here")).Statuses[0], ok, 0, -1)
	})

	t.Run("unlimited answers MaxUint32 remaining and no current_limit", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		for range 3 {
			wantStatus(t, "unlimited", f.ask(t, 1000, desc("ldap=x")).Statuses[0], ok, math.MaxUint32, -1)
		}
	})

	t.Run("shadow mode answers OK, counts what it would deny, and blocks nothing", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		for i := range 4 {
			r := f.ask(t, 0, desc("service=auth", "user=user-a"), desc("remote_address=10.9.9.9"))
			wantOverall(t, fmt.Sprint("request ", i+1), r, ok)
			wantStatus(t, "the enforced rule is charged every time", r.Statuses[1], ok, uint32(9-i), 10)
		}
		if got := testutil.ToFloat64(f.metrics.shadow.WithLabelValues("edge", "edge.service.user_user-a")); got != 2 {
			t.Errorf("shadow_mode hits: got %v, want 2", got)
		}
		if got := testutil.ToFloat64(f.metrics.over.WithLabelValues("edge", "edge.service.user_user-a")); got != 2 {
			t.Errorf("over_limit hits of the shadow rule: got %v, want 2", got)
		}
		for range 3 {
			f.ask(t, 0, desc("service=auth", "user=user-b"))
		}
		if f.ask(t, 0, desc("service=auth", "user=user-b")).OverallCode != over {
			t.Error("user-b, not in shadow mode, was not limited")
		}
	})

	t.Run("replaces drops the replaced rule and leaves its bucket alone", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		r := f.ask(t, 0, desc("key_1=value_1", "user=bkthomps"), desc("key_2=value_2", "user=bkthomps"))
		wantStatus(t, "replaced", r.Statuses[0], ok, 0, -1)
		wantStatus(t, "replacing", r.Statuses[1], ok, 9, 10)
		wantStatus(t, "alone, untouched", f.ask(t, 0, desc("key_1=value_1", "user=bkthomps")).Statuses[0], ok, 4, 5)
	})

	t.Run("share_threshold shares one bucket across a wildcard; without it each value has its own", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		wantStatus(t, "a.pdf", f.ask(t, 0, desc("files=files/a.pdf")).Statuses[0], ok, 2, 3)
		wantStatus(t, "b.csv", f.ask(t, 0, desc("files=files/b.csv")).Statuses[0], ok, 1, 3)
		wantStatus(t, "c.txt", f.ask(t, 0, desc("files=files/c.txt")).Statuses[0], ok, 0, 3)
		wantStatus(t, "shared and spent", f.ask(t, 0, desc("files=files/d")).Statuses[0], over, 0, 3)
		wantStatus(t, "no share a", f.ask(t, 0, desc("files_no_share=files_no_share/a")).Statuses[0], ok, 2, 3)
		wantStatus(t, "no share b", f.ask(t, 0, desc("files_no_share=files_no_share/b")).Statuses[0], ok, 2, 3)
		wantStatus(t, "not a match", f.ask(t, 0, desc("files=other/a")).Statuses[0], ok, 0, -1)
	})

	t.Run("a wildcard within a value matches prefix and suffix, and detailed_metric keys by value", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		wantStatus(t, "match", f.ask(t, 0, desc("path=/api/123/action")).Statuses[0], ok, 1, 2)
		wantStatus(t, "other value", f.ask(t, 0, desc("path=/api/456/action")).Statuses[0], ok, 1, 2)
		wantStatus(t, "no match", f.ask(t, 0, desc("path=/api/123/other")).Statuses[0], ok, 0, -1)
		if got := testutil.ToFloat64(f.metrics.hits.WithLabelValues("edge", "edge.path_/api/123/action")); got != 1 {
			t.Errorf("detailed metric hits: got %v, want 1", got)
		}
	})

	t.Run("hits_addend: the request's, a descriptor's own, and 0 looks without consuming", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		wantStatus(t, "request hits 4", f.ask(t, 4, desc("remote_address=1.1.1.1")).Statuses[0], ok, 6, 10)
		d := desc("remote_address=1.1.1.1")
		d.HitsAddend = wrapperspb.UInt64(2)
		wantStatus(t, "descriptor hits 2 overrides 4", f.ask(t, 4, d).Statuses[0], ok, 4, 10)
		d.HitsAddend = wrapperspb.UInt64(0)
		for range 3 {
			wantStatus(t, "hits 0 looks", f.ask(t, 4, d).Statuses[0], ok, 4, 10)
		}
		st := f.ask(t, 5, desc("remote_address=1.1.1.1")).Statuses[0]
		wantStatus(t, "5 of 4 left: over, nothing left for it, as the peer says", st, over, 0, 10)
		if st.DurationUntilReset.AsDuration() <= 0 {
			t.Errorf("over the limit with reset %v, want more than 0", st.DurationUntilReset.AsDuration())
		}
		wantStatus(t, "4 of 4: allowed, the 5 took nothing", f.ask(t, 4, desc("remote_address=1.1.1.1")).Statuses[0], ok, 0, 10)
		d.HitsAddend = wrapperspb.UInt64(0)
		wantStatus(t, "a look at an empty bucket is OK", f.ask(t, 0, d).Statuses[0], ok, 0, 10)
	})

	t.Run("hits_addend above the capacity is OVER_LIMIT and charges no descriptor", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		big := desc("remote_address=2.2.2.2")
		big.HitsAddend = wrapperspb.UInt64(math.MaxUint64)
		r := f.ask(t, 0, big, desc("to_number=42"))
		wantOverall(t, "the request", r, over)
		wantStatus(t, "the huge one", r.Statuses[0], over, 0, 10)
		wantStatus(t, "the other, only looked at: what its hit would leave", r.Statuses[1], ok, 99, 100)
		wantStatus(t, "later, the other is full", f.ask(t, 0, desc("to_number=42")).Statuses[0], ok, 99, 100)
		wantStatus(t, "request hits 3", f.ask(t, 3, desc("remote_address=2.2.2.2")).Statuses[0], ok, 7, 10)
		wantStatus(t, "request hits 11 > 10, alone: over", f.ask(t, 11, desc("remote_address=2.2.2.2")).Statuses[0], over, 0, 10)
		wantStatus(t, "nothing taken", f.ask(t, 0, desc("remote_address=2.2.2.2")).Statuses[0], ok, 6, 10)
	})

	t.Run("all or nothing: a request with one descriptor over its limit charges none", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		for range 5 {
			f.ask(t, 0, desc("message_type=marketing", "to_number=7"))
		}
		r := f.ask(t, 0, desc("message_type=marketing", "to_number=7"), desc("to_number=7"))
		wantOverall(t, "the request", r, over)
		wantStatus(t, "spent", r.Statuses[0], over, 0, 5)
		wantStatus(t, "would pass alone: what its hit would leave", r.Statuses[1], ok, 99, 100)
		wantStatus(t, "still untouched", f.ask(t, 0, desc("to_number=7")).Statuses[0], ok, 99, 100)
	})

	t.Run("two descriptors on one bucket add their hits, counted in turn", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		r := f.ask(t, 3, desc("remote_address=3.3.3.3"), desc("remote_address=3.3.3.3"))
		wantStatus(t, "first", r.Statuses[0], ok, 7, 10)
		wantStatus(t, "second", r.Statuses[1], ok, 4, 10)
		r = f.ask(t, 3, desc("remote_address=3.3.3.3"), desc("remote_address=3.3.3.3"))
		wantOverall(t, "6 of 4", r, over)
		wantStatus(t, "3 of 4: OK in turn", r.Statuses[0], ok, 1, 10)
		wantStatus(t, "then 3 of 1: over", r.Statuses[1], over, 0, 10)
		wantStatus(t, "nothing was taken", f.ask(t, 4, desc("remote_address=3.3.3.3")).Statuses[0], ok, 0, 10)
	})

	t.Run("a descriptor's own limit overrides the file", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		d := desc("remote_address=4.4.4.4")
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
		wantStatus(t, "1", f.ask(t, 0, d).Statuses[0], ok, 1, 2)
		wantStatus(t, "2", f.ask(t, 0, d).Statuses[0], ok, 0, 2)
		st := f.ask(t, 0, d).Statuses[0]
		wantStatus(t, "3", st, over, 0, 2)
		if st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Errorf("got unit %v, want MINUTE", st.CurrentLimit.Unit)
		}
		wantStatus(t, "the file's rule is untouched", f.ask(t, 0, desc("remote_address=4.4.4.4")).Statuses[0], ok, 9, 10)
		d.Limit.Unit = typev3.RateLimitUnit_UNKNOWN
		_, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{d}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("unknown unit: got %v, want INVALID_ARGUMENT", err)
		}
	})

	t.Run("burst, our extension, sets the capacity", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		for i := range 5 {
			wantStatus(t, "burst", f.ask(t, 0, desc("burst_key=k")).Statuses[0], ok, uint32(4-i), 60)
		}
		wantStatus(t, "past the burst", f.ask(t, 0, desc("burst_key=k")).Statuses[0], over, 0, 60)
		f.clock.Add(time.Second)
		wantStatus(t, "one a second", f.ask(t, 0, desc("burst_key=k")).Statuses[0], ok, 0, 60)
	})

	t.Run("response headers, the peer's and the httpapi fields", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{Enabled: true, Remaining: "X-Left"})
		r := f.ask(t, 0, desc("remote_address=5.5.5.5"), desc("burst_key=5"))
		got := map[string]string{}
		for _, h := range r.ResponseHeadersToAdd {
			got[h.Key] = h.Value
		}
		// burst_key has 4 left, fewer than remote_address's 9: it binds.
		want := map[string]string{
			"RateLimit-Limit": "60", "X-Left": "4", "RateLimit-Reset": "1",
			"RateLimit-Policy": `"edge.burst_key";q=5;w=5`, "RateLimit": `"edge.burst_key";r=4;t=1`,
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("header %s: got %q, want %q (all: %v)", k, got[k], v, got)
			}
		}
		if _, there := got["Retry-After"]; there {
			t.Errorf("Retry-After on an allowed request: %v", got)
		}
		for range 4 {
			f.ask(t, 0, desc("burst_key=5"))
		}
		r = f.ask(t, 0, desc("remote_address=5.5.5.5"), desc("burst_key=5"))
		got = map[string]string{}
		for _, h := range r.ResponseHeadersToAdd {
			got[h.Key] = h.Value
		}
		// Denied by burst_key, empty: one token a second.
		if got["Retry-After"] != "1" || got["X-Left"] != "0" || got["RateLimit-Reset"] != "5" {
			t.Errorf("a denial's headers: %v", got)
		}
	})

	t.Run("is_negative_hits refunds hits_addend, capped at capacity", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		refund := func(hits uint64, pairs ...string) *rlv3.RateLimitDescriptor {
			d := desc(pairs...)
			d.HitsAddend, d.IsNegativeHits = wrapperspb.UInt64(hits), true
			return d
		}
		take := func(hits uint64, pairs ...string) *rlv3.RateLimitDescriptor {
			d := desc(pairs...)
			d.HitsAddend = wrapperspb.UInt64(hits)
			return d
		}
		wantStatus(t, "30 hits", f.ask(t, 30, desc("to_number=555")).Statuses[0], ok, 70, 100)
		wantStatus(t, "a refund of 20", f.ask(t, 0, refund(20, "to_number=555")).Statuses[0], ok, 90, 100)
		wantStatus(t, "a refund of 50, capped at the capacity", f.ask(t, 0, refund(50, "to_number=555")).Statuses[0], ok, 100, 100)
		wantStatus(t, "a look", f.ask(t, 0, take(0, "to_number=555")).Statuses[0], ok, 100, 100)
		// A request's refund is given after its checks: it cannot admit
		// them. 100 hits on a full bucket fit; 101 never do.
		r := f.ask(t, 0, take(101, "to_number=555"), refund(100, "to_number=555"))
		if r.OverallCode != over {
			t.Errorf("101 hits beside a refund of 100: %v, want OVER_LIMIT", r.OverallCode)
		}
		wantStatus(t, "the refund beside a denial", r.Statuses[1], ok, 100, 100)
		r = f.ask(t, 0, take(100, "to_number=555"), refund(40, "to_number=555"))
		wantStatus(t, "100 hits beside a refund", r.Statuses[0], ok, 0, 100)
		wantStatus(t, "a refund of 40 after them", r.Statuses[1], ok, 40, 100)
		// The refund of hits_addend 0 looks; a refund without a bucket
		// (no rule, unlimited, rpu 0) does nothing and is OK.
		wantStatus(t, "a refund of 0", f.ask(t, 0, refund(0, "to_number=555")).Statuses[0], ok, 40, 100)
		r = f.ask(t, 0, refund(5, "ldap=x"), refund(5, "nothing=here"), refund(5, "remote_address=50.0.0.5"))
		if r.OverallCode != ok {
			t.Errorf("refunds without a bucket: %v", r)
		}
		// A request-level hits_addend is refunded the same way.
		d := desc("to_number=555")
		d.IsNegativeHits = true
		wantStatus(t, "a refund of the request's 7", f.ask(t, 7, d).Statuses[0], ok, 47, 100)
	})

	t.Run("malformed requests are INVALID_ARGUMENT", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		many := make([]*rlv3.RateLimitDescriptor, MaxDescriptors+1)
		for i := range many {
			many[i] = desc("remote_address=x")
		}
		for _, tc := range []struct {
			name string
			req  *rlsv3.RateLimitRequest
		}{
			{"no domain", &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("a=b")}}},
			{"no descriptors", &rlsv3.RateLimitRequest{Domain: "edge"}},
			{"a descriptor without entries", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{}}}},
			{"an empty key", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("=v")}}},
			{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: many}},
		} {
			_, err := f.client.ShouldRateLimit(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: got %v, want INVALID_ARGUMENT", tc.name, err)
			}
		}
		_, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("a=" + strings.Repeat("x", MaxRecvMsgSize))}})
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a request above the message cap: got %v, want RESOURCE_EXHAUSTED", err)
		}
		if r := f.ask(t, 0, desc("remote_address=still-serving")); r.OverallCode != ok {
			t.Errorf("after bad input: got %v", r.OverallCode)
		}
	})

	t.Run("metrics count hits, over limit and near limit per rule", func(t *testing.T) {
		f := serve(t, newStore(t), e2eConfig, Headers{})
		for range 12 {
			f.ask(t, 0, desc("remote_address=6.6.6.6"))
		}
		key := "edge.remote_address"
		for _, tc := range []struct {
			name string
			got  float64
			want float64
		}{
			{"hits", testutil.ToFloat64(f.metrics.hits.WithLabelValues("edge", key)), 12},
			{"over", testutil.ToFloat64(f.metrics.over.WithLabelValues("edge", key)), 2},
			{"within", testutil.ToFloat64(f.metrics.within.WithLabelValues("edge", key)), 10},
			{"near (past 8 of 10)", testutil.ToFloat64(f.metrics.near.WithLabelValues("edge", key)), 2},
		} {
			if tc.got != tc.want {
				t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
			}
		}
	})
}

func TestReloadKeepsTheOldConfigOnError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.yaml")
	testkit.WriteFile(t, path, "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	svc, err := New(Options{Store: memstore.New()})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Reload(path); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, path, "domain: edge\ndescriptors:\n  - key: a\n    rate_limt: {}\n")
	err = svc.Reload(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "rate_limt") {
		t.Fatalf("got %v, want an error naming the file and the field", err)
	}
	if got := svc.Config().Rules(); got != 1 {
		t.Errorf("after a bad reload: %d rules in force, want the old 1", got)
	}
}

// TestConcurrentRequestsAreExact: many clients at once on one bucket admit
// exactly its capacity (the clock is frozen, so nothing refills).
func TestConcurrentRequestsAreExact(t *testing.T) {
	f := serve(t, memstore.New(), e2eConfig, Headers{})
	if got := concurrentOK(t, f, desc("remote_address=crowd")); got != 10 {
		t.Errorf("128 concurrent requests on a 10/s bucket: %d allowed, want 10", got)
	}
}

// TestConcurrentAllOrNothing: concurrent requests, each with a roomy
// descriptor first and a tight one second, charge the roomy bucket exactly
// as often as the tight one admits: a denial charges neither, even in a race.
// memstore decides a request's descriptors in one ApplyAll.
var _ ratelimit.BatchStore = (*memstore.Store)(nil)

func TestConcurrentAllOrNothing(t *testing.T) {
	concurrentAllOrNothing(t, memstore.New())
}

// plain hides a store's ApplyAll, for the sequential path.
type plain struct{ ratelimit.Store }

// Refund is the store's: plain hides ApplyAll only.
func (p plain) Refund(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	return p.Store.(ratelimit.Refunder).Refund(ctx, key, r)
}

// TestSequentialPath runs every feature on a store without ApplyAll: one
// client at a time, the peek-then-take path is all or nothing too.
func TestSequentialPath(t *testing.T) {
	endToEnd(t, func(*testing.T) ratelimit.Store { return plain{memstore.New()} })
}

func concurrentAllOrNothing(t *testing.T, store ratelimit.Store) {
	f := serve(t, store, e2eConfig, Headers{})
	if got := concurrentOK(t, f, desc("to_number=race"), desc("remote_address=race")); got != 10 {
		t.Errorf("%d allowed, want 10", got)
	}
	wantStatus(t, "the roomy bucket, charged once per admission", f.ask(t, 0, desc("to_number=race")).Statuses[0], ok, 89, 100)
}

func TestLongValuesKeepTheirOwnBuckets(t *testing.T) {
	f := serve(t, memstore.New(), e2eConfig, Headers{})
	long := strings.Repeat("v", 64<<10) // beyond any bound on one value: answered
	a, b := long[:len(long)-1]+"a", long[:len(long)-1]+"b"
	for range 10 {
		f.ask(t, 0, desc("remote_address="+a))
	}
	wantStatus(t, "a spent", f.ask(t, 0, desc("remote_address="+a)).Statuses[0], over, 0, 10)
	wantStatus(t, "b, its own bucket", f.ask(t, 0, desc("remote_address="+b)).Statuses[0], ok, 9, 10)
}

// concurrentOK sends 128 requests of descs in domain edge from 16 goroutines
// at once and returns how many were answered OK.
func concurrentOK(t *testing.T, f *fixture, descs ...*rlv3.RateLimitDescriptor) int64 {
	t.Helper()
	return testkit.Concurrently(t, 16, 8, func(int, int) (bool, error) {
		r, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: descs})
		return err == nil && r.OverallCode == ok, err
	})
}

// deadlineStore records the deadline of each Apply's context.
type deadlineStore struct {
	ratelimit.Store
	deadline time.Time
	ok       bool
}

func (d *deadlineStore) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	d.deadline, d.ok = ctx.Deadline()
	return d.Store.Apply(ctx, key, r)
}

// TestStoreCallsBounded checks that the store calls of a request are
// bounded by Options.Timeout, and by the caller's deadline when that comes
// first.
func TestStoreCallsBounded(t *testing.T) {
	cfg, err := ParseConfig("t.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	store := &deadlineStore{Store: memstore.New()}
	svc, err := New(Options{Store: store, Config: cfg, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}},
	}}
	for _, tc := range []struct {
		name   string
		caller time.Duration // 0: no deadline
		want   time.Duration
	}{
		{"no deadline", 0, time.Minute},
		{"a later deadline", time.Hour, time.Minute},
		{"an earlier deadline", time.Second, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.caller > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.caller)
				defer cancel()
			}
			start := time.Now()
			if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
				t.Fatal(err)
			}
			if !store.ok {
				t.Fatal("the store call had no deadline")
			}
			end := time.Now()
			if store.deadline.After(end.Add(tc.want)) || store.deadline.Before(start.Add(tc.want-time.Second/2)) {
				t.Fatalf("the store call's deadline is %v after the request, want about %v", store.deadline.Sub(start), tc.want)
			}
		})
	}
}
