package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/exactlimit/ratelimit/internal/clientkey"
)

// ClientIP keys a request by the IP address of the connection's peer
// (r.RemoteAddr), and believes no header: behind a reverse proxy every
// request would share the proxy's key, so list the proxies in a
// TrustedProxies and key with its ClientIP method instead. An IPv4 client
// is keyed by its address, an IPv6 one by its /64 ("2001:db8:1:2::/64"),
// since a client usually holds a whole /64; TrustedProxies.IPv6Bits sets
// another prefix. IPv4-mapped IPv6 addresses are keyed as IPv4, and a zone
// is dropped. The address is kept readable: it is not hashed.
func ClientIP(r *http.Request) (string, error) { return TrustedProxies{}.ClientIP(r) }

// TrustedProxies describes the reverse proxies in front of a server, so that
// the client's address can be read from the header they write.
type TrustedProxies struct {
	// Prefixes lists the proxies' addresses; a single address is a /32 or
	// /128 prefix. ParsePrefixes reads them from strings.
	Prefixes []netip.Prefix
	// Header names the header the proxies append the client's address to:
	// "X-Forwarded-For" (the default when empty) or "Forwarded" (RFC 7239,
	// its for= parameters). Only this header is read: a proxy that writes
	// one usually passes the other through from the client unchanged.
	Header string
	// IPv6Bits is the prefix length IPv6 clients are keyed by: 0 for the
	// default, 64; 128 keys by the whole address. A value outside 0 to 128
	// makes ClientIP fail with an error wrapping ratelimit.ErrInvalidArgument.
	IPv6Bits int
}

// ClientIP keys a request by the client's IP address. When the peer is not
// one of p's proxies, that is the peer's address and no header is read, so a
// client that sends X-Forwarded-For itself keys nothing but its own address.
// When the peer is a trusted proxy, p.Header is read from the right: each
// address the trusted proxies appended is skipped, and the first one not in
// p.Prefixes is the client. If every address is trusted, the leftmost is
// used; if an entry is not an IP address (Forwarded allows "unknown" and
// obfuscated names), the trusted proxy that reported it is keyed instead.
// IPv6 clients are keyed by their prefix of p.IPv6Bits.
func (p TrustedProxies) ClientIP(r *http.Request) (string, error) {
	a, err := peerAddr(r)
	if err != nil {
		return "", err
	}
	return p.proxies().Client(a, r.Header.Values(p.header()))
}

// Chain returns the addresses p vouches for on the request's way, from the
// client to the connection's peer: the peer alone when it is not one of p's
// proxies, else the addresses the trusted proxies appended to p.Header, from
// the right, up to and including the first that is not trusted (the
// client), followed by the peer. Whatever a client wrote further left is not
// in it. ClientIP keys by its first address; a proxy forwarding the request
// should send the chain on, not the header it received.
func (p TrustedProxies) Chain(r *http.Request) ([]netip.Addr, error) {
	a, err := peerAddr(r)
	if err != nil {
		return nil, err
	}
	return p.proxies().Chain(a, r.Header.Values(p.header())), nil
}

func (p TrustedProxies) header() string {
	if p.Header == "" {
		return "X-Forwarded-For"
	}
	return p.Header
}

func (p TrustedProxies) proxies() clientkey.Proxies {
	return clientkey.Proxies{Prefixes: p.Prefixes, Forwarded: strings.EqualFold(p.Header, "Forwarded"), IPv6Bits: p.IPv6Bits}
}

// ParsePrefixes parses addresses ("10.0.0.7", "::1") and CIDR prefixes
// ("10.0.0.0/8", "fd00::/8") for TrustedProxies.Prefixes. Each string may
// itself hold several, separated by commas.
func ParsePrefixes(list ...string) ([]netip.Prefix, error) { return clientkey.ParsePrefixes(list...) }

// Header returns a KeyFunc that keys a request by the value of header name,
// for example an API key, without storing the value itself: the key is
// "sha256:" and the unpadded base64url encoding of the first 128 bits of the
// value's SHA-256, so that whoever reads the store does not read the
// clients' credentials. The value is taken byte for byte, but for the
// leading and trailing spaces and tabs HTTP does not count as part of it. A
// request without the header, or with an empty one, has no key; a value
// longer than MaxKeyBytes is refused with ErrKeyTooLong (431) before it is
// hashed. RawHeader keys by the value itself.
func Header(name string) KeyFunc {
	raw := RawHeader(name)
	return func(r *http.Request) (string, error) {
		v, err := raw(r)
		if err != nil {
			return "", err
		}
		return clientkey.Credential(v), nil
	}
}

// RawHeader is Header keeping the value as the key, readable in the store
// (a tenant or a region, say, rather than a credential).
func RawHeader(name string) KeyFunc {
	canon := http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := strings.Trim(r.Header.Get(canon), " \t")
		if v == "" {
			return "", fmt.Errorf("%w: missing %s header", ErrNoKey, canon)
		}
		if err := clientkey.CheckLen("the "+canon+" header", v); err != nil {
			return "", err
		}
		return v, nil
	}
}

// Route keys a request by the pattern http.ServeMux routes it by
// (r.Pattern, such as "GET /items/{id}"), so that all requests to one route
// share a key whatever their path values. Inside the mux (the middleware
// wraps a handler registered on it) the mux has set the pattern; around it
// (the middleware wraps the mux, or is told it with WithServeMux) the
// middleware asks the mux for it. A request the mux has no pattern for (one
// it answers 404 or 405) has no key.
func Route(r *http.Request) (string, error) {
	if r.Pattern == "" {
		return "", fmt.Errorf("%w: request matches no route pattern", ErrNoKey)
	}
	return r.Pattern, nil
}

// Join returns a KeyFunc that keys a request by all of keys together: the
// request has a key only when each of them gives one. Each part is framed by
// its length, so no two different combinations give the same key.
func Join(keys ...KeyFunc) KeyFunc {
	keys = append([]KeyFunc(nil), keys...)
	return func(r *http.Request) (string, error) {
		return clientkey.Join(len(keys), func(i int) (string, error) {
			if keys[i] == nil {
				return "", errors.New("httplimit: nil key function in Join")
			}
			return keys[i](r)
		})
	}
}

// PerRoute returns a KeyFunc that keys a request by its route (see Route)
// and by key, so that each client has a bucket per route.
func PerRoute(key KeyFunc) KeyFunc { return Join(Route, key) }

// peerAddr returns the address of the connection's peer.
func peerAddr(r *http.Request) (netip.Addr, error) {
	a, ok := clientkey.ParseAddr(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("%w: peer address %q is not an IP address", ErrNoKey, r.RemoteAddr)
	}
	return a, nil
}
