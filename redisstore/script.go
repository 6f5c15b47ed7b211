package redisstore

import (
	"crypto/sha1"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// Script is the body of tokenbucket.lua, the Redis twin of ratelimit's Step
// and StepAll. It is exported so that a caller can load it ahead of time or
// run it directly; its header comment documents KEYS, ARGV, the reply and the
// stored value. Args and ParseReply build its arguments and read its reply.
//
//go:embed tokenbucket.lua
var Script string

// ScriptSHA is the SHA-1 digest of Script, the name EVALSHA runs it by.
var ScriptSHA = func() string {
	sum := sha1.Sum([]byte(Script))
	return hex.EncodeToString(sum[:])
}()

// ErrUnexpectedReply is wrapped by the error of a check whose script reply
// is not the one tokenbucket.lua gives: another script loaded under its
// name, or a proxy that rewrote the reply. Nothing can be read from it.
var ErrUnexpectedReply = errors.New("redisstore: unexpected script reply")

// replyLen is the number of integers the script replies per key.
const replyLen = 5

// Args returns the script's ARGV for a check of r, which must be valid: the
// time (none for the server's TIME), then r's part (see appendRequest).
func Args(r ratelimit.Request) []any {
	return appendRequest(timeArgs(r, 3), r)
}

// timeArgs returns ARGV with room for n values, holding the time of r: none
// for the server's TIME.
func timeArgs(r ratelimit.Request, n int) []any {
	args := make([]any, 0, n)
	if !r.Now.IsZero() {
		args = append(args, r.Now.UnixMicro())
	}
	return args
}

// appendRequest appends one key's part of the script's ARGV for r: its cost
// (-1 for a peek, which asks for one token and takes none; a negative cost
// asks for that many and takes none) and its policy.
func appendRequest(args []any, r ratelimit.Request) []any {
	var cost any = r.Cost
	if r.Peek {
		cost = -1
	}
	return append(args, cost, policyArg(r.Limits))
}

// policyCache keeps the script's policy argument of the one-limit policies
// seen, since a process uses few policies and each check would otherwise
// encode its own: a map replaced on write, read without a lock.
var policyCache struct {
	mu sync.Mutex
	m  atomic.Pointer[map[ratelimit.Limit]any] // each value a string, boxed once
}

// maxCachedPolicies bounds policyCache; policies beyond it are encoded per
// check.
const maxCachedPolicies = 4096

// policyArg returns the script's policy argument for limits (see the header
// of tokenbucket.lua): their number, then each limit's signature, its
// values in lowest terms as the varints the bucket stores.
func policyArg(limits []ratelimit.Limit) any {
	if len(limits) != 1 {
		b := []byte{byte(len(limits))}
		for _, l := range limits {
			b = appendLimit(b, l)
		}
		return string(b)
	}
	l := limits[0]
	if m := policyCache.m.Load(); m != nil {
		if a, ok := (*m)[l]; ok {
			return a
		}
	}
	var a any = string(appendLimit([]byte{1}, l))
	policyCache.mu.Lock()
	defer policyCache.mu.Unlock()
	old := policyCache.m.Load()
	if old != nil && len(*old) >= maxCachedPolicies {
		return a
	}
	next := make(map[ratelimit.Limit]any, 1+lenOf(old))
	if old != nil {
		for k, v := range *old {
			next[k] = v
		}
	}
	next[l] = a
	policyCache.m.Store(&next)
	return a
}

// appendLimit appends l's part of a policy argument: the length of its
// signature and the signature, its capacity, refill tokens and refill period
// (µs) in lowest terms as varints.
func appendLimit(b []byte, l ratelimit.Limit) []byte {
	lo := tokenbucket.Lowest(l)
	var sig [3 * binary.MaxVarintLen64]byte
	n := binary.PutUvarint(sig[:], uint64(lo.Capacity))
	n += binary.PutUvarint(sig[n:], uint64(lo.RefillTokens))
	n += binary.PutUvarint(sig[n:], uint64(lo.RefillPeriod.Microseconds()))
	b = append(b, byte(n))
	return append(b, sig[:n]...)
}

func lenOf(m *map[ratelimit.Limit]any) int {
	if m == nil {
		return 0
	}
	return len(*m)
}

// ParseReply turns the script's reply to a check of r into a Decision.
func ParseReply(r ratelimit.Request, reply any) (ratelimit.Decision, error) {
	v, ok := reply.([]any)
	if !ok || len(v) != replyLen && len(v) != shortReplyLen {
		return ratelimit.Decision{}, unexpected(reply)
	}
	return parseAt(r, v, reply)
}

// shortReplyLen is the length of a one-key reply whose retry and catch-up
// are 0.
const shortReplyLen = 3

// parseAt reads one key's replyLen integers of a reply.
func parseAt(r ratelimit.Request, v []any, reply any) (ratelimit.Decision, error) {
	var n [replyLen]int64
	for i := range min(len(v), replyLen) {
		x, ok := v[i].(int64)
		if !ok || x < 0 {
			return ratelimit.Decision{}, unexpected(reply)
		}
		n[i] = x
	}
	flags, reset, retry, back := n[0], n[2], n[3], n[4]
	bound := flags >> 2
	if bound >= int64(len(r.Limits)) {
		return ratelimit.Decision{}, unexpected(reply)
	}
	if retry > 0 {
		retry += back
	}
	if reset > 0 {
		reset += back
	}
	return ratelimit.Decision{
		Allowed:    flags&1 != 0,
		Remaining:  n[1],
		RetryAfter: micros(retry),
		ResetAfter: micros(reset),
		Limit:      r.Limits[bound],
		Converted:  flags&2 != 0,
	}, nil
}

func unexpected(reply any) error {
	s := fmt.Sprint(reply)
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return fmt.Errorf("%w: %s", ErrUnexpectedReply, s)
}

// micros converts µs to a Duration, saturating at the largest.
func micros(us int64) time.Duration {
	if us > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

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
