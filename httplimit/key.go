package httplimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ClientIP keys a request by the IP address of the connection's peer
// (r.RemoteAddr), and believes no header: behind a reverse proxy every
// request would share the proxy's key, so list the proxies in a
// TrustedProxies and key with its ClientIP method instead. IPv4-mapped IPv6
// addresses are keyed as IPv4, and a zone is dropped.
func ClientIP(r *http.Request) (string, error) {
	a, err := peerAddr(r)
	if err != nil {
		return "", err
	}
	return a.String(), nil
}

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
	// IPv6Bits, when between 1 and 127, keys IPv6 clients by their prefix of
	// that length (for example 64, since a client usually holds a whole
	// /64) rather than by the full address. 0 keys by the full address.
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
func (p TrustedProxies) ClientIP(r *http.Request) (string, error) {
	chain, err := p.Chain(r)
	if err != nil {
		return "", err
	}
	return p.KeyOf(chain[0]), nil
}

// KeyOf returns the key ClientIP gives the client address a: a itself, or
// for IPv6 its prefix of p.IPv6Bits when that is set.
func (p TrustedProxies) KeyOf(a netip.Addr) string {
	if a.Is6() && p.IPv6Bits > 0 && p.IPv6Bits < 128 {
		pfx, _ := a.Prefix(p.IPv6Bits)
		return pfx.String()
	}
	return a.String()
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
	name := p.Header
	if name == "" {
		name = "X-Forwarded-For"
	}
	return p.ChainFrom(a, r.Header.Values(name)), nil
}

// ChainFrom is Chain for a connection's peer address and the values of
// p.Header read from wherever the proxies put them (gRPC metadata, say): the
// values are read as a Forwarded header (RFC 7239, its for= parameters) when
// p.Header is "Forwarded" in any case, else as comma-separated addresses, as
// X-Forwarded-For. The values are read only when peer is trusted.
func (p TrustedProxies) ChainFrom(peer netip.Addr, values []string) []netip.Addr {
	chain := []netip.Addr{peer}
	if p.trusted(peer) {
		var hops []string
		if strings.EqualFold(p.Header, "Forwarded") {
			hops = forwardedFor(values)
		} else {
			hops = commaList(values)
		}
		for i := len(hops) - 1; i >= 0; i-- {
			h, ok := parseHop(hops[i])
			if !ok {
				break
			}
			chain = append(chain, h)
			if !p.trusted(h) {
				break
			}
		}
	}
	slices.Reverse(chain)
	return chain
}

func (p TrustedProxies) trusted(a netip.Addr) bool {
	for _, pfx := range p.Prefixes {
		if pfx.Contains(a) {
			return true
		}
	}
	return false
}

// ParsePrefixes parses addresses ("10.0.0.7", "::1") and CIDR prefixes
// ("10.0.0.0/8", "fd00::/8") for TrustedProxies.Prefixes. Each string may
// itself hold several, separated by commas.
func ParsePrefixes(list ...string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range commaList(list) {
		if strings.Contains(s, "/") {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, fmt.Errorf("trusted proxy %q: not an address or CIDR prefix", s)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: not an address or CIDR prefix", s)
		}
		a = a.Unmap().WithZone("")
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// Header returns a KeyFunc that keys a request by the value of header name,
// for example an API key, byte for byte. A request without the header, or
// with an empty one, has no key; a value longer than MaxKeyBytes is refused
// with ErrKeyTooLong (431), so that a client cannot make the store keep
// keys of any size.
func Header(name string) KeyFunc {
	canon := http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := strings.TrimSpace(r.Header.Get(canon))
		if v == "" {
			return "", fmt.Errorf("%w: missing %s header", ErrNoKey, canon)
		}
		if len(v) > MaxKeyBytes {
			return "", fmt.Errorf("%w: %s header is longer than %d bytes", ErrKeyTooLong, canon, MaxKeyBytes)
		}
		return v, nil
	}
}

// Route keys a request by the pattern http.ServeMux routed it by
// (r.Pattern, such as "GET /items/{id}"), so that all requests to one route
// share a key whatever their path values. The pattern is set only inside the
// mux: wrap the handler registered on it, not the mux itself. A request with
// no pattern has no key.
func Route(r *http.Request) (string, error) {
	if r.Pattern == "" {
		return "", fmt.Errorf("%w: request has no route pattern (wrap the handler registered on http.ServeMux, not the mux)", ErrNoKey)
	}
	return r.Pattern, nil
}

// Join returns a KeyFunc that keys a request by all of keys together: the
// request has a key only when each of them gives one. Each part is framed by
// its length, so no two different combinations give the same key.
func Join(keys ...KeyFunc) KeyFunc {
	keys = append([]KeyFunc(nil), keys...)
	return func(r *http.Request) (string, error) {
		var b strings.Builder
		for i, k := range keys {
			if k == nil {
				return "", errors.New("httplimit: nil key function in Join")
			}
			v, err := k(r)
			if err == nil && v == "" {
				err = ErrNoKey
			}
			if err != nil {
				return "", err
			}
			if i > 0 {
				b.WriteByte('|')
			}
			b.WriteString(strconv.Itoa(len(v)))
			b.WriteByte(':')
			b.WriteString(v)
		}
		return b.String(), nil
	}
}

// PerRoute returns a KeyFunc that keys a request by its route (see Route)
// and by key, so that each client has a bucket per route.
func PerRoute(key KeyFunc) KeyFunc { return Join(Route, key) }

// peerAddr returns the address of the connection's peer.
func peerAddr(r *http.Request) (netip.Addr, error) {
	host := r.RemoteAddr
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: peer address %q is not an IP address", ErrNoKey, r.RemoteAddr)
	}
	return a.Unmap().WithZone(""), nil
}

// parseHop parses one forwarded address: an IP, possibly with a port, and
// possibly in brackets.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a.Unmap().WithZone(""), true
		}
	}
	return netip.Addr{}, false
}

// commaList splits each value on commas and returns the trimmed, non-empty
// parts in order.
func commaList(values []string) []string {
	var out []string
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	}
	return out
}

// forwardedFor returns the for= value of each element of RFC 7239 Forwarded
// header values, in order, unquoted. An element without for= gives "".
func forwardedFor(values []string) []string {
	var out []string
	for _, v := range values {
		for _, elem := range splitQuoted(v, ',') {
			if strings.TrimSpace(elem) == "" {
				continue
			}
			val := ""
			for _, pair := range splitQuoted(elem, ';') {
				k, x, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(strings.TrimSpace(k), "for") {
					val = unquote(strings.TrimSpace(x))
					break
				}
			}
			out = append(out, val)
		}
	}
	return out
}

// splitQuoted splits s on sep outside double-quoted strings.
func splitQuoted(s string, sep byte) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// unquote removes the quotes and backslash escapes of a quoted-string; an
// unquoted token is returned as it is.
func unquote(s string) string {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s
	}
	var b strings.Builder
	for i := 1; i < len(s)-1; i++ {
		if s[i] == '\\' && i+1 < len(s)-1 {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
