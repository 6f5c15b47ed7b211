package httplimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/clientkey"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
)

// prefixes returns the prefixes of CIDR strings.
func prefixes(s ...string) (out []netip.Prefix) {
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

func TestClientIP(t *testing.T) {
	proxies := prefixes("10.0.0.0/8", "2001:db8:ffff::1/128")
	xff := TrustedProxies{Prefixes: proxies}
	fwd := TrustedProxies{Prefixes: proxies, Header: "Forwarded"}
	xff128 := TrustedProxies{Prefixes: proxies, IPv6Bits: 128}
	fwd128 := TrustedProxies{Prefixes: proxies, Header: "Forwarded", IPv6Bits: 128}
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
		{"X-Forwarded-For entries may carry ports and brackets", xff128.ClientIP, "10.0.0.2:80",
			[]string{"X-Forwarded-For", "[2001:db8::5]:443"}, "2001:db8::5"},
		{"an IPv6 client behind a proxy is keyed by its /64", xff.ClientIP, "10.0.0.2:80",
			[]string{"X-Forwarded-For", "[2001:db8::5]:443"}, "2001:db8::/64"},
		{"an IPv6 trusted proxy", xff.ClientIP, "[2001:db8:ffff::1]:80",
			[]string{"X-Forwarded-For", "198.51.100.9:1234"}, "198.51.100.9"},
		{"IPv4-mapped addresses key as IPv4", ClientIP, "[::ffff:192.0.2.1]:80", nil, "192.0.2.1"},
		{"the Forwarded header is read when configured", fwd128.ClientIP, "10.0.0.2:80",
			[]string{"Forwarded", `for=1.2.3.4, for="[2001:db8::7]:4711";proto=https, for=10.0.0.3;by=10.0.0.2`}, "2001:db8::7"},
		{"a Forwarded IPv6 client is keyed by its /64", fwd.ClientIP, "10.0.0.2:80",
			[]string{"Forwarded", `for="[2001:db8::7]:4711"`}, "2001:db8::/64"},
		{"X-Forwarded-For is ignored when Forwarded is configured", fwd.ClientIP, "10.0.0.2:80",
			[]string{"X-Forwarded-For", "198.51.100.9"}, "10.0.0.2"},
		{"Forwarded is ignored when X-Forwarded-For is configured", xff.ClientIP, "10.0.0.2:80",
			[]string{"Forwarded", "for=198.51.100.9"}, "10.0.0.2"},
		{"Forwarded for=unknown keys the proxy that wrote it", fwd.ClientIP, "10.0.0.2:80",
			[]string{"Forwarded", "for=1.2.3.4, for=unknown"}, "10.0.0.2"},
		{"quoted commas in Forwarded do not split elements", fwd.ClientIP, "10.0.0.2:80",
			[]string{"Forwarded", `for=198.51.100.9;host="a,b"`}, "198.51.100.9"},
		{"IPv6 clients are keyed by their /64 by default", ClientIP, "[2001:db8:1:2:3:4:5:6]:80",
			nil, "2001:db8:1:2::/64"},
		{"IPv6Bits sets another prefix", TrustedProxies{IPv6Bits: 48}.ClientIP, "[2001:db8:1:2:3:4:5:6]:80",
			nil, "2001:db8:1::/48"},
		{"IPv6Bits 128 keys by the whole address", TrustedProxies{IPv6Bits: 128}.ClientIP, "[2001:db8:1:2:3:4:5:6]:80",
			nil, "2001:db8:1:2:3:4:5:6"},
		{"a zone is dropped", ClientIP, "[fe80::1%eth0]:80", nil, "fe80::/64"},
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
	c := testkit.NewClock(t0)
	lim := newLimiter(t, c, ratelimit.PerMinute(1))
	p := TrustedProxies{Prefixes: prefixes("10.0.0.0/8")}
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
	// The SHA-256 of "k1", its first 16 bytes in unpadded base64url (as
	// openssl dgst -sha256 -binary | head -c16 | base64 gives them).
	if want := "15:GET /items/{id}|29:sha256:arnx6499M4j0-dWG9m6Z_Q"; got != want || gotErr != nil {
		t.Errorf("PerRoute(Header) = %q, %v; want %q", got, gotErr, want)
	}

	r = httptest.NewRequest("GET", "/items/7", nil)
	if _, err := Route(r); !errors.Is(err, ErrNoKey) || !strings.Contains(err.Error(), "matches no route pattern") {
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

func TestIPv6ClientsShareTheirSlash64(t *testing.T) {
	c := testkit.NewClock(t0)
	h := newMiddleware(t, newLimiter(t, c, ratelimit.PerMinute(1)), c)
	if w := get(h, "[2001:db8:1:2::1]:1"); w.Code != 200 {
		t.Fatalf("first address of the /64: %d", w.Code)
	}
	for _, a := range []string{"[2001:db8:1:2::2]:1", "[2001:db8:1:2:ffff:ffff:ffff:ffff]:1"} {
		if w := get(h, a); w.Code != 429 {
			t.Errorf("%s, of the same /64: %d, want 429 (one bucket)", a, w.Code)
		}
	}
	if w := get(h, "[2001:db8:1:3::1]:1"); w.Code != 200 {
		t.Errorf("another /64: %d, want 200", w.Code)
	}
}

func TestBadIPv6BitsIsAnError(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "[2001:db8::1]:1"
	for _, bits := range []int{-1, 129} {
		if k, err := (TrustedProxies{IPv6Bits: bits}).ClientIP(r); !errors.Is(err, ratelimit.ErrInvalidArgument) {
			t.Errorf("IPv6Bits %d: %q, %v; want ErrInvalidArgument", bits, k, err)
		}
	}
}

func TestHeaderValuesAreTheirExactBytes(t *testing.T) {
	key := func(k KeyFunc, v string) string {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-API-Key", v)
		s, err := k(r)
		if err != nil {
			t.Fatalf("key of %q: %v", v, err)
		}
		return s
	}
	for _, k := range []KeyFunc{Header("X-API-Key"), RawHeader("X-API-Key")} {
		seen := map[string]string{}
		for _, v := range []string{"bob", "bob\u00a0", "\u00a0bob", "bob\x00", "Bob"} {
			s := key(k, v)
			if prev, ok := seen[s]; ok {
				t.Errorf("%q and %q share the key %q", prev, v, s)
			}
			seen[s] = v
		}
		// Spaces and tabs around a field value are not part of it in HTTP.
		if key(k, " bob\t") != key(k, "bob") {
			t.Errorf("optional whitespace changed the key")
		}
	}
	if got := key(RawHeader("X-API-Key"), "tenant-7"); got != "tenant-7" {
		t.Errorf("RawHeader = %q, want the value", got)
	}
}

// The store never holds a credential: the key the store is asked about,
// and the key Redis holds, for X-API-Key k1 do not contain k1.
func TestHeaderKeysAreNotStoredAsThemselves(t *testing.T) {
	c := testkit.NewClock(t0)
	srv := redistest.StartServer(t)
	client := redistest.Client(t, srv.Addr())
	for _, tt := range []struct {
		name  string
		store ratelimit.Store
		keys  func() []string
	}{
		{"memstore", nil, nil},
		{"redis", redisstore.New(client), func() []string { return client.Keys(context.Background(), "*").Val() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := &countingStore{st: memstore.New(memstore.WithClock(c.Now)), keys: map[string]bool{}}
			store := ratelimit.Store(st)
			if tt.store != nil {
				store = tt.store
			}
			lim, err := ratelimit.New[string](store, ratelimit.PerSecond(10), ratelimit.WithNamespace("app-a"), ratelimit.WithClock(c.Now))
			if err != nil {
				t.Fatal(err)
			}
			url := testkit.Serve(t, newMiddleware(t, lim, c, WithKey(Header("X-API-Key"))))
			if res, body := send(t, "GET", url, "X-API-Key", "k1"); res.StatusCode != 200 {
				t.Fatalf("%d %q", res.StatusCode, body)
			}
			var keys []string
			for k := range st.keys {
				keys = append(keys, k)
			}
			if tt.keys != nil {
				keys = tt.keys()
			}
			if len(keys) != 1 {
				t.Fatalf("the store holds keys %q, want one", keys)
			}
			if k := keys[0]; strings.Contains(k, "k1") || !strings.Contains(k, "app-a") || !strings.Contains(k, "sha256:") {
				t.Errorf("the store key %q holds the credential, or no hash of it", k)
			}
		})
	}
}

// Route finds the pattern whether the middleware is inside the mux (around
// a handler registered on it), around the mux, or around a handler in
// front of the mux it is told of.
func TestRouteInsideAndAroundTheMux(t *testing.T) {
	c := testkit.NewClock(t0)
	build := map[string]func(m *Middleware, lim Limiter) http.Handler{
		"inside the mux": func(m *Middleware, _ Limiter) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /items/{id}", m.Handler(okHandler()))
			mux.Handle("GET /users/{id}", m.Handler(okHandler()))
			return mux
		},
		"around the mux": func(m *Middleware, _ Limiter) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /items/{id}", okHandler())
			mux.Handle("GET /users/{id}", okHandler())
			return m.Handler(mux)
		},
		"around a handler in front of the mux, with WithServeMux": func(_ *Middleware, lim Limiter) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /items/{id}", okHandler())
			mux.Handle("GET /users/{id}", okHandler())
			m, err := New(lim, WithClock(c.Now), WithKey(PerRoute(ClientIP)), WithServeMux(mux))
			if err != nil {
				t.Fatal(err)
			}
			logged := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { mux.ServeHTTP(w, r) })
			return m.Handler(logged)
		},
	}
	for name, b := range build {
		t.Run(name, func(t *testing.T) {
			lim := newLimiter(t, c, ratelimit.PerMinute(1))
			m, err := New(lim, WithClock(c.Now), WithKey(PerRoute(ClientIP)))
			if err != nil {
				t.Fatal(err)
			}
			url := testkit.Serve(t, b(m, lim))
			for _, tt := range []struct {
				path string
				code int
			}{
				{"/items/1", 200},
				{"/items/2", 429}, // the same route, whatever the path value
				{"/users/1", 200}, // another route, another bucket
				{"/users/2", 429},
			} {
				if res, body := send(t, "GET", url+tt.path); res.StatusCode != tt.code {
					t.Errorf("GET %s: %d %q, want %d", tt.path, res.StatusCode, body, tt.code)
				}
			}
		})
	}
	t.Run("a request the mux has no pattern for has no route key", func(t *testing.T) {
		mux := http.NewServeMux()
		mux.Handle("GET /items/{id}", okHandler())
		lim := newLimiter(t, c, ratelimit.PerMinute(1))
		for _, tt := range []struct {
			opts []Option
			code int
		}{{nil, 400}, {[]Option{PassMissingKey()}, 404}} {
			m, err := New(lim, append([]Option{WithKey(PerRoute(ClientIP))}, tt.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("GET", "/nowhere", nil)
			w := httptest.NewRecorder()
			m.Handler(mux).ServeHTTP(w, r)
			if w.Code != tt.code {
				t.Errorf("GET /nowhere: %d %q, want %d", w.Code, w.Body.String(), tt.code)
			}
		}
	})
}

func TestMaxKeyBytesIsTheSharedBound(t *testing.T) {
	if MaxKeyBytes != clientkey.MaxBytes {
		t.Fatalf("MaxKeyBytes %d, the bound the key functions check %d", MaxKeyBytes, clientkey.MaxBytes)
	}
}
