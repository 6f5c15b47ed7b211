// Package script is the Redis side of package redisstore: tokenbucket.lua,
// the twin of tokenbucket.State.Step, with the Go code that builds its
// arguments, reads its reply, and encodes the value it stores. redisstore
// runs it; the bench drives it directly.
package script

import (
	"crypto/sha1"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// Source is the body of tokenbucket.lua, the Redis twin of
// tokenbucket.State.Step and StepAll; its header comment documents KEYS,
// ARGV, the reply and the stored value. Encoder.Args and ParseReply build
// its arguments and read its reply.
//
//go:embed tokenbucket.lua
var Source string

// SHA is the SHA-1 digest of Source, the name EVALSHA runs it by.
var SHA = func() string {
	sum := sha1.Sum([]byte(Source))
	return hex.EncodeToString(sum[:])
}()

// ErrUnexpectedReply is wrapped by the error of a check whose reply is not
// one tokenbucket.lua gives (redisstore exports it).
var ErrUnexpectedReply = errors.New("redisstore: unexpected script reply")

// ReplyLen is the number of integers the script replies per key.
const ReplyLen = 5

// Args returns the script's ARGV for a check of r, which must be valid: the
// time (none for the server's TIME), then r's part (see AppendRequest).
func (e *Encoder) Args(r ratelimit.Request) []any {
	return e.AppendRequest(TimeArgs(r, 3), r)
}

// TimeArgs returns ARGV with room for n values, holding the time of r: none
// for the server's TIME.
func TimeArgs(r ratelimit.Request, n int) []any {
	args := make([]any, 0, n)
	if !r.Now.IsZero() {
		args = append(args, r.Now.UnixMicro())
	}
	return args
}

// AppendRequest appends one key's part of the script's ARGV for r: its cost
// (-1 for a peek, which asks for one token and takes none; a negative cost
// asks for that many and takes none) and its policy.
func (e *Encoder) AppendRequest(args []any, r ratelimit.Request) []any {
	var cost any = r.Cost
	if r.Peek {
		cost = -1
	}
	return append(args, cost, e.policy(r.Limits))
}

// Encoder builds the script's arguments. It keeps the policy argument of
// the one-limit policies it has seen, since a store uses few policies and
// each check would otherwise encode its own: a map replaced on write, read
// without a lock. Each redisstore.Store has its own; the zero Encoder is
// ready to use and safe for simultaneous use.
type Encoder struct {
	mu sync.Mutex
	m  atomic.Pointer[map[ratelimit.Limit]any] // each value a string, boxed once
}

// maxCachedPolicies bounds an Encoder's cache; policies beyond it are
// encoded per check.
const maxCachedPolicies = 4096

// policy returns the script's policy argument for limits (see the header
// of tokenbucket.lua): their number, then each limit's signature, its
// values in lowest terms as the varints the bucket stores.
func (e *Encoder) policy(limits []ratelimit.Limit) any {
	if len(limits) != 1 {
		b := []byte{byte(len(limits))}
		for _, l := range limits {
			b = appendLimit(b, l)
		}
		return string(b)
	}
	l := limits[0]
	if m := e.m.Load(); m != nil {
		if a, ok := (*m)[l]; ok {
			return a
		}
	}
	var a any = string(appendLimit([]byte{1}, l))
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.m.Load()
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
	e.m.Store(&next)
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
	if !ok || len(v) != ReplyLen && len(v) != shortReplyLen {
		return ratelimit.Decision{}, Unexpected(reply)
	}
	return ParseAt(r, v, reply)
}

// shortReplyLen is the length of a one-key reply whose retry and catch-up
// are 0.
const shortReplyLen = 3

// ParseAt reads one key's ReplyLen integers of a reply.
func ParseAt(r ratelimit.Request, v []any, reply any) (ratelimit.Decision, error) {
	var n [ReplyLen]int64
	for i := range min(len(v), ReplyLen) {
		x, ok := v[i].(int64)
		if !ok || x < 0 {
			return ratelimit.Decision{}, Unexpected(reply)
		}
		n[i] = x
	}
	flags, reset, retry, back := n[0], n[2], n[3], n[4]
	bound := flags >> 2
	if bound >= int64(len(r.Limits)) {
		return ratelimit.Decision{}, Unexpected(reply)
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

// Unexpected is the error of a reply that is not the script's.
func Unexpected(reply any) error {
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
