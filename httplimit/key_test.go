package httplimit

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit"
)

func mustPrefixes(t *testing.T, s ...string) []netip.Prefix {
	t.Helper()
	p, err := ParsePrefixes(s...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestClientIP(t *testing.T) {
	proxies := mustPrefixes(t, "10.0.0.0/8", "2001:db8:ffff::1")
	xff := TrustedProxies{Prefixes: proxies}
	fwd := TrustedProxies{Prefixes: proxies, Header: "Forwarded"}
	none := TrustedProxies{}
	tests := []struct {
		name   string
		key    KeyFunc
		remote string
		hdr    []string
		want   string
	}{
		{"the peer address is the key", ClientIP, "192.0.2.1:5555", nil, "192.0.2.1"},
		{"a spoofed X-Forwarded-For does not change ClientIP's key", ClientIP, "192.0.2.1:5555",
			[]string{"X-Forwarded-For", "198.51.100.9"}, "192.0.2.1"},
		{"a spoofed Forwarded does not change ClientIP's key", ClientIP, "192.0.2.1:5555",
			[]string{"Forwarded", "for=198.51.100.9"}, "192.0.2.1"},
		{"no trusted proxies: headers are ignored", none.ClientIP, "10.1.1.1:80",
			[]string{"X-Forwarded-For", "198.51.100.9"}, "10.1.1.1"},
		{"an untrusted peer's X-Forwarded-For is ignored", xff.ClientIP, "192.0.2.1:5555",
			[]string{"X-Forwarded-For", "198.51.100.9, 10.0.0.1"}, "192.0.2.1"},
		{"a trusted proxy's X-Forwarded-For gives the client", xff.ClientIP, "10.0.0.2:80",
			[]string{"X-Forwarded-For", "198.51.100.9"}, "198.51.100.9"},
		{"a client's spoofed entry left of the real one is skipped", xff.ClientIP, "10.0.0.2:80",
			[]string{"X-Forwarded-For", "1.2.3.4, 198.51.100.9"}, "198.51.100.9"},
		{"trusted hops are skipped from the right", xff.ClientIP, "10.0.0.2:80",
			[]string{"X-Forwarded-For", "1.2.3.4, 198.51.100.9, 10.0.0.7", "X-Forwarded-For", "10.9.9.9"}, "198.51.100.9"},
		{"when every hop is trusted the leftmost is the client", xff.ClientIP, "10.0.0.2:80",
			[]string{"X-Forwarded-For", "10.0.0.5, 10.0.0.6"}, "10.0.0.5"},
		{"a trusted proxy without the header keys itself", xff.ClientIP, "10.0.0.2:80", nil, "10.0.0.2"},
		{"garbage reported by a trusted proxy keys that proxy", xff.ClientIP, "10.0.0.2:80",
			[]string{"X-Forwarded-For", "198.51.100.9, not-an-ip"}, "10.0.0.2"},
		{"X-Forwarded-For entries may carry ports and brackets", xff.ClientIP, "10.0.0.2:80",
			[]string{"X-Forwarded-For", "[2001:db8::5]:443"}, "2001:db8::5"},
		{"an IPv6 trusted proxy", xff.ClientIP, "[2001:db8:ffff::1]:80",
			[]string{"X-Forwarded-For", "198.51.100.9:1234"}, "198.51.100.9"},
		{"IPv4-mapped addresses key as IPv4", ClientIP, "[::ffff:192.0.2.1]:80", nil, "192.0.2.1"},
		{"the Forwarded header is read when configured", fwd.ClientIP, "10.0.0.2:80",
			[]string{"Forwarded", `for=1.2.3.4, for="[2001:db8::7]:4711";proto=https, for=10.0.0.3;by=10.0.0.2`}, "2001:db8::7"},
		{"X-Forwarded-For is ignored when Forwarded is configured", fwd.ClientIP, "10.0.0.2:80",
			[]string{"X-Forwarded-For", "198.51.100.9"}, "10.0.0.2"},
		{"Forwarded is ignored when X-Forwarded-For is configured", xff.ClientIP, "10.0.0.2:80",
			[]string{"Forwarded", "for=198.51.100.9"}, "10.0.0.2"},
		{"Forwarded for=unknown keys the proxy that wrote it", fwd.ClientIP, "10.0.0.2:80",
			[]string{"Forwarded", "for=1.2.3.4, for=unknown"}, "10.0.0.2"},
		{"quoted commas in Forwarded do not split elements", fwd.ClientIP, "10.0.0.2:80",
			[]string{"Forwarded", `for=198.51.100.9;host="a,b"`}, "198.51.100.9"},
		{"IPv6 clients can be keyed by their /64", TrustedProxies{IPv6Bits: 64}.ClientIP, "[2001:db8:1:2:3:4:5:6]:80",
			nil, "2001:db8:1:2::/64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.remote
			for i := 0; i+1 < len(tt.hdr); i += 2 {
				r.Header.Add(tt.hdr[i], tt.hdr[i+1])
			}
			got, err := tt.key(r)
			if err != nil || got != tt.want {
				t.Fatalf("key = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestSpoofedForwardedForThroughTheMiddleware(t *testing.T) {
	c := &clock{now: t0}
	lim := newLimiter(t, c, ratelimit.PerMinute(1))
	p := TrustedProxies{Prefixes: mustPrefixes(t, "10.0.0.0/8")}
	h := newMiddleware(t, lim, c, WithKey(p.ClientIP))
	if w := get(h, "192.0.2.1:1"); w.Code != 200 {
		t.Fatalf("first request: %d", w.Code)
	}
	for _, spoof := range []string{"198.51.100.1", "198.51.100.2, 10.0.0.1", "10.0.0.3"} {
		if w := get(h, "192.0.2.1:1", "X-Forwarded-For", spoof); w.Code != 429 {
			t.Errorf("X-Forwarded-For %q from an untrusted peer: status %d, want 429 (same key)", spoof, w.Code)
		}
	}
	if w := get(h, "10.0.0.1:1", "X-Forwarded-For", "198.51.100.1"); w.Code != 200 {
		t.Errorf("a client behind a trusted proxy: status %d, want 200 (its own key)", w.Code)
	}
}

func TestParsePrefixes(t *testing.T) {
	got, err := ParsePrefixes("10.0.0.9/8, 192.0.2.1", "::1", "::ffff:192.0.2.2")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "192.0.2.1/32", "::1/128", "192.0.2.2/32"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("prefix %d = %v, want %s", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "example.com", "1.2.3"} {
		if _, err := ParsePrefixes(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParsePrefixes(%q) error = %v, want one naming it", bad, err)
		}
	}
}

func TestHeaderRouteJoin(t *testing.T) {
	mux := http.NewServeMux()
	var got string
	var gotErr error
	key := PerRoute(Header("X-API-Key"))
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) { got, gotErr = key(r) })
	r := httptest.NewRequest("GET", "/items/7", nil)
	r.Header.Set("X-Api-Key", " k1 ")
	mux.ServeHTTP(httptest.NewRecorder(), r)
	if want := "15:GET /items/{id}|2:k1"; got != want || gotErr != nil {
		t.Errorf("PerRoute(Header) = %q, %v; want %q", got, gotErr, want)
	}

	r = httptest.NewRequest("GET", "/items/7", nil)
	if _, err := Route(r); !errors.Is(err, ErrNoKey) || !strings.Contains(err.Error(), "wrap the handler") {
		t.Errorf("Route outside a mux: %v", err)
	}
	if _, err := Header("X-API-Key")(r); !errors.Is(err, ErrNoKey) {
		t.Errorf("Header without the header: %v", err)
	}
	a := func(s string) KeyFunc { return func(*http.Request) (string, error) { return s, nil } }
	k1, _ := Join(a("a|1:b"), a("c"))(r)
	k2, _ := Join(a("a"), a("b|1:c"))(r)
	if k1 == k2 {
		t.Errorf("Join gave %q for two different combinations", k1)
	}
	if _, err := Join(a("a"), a(""))(r); !errors.Is(err, ErrNoKey) {
		t.Errorf("Join with an empty part: %v", err)
	}
	if _, err := Join(a("a"), nil)(r); err == nil {
		t.Errorf("Join with a nil part: no error")
	}
}
