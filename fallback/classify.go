package fallback

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// unreachableErrnos are the system errors of a connection that could not be
// made or was lost.
var unreachableErrnos = []error{
	syscall.ECONNREFUSED,
	syscall.ECONNRESET,
	syscall.ECONNABORTED,
	syscall.EPIPE,
	syscall.ETIMEDOUT,
	syscall.EHOSTUNREACH,
	syscall.ENETUNREACH,
	syscall.ENETDOWN,
}

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
	if errors.Is(err, ratelimit.ErrUnavailable) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) {
		return true
	}
	for _, errno := range unreachableErrnos {
		if errors.Is(err, errno) {
			return true
		}
	}
	var opErr *net.OpError
	var dnsErr *net.DNSError
	if errors.As(err, &opErr) || errors.As(err, &dnsErr) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return true
	}
	return false
}
