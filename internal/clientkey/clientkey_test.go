package clientkey

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
)

func TestCredential(t *testing.T) {
	// The SHA-256 of "k1", its first 16 bytes in unpadded base64url (as
	// openssl dgst -sha256 -binary | head -c16 | base64 gives them).
	if got, want := Credential("k1"), "sha256:arnx6499M4j0-dWG9m6Z_Q"; got != want {
		t.Errorf("Credential(k1) = %q, want %q", got, want)
	}
	if got := Credential(strings.Repeat("x", 1<<20)); len(got) != 29 {
		t.Errorf("a 1 MiB value's key has %d bytes, want 29", len(got))
	}
	if Credential("bob") == Credential("bob\u00a0") || Credential("k\x00") == Credential("k\x00 ") {
		t.Error("two values that differ in a byte share a key")
	}
}

func TestCheckLen(t *testing.T) {
	if err := CheckLen("the key", strings.Repeat("k", MaxBytes)); err != nil {
		t.Errorf("a key of MaxBytes: %v", err)
	}
	err := CheckLen("the key", strings.Repeat("k", MaxBytes+1))
	if !errors.Is(err, ErrKeyTooLong) || !strings.Contains(err.Error(), "the key is longer than 1024 bytes") {
		t.Errorf("a key over MaxBytes: %v", err)
	}
}

func TestJoin(t *testing.T) {
	parts := func(p ...string) func(int) (string, error) {
		return func(i int) (string, error) { return p[i], nil }
	}
	if got, _ := Join(2, parts("GET /x", "k1")); got != "6:GET /x|2:k1" {
		t.Errorf("Join = %q", got)
	}
	a, _ := Join(2, parts("a|1:b", "c"))
	b, _ := Join(2, parts("a", "b|1:c"))
	if a == b {
		t.Errorf("two combinations share %q", a)
	}
	if _, err := Join(2, parts("a", "")); !errors.Is(err, ErrNoKey) {
		t.Errorf("an empty part: %v", err)
	}
	boom := errors.New("boom")
	if _, err := Join(1, func(int) (string, error) { return "", boom }); !errors.Is(err, boom) {
		t.Errorf("a failing part: %v", err)
	}
}

func TestProxies(t *testing.T) {
	pfx, err := ParsePrefixes("10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	peer := netip.MustParseAddr("10.0.0.2")
	tests := []struct {
		p      Proxies
		peer   netip.Addr
		values []string
		chain  string
		key    string
	}{
		{Proxies{}, peer, []string{"1.2.3.4"}, "[10.0.0.2]", "10.0.0.2"},
		{Proxies{Prefixes: pfx}, peer, []string{"1.2.3.4, 198.51.100.9", "10.0.0.7"}, "[198.51.100.9 10.0.0.7 10.0.0.2]", "198.51.100.9"},
		{Proxies{Prefixes: pfx, Forwarded: true}, peer, []string{`for=1.2.3.4, for="[2001:db8:1:2::7]:80"`}, "[2001:db8:1:2::7 10.0.0.2]", "2001:db8:1:2::/64"},
		{Proxies{Prefixes: pfx, IPv6Bits: 128}, peer, []string{"[2001:db8::7]"}, "[2001:db8::7 10.0.0.2]", "2001:db8::7"},
		{Proxies{Prefixes: pfx}, peer, []string{"198.51.100.9, junk"}, "[10.0.0.2]", "10.0.0.2"},
	}
	for i, tt := range tests {
		if got := fmt.Sprint(tt.p.Chain(tt.peer, tt.values)); got != tt.chain {
			t.Errorf("%d: Chain = %s, want %s", i, got, tt.chain)
		}
		if got, err := tt.p.Client(tt.peer, tt.values); got != tt.key || err != nil {
			t.Errorf("%d: Client = %q, %v; want %q", i, got, err, tt.key)
		}
	}
	if _, err := (Proxies{IPv6Bits: -1}).KeyOf(netip.MustParseAddr("::1")); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Errorf("IPv6Bits -1: %v", err)
	}
}

func TestOptions(t *testing.T) {
	o := NewOptions("pkg")
	o.PolicyName("api")
	o.NotNil(true, "clock")
	if o.Timeout(0) != 0 || o.Err() != nil {
		t.Fatalf("valid options: %v", o.Err())
	}
	o.Timeout(-time.Second)
	o.PolicyName("")
	err := o.Err()
	if !errors.Is(err, ratelimit.ErrInvalidArgument) || !strings.Contains(err.Error(), "pkg: timeout must not be negative") {
		t.Fatalf("the first invalid option: %v", err)
	}
	for _, name := range []string{"", strings.Repeat("a", 65), "a\nb", "é"} {
		o := NewOptions("pkg")
		if o.PolicyName(name); o.Err() == nil {
			t.Errorf("policy name %q accepted", name)
		}
	}
}

func TestWithTimeoutAndClassify(t *testing.T) {
	ctx, cancel := WithTimeout(context.Background(), 0)
	cancel()
	if _, ok := ctx.Deadline(); ok || ctx.Err() != nil {
		t.Error("WithTimeout(0) set a bound")
	}
	ctx, cancel = WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if _, ok := ctx.Deadline(); !ok {
		t.Error("WithTimeout(1h) set no bound")
	}
	gone, stop := context.WithCancel(context.Background())
	stop()
	for _, tt := range []struct {
		ctx  context.Context
		err  error
		want Failure
		msg  string
	}{
		{context.Background(), fmt.Errorf("%w: cost must be at least 1", ratelimit.ErrInvalidArgument), Invalid, "cost must be at least 1"},
		{gone, context.Canceled, Gone, ""},
		{context.Background(), errors.New("connection refused"), Outage, ""},
	} {
		if f, msg := Classify(tt.ctx, tt.err); f != tt.want || msg != tt.msg {
			t.Errorf("Classify(%v) = %v, %q; want %v, %q", tt.err, f, msg, tt.want, tt.msg)
		}
	}
}
