package httplimit

import (
	"net/http"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/ratelimitheader"
)

// SetHeaders sets on h the rate-limit headers of decision d, made under the
// policy limits named name, at time now:
//
//   - RateLimit-Policy lists every limit as "name";q=capacity;w=seconds, where
//     w is the time an empty bucket takes to fill, rounded up. With several
//     limits they are named name-1, name-2, ...
//   - RateLimit gives the limit that bound d as "name";r=remaining;t=seconds,
//     with t the seconds until that limit's bucket is full, rounded up: with
//     several limits, r and t both belong to the limit the field names.
//   - X-RateLimit-Limit is that limit's capacity (d.Limit's when it is not one
//     of limits, as a fallback's share), X-RateLimit-Remaining the
//     tokens left, and X-RateLimit-Reset the Unix time, in seconds rounded
//     up, when that bucket is full.
//
// Retry-After is not set here: it belongs to denials only, and the middleware
// adds it. SetHeaders sets nothing when limits is empty and d carries no
// valid limit. The middleware, grpclimit, the ratelimit service and its Envoy
// service all write these fields through one internal package, so their
// headers agree.
func SetHeaders(h http.Header, name string, limits []ratelimit.Limit, d ratelimit.Decision, now time.Time) {
	if f, ok := ratelimitheader.Of(name, limits, d); ok {
		f.Set(h, now)
	}
}
