// Package clientkey is what the httplimit and grpclimit middlewares share:
// how a client is keyed (its address, the proxies in front of the server, a
// credential, several keys joined) and the rules both apply to a key and to
// their options. It reads no clock and keeps no state.
package clientkey

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
)

// ErrNoKey is wrapped by the errors of the key functions of both
// middlewares when a request or call carries no key.
var ErrNoKey = errors.New("no rate-limit key")

// ErrKeyTooLong is wrapped by the error of a key longer than MaxBytes.
var ErrKeyTooLong = errors.New("rate-limit key too long")

// MaxBytes bounds a key, as the ratelimit service bounds a subject: both
// middlewares refuse a longer key rather than store it, and the credential
// keys refuse a longer value before hashing it.
const MaxBytes = 1024

// DefaultIPv6Bits is the prefix length IPv6 clients are keyed by unless
// another is set: a client usually holds a whole /64.
const DefaultIPv6Bits = 64

// HashPrefix starts every hashed credential.
const HashPrefix = "sha256:"

// Credential returns the key of a credential value: ratelimit.HashSubject,
// HashPrefix and the unpadded base64url encoding of the first 128 bits of its
// SHA-256, 29 bytes whatever the value's length. The value itself never
// reaches a store.
func Credential(v string) string { return ratelimit.HashSubject(v) }

// CheckLen returns an error wrapping ErrKeyTooLong when key (what names
// it) is longer than MaxBytes.
func CheckLen(what, key string) error {
	if len(key) > MaxBytes {
		return fmt.Errorf("%w: %s is longer than %d bytes", ErrKeyTooLong, what, MaxBytes)
	}
	return nil
}

// Join keys by n parts together, part(i) giving the i-th: each part is
// framed by its length, "<len>:<part>", and the frames are separated by
// '|', so no two different combinations give the same key. A part that
// fails, or is empty, fails the whole key.
func Join(n int, part func(i int) (string, error)) (string, error) {
	parts := make([]string, n)
	for i := range n {
		v, err := part(i)
		if err == nil && v == "" {
			err = ErrNoKey
		}
		if err != nil {
			return "", err
		}
		parts[i] = v
	}
	return keyfmt.Join(parts...), nil
}

// Proxies are the reverse proxies in front of a server, as the
// middlewares' TrustedProxies describe them.
type Proxies struct {
	Prefixes []netip.Prefix
	// Forwarded reads the values as RFC 7239 Forwarded headers (their for=
	// parameters), else as comma-separated addresses (X-Forwarded-For).
	Forwarded bool
	// IPv6Bits: 0 for DefaultIPv6Bits, else 1 to 128.
	IPv6Bits int
}

// Chain returns the addresses p vouches for on a request's way, from the
// client to the connection's peer: the peer alone when it is not one of p's
// proxies, else the addresses the trusted proxies appended to values, from
// the right, up to and including the first that is not trusted (the
// client), followed by the peer. An entry that is not an IP address ends the
// chain at the proxy that reported it.
func (p Proxies) Chain(peer netip.Addr, values []string) []netip.Addr {
	chain := []netip.Addr{peer}
	if p.trusted(peer) {
		var hops []string
		if p.Forwarded {
			hops = forwardedFor(values)
		} else {
			hops = CommaList(values)
		}
		for i := len(hops) - 1; i >= 0; i-- {
			h, ok := ParseAddr(hops[i])
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

// Client returns the key of the client of a request from peer with the
// forwarding header values: the first address of Chain, as KeyOf gives it.
func (p Proxies) Client(peer netip.Addr, values []string) (string, error) {
	return p.KeyOf(p.Chain(peer, values)[0])
}

// KeyOf returns the key of client address a: a itself for IPv4, and for
// IPv6 its prefix of p.IPv6Bits (DefaultIPv6Bits when 0), such as
// "2001:db8:1:2::/64"; 128 keys by the whole address. IPv6Bits outside 0 to
// 128 is an error wrapping ratelimit.ErrInvalidArgument.
func (p Proxies) KeyOf(a netip.Addr) (string, error) {
	bits := p.IPv6Bits
	switch {
	case bits == 0:
		bits = DefaultIPv6Bits
	case bits < 0 || bits > 128:
		return "", fmt.Errorf("%w: IPv6Bits must be 0 to 128 (got %d)", ratelimit.ErrInvalidArgument, p.IPv6Bits)
	}
	if !a.Is6() || bits == 128 {
		return a.String(), nil
	}
	pfx, _ := a.Prefix(bits)
	return pfx.String(), nil
}

func (p Proxies) trusted(a netip.Addr) bool {
	for _, pfx := range p.Prefixes {
		if pfx.Contains(a) {
			return true
		}
	}
	return false
}

// ParsePrefixes parses addresses ("10.0.0.7", "::1") and CIDR prefixes
// ("10.0.0.0/8", "fd00::/8"), several to a string when separated by commas.
func ParsePrefixes(list ...string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range CommaList(list) {
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

// ParseAddr parses an address as a peer or a proxy reports it: an IP,
// possibly with a port, possibly in brackets. IPv4-mapped IPv6 addresses
// become IPv4, and a zone is dropped.
func ParseAddr(s string) (netip.Addr, bool) {
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

// CommaList splits each value on commas and returns the trimmed, non-empty
// parts in order.
func CommaList(values []string) []string {
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
