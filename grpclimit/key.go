package grpclimit

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/exactlimit/ratelimit/httplimit"
)

// KeyFunc returns the subject a call is limited by, from the call's context
// (its peer and incoming metadata) and its full method name
// ("/package.Service/Method"). An error, or an empty subject, means the call
// has no key; its message says why, and is sent to the client.
type KeyFunc func(ctx context.Context, method string) (string, error)

// ErrNoKey is wrapped by the errors of the key functions of this package
// when a call carries no key.
var ErrNoKey = errors.New("no rate-limit key")

// MaxKeyBytes is the longest subject the interceptors pass to the Limiter as
// it is. A longer one (a bearer token keyed by Metadata, say) is hashed: it
// is replaced by "sha256:" and the unpadded base64url SHA-256 of it, 50
// bytes, so that a client cannot make the store hold keys as large as its
// metadata. A subject that itself starts with "sha256:" is hashed too, so a
// short subject can never name the bucket of a hashed long one. Different
// subjects keep different keys, barring a SHA-256 collision.
const MaxKeyBytes = 256

// hashPrefix marks a hashed subject.
const hashPrefix = "sha256:"

// capKey returns key, or its hash when it is longer than MaxKeyBytes or
// starts with hashPrefix.
func capKey(key string) string {
	if len(key) <= MaxKeyBytes && !strings.HasPrefix(key, hashPrefix) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return hashPrefix + base64.RawURLEncoding.EncodeToString(sum[:])
}

// PeerIP keys a call by the IP address of the connection's peer, and
// believes no metadata: behind a proxy every call would share the proxy's
// key, so list the proxies in a TrustedProxies and key with its PeerIP method
// instead. IPv4-mapped IPv6 addresses are keyed as IPv4, and a zone is
// dropped. A peer that is not an IP address (a Unix socket, an in-memory
// listener) has no key.
func PeerIP(ctx context.Context, _ string) (string, error) {
	a, err := peerAddr(ctx)
	if err != nil {
		return "", err
	}
	return a.String(), nil
}

// TrustedProxies describes the proxies in front of a gRPC server (an Envoy, a
// load balancer), so that the client's address can be read from the
// metadata they add: httplimit's TrustedProxies, with Header naming a
// metadata key ("x-forwarded-for", Envoy's, when empty; keys are
// case-insensitive).
type TrustedProxies httplimit.TrustedProxies

// PeerIP keys a call by the client's IP address. When the peer is not one of
// p's proxies, that is the peer's address and no metadata is read, so a
// client that sends x-forwarded-for itself keys nothing but its own address.
// When the peer is a trusted proxy, p.Header is read from the right: each
// address the trusted proxies appended is skipped, and the first one not in
// p.Prefixes is the client. If every address is trusted, the leftmost is
// used; if an entry is not an IP address, the trusted proxy that reported it
// is keyed instead. It reads the header as httplimit.TrustedProxies reads
// X-Forwarded-For.
func (p TrustedProxies) PeerIP(ctx context.Context, _ string) (string, error) {
	a, err := peerAddr(ctx)
	if err != nil {
		return "", err
	}
	hp := httplimit.TrustedProxies(p)
	if hp.Header == "" {
		hp.Header = "x-forwarded-for"
	}
	var values []string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		values = md.Get(hp.Header)
	}
	return hp.KeyOf(hp.ChainFrom(a, values)[0]), nil
}

// ParsePrefixes parses addresses ("10.0.0.7", "::1") and CIDR prefixes
// ("10.0.0.0/8", "fd00::/8") for TrustedProxies.Prefixes, as
// httplimit.ParsePrefixes does. Each string may hold several, separated by
// commas.
func ParsePrefixes(list ...string) ([]netip.Prefix, error) { return httplimit.ParsePrefixes(list...) }

// Metadata returns a KeyFunc that keys a call by the value of the incoming
// metadata key name (case-insensitive), for example an API key. When the key
// has several values, the first non-empty one is used. A call without it, or
// with only empty values, has no key. Keys ending in "-bin" are binary: their
// value is used as its bytes.
func Metadata(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		for _, v := range md.Get(name) {
			if v = strings.TrimSpace(v); v != "" {
				return v, nil
			}
		}
		return "", fmt.Errorf("%w: missing %s metadata", ErrNoKey, name)
	}
}

// Method keys a call by its full method name, "/package.Service/Method", so
// that all calls of a method share one bucket.
func Method(_ context.Context, method string) (string, error) {
	if method == "" {
		return "", fmt.Errorf("%w: call has no method name", ErrNoKey)
	}
	return method, nil
}

// Join returns a KeyFunc that keys a call by all of keys together: the call
// has a key only when each of them gives one. Each part is framed by its
// length, so no two different combinations give the same key.
func Join(keys ...KeyFunc) KeyFunc {
	keys = append([]KeyFunc(nil), keys...)
	return func(ctx context.Context, method string) (string, error) {
		var b strings.Builder
		for i, k := range keys {
			if k == nil {
				return "", errors.New("grpclimit: nil key function in Join")
			}
			v, err := k(ctx, method)
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

// PerMethod returns a KeyFunc that keys a call by its method and by key, so
// that each client has a bucket per method.
func PerMethod(key KeyFunc) KeyFunc { return Join(Method, key) }

// peerAddr returns the IP address of the call's peer.
func peerAddr(ctx context.Context) (netip.Addr, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}, fmt.Errorf("%w: call has no peer", ErrNoKey)
	}
	if tcp, ok := p.Addr.(*net.TCPAddr); ok {
		if a, ok := netip.AddrFromSlice(tcp.IP); ok {
			return a.Unmap().WithZone(""), nil
		}
	}
	s := p.Addr.String()
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), nil
	}
	return netip.Addr{}, fmt.Errorf("%w: peer address %q is not an IP address", ErrNoKey, s)
}
