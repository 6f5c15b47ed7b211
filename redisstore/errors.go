package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/netfail"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/exactlimit/ratelimit/tokenbucket"
	"github.com/redis/go-redis/v9"
)

// ErrUnexpectedReply is wrapped by the error of a check whose script reply
// is not the one the store's script gives: another script loaded under its
// name, or a proxy that rewrote the reply. Nothing can be read from it.
var ErrUnexpectedReply = script.ErrUnexpectedReply

// wrapErr adds the operation and the key's label to err, makes the
// script's own errors match the sentinels they stand for, and wraps
// ratelimit.ErrUnavailable around a failure that says Redis could not be
// reached or did not answer in time (see unreachable).
func wrapErr(op, key string, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "ratelimit: invalid argument: "):
		return fmt.Errorf("%w: redis %s of %s: %s", ratelimit.ErrInvalidArgument, op, keyfmt.Label(key), after(msg, "ratelimit: invalid argument: "))
	case strings.Contains(msg, "ratelimit: malformed bucket state: "):
		return fmt.Errorf("%w: redis %s of %s: %s", tokenbucket.ErrCorruptState, op, keyfmt.Label(key), after(msg, "ratelimit: malformed bucket state: "))
	case unreachable(err):
		return fmt.Errorf("%w: redis %s of %s: %w", ratelimit.ErrUnavailable, op, keyfmt.Label(key), err)
	}
	return fmt.Errorf("ratelimit: redis %s of %s: %w", op, keyfmt.Label(key), err)
}

// busyReplies are the Redis error replies that say the server cannot serve
// the key right now, though it answered: a replica or a restarted server
// still loading its data, a replica without its master, a cluster with the
// key's slot unserved, a multi-key command during resharding.
var busyReplies = []string{"LOADING ", "MASTERDOWN ", "CLUSTERDOWN ", "TRYAGAIN "}

// unreachable reports whether err, an error of go-redis, says that Redis
// could not be reached or did not answer in time: a refused, reset or
// aborted connection, a broken pipe, an unreachable host or network, EOF,
// a closed connection, any *net.OpError or *net.DNSError, a network or I/O
// timeout, go-redis's connection pool timeout (what a hung server with a
// full pool looks like), and the replies LOADING, MASTERDOWN, CLUSTERDOWN and
// TRYAGAIN, in err or any error it wraps. It is false for the caller's
// context ending (the caller's, not the server's), a script error, a
// refused credential or permission, and a closed client.
func unreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, redis.ErrPoolTimeout) || netfail.Is(err) {
		return true
	}
	return anyInChain(err, func(e error) bool {
		msg := e.Error()
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

// after returns the part of a script error after sep, without the " script:
// <sha>, on @user_script:N." suffix Redis may append.
func after(s, sep string) string {
	_, rest, _ := strings.Cut(s, sep)
	rest, _, _ = strings.Cut(rest, " script: ")
	return rest
}
