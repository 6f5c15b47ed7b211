// Package netfail recognises the errors of a network peer that could not be
// reached or did not answer in time, whatever client made them: the one
// test that redisstore (around go-redis's errors) and package fallback
// (around any store's) share.
package netfail

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// errnos are the system errors of a connection that could not be made or
// was lost.
var errnos = []error{
	syscall.ECONNREFUSED,
	syscall.ECONNRESET,
	syscall.ECONNABORTED,
	syscall.EPIPE,
	syscall.ETIMEDOUT,
	syscall.EHOSTUNREACH,
	syscall.ENETUNREACH,
	syscall.ENETDOWN,
}

// Is reports whether err, or an error it wraps, is a network failure: a
// refused, reset or aborted connection, a broken pipe, an unreachable host
// or network, EOF, a closed connection, any *net.OpError or *net.DNSError,
// or a network or I/O timeout (os.ErrDeadlineExceeded). It says nothing of
// context errors: whether a caller's deadline is the peer's failure is the
// caller's to decide.
func Is(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		return false // (which is a net.Error whose Timeout is true)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) {
		return true
	}
	for _, errno := range errnos {
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
	return errors.As(err, &netErr) && netErr.Timeout()
}
