// Package script is the Redis side of package redisstore: tokenbucket.lua,
// the twin of tokenbucket.State.Step, with the Go code that builds its
// arguments, reads its reply, and encodes the value it stores. redisstore
// runs it; the bench drives it directly.
package script

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/calendar"
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

// Function is the name of the function that runs Source (FCALL), and of
// the library that holds it (Library): "exactlimit_" and SHA, so that the
// script of each release is a library of its own and two releases of a
// rolling deploy run side by side on one server.
var Function = "exactlimit_" + SHA

// Library is Source as the function library Function (FUNCTION LOAD): its
// name, and the local NAME the source registers main under.
var Library = "#!lua name=" + Function + "\nlocal NAME = '" + Function + "'\n" + Source

// ErrUnexpectedReply is wrapped by the error of a check whose reply is not
// one tokenbucket.lua gives (redisstore exports it).
var ErrUnexpectedReply = errors.New("redisstore: unexpected script reply")

// ReplyLen is the number of integers of one key's entry in the script's
// reply (which begins with it) for a call whose every policy is one limit;
// a call with a policy of several limits or quotas adds two per limit and
// quota of the largest (their standings), up to MaxReplyLen.
const (
	ReplyLen    = 5
	MaxReplyLen = ReplyLen + 2*tokenbucket.MaxLimits
)

// Args returns the script's ARGV for one check of r, which must be valid:
// the call's part (see CallArgs), then r's (see AppendRequest).
func (e *Encoder) Args(r ratelimit.Request) []any {
	return e.AppendRequest(CallArgs(r, Each, 1), r)
}

// FCall returns the whole command of one check of r on key, which must be
// valid, by FCALL of Function: FCALL, Function, 1, key, then Args(r). The
// command is made in one slice that the caller hands to redis.NewCmd as it
// is, where the client's FCall would copy keys and arguments into a new one
// and box the function's name on every call.
func (e *Encoder) FCall(key string, r ratelimit.Request) []any {
	args := make([]any, 6, 8)
	args[0], args[1], args[2], args[3] = "fcall", functionArg, 1, key
	args[4], args[5] = "", Each
	if !r.Now.IsZero() {
		args[4] = r.Now.UnixMicro()
	}
	return e.AppendRequest(args, r)
}

// functionArg is Function, boxed once.
var functionArg any = Function

// The script's modes (see the header of tokenbucket.lua). A call of
// all-or-nothing groups of keys names their sizes instead: see Groups.
const (
	Each    = "each"    // every key decided on its own
	All     = "all"     // every key, all or nothing
	Reserve = "reserve" // one key, and a record of what it took
	Settle  = "settle"  // a record settled on its bucket
	Refund  = "refund"  // one key's costs given back
)

// modeArg returns mode as an argument: a mode of one key boxed once, not on
// every call.
func modeArg(mode string) any {
	switch mode {
	case Each:
		return Each
	case All:
		return All
	case Reserve:
		return Reserve
	case Settle:
		return Settle
	case Refund:
		return Refund
	}
	return mode
}

// Groups returns the mode of a call of consecutive all-or-nothing groups of
// the given sizes, each at least 1: "3,1,2".
func Groups(sizes []int) string {
	b := make([]byte, 0, 4*len(sizes))
	for i, n := range sizes {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(n), 10)
	}
	return string(b)
}

// CallArgs returns the start of the script's ARGV for a call of keys checks
// decided at the time of r (the server's TIME when r.Now is zero) in mode,
// with room for the checks' part.
func CallArgs(r ratelimit.Request, mode string, keys int) []any {
	args := make([]any, 2, 3+2*keys)
	args[0], args[1] = "", modeArg(mode)
	if !r.Now.IsZero() {
		args[0] = r.Now.UnixMicro()
	}
	return args
}

// AppendRequest appends one key's part of the script's ARGV for r: its cost
// (-1 for a peek, which asks for one token and takes none; a negative cost
// asks for that many and takes none), or its costs, one per limit, and its
// policy.
func (e *Encoder) AppendRequest(args []any, r ratelimit.Request) []any {
	var cost any = r.Cost
	switch {
	case r.Peek:
		cost = -1
	case r.Costs != nil:
		cost = costList(r.Costs)
	}
	return append(args, cost, e.policyOf(r))
}

// ReserveArgs returns the ARGV of a reserve of r (KEYS: the bucket, then the
// record), its record kept for ttl (rounded up to the millisecond).
func (e *Encoder) ReserveArgs(r ratelimit.Request, ttl time.Duration) []any {
	ms := (ttl + time.Millisecond - 1) / time.Millisecond
	return append(e.AppendRequest(CallArgs(r, Reserve, 1), r), int64(ms))
}

// SettleArgs returns the ARGV of a settle on r's limits and time of the
// tokens actually used, one per limit (KEYS: the bucket, then the record).
func (e *Encoder) SettleArgs(r ratelimit.Request, actual []int64) []any {
	return append(CallArgs(r, Settle, 1), costList(actual), e.policyOf(r))
}

// SettleRecordArgs returns the ARGV of a settle as SettleArgs does, of a
// reservation whose bucket is not known (KEYS: the record alone): the bucket
// is the one the record names, when its key starts with prefix.
func (e *Encoder) SettleRecordArgs(r ratelimit.Request, actual []int64, prefix string) []any {
	return append(e.SettleArgs(r, actual), prefix)
}

// costList is the script's list of costs, one per limit: "1,500".
func costList(costs []int64) string {
	b := make([]byte, 0, 8*len(costs))
	for i, c := range costs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, c, 10)
	}
	return string(b)
}

// Encoder builds the script's arguments. It keeps the policy argument of
// the one-limit policies it has seen, since a store uses few policies and
// each check would otherwise encode its own: a map replaced on write, read
// without a lock. Each redisstore.Store has its own; the zero Encoder is
// ready to use and safe for simultaneous use.
type Encoder struct {
	limits cache[ratelimit.Limit, any] // the argument of a policy of one limit, a string boxed once
	quotas cache[quotaKey, quotaArg]   // the argument of a limit and a quota, in a window

	// Clock, when not nil, is the time the windows of a request's quotas
	// are found around when the request carries none (the server's clock
	// decides): see policyOf. The default is time.Now.
	Clock func() time.Time
}

// policyOf returns the script's policy argument for r: its limits' (see
// policy), then, for a policy with quotas, their number (1 byte) and per
// quota its allowance and four times in µs: the previous window's start,
// the window's start and end, and the next window's end, around r.Now, or
// around e.Clock when r.Now is zero. The script picks, of the three
// windows, the one that holds the time it decides at, so the server's
// clock may differ from e.Clock by up to a window.
func (e *Encoder) policyOf(r ratelimit.Request) any {
	if len(r.Quotas) == 0 {
		return e.policy(r.Limits)
	}
	t := r.Now
	if t.IsZero() {
		if e.Clock != nil {
			t = e.Clock()
		} else {
			t = time.Now()
		}
	}
	us := t.UnixMicro()
	var key quotaKey
	usual := len(r.Limits) == 1 && len(r.Quotas) == 1
	if usual {
		// The usual policy of a limit and a quota: its argument holds
		// while its window does.
		key = quotaKey{r.Limits[0], r.Quotas[0]}
		if a, ok := e.quotas.load(key); ok && a.s <= us && us < a.e {
			return a.arg
		}
	}
	b := make([]byte, 0, 2+21*len(r.Limits)+35*len(r.Quotas))
	b = append(b, byte(len(r.Limits)))
	for _, l := range r.Limits {
		b = appendLimit(b, tokenbucket.Lowest(l))
	}
	b = append(b, byte(len(r.Quotas)))
	var arg quotaArg
	for _, q := range r.Quotas {
		ps, s, end, ne := calendar.Around(uint8(q.Period), q.Start, us)
		b = appendUint56(b, q.Allowance)
		b = appendUint56(b, ps)
		b = appendUint56(b, s)
		b = appendUint56(b, end)
		b = appendUint56(b, ne)
		arg.s, arg.e = s, end
	}
	arg.arg = string(b)
	if usual {
		e.quotas.store(key, arg)
	}
	return arg.arg
}

// quotaKey is a policy of one limit and one quota; quotaArg its argument
// around a time in the window [s, e), which is its argument at any time of
// that window.
type (
	quotaKey struct {
		limit ratelimit.Limit
		quota ratelimit.Quota
	}
	quotaArg struct {
		arg  any
		s, e int64
	}
)

// maxCachedPolicies bounds an Encoder's cache; policies beyond it are
// encoded per check.
const maxCachedPolicies = 4096

// policy returns the script's policy argument for limits (see the header
// of tokenbucket.lua): their number, then each limit's capacity, refill
// tokens and refill period (µs) in lowest terms, 7 bytes each.
func (e *Encoder) policy(limits []ratelimit.Limit) any {
	if len(limits) != 1 {
		b := make([]byte, 1, 1+21*len(limits))
		b[0] = byte(len(limits))
		for _, l := range limits {
			b = appendLimit(b, tokenbucket.Lowest(l))
		}
		return string(b)
	}
	l := limits[0]
	if a, ok := e.limits.load(l); ok {
		return a
	}
	var a any = string(appendLimit([]byte{1}, tokenbucket.Lowest(l)))
	e.limits.store(l, a)
	return a
}

// cache is a map that readers load without a lock and each store copies, of
// at most maxCachedPolicies keys (a new key beyond them is not kept; a key
// already there is replaced).
type cache[K comparable, V any] struct {
	mu sync.Mutex
	m  atomic.Pointer[map[K]V]
}

func (c *cache[K, V]) load(k K) (v V, ok bool) {
	if m := c.m.Load(); m != nil {
		v, ok = (*m)[k]
	}
	return v, ok
}

func (c *cache[K, V]) store(k K, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var old map[K]V
	if m := c.m.Load(); m != nil {
		old = *m
	}
	if _, there := old[k]; !there && len(old) >= maxCachedPolicies {
		return
	}
	next := make(map[K]V, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[k] = v
	c.m.Store(&next)
}

// appendLimit appends l's capacity, refill tokens and refill period (µs),
// 7 bytes each, big-endian: a limit of the policy argument and of the
// stored value.
func appendLimit(b []byte, l ratelimit.Limit) []byte {
	b = appendUint56(b, l.Capacity)
	b = appendUint56(b, l.RefillTokens)
	return appendUint56(b, l.RefillPeriod.Microseconds())
}

// ParseReply turns the script's reply to a call of one check of r into a
// Decision.
func ParseReply(r ratelimit.Request, reply any) (ratelimit.Decision, error) {
	rp, err := ParseCall(reply, 1)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	return rp.Decision(r, 0)
}

// Reply is the script's reply to a call of k keys, w values a key (the
// reply's first value: ReplyLen, or more with the standings of policies of
// several limits and quotas), in one of the script's two forms: the string
// it packs a reply without errors into (W in a byte, then each value in 7
// bytes, big-endian), or the array Redis makes of its table, where a key's
// error stands in place of its flags. Reading it allocates nothing.
type Reply struct {
	raw    any    // the reply as the client gave it, for Unexpected
	w      int    // values a key
	arr    []any  // the array form: the values after W
	packed string // the packed form: the bytes after W
}

// ParseCall checks that reply is the script's reply to a call of k checks;
// a reply of another shape is an error wrapping ErrUnexpectedReply.
func ParseCall(reply any, k int) (Reply, error) {
	rp := Reply{raw: reply}
	var n int64
	switch v := reply.(type) {
	case string:
		if len(v) < 1 {
			return rp, Unexpected(reply)
		}
		n, rp.packed = int64(v[0]), v[1:]
		if int64(len(rp.packed)) != 7*n*int64(k) {
			return rp, Unexpected(reply)
		}
	case []any:
		var ok bool
		if len(v) >= 1 {
			n, ok = v[0].(int64)
		}
		if !ok || int64(len(v)) != 1+n*int64(k) {
			return rp, Unexpected(reply)
		}
		rp.arr = v[1:]
	default:
		return rp, Unexpected(reply)
	}
	if n < ReplyLen || n > MaxReplyLen || (n-ReplyLen)%2 != 0 {
		return rp, Unexpected(reply)
	}
	rp.w = int(n)
	return rp, nil
}

// value returns value i of key j's entry, which is an integer of at least 0
// when ok.
func (rp Reply) value(j, i int) (x int64, ok bool) {
	at := rp.w*j + i
	if rp.arr != nil {
		x, ok = rp.arr[at].(int64)
		return x, ok && x >= 0
	}
	b := rp.packed[7*at : 7*at+7]
	return int64(b[0])<<48 | int64(b[1])<<40 | int64(b[2])<<32 | int64(b[3])<<24 |
		int64(b[4])<<16 | int64(b[5])<<8 | int64(b[6]), true
}

// Entry returns key j's entry of the reply as values: its error alone, or
// its W integers (the tests read a reply as the script wrote it).
func (rp Reply) Entry(j int) []any {
	if rp.arr != nil {
		if err, ok := rp.arr[rp.w*j].(error); ok {
			return []any{err}
		}
	}
	v := make([]any, rp.w)
	for i := range v {
		v[i], _ = rp.value(j, i)
	}
	return v
}

// Decision reads key j's entry as the decision of a check of r: the key's
// error (as the script words it, for the caller to wrap), or the decision
// its integers give, with the standing of each limit and quota for a
// policy of several.
func (rp Reply) Decision(r ratelimit.Request, j int) (ratelimit.Decision, error) {
	if rp.arr != nil {
		if err, ok := rp.arr[rp.w*j].(error); ok {
			return ratelimit.Decision{}, err
		}
	}
	var n [ReplyLen]int64
	for i := range n {
		x, ok := rp.value(j, i)
		if !ok {
			return ratelimit.Decision{}, Unexpected(rp.raw)
		}
		n[i] = x
	}
	flags, reset, retry, back := n[0], n[2], n[3], n[4]
	parts := len(r.Limits) + len(r.Quotas)
	bound := flags >> 4
	if bound >= int64(parts) {
		return ratelimit.Decision{}, Unexpected(rp.raw)
	}
	if retry > 0 {
		retry += back
	}
	if reset > 0 {
		reset += back
	}
	d := ratelimit.Decision{
		Allowed:    flags&1 != 0,
		Remaining:  n[1],
		RetryAfter: micros(retry),
		ResetAfter: micros(reset),
		Binding:    int(bound),
		Converted:  flags&2 != 0,
	}
	if int(bound) < len(r.Limits) {
		d.Limit = r.Limits[bound]
	}
	if parts > 1 {
		if rp.w < ReplyLen+2*parts {
			return ratelimit.Decision{}, Unexpected(rp.raw)
		}
		d.Standings = make([]ratelimit.Standing, parts)
		for i := range d.Standings {
			rem, ok1 := rp.value(j, ReplyLen+2*i)
			rst, ok2 := rp.value(j, ReplyLen+2*i+1)
			if !ok1 || !ok2 {
				return ratelimit.Decision{}, Unexpected(rp.raw)
			}
			if rst > 0 {
				rst += back
			}
			d.Standings[i] = ratelimit.Standing{Remaining: rem, ResetAfter: micros(rst)}
		}
	}
	return d, nil
}

// ParseSettle reads the reply to a settle on r's limits: the standing
// afterwards, and whether the script found the reservation's record.
func ParseSettle(r ratelimit.Request, reply any) (d ratelimit.Decision, found bool, err error) {
	rp, err := ParseCall(reply, 1)
	if err != nil {
		return d, false, err
	}
	if d, err = rp.Decision(r, 0); err != nil {
		return d, false, err
	}
	flags, _ := rp.value(0, 0)
	return d, flags&8 == 0, nil
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
