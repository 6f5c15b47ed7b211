package ratelimit

import (
	"crypto/sha256"
	"encoding/base64"
)

// HashSubject returns a subject that stands for credential (an API key, a
// session token) without holding it: "sha256:" and the unpadded base64url
// encoding of the first 128 bits of its SHA-256, 29 bytes whatever its
// length, as httplimit.Header and grpclimit.Metadata key a request. Limit by
// HashSubject(apiKey) rather than apiKey, so that neither the store's keys
// nor an ErrorEvent nor a reservation's record hold the credential; equal
// credentials share a bucket, and a limiter keyed by the middleware's
// Header shares it too.
func HashSubject(credential string) string {
	sum := sha256.Sum256([]byte(credential))
	return "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:16])
}
