package fallback

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
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

// busyReplies are the Redis error replies that say the server cannot serve
// the key right now, though it answered: a replica or a restarted server
// still loading its data, a replica without its master, a cluster with the
// key's slot unserved, a multi-key command during resharding.
var busyReplies = []string{"LOADING ", "MASTERDOWN ", "CLUSTERDOWN ", "TRYAGAIN "}

// poolTimeout is go-redis's error when no connection of its pool came free
// in time, which is what a hung server with a full pool looks like.
const poolTimeout = "redis: connection pool timeout"

// IsUnreachable reports whether err says that a store could not be reached,
// as opposed to a store that answered: it is the default test of which
// errors mark the primary down.
//
// It is true for a refused, reset or aborted connection, a broken pipe, an
// unreachable host or network, EOF, any *net.OpError or *net.DNSError, a
// network or I/O timeout, context.DeadlineExceeded, go-redis's connection
// pool timeout, an error wrapping ErrUnavailable, and the Redis replies
// LOADING, MASTERDOWN, CLUSTERDOWN and TRYAGAIN. It is false for nil, for an
// error wrapping ratelimit.ErrInvalidArgument or tokenbucket.ErrCorruptState
// (the store answered, and would answer the same again), for
// context.Canceled (the caller gave up), and for anything else, such as a
// script error or a closed client.
func IsUnreachable(err error) bool {
	if err == nil ||
		errors.Is(err, ratelimit.ErrInvalidArgument) ||
		errors.Is(err, tokenbucket.ErrCorruptState) ||
		errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, ErrUnavailable) ||
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
	return anyInChain(err, func(e error) bool {
		msg := e.Error()
		if msg == poolTimeout {
			return true
		}
		for _, p := range busyReplies {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	})
}

// anyInChain reports whether fn holds for err or any error it wraps.
func anyInChain(err error, fn func(error) bool) bool {
	for err != nil {
		if fn(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if anyInChain(e, fn) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}
