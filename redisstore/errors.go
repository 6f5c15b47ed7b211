package redisstore

import (
	"fmt"
	"strings"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// ErrUnexpectedReply is wrapped by the error of a check whose script reply
// is not the one the store's script gives: another script loaded under its
// name, or a proxy that rewrote the reply. Nothing can be read from it.
var ErrUnexpectedReply = script.ErrUnexpectedReply

// wrapErr adds the operation and the key's label to err, and makes the
// script's own errors match the sentinels they stand for.
func wrapErr(op, key string, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "ratelimit: invalid argument: "):
		return fmt.Errorf("%w: redis %s of %s: %s", ratelimit.ErrInvalidArgument, op, keyfmt.Label(key), after(msg, "ratelimit: invalid argument: "))
	case strings.Contains(msg, "ratelimit: malformed bucket state: "):
		return fmt.Errorf("%w: redis %s of %s: %s", tokenbucket.ErrCorruptState, op, keyfmt.Label(key), after(msg, "ratelimit: malformed bucket state: "))
	}
	return fmt.Errorf("ratelimit: redis %s of %s: %w", op, keyfmt.Label(key), err)
}

// after returns the part of a script error after sep, without the " script:
// <sha>, on @user_script:N." suffix Redis may append.
func after(s, sep string) string {
	_, rest, _ := strings.Cut(s, sep)
	rest, _, _ = strings.Cut(rest, " script: ")
	return rest
}
