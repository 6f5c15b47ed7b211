package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/exactlimit/ratelimit/httplimit"
	"github.com/exactlimit/ratelimit/internal/clientkey"
)

// KeyFunc returns the subject a call is limited by, from the call's context
// (its peer and incoming metadata) and its full method name
// ("/package.Service/Method"). An error, or an empty subject, means the call
// has no key; its message says why, and is sent to the client.
type KeyFunc func(ctx context.Context, method string) (string, error)

// ErrNoKey is wrapped by the errors of the key functions of this package
// when a call carries no key: httplimit's ErrNoKey.
var ErrNoKey = httplimit.ErrNoKey

// ErrKeyTooLong is wrapped by the error of a call whose key is longer than
// MaxKeyBytes: httplimit's ErrKeyTooLong. Such a call is answered
// codes.InvalidArgument, even with PassMissingKey, and its key never
// reaches the store.
var ErrKeyTooLong = httplimit.ErrKeyTooLong

// MaxKeyBytes bounds a call's key to 1,024 bytes, as httplimit bounds a
// request's and the ratelimit service a subject: a longer key (from
// RawMetadata, Join or any KeyFunc) is refused with ErrKeyTooLong rather
// than stored, and so is a Metadata value longer than this before it is
// hashed.
const MaxKeyBytes = httplimit.MaxKeyBytes

// PeerIP keys a call by the IP address of the connection's peer, and
// believes no metadata: behind a proxy every call would share the proxy's
// key, so list the proxies in a TrustedProxies and key with its PeerIP method
// instead. An IPv4 client is keyed by its address, an IPv6 one by its /64
// ("2001:db8:1:2::/64"), as httplimit.ClientIP and the ratelimit service
// key them; TrustedProxies.IPv6Bits sets another prefix. IPv4-mapped IPv6
// addresses are keyed as IPv4, and a zone is dropped. A peer that is not an
// IP address (a Unix socket, an in-memory listener) has no key.
func PeerIP(ctx context.Context, method string) (string, error) {
	return TrustedProxies{}.PeerIP(ctx, method)
}

// TrustedProxies describes the proxies in front of a gRPC server (an Envoy, a
// load balancer), so that the client's address can be read from the
// metadata they add: httplimit's TrustedProxies, with Header naming a
// metadata key ("x-forwarded-for", Envoy's, when empty; keys are
// case-insensitive), and IPv6Bits the prefix IPv6 clients are keyed by (0
// for 64, 128 for the whole address).
type TrustedProxies httplimit.TrustedProxies

// PeerIP keys a call by the client's IP address. When the peer is not one of
// p's proxies, that is the peer's address and no metadata is read, so a
// client that sends x-forwarded-for itself keys nothing but its own address.
// When the peer is a trusted proxy, p.Header is read from the right: each
// address the trusted proxies appended is skipped, and the first one not in
// p.Prefixes is the client. If every address is trusted, the leftmost is
// used; if an entry is not an IP address, the trusted proxy that reported it
// is keyed instead. It reads the header as httplimit.TrustedProxies reads
// X-Forwarded-For, or Forwarded when p.Header is "forwarded".
func (p TrustedProxies) PeerIP(ctx context.Context, _ string) (string, error) {
	a, err := peerAddr(ctx)
	if err != nil {
		return "", err
	}
	name := p.Header
	if name == "" {
		name = "x-forwarded-for"
	}
	var values []string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		values = md.Get(name)
	}
	pp := clientkey.Proxies{Prefixes: p.Prefixes, Forwarded: strings.EqualFold(p.Header, "Forwarded"), IPv6Bits: p.IPv6Bits}
	return pp.Client(a, values)
}

// ParsePrefixes parses addresses ("10.0.0.7", "::1") and CIDR prefixes
// ("10.0.0.0/8", "fd00::/8") for TrustedProxies.Prefixes, as
// httplimit.ParsePrefixes does. Each string may hold several, separated by
// commas.
func ParsePrefixes(list ...string) ([]netip.Prefix, error) { return clientkey.ParsePrefixes(list...) }

// Metadata returns a KeyFunc that keys a call by the value of the incoming
// metadata key name (case-insensitive), for example an API key, without
// storing the value itself: the key is "sha256:" and the unpadded base64url
// encoding of the first 128 bits of the value's SHA-256, as
// httplimit.Header's, so that whoever reads the store does not read the
// clients' credentials. The value is taken as its exact bytes: nothing is
// trimmed or normalised, so two values that differ in any byte have two
// buckets. When the key has several values, the first non-empty one is
// used. A call without it, or with only empty values, has no key; a value
// longer than MaxKeyBytes is refused with ErrKeyTooLong before it is
// hashed. Keys ending in "-bin" are binary: their value is used as its
// bytes. RawMetadata keys by the value itself.
func Metadata(name string) KeyFunc {
	raw := RawMetadata(name)
	return func(ctx context.Context, method string) (string, error) {
		v, err := raw(ctx, method)
		if err != nil {
			return "", err
		}
		return clientkey.Credential(v), nil
	}
}

// RawMetadata is Metadata keeping the value as the key, readable in the
// store (a tenant or a region, say, rather than a credential).
func RawMetadata(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		for _, v := range md.Get(name) {
			if v == "" {
				continue
			}
			if err := clientkey.CheckLen("the "+name+" metadata", v); err != nil {
				return "", err
			}
			return v, nil
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
// length, so no two different combinations give the same key, as
// httplimit.Join frames them.
func Join(keys ...KeyFunc) KeyFunc {
	keys = append([]KeyFunc(nil), keys...)
	return func(ctx context.Context, method string) (string, error) {
		return clientkey.Join(len(keys), func(i int) (string, error) {
			if keys[i] == nil {
				return "", errors.New("grpclimit: nil key function in Join")
			}
			return keys[i](ctx, method)
		})
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
	if a, ok := clientkey.ParseAddr(p.Addr.String()); ok {
		return a, nil
	}
	return netip.Addr{}, fmt.Errorf("%w: peer address %q is not an IP address", ErrNoKey, p.Addr.String())
}
