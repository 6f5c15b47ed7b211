package redisstore

import (
	"crypto/sha1"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
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
const replyLen = 7

// Args returns the script's ARGV for a check of r, which must be valid: the
// time (or "" for the server's TIME), then r's part (see appendRequest).
func Args(r ratelimit.Request) []any {
	args := make([]any, 1, 3+4*len(r.Limits))
	args[0] = timeArg(r)
	return appendRequest(args, r)
}

// timeArg is the script's ARGV[1] for r.
func timeArg(r ratelimit.Request) any {
	if r.Now.IsZero() {
		return ""
	}
	return r.Now.UnixMicro()
}

// appendRequest appends one key's part of the script's ARGV for r: its cost
// (-1 for a peek, which asks for one token and takes none), the number of its
// limits, and each limit in lowest terms with its signature.
func appendRequest(args []any, r ratelimit.Request) []any {
	var cost any = r.Cost
	if r.Peek {
		cost = -1
	}
	args = append(args, cost, len(r.Limits))
	for _, l := range r.Limits {
		a := limitArgs(l)
		args = append(args, a[:]...)
	}
	return args
}

// appendDry appends r's part of ARGV asking for its cost without taking it.
func appendDry(args []any, r ratelimit.Request) []any {
	if !r.Peek {
		r.Cost = -r.Cost
	} else {
		r.Peek, r.Cost = false, -1
	}
	return appendRequest(args, r)
}

// limitCache keeps the script arguments of the limits seen, since a process
// uses few policies and each check would otherwise encode its own: a map
// replaced on write, read without a lock.
var limitCache struct {
	mu sync.Mutex
	m  atomic.Pointer[map[ratelimit.Limit]*[4]any]
}

// maxCachedLimits bounds limitCache; limits beyond it are encoded per check.
const maxCachedLimits = 4096

// limitArgs returns l's four script arguments: capacity, refill tokens and
// refill period in µs in lowest terms, and their varints, as stored.
func limitArgs(l ratelimit.Limit) *[4]any {
	if m := limitCache.m.Load(); m != nil {
		if a, ok := (*m)[l]; ok {
			return a
		}
	}
	lo := l.Lowest()
	p := lo.RefillPeriod.Microseconds()
	b := binary.AppendUvarint(nil, uint64(lo.Capacity))
	b = binary.AppendUvarint(b, uint64(lo.RefillTokens))
	b = binary.AppendUvarint(b, uint64(p))
	a := &[4]any{lo.Capacity, lo.RefillTokens, p, string(b)}
	limitCache.mu.Lock()
	defer limitCache.mu.Unlock()
	old := limitCache.m.Load()
	if old != nil && len(*old) >= maxCachedLimits {
		return a
	}
	next := make(map[ratelimit.Limit]*[4]any, 1+lenOf(old))
	if old != nil {
		for k, v := range *old {
			next[k] = v
		}
	}
	next[l] = a
	limitCache.m.Store(&next)
	return a
}

func lenOf(m *map[ratelimit.Limit]*[4]any) int {
	if m == nil {
		return 0
	}
	return len(*m)
}

// ParseReply turns the script's reply to a check of r into a Decision.
func ParseReply(r ratelimit.Request, reply any) (ratelimit.Decision, error) {
	v, ok := reply.([]any)
	if !ok || len(v) != replyLen {
		return ratelimit.Decision{}, unexpected(reply)
	}
	return parseAt(r, v, reply)
}

// parseAt reads one key's replyLen integers of a reply.
func parseAt(r ratelimit.Request, v []any, reply any) (ratelimit.Decision, error) {
	var n [replyLen]int64
	for i := range n {
		x, ok := v[i].(int64)
		if !ok || x < 0 {
			return ratelimit.Decision{}, unexpected(reply)
		}
		n[i] = x
	}
	if n[0] > 1 || n[5] > 1 || n[4] >= int64(len(r.Limits)) {
		return ratelimit.Decision{}, unexpected(reply)
	}
	retry, reset, back := n[2], n[3], n[6]
	if retry > 0 {
		retry += back
	}
	if reset > 0 {
		reset += back
	}
	return ratelimit.Decision{
		Allowed:    n[0] == 1,
		Remaining:  n[1],
		RetryAfter: micros(retry),
		ResetAfter: micros(reset),
		Limit:      r.Limits[n[4]],
		Converted:  n[5] == 1,
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
		return fmt.Errorf("%w: redis %s of %s: %s", ratelimit.ErrInvalidArgument, op, KeyLabel(key), after(msg, "ratelimit: invalid argument: "))
	case strings.Contains(msg, "ratelimit: malformed bucket state: "):
		return fmt.Errorf("%w: redis %s of %s: %s", ratelimit.ErrCorruptState, op, KeyLabel(key), after(msg, "ratelimit: malformed bucket state: "))
	}
	return fmt.Errorf("ratelimit: redis %s of %s: %w", op, KeyLabel(key), err)
}

// KeyLabel names a key in an error or a log line without its subject, which
// may be personal data or a secret (an API key): a Limiter's key
// "<len>:<namespace>:<subject>" becomes namespace "api", subject #1a2b3c4d
// (the first 4 bytes of the subject's SHA-256, enough to tell subjects apart
// in a log, not to recover one), and any other key key #1a2b3c4d.
func KeyLabel(key string) string {
	ns, subject, ok := splitKey(key)
	if !ok {
		return "key #" + shortHash(key)
	}
	return "namespace " + strconv.Quote(ns) + ", subject #" + shortHash(subject)
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:4])
}

// splitKey cuts a Limiter's key "<len(ns)>:<ns>:<subject>".
func splitKey(key string) (ns, subject string, ok bool) {
	n, rest, found := strings.Cut(key, ":")
	if !found || len(n) == 0 || len(n) > 4 {
		return "", "", false
	}
	size, err := strconv.Atoi(n)
	if err != nil || size < 0 || size >= len(rest) || rest[size] != ':' {
		return "", "", false
	}
	return rest[:size], rest[size+1:], true
}

// after returns the part of a script error after sep, without the " script:
// <sha>, on @user_script:N." suffix Redis may append.
func after(s, sep string) string {
	_, rest, _ := strings.Cut(s, sep)
	rest, _, _ = strings.Cut(rest, " script: ")
	return rest
}
