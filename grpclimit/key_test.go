package grpclimit

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// callCtx returns the context of a call from peer addr (nil: no peer) with
// incoming metadata md (key, value pairs).
func callCtx(addr net.Addr, md ...string) context.Context {
	ctx := context.Background()
	if addr != nil {
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: addr})
	}
	if len(md) > 0 {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(md...))
	}
	return ctx
}

func tcp(s string) net.Addr {
	ap := netip.MustParseAddrPort(s)
	return net.TCPAddrFromAddrPort(ap)
}

func TestPeerIPAndTrustedProxies(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::1/128")}
	xff := TrustedProxies{Prefixes: proxies}
	custom := TrustedProxies{Prefixes: proxies, Header: "X-Real-Client"}
	xff128 := TrustedProxies{Prefixes: proxies, IPv6Bits: 128}
	fwd := TrustedProxies{Prefixes: proxies, Header: "Forwarded"}
	tests := []struct {
		name string
		key  KeyFunc
		peer net.Addr
		md   []string
		want string
	}{
		{"the peer address is the key", PeerIP, tcp("192.0.2.1:5555"), nil, "192.0.2.1"},
		{"a spoofed x-forwarded-for does not change PeerIP's key", PeerIP, tcp("192.0.2.1:5555"),
			[]string{"x-forwarded-for", "198.51.100.9"}, "192.0.2.1"},
		{"an untrusted peer's x-forwarded-for is ignored", xff.PeerIP, tcp("192.0.2.1:5555"),
			[]string{"x-forwarded-for", "198.51.100.9, 10.0.0.1"}, "192.0.2.1"},
		{"a trusted proxy's x-forwarded-for gives the client", xff.PeerIP, tcp("10.0.0.2:80"),
			[]string{"x-forwarded-for", "198.51.100.9"}, "198.51.100.9"},
		{"a client's spoofed entry left of the real one is skipped", xff.PeerIP, tcp("10.0.0.2:80"),
			[]string{"x-forwarded-for", "1.2.3.4, 198.51.100.9"}, "198.51.100.9"},
		{"trusted hops are skipped from the right, across values", xff.PeerIP, tcp("10.0.0.2:80"),
			[]string{"x-forwarded-for", "1.2.3.4, 198.51.100.9, 10.0.0.7", "x-forwarded-for", "10.9.9.9"}, "198.51.100.9"},
		{"when every hop is trusted the leftmost is the client", xff.PeerIP, tcp("10.0.0.2:80"),
			[]string{"x-forwarded-for", "10.0.0.5, 10.0.0.6"}, "10.0.0.5"},
		{"a trusted proxy without the metadata keys itself", xff.PeerIP, tcp("10.0.0.2:80"), nil, "10.0.0.2"},
		{"garbage reported by a trusted proxy keys that proxy", xff.PeerIP, tcp("10.0.0.2:80"),
			[]string{"x-forwarded-for", "198.51.100.9, not-an-ip"}, "10.0.0.2"},
		{"entries may carry ports and brackets", xff128.PeerIP, tcp("10.0.0.2:80"),
			[]string{"x-forwarded-for", "[2001:db8::5]:443"}, "2001:db8::5"},
		{"an IPv6 client behind a proxy is keyed by its /64", xff.PeerIP, tcp("10.0.0.2:80"),
			[]string{"x-forwarded-for", "[2001:db8::5]:443"}, "2001:db8::/64"},
		{"forwarded metadata is read as RFC 7239 when configured", fwd.PeerIP, tcp("10.0.0.2:80"),
			[]string{"forwarded", `for=1.2.3.4, for="198.51.100.7:80"`, "x-forwarded-for", "198.51.100.9"}, "198.51.100.7"},
		{"an IPv6 trusted proxy", xff.PeerIP, tcp("[2001:db8:ffff::1]:80"),
			[]string{"x-forwarded-for", "198.51.100.9:1234"}, "198.51.100.9"},
		{"IPv4-mapped addresses key as IPv4", PeerIP, tcp("[::ffff:192.0.2.1]:80"), nil, "192.0.2.1"},
		{"another metadata key when configured (case-insensitive)", custom.PeerIP, tcp("10.0.0.2:80"),
			[]string{"x-real-client", "198.51.100.7", "x-forwarded-for", "198.51.100.9"}, "198.51.100.7"},
		{"IPv6 peers are keyed by their /64 by default", PeerIP, tcp("[2001:db8:1:2:3:4:5:6]:80"),
			nil, "2001:db8:1:2::/64"},
		{"IPv6Bits 128 keys by the whole address", TrustedProxies{IPv6Bits: 128}.PeerIP, tcp("[2001:db8:1:2:3:4:5:6]:80"),
			nil, "2001:db8:1:2:3:4:5:6"},
		{"IPv6Bits sets another prefix", TrustedProxies{IPv6Bits: 56}.PeerIP, tcp("[2001:db8:1:2:3:4:5:6]:80"),
			nil, "2001:db8:1::/56"},
		{"a peer given as a string address", PeerIP, stringAddr("192.0.2.8:1"), nil, "192.0.2.8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.key(callCtx(tt.peer, tt.md...), checkMethod)
			if err != nil || got != tt.want {
				t.Fatalf("key = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestParsePrefixes(t *testing.T) {
	got, err := ParsePrefixes("10.0.0.9/8, 127.0.0.1", "::ffff:192.0.2.2")
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("192.0.2.2/32")}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("ParsePrefixes = %v, %v", got, err)
	}
	if _, err := ParsePrefixes("example.com"); err == nil {
		t.Error("ParsePrefixes(example.com): no error")
	}
}

type stringAddr string

func (a stringAddr) Network() string { return "test" }
func (a stringAddr) String() string  { return string(a) }

func TestKeysWithoutAKey(t *testing.T) {
	tests := []struct {
		name string
		key  KeyFunc
		ctx  context.Context
		want string
	}{
		{"no peer", PeerIP, callCtx(nil), "call has no peer"},
		{"a peer that is not an IP", PeerIP, callCtx(&net.UnixAddr{Name: "/tmp/s", Net: "unix"}), `peer address "/tmp/s" is not an IP address`},
		{"no such metadata", Metadata("X-API-Key"), callCtx(nil), "missing x-api-key metadata"},
		{"only empty values", Metadata("x-api-key"), callCtx(nil, "x-api-key", "", "x-api-key", ""), "missing x-api-key metadata"},
		{"a part of a Join without a key", Join(Method, Metadata("x-api-key")), callCtx(nil), "missing x-api-key metadata"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.key(tt.ctx, checkMethod)
			if !errors.Is(err, ErrNoKey) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrNoKey saying %q", err, tt.want)
			}
		})
	}
	if _, err := Join(Method, nil)(callCtx(nil), checkMethod); err == nil {
		t.Error("Join with a nil part: no error")
	}
	if _, err := Method(callCtx(nil), ""); !errors.Is(err, ErrNoKey) {
		t.Errorf("Method with no method: %v", err)
	}
}

func TestMetadataMethodJoin(t *testing.T) {
	ctx := callCtx(nil, "x-api-key", "", "x-api-key", "k1", "x-api-key", "k2")
	if got, err := RawMetadata("X-Api-Key")(ctx, checkMethod); got != "k1" || err != nil {
		t.Errorf("RawMetadata = %q, %v; want the first non-empty value", got, err)
	}
	// "k1" hashed: the first 16 bytes of its SHA-256 in unpadded base64url.
	if got, err := Metadata("X-Api-Key")(ctx, checkMethod); got != "sha256:arnx6499M4j0-dWG9m6Z_Q" || err != nil {
		t.Errorf("Metadata = %q, %v; want the hash of k1", got, err)
	}
	if got, _ := PerMethod(RawMetadata("x-api-key"))(ctx, checkMethod); got != "28:/grpc.health.v1.Health/Check|2:k1" {
		t.Errorf("PerMethod(RawMetadata) = %q", got)
	}
	a := func(s string) KeyFunc { return func(context.Context, string) (string, error) { return s, nil } }
	k1, _ := Join(a("a|1:b"), a("c"))(ctx, "")
	k2, _ := Join(a("a"), a("b|1:c"))(ctx, "")
	if k1 == k2 {
		t.Errorf("Join gave %q for two different combinations", k1)
	}
}

// A metadata key is its value's exact bytes: values that differ in a
// space, a NUL, a tab or a no-break space have buckets of their own.
func TestMetadataIsTheValuesExactBytes(t *testing.T) {
	values := []string{"k\x00", "k\x00 ", "\tk\x00", "k", " k", "bob", "bob\u00a0", "Bob"}
	for _, key := range []KeyFunc{Metadata("x-api-key"), RawMetadata("x-api-key")} {
		seen := map[string]string{}
		for _, v := range values {
			got, err := key(callCtx(nil, "x-api-key", v), checkMethod)
			if err != nil {
				t.Fatalf("key of %q: %v", v, err)
			}
			if prev, ok := seen[got]; ok {
				t.Errorf("%q and %q share the key %q", prev, v, got)
			}
			seen[got] = v
		}
	}
	if got, _ := RawMetadata("x-api-key")(callCtx(nil, "x-api-key", " k "), checkMethod); got != " k " {
		t.Errorf("RawMetadata of %q = %q, want the value as it is", " k ", got)
	}
}

// Over a real connection: values that differ in a byte keep their own
// buckets (grpc-go's client sends printable ASCII only, spaces included).
func TestMetadataBucketsOverTheWire(t *testing.T) {
	clock := testkit.NewClock(testkit.Start)
	lim := newLimiter(t, stores(t)[0].new(t, clock), clock, "api", ratelimit.PerMinute(1))
	client := serve(t, newInterceptor(t, lim, WithKey(Metadata("x-api-key"))))
	for _, v := range []string{"bob", "bob ", " bob", "bob  ", "Bob"} {
		if _, _, err := check(client, context.Background(), "x-api-key", v); err != nil {
			t.Errorf("first call with %q: %v, want its own bucket", v, err)
		}
	}
	_, _, err := check(client, context.Background(), "x-api-key", "bob")
	wantStatus(t, "bob again", err, codes.ResourceExhausted, -1)
}

// Three addresses of one IPv6 /64 share one bucket; another /64 has its
// own.
func TestIPv6PeersShareTheirSlash64(t *testing.T) {
	clock := testkit.NewClock(testkit.Start)
	lim := newLimiter(t, stores(t)[0].new(t, clock), clock, "api", ratelimit.PerMinute(1))
	in := newInterceptor(t, lim)
	for i, tt := range []struct {
		addr string
		code codes.Code
	}{
		{"[2001:db8:1:2::1]:5555", codes.OK},
		{"[2001:db8:1:2::2]:5555", codes.ResourceExhausted},
		{"[2001:db8:1:2:ffff:ffff:ffff:ffff]:5555", codes.ResourceExhausted},
		{"[2001:db8:1:3::1]:5555", codes.OK},
	} {
		_, err := in.check(callCtx(tcp(tt.addr)), checkMethod, nil)
		if status.Code(err) != tt.code {
			t.Errorf("call %d from %s: %v, want %v", i, tt.addr, err, tt.code)
		}
	}
	if _, err := (TrustedProxies{IPv6Bits: 129}).PeerIP(callCtx(tcp("[2001:db8::1]:1")), checkMethod); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Errorf("IPv6Bits 129: %v, want ErrInvalidArgument", err)
	}
}

func TestSpoofedForwardedForThroughTheServer(t *testing.T) {
	clock := testkit.NewClock(testkit.Start)
	lim := newLimiter(t, stores(t)[0].new(t, clock), clock, "api", ratelimit.PerMinute(1))
	ctx := context.Background()
	t.Run("an untrusted client cannot choose its key", func(t *testing.T) {
		p := TrustedProxies{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
		client := serve(t, newInterceptor(t, lim, WithKey(p.PeerIP)))
		if _, _, err := check(client, ctx); err != nil {
			t.Fatalf("first call: %v", err)
		}
		for _, spoof := range []string{"198.51.100.1", "198.51.100.2, 10.0.0.1"} {
			_, _, err := check(client, ctx, "x-forwarded-for", spoof)
			wantStatus(t, "x-forwarded-for "+spoof, err, codes.ResourceExhausted, -1)
		}
	})
	t.Run("behind a trusted proxy each client has its key", func(t *testing.T) {
		p := TrustedProxies{Prefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
		client := serve(t, newInterceptor(t, lim, WithKey(p.PeerIP)))
		for _, c := range []string{"198.51.100.1", "198.51.100.2"} {
			if _, _, err := check(client, ctx, "x-forwarded-for", c); err != nil {
				t.Fatalf("client %s: %v", c, err)
			}
		}
		_, _, err := check(client, ctx, "x-forwarded-for", "198.51.100.1")
		wantStatus(t, "client 198.51.100.1 again", err, codes.ResourceExhausted, -1)
	})
}
