package fallback

import (
	"context"
	"errors"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/netfail"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// IsUnreachable reports whether err says that a store could not be reached,
// as opposed to a store that answered: it is the default test of which
// errors mark the primary down.
//
// It is true for an error wrapping ratelimit.ErrUnavailable, which a store
// wraps around the failures it recognises (redisstore around go-redis's,
// among them the Redis replies LOADING, MASTERDOWN, CLUSTERDOWN and
// TRYAGAIN and the connection pool timeout), and, from any store, for a
// refused, reset or aborted connection, a broken pipe, an unreachable host
// or network, EOF, any *net.OpError or *net.DNSError, a network or I/O
// timeout and context.DeadlineExceeded. It is false for nil, for an error
// wrapping ratelimit.ErrInvalidArgument or tokenbucket.ErrCorruptState (the
// store answered, and would answer the same again), for context.Canceled
// (the caller gave up), and for anything else, such as a script error or a
// closed client.
func IsUnreachable(err error) bool {
	if err == nil ||
		errors.Is(err, ratelimit.ErrInvalidArgument) ||
		errors.Is(err, tokenbucket.ErrCorruptState) ||
		errors.Is(err, context.Canceled) {
		return false
	}
	return errors.Is(err, ratelimit.ErrUnavailable) ||
		errors.Is(err, context.DeadlineExceeded) ||
		netfail.Is(err)
}
