package redisstore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/exactlimit/ratelimit/storetest"
	"github.com/exactlimit/ratelimit/tokenbucket"
	"github.com/redis/go-redis/v9"
)

func standalone(t testing.TB) (*redistest.Server, redis.UniversalClient) {
	t.Helper()
	srv := redistest.StartServer(t)
	return srv, redistest.Client(t, srv.Addr())
}

func TestSuiteStandalone(t *testing.T) {
	_, client := standalone(t)
	store := redisstore.New(client)
	storetest.Run(t, func(*testing.T) ratelimit.Store { return store })
}

// TestSuiteWithoutFunctions runs the suite on a server without functions,
// where the Store runs the same script by EVALSHA.
func TestSuiteWithoutFunctions(t *testing.T) {
	_, client := withoutFunctions(t)
	store := redisstore.New(client)
	storetest.Run(t, func(*testing.T) ratelimit.Store { return store })
}

func TestSuiteCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	client := redistest.NewClusterClient(cluster.Addrs()...)
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client)
	storetest.Run(t, func(*testing.T) ratelimit.Store { return store })

	t.Run("subjects spread over every master, one key each", func(t *testing.T) {
		ctx := context.Background()
		l, err := ratelimit.NewEncoded(store, strconv.Itoa, []ratelimit.Limit{ratelimit.PerMinute(10)}, ratelimit.WithNamespace("spread"))
		if err != nil {
			t.Fatal(err)
		}
		perMaster := map[string]int{}
		for i := range 300 {
			if d, err := l.TryAcquire(ctx, i); err != nil || !d.Allowed {
				t.Fatalf("subject %d: %+v %v", i, d, err)
			}
			perMaster[cluster.MasterOf(redistest.SlotOf(l.Key(i))).Addr()]++
		}
		for _, m := range cluster.Masters() {
			mc := redistest.NewClient(m.Addr())
			n, err := mc.DBSize(ctx).Result()
			mc.Close()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 || perMaster[m.Addr()] == 0 {
				t.Fatalf("master %s holds %d keys (%d subjects hash to it), want some of the 300", m.Addr(), n, perMaster[m.Addr()])
			}
		}
	})
}

// exec runs the script directly on one key, bypassing every Go check, with
// the raw ARGV given, and returns the key's entry of the reply or the error
// of the call or of the key.
func exec(ctx context.Context, c redis.UniversalClient, key string, argv ...any) (any, error) {
	res, err := c.Eval(ctx, script.Source, []string{key}, argv...).Result()
	if err != nil {
		return nil, err
	}
	rp, err := script.ParseCall(res, 1)
	if err != nil {
		return nil, err
	}
	v := rp.Entry(0)
	if err, ok := v[0].(error); ok {
		return nil, err
	}
	if len(v) != script.ReplyLen {
		return nil, fmt.Errorf("an entry of %d values to a call of one key: %v", len(v), res)
	}
	return v, nil
}

func lim(capacity, refill int64, period time.Duration) ratelimit.Limit {
	return ratelimit.Limit{Capacity: capacity, RefillTokens: refill, RefillPeriod: period}
}

// rawArgs is the script's ARGV for a call of one key, built without any Go
// check or reduction: time, the mode "each", cost, and the policy (the
// number of limits, then c, r and p as 7-byte integers per limit), as the
// header of tokenbucket.lua documents it.
func rawArgs(now any, cost any, limits ...[3]int64) []any {
	b := []byte{byte(len(limits))}
	for _, l := range limits {
		for _, v := range l {
			b = appendUint7(b, v)
		}
	}
	return []any{now, "each", cost, string(b)}
}

// TestTheScriptRefusesWhatValidateRefuses: every request Request.Validate
// refuses, the script refuses too, as a malformed argument (Validate runs
// before any call and gives the reason; the script only guards its
// arithmetic), and the store reports it as ErrInvalidArgument.
func TestTheScriptRefusesWhatValidateRefuses(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	// The script reads the policy's values as doubles, where 2^53 + 1 is
	// 2^53: the values past the bound are 2^53 + 2. Negative values cannot
	// be written at all.
	us := func(d time.Duration) int64 { return int64(d / time.Microsecond) }
	sec := us(time.Second)
	tests := []struct {
		name string
		r    ratelimit.Request
		argv []any // the same request as the script sees it
	}{
		{"capacity 0", ratelimit.Request{Limits: []ratelimit.Limit{lim(0, 1, time.Second)}, Cost: 1}, rawArgs("", 1, [3]int64{0, 1, sec})},
		{"refill tokens 0", ratelimit.Request{Limits: []ratelimit.Limit{lim(1, 0, time.Second)}, Cost: 1}, rawArgs("", 1, [3]int64{1, 0, sec})},
		{"period 0", ratelimit.Request{Limits: []ratelimit.Limit{lim(1, 1, 0)}, Cost: 1}, rawArgs("", 1, [3]int64{1, 1, 0})},
		{"capacity too large", ratelimit.Request{Limits: []ratelimit.Limit{lim(1<<53+2, 1, time.Microsecond)}, Cost: 1}, rawArgs("", 1, [3]int64{int64(1)<<53 + 2, 1, 1})},
		{"refill tokens too large", ratelimit.Request{Limits: []ratelimit.Limit{lim(1, 1<<53+2, time.Second)}, Cost: 1}, rawArgs("", 1, [3]int64{1, int64(1)<<53 + 2, sec})},
		{"period too large", ratelimit.Request{Limits: []ratelimit.Limit{lim(1, 1, (1<<53+2)*time.Microsecond)}, Cost: 1}, rawArgs("", 1, [3]int64{1, 1, int64(1)<<53 + 2})},
		{"capacity × period too large", ratelimit.Request{Limits: []ratelimit.Limit{lim(1<<33, 1, time.Hour)}, Cost: 1}, rawArgs("", 1, [3]int64{int64(1) << 33, 1, us(time.Hour)})},
		{"capacity × period just too large", ratelimit.Request{Limits: []ratelimit.Limit{lim(1<<52+1, 1, 2*time.Microsecond)}, Cost: 1}, rawArgs("", 1, [3]int64{int64(1)<<52 + 1, 1, 2})},
		{"cost 0", ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(5)}, Cost: 0}, rawArgs("", 0, [3]int64{5, 1, 200000})},
		{"cost above capacity", ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(5)}, Cost: 6}, rawArgs("", 6, [3]int64{5, 1, 200000})},
		{"no limits", ratelimit.Request{Cost: 1}, rawArgs("", 1)},
		{"nine limits", ratelimit.Request{Limits: make([]ratelimit.Limit, 9), Cost: 1}, rawArgs("", 1, [3]int64{1, 1, 1}, [3]int64{1, 1, 1}, [3]int64{1, 1, 1}, [3]int64{1, 1, 1}, [3]int64{1, 1, 1}, [3]int64{1, 1, 1}, [3]int64{1, 1, 1}, [3]int64{1, 1, 1}, [3]int64{1, 1, 1})},
		{"second limit invalid", ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(5), lim(5, 0, time.Second)}, Cost: 1}, rawArgs("", 1, [3]int64{5, 1, 200000}, [3]int64{5, 0, sec})},
		{"time before the epoch", ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(5)}, Cost: 1, Now: time.UnixMicro(-1)}, rawArgs(-1, 1, [3]int64{5, 1, 200000})},
		{"time too late", ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(5)}, Cost: 1, Now: time.UnixMicro(tokenbucket.MaxTime + 1)}, rawArgs(tokenbucket.MaxTime+1, 1, [3]int64{5, 1, 200000})},
	}
	const malformed = "ratelimit: invalid argument: malformed argument"
	for _, tt := range tests {
		goErr := tt.r.Validate()
		_, luaErr := exec(ctx, client, "twin", tt.argv...)
		if !errors.Is(goErr, ratelimit.ErrInvalidArgument) || luaErr == nil || !strings.Contains(luaErr.Error(), malformed) {
			t.Errorf("%s: Go says %v, the script says %v; want both to refuse", tt.name, goErr, luaErr)
		}
	}
	// And both accept the largest exact values.
	for _, argv := range [][]any{
		rawArgs("", 1, [3]int64{int64(1) << 53, int64(1) << 53, 1}),
		rawArgs("", 1, [3]int64{1, 1, int64(1) << 53}),
		rawArgs(tokenbucket.MaxTime, 1, [3]int64{1, 1, 1}),
		rawArgs(0, -1, [3]int64{1, 1, 1}),
	} {
		if _, err := exec(ctx, client, "twin-ok", argv...); err != nil {
			t.Errorf("script refused %q: %v", argv, err)
		}
	}
	// Values Go's types cannot express are refused too, and so is a call
	// whose ARGV does not match its keys.
	for _, argv := range [][]any{
		rawArgs("", "1.5", [3]int64{5, 5, 1000000}),
		rawArgs("1.5", 1, [3]int64{5, 5, 1000000}),
		rawArgs("", "x", [3]int64{5, 5, 1000000}),
		rawArgs("", "nan", [3]int64{5, 5, 1000000}),
		rawArgs("", "inf", [3]int64{5, 5, 1000000}),
		{"", "each", 1, "\x01\x00\x00"},                                // a policy cut short
		{"", "each", 1},                                                // no policy
		{"", "some", 1, rawArgs("", 1, [3]int64{5, 5, 1000000})[3]},    // no such mode
		{"", "each", 1, rawArgs("", 1, [3]int64{5, 5, 1000000})[3], 9}, // a width after one key
		{}, // no arguments at all
	} {
		if _, err := exec(ctx, client, "twin-bad", argv...); err == nil || !strings.Contains(err.Error(), malformed) {
			t.Errorf("script accepted %q: err = %v", argv, err)
		}
	}
	if n, _ := client.Exists(ctx, "twin").Result(); n != 0 {
		t.Fatal("a refused request wrote the bucket")
	}
	// Through the store, the script's refusal is ErrInvalidArgument.
	if _, err := redisstore.New(client).Apply(ctx, "k", ratelimit.Request{Limits: []ratelimit.Limit{lim(0, 1, time.Second)}, Cost: 1}); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Errorf("Apply of an invalid request: %v", err)
	}
}

// encodeState writes a bucket in the script's stored format: the version,
// last, then per band its level and its limit as given, 7 bytes each (see
// the header of tokenbucket.lua).
func encodeState(last int64, bands ...tokenbucket.Band) string {
	b := appendUint7([]byte{1}, last)
	for _, band := range bands {
		b = appendUint7(b, band.Level)
		b = appendUint7(b, band.Limit.Capacity)
		b = appendUint7(b, band.Limit.RefillTokens)
		b = appendUint7(b, band.Limit.RefillPeriod.Microseconds())
	}
	return string(b)
}

// lowest returns a band of limit in lowest terms holding tokens whole tokens
// and frac of the next in units of 1/p, as the script stores it.
func lowest(limit ratelimit.Limit, tokens, frac int64) tokenbucket.Band {
	lo := tokenbucket.Lowest(limit)
	return tokenbucket.Band{Limit: lo, Level: tokens*lo.RefillPeriod.Microseconds() + frac}
}

func appendUint7(b []byte, v int64) []byte {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], uint64(v))
	return append(b, buf[1:]...)
}

func decodeUint7(s string) (int64, bool) {
	if len(s) < 7 {
		return 0, false
	}
	var buf [8]byte
	copy(buf[1:], s[:7])
	return int64(binary.BigEndian.Uint64(buf[:])), true
}

func TestStoredFormat(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	now := testkit.Start
	limit := ratelimit.PerSecond(1000)
	l, _ := ratelimit.New[string](redisstore.New(client), limit, ratelimit.WithClock(func() time.Time { return now }))
	l.TryAcquireN(ctx, "s", 3)
	raw, _ := client.Get(ctx, l.Key("s")).Result()
	// 1000 per second is, in lowest terms, 1 per 1000 µs: a level in
	// thousandths of a token.
	want := encodeState(now.UnixMicro(), lowest(limit, 997, 0))
	if raw != want {
		t.Fatalf("stored %x, want %x", raw, want)
	}
	if len(raw) != 36 {
		t.Fatalf("a bucket of 1000/s takes %d bytes, want 36", len(raw))
	}
	// A bucket written by hand in the documented format is read back.
	client.Set(ctx, l.Key("h"), encodeState(now.UnixMicro(), lowest(limit, 5, 500)), time.Minute)
	if d, err := l.Peek(ctx, "h"); err != nil || d.Remaining != 5 || d.Converted {
		t.Fatalf("a hand-written bucket of 5.5 tokens: %+v %v", d, err)
	}
	// A bucket written in other terms is another policy's: converted, its
	// whole tokens and its part of a token carried over.
	client.Set(ctx, l.Key("o"), encodeState(now.UnixMicro(), tokenbucket.Band{Limit: limit, Level: 5*1_000_000 + 500_000}), time.Minute)
	if d, err := l.Peek(ctx, "o"); err != nil || d.Remaining != 5 || !d.Converted {
		t.Fatalf("a bucket in other terms: %+v %v", d, err)
	}
}

func TestMalformedStateIsAnErrorAndGrantsNothing(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	limit := ratelimit.PerSecond(10)
	l, _ := ratelimit.New[string](redisstore.New(client), limit)
	now := time.Now().UnixMicro()
	ok := lowest(limit, 5, 0)
	band := func(level, c, r int64, p time.Duration) tokenbucket.Band {
		return tokenbucket.Band{Limit: ratelimit.Limit{Capacity: c, RefillTokens: r, RefillPeriod: p}, Level: level}
	}
	valid := encodeState(now, ok)
	for _, bad := range []string{
		"",
		"garbage",
		fmt.Sprint(now) + " 5 10 10 1000000", // text, not the stored format
		valid[:8],                            // a time and no limit
		valid[:15],                           // a level and no limit
		valid[:len(valid)-1],                 // a truncated limit
		valid + "\x00",                       // a trailing byte
		"\x02" + valid[1:],                   // a version this script does not know
		valid[1:] + "\x00",                   // no version byte: the length is right, the version 0
		encodeState(tokenbucket.MaxTime+1, ok),
		encodeState(now, band(10_000_001, 10, 10, time.Second)),
		encodeState(now, band(5, 0, 10, time.Second)),
		encodeState(now, band(5, 10, 0, time.Second)),
		encodeState(now, band(0, 10, 10, 0)),
		encodeState(now, band(0, 1<<33, 1, time.Hour)),
		encodeState(now, band(0, 1<<53+2, 1, time.Microsecond)),
		encodeState(now, ok, ok, ok, ok, ok, ok, ok, ok, ok),
		valid[:8] + strings.Repeat("\xff", 28),
		// In the policy's own terms, as a check of it reads them without
		// converting: above full, in debt without version 2 (or version 2
		// without debt), below the debt floor.
		encodeState(now, lowest(limit, 10, 1)),
		encodeState(now, lowest(limit, -1, 0)),
		"\x02" + encodeState(now, lowest(limit, 0, 0))[1:],
		"\x02" + encodeState(now, lowest(limit, -11, 0))[1:],
	} {
		key := l.Key("s")
		if err := client.Set(ctx, key, bad, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		d, err := l.TryAcquire(ctx, "s")
		if !errors.Is(err, tokenbucket.ErrCorruptState) || d.Allowed {
			t.Errorf("stored %q: got %+v, %v; want an error wrapping ErrCorruptState", bad, d, err)
		}
		if got, _ := client.Get(ctx, key).Result(); got != bad {
			t.Errorf("stored %q was rewritten to %q", bad, got)
		}
	}
	client.Del(ctx, l.Key("s"))
	client.HSet(ctx, l.Key("s"), "tokens", 10)
	if _, err := l.TryAcquire(ctx, "s"); !errors.Is(err, tokenbucket.ErrCorruptState) {
		t.Errorf("a hash at the key: err = %v, want ErrCorruptState", err)
	}
}

func commandCalls(t *testing.T, c redis.UniversalClient, cmd string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			return n
		}
	}
	return 0
}

// hookedClient returns a client of srv with an open connection, and the hook
// that records what it sends from then on.
// scriptCalls returns the script calls the server behind c has run: FCALL,
// EVALSHA and EVAL.
func scriptCalls(t *testing.T, c redis.UniversalClient) int {
	t.Helper()
	return commandCalls(t, c, "fcall") + commandCalls(t, c, "evalsha") + commandCalls(t, c, "eval")
}

// preload loads the script's library on the server behind c, as the first
// check would (so that no call is sent twice).
func preload(t *testing.T, c redis.Cmdable) {
	t.Helper()
	if err := c.FunctionLoad(context.Background(), script.Library).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
}

// withoutFunctions starts a standalone server that has no FCALL and no
// FUNCTION, as Redis before 7: the Store runs the script by EVALSHA.
func withoutFunctions(t testing.TB) (*redistest.Server, redis.UniversalClient) {
	t.Helper()
	srv := redistest.StartServer(t, "--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")
	return srv, redistest.Client(t, srv.Addr())
}

func hookedClient(t *testing.T, srv *redistest.Server) (redis.UniversalClient, *sent) {
	t.Helper()
	client := redistest.Client(t, srv.Addr())
	if err := client.Ping(context.Background()).Err(); err != nil { // open the connection first
		t.Fatal(err)
	}
	hook := &sent{}
	client.AddHook(hook)
	return client, hook
}

// sent records the commands a client sends: one entry in names per single
// command, one in pipes per pipeline, and one in scripts per script call,
// alone or in a pipeline.
type sent struct {
	mu      sync.Mutex
	names   []string
	pipes   []string
	scripts []scriptCall
}

// scriptCall is a script call's number of keys and its mode (ARGV[2]).
type scriptCall struct {
	keys int
	mode string
}

// script records cmd when it is a script call. h.mu must be held.
func (h *sent) script(cmd redis.Cmder) {
	if name := cmd.Name(); name != "fcall" && name != "evalsha" && name != "eval" {
		return
	}
	a := cmd.Args() // fcall or evalsha, the function or sha, numkeys, keys..., argv...
	n, _ := strconv.Atoi(fmt.Sprint(a[2]))
	h.scripts = append(h.scripts, scriptCall{keys: n, mode: fmt.Sprint(a[3+n+1])})
}

func (h *sent) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *sent) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.names = append(h.names, cmd.Name())
		h.script(cmd)
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h *sent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		h.mu.Lock()
		for i, c := range cmds {
			names[i] = c.Name()
			h.script(c)
		}
		h.pipes = append(h.pipes, strings.Join(names, " "))
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// TestOneRoundTripAndOneLoadWhenTheServerLacksTheScript checks the commands
// a check sends: one FCALL; after FUNCTION FLUSH one more FUNCTION LOAD and
// FCALL, once; on a server without functions, or an ACL that refuses
// FUNCTION LOAD, one EVAL of the body (the server lacks the script after
// SCRIPT FLUSH), and EVALSHA from then on.
func TestOneRoundTripAndOneLoadWhenTheServerLacksTheScript(t *testing.T) {
	for _, tc := range []struct {
		name               string
		noFunctions, noACL bool
		first, then        string
		want               map[string]int // the server's commandstats
	}{
		// (A call that finds no function counts as a call.)
		{"functions", false, false, "fcall function fcall", "fcall",
			map[string]int{"fcall": 7, "function|load": 1, "evalsha": 0, "eval": 0}},
		{"no functions", true, false, "fcall eval", "evalsha",
			map[string]int{"evalsha": 5, "eval": 1}},
		{"an ACL without FUNCTION", false, true, "fcall function eval", "evalsha",
			map[string]int{"fcall": 1, "function|load": 0, "evalsha": 5, "eval": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, admin := standalone(t)
			if tc.noFunctions {
				srv, admin = withoutFunctions(t)
			}
			ctx := context.Background()
			client, hook := hookedClient(t, srv)
			if tc.noACL {
				if err := admin.Do(ctx, "ACL", "SETUSER", "default", "-function").Err(); err != nil {
					t.Fatal(err)
				}
			}
			l, _ := ratelimit.New[string](redisstore.New(client), ratelimit.PerSecond(10))
			admin.ScriptFlush(ctx)
			if !tc.noFunctions {
				admin.FunctionFlush(ctx)
			}
			admin.ConfigResetStat(ctx)
			if _, err := l.TryAcquire(ctx, "s"); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(hook.names, " "); got != tc.first {
				t.Fatalf("first check after the flush sent %q, want %q", got, tc.first)
			}
			hook.names = nil
			for range 5 {
				l.TryAcquire(ctx, "s")
			}
			if got, want := strings.Join(hook.names, " "), strings.TrimSpace(strings.Repeat(tc.then+" ", 5)); got != want {
				t.Fatalf("five more checks sent %q, want %q", got, want)
			}
			for cmd, n := range tc.want {
				if got := commandCalls(t, admin, cmd); got != n {
					t.Errorf("the server ran %d %s, want %d", got, cmd, n)
				}
			}
		})
	}
}

func TestOneStringKeyPerSubjectExpiringWhenFull(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	store := redisstore.New(client)
	l, _ := ratelimit.New[string](store, ratelimit.PerMinute(10), ratelimit.WithNamespace("ttl"))
	l.TryAcquireN(ctx, "s", 5)
	keys, _ := client.Keys(ctx, "*").Result()
	if len(keys) != 1 || keys[0] != "3:ttl:s" {
		t.Fatalf("keys after one check = %v, want [3:ttl:s]", keys)
	}
	if typ, _ := client.Type(ctx, keys[0]).Result(); typ != "string" {
		t.Fatalf("the bucket is a %s, want a string", typ)
	}
	// 5 tokens of 10 per minute refill in 30 s.
	if ttl, _ := client.PTTL(ctx, keys[0]).Result(); ttl > 30*time.Second || ttl < 29*time.Second {
		t.Fatalf("PTTL = %v, want just under 30s", ttl)
	}
	// A bucket refilled to full in a millisecond gets the 1 ms minimum.
	fast, _ := ratelimit.New[string](store, ratelimit.Limit{Capacity: 1000, RefillTokens: 1000, RefillPeriod: time.Millisecond}, ratelimit.WithNamespace("fast"))
	fast.TryAcquire(ctx, "s")
	if ttl, _ := client.PTTL(ctx, fast.Key("s")).Result(); ttl > time.Millisecond || ttl == -1*time.Nanosecond {
		t.Fatalf("PTTL of a bucket full in 1µs = %v, want at most 1ms (and an expiry)", ttl)
	}
	// Without an injected clock the script reads the server's TIME.
	l.TryAcquire(ctx, "s")
	raw, _ := client.Get(ctx, l.Key("s")).Result()
	last, _ := decodeUint7(raw[1:]) // after the version byte
	serverNow, _ := client.Time(ctx).Result()
	if diff := serverNow.UnixMicro() - last; diff < 0 || diff > int64(5*time.Second/time.Microsecond) {
		t.Fatalf("stored time %d is %dµs from the server's TIME", last, diff)
	}
}

func TestQueueOnAPipeline(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	client.FunctionFlush(ctx)
	now := testkit.Start
	l, _ := ratelimit.New[string](redisstore.New(client), ratelimit.PerSecond(2), ratelimit.WithClock(func() time.Time { return now }))
	key, r, err := l.Request("s", 2)
	if err != nil {
		t.Fatal(err)
	}
	pipe := client.Pipeline()
	set := pipe.Set(ctx, "other", "x", 0)
	store := l.Store().(*redisstore.Store)
	first := store.Queue(ctx, pipe, key, r)
	second := store.Queue(ctx, pipe, key, r)
	incr := pipe.Incr(ctx, "counter")
	bad := store.Queue(ctx, pipe, key, ratelimit.Request{Limits: r.Limits, Cost: 3})
	// The server does not hold the library: the checks fail with "Function
	// not found" (they did not run), and each Result runs its check once
	// more, the first loading it.
	if _, err := pipe.Exec(ctx); err == nil || !redis.HasErrorPrefix(err, "Function not found") {
		t.Fatalf("Exec = %v, want Function not found", err)
	}
	if set.Err() != nil || incr.Val() != 1 {
		t.Fatalf("the pipeline's other commands: %v, %v", set.Err(), incr.Val())
	}
	if d, err := first.Result(); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("first queued check = %+v, %v; want allowed with 0 left", d, err)
	}
	if d, err := second.Result(); err != nil || d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("second queued check = %+v, %v; want denied, retry after 1s", d, err)
	}
	if _, err := bad.Result(); !errors.Is(err, ratelimit.ErrInvalidArgument) {
		t.Fatalf("an invalid queued check: err = %v, want ErrInvalidArgument", err)
	}
	// From then on the server holds it: FCALL, no error.
	pipe = client.Pipeline()
	third := store.Queue(ctx, pipe, key, r)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := third.Result(); err != nil || d.Allowed {
		t.Fatalf("third queued check = %+v, %v; want denied", d, err)
	}
}

func TestUnreachableServerIsAnError(t *testing.T) {
	srv, client := standalone(t)
	srv.Kill()
	l, _ := ratelimit.New[string](redisstore.New(client), ratelimit.PerSecond(2))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	d, err := l.TryAcquire(ctx, "s")
	if err == nil || d.Allowed {
		t.Fatalf("check against a dead server = %+v, %v; want an error", d, err)
	}
	if errors.Is(err, ratelimit.ErrInvalidArgument) || errors.Is(err, tokenbucket.ErrCorruptState) ||
		!strings.Contains(err.Error(), `namespace "default"`) || strings.Contains(err.Error(), l.Key("s")) {
		t.Fatalf("err = %v; want a connection error that names the namespace, not the key", err)
	}
	if err := l.Reset(ctx, "s"); err == nil {
		t.Fatal("Reset against a dead server returned nil")
	}
}

// TestDifferential runs random operation sequences (time steps forward and
// backward, costs, peeks, resets, policy switches, several limits) through
// the pure Step, memstore and the Redis script, and compares every Decision
// and the Redis key's expiry.
// differentialSequences is how many random sequences of 60 steps
// TestDifferential runs; -differential.sequences=3400 runs 200,000 steps.
var differentialSequences = flag.Int("differential.sequences", 40, "random sequences of TestDifferential")

func TestDifferential(t *testing.T) {
	t.Run("function", func(t *testing.T) {
		_, client := standalone(t)
		differential(t, client, callFunction)
	})
	t.Run("script", func(t *testing.T) {
		_, client := withoutFunctions(t)
		differential(t, client, callScript)
	})
}

// callFunc queues one call of the script on c, as the Store under test
// sends it.
type callFunc func(ctx context.Context, c redis.Cmdable, keys []string, args []any) *redis.Cmd

func callFunction(ctx context.Context, c redis.Cmdable, keys []string, args []any) *redis.Cmd {
	return c.FCall(ctx, script.Function, keys, args...)
}

func callScript(ctx context.Context, c redis.Cmdable, keys []string, args []any) *redis.Cmd {
	return c.EvalSha(ctx, script.SHA, keys, args...)
}

func differential(t *testing.T, client redis.UniversalClient, call callFunc) {
	ctx := context.Background()
	rs := redisstore.New(client)
	// memstore's own clock stands still, so it never expires a bucket on its
	// own; the test removes Redis's expiry after checking it, for the same
	// reason: expiry runs on real time, the decisions on the test's clock.
	ms := memstore.New(memstore.WithClock(func() time.Time { return testkit.Start }))
	paris, _ := time.LoadLocation("Europe/Paris")
	newYork, _ := time.LoadLocation("America/New_York")
	// Policies with quotas: small allowances whose windows the clock
	// crosses (it jumps to just before a window's end, below), in zones with
	// daylight saving, anchored on a month's 31st and at odd hours.
	quotaPolicies := []diffPolicy{
		{[]ratelimit.Limit{ratelimit.PerSecond(10)}, []ratelimit.Quota{ratelimit.CalendarQuota(25, ratelimit.Day, paris)}},
		{[]ratelimit.Limit{ratelimit.PerSecond(7)}, []ratelimit.Quota{ratelimit.CalendarQuota(30, ratelimit.Day, newYork), ratelimit.CalendarQuota(50, ratelimit.Week, nil)}},
		{[]ratelimit.Limit{ratelimit.PerMinute(5), ratelimit.NewLimit(100, 24*time.Hour, 100)}, []ratelimit.Quota{{Allowance: 40, Period: ratelimit.Month, Start: time.Date(2026, 1, 31, 9, 30, 0, 0, paris)}}},
		{[]ratelimit.Limit{ratelimit.NewLimit(3, 10*time.Microsecond, 5)}, []ratelimit.Quota{{Allowance: 12, Period: ratelimit.Day, Start: time.Date(2026, 1, 1, 13, 37, 0, 0, newYork)}, {Allowance: 60, Period: ratelimit.Year, Start: time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC)}}},
		{[]ratelimit.Limit{ratelimit.PerSecond(10)}, []ratelimit.Quota{ratelimit.CalendarQuota(20, ratelimit.Day, paris), ratelimit.CalendarQuota(20, ratelimit.Day, paris)}},
	}
	limitPolicies := [][]ratelimit.Limit{
		{ratelimit.PerSecond(10)},
		{ratelimit.PerSecond(7)},
		{ratelimit.NewLimit(3, 10*time.Microsecond, 5)},
		{ratelimit.NewLimit(7, 3*time.Second, 4)},
		{ratelimit.PerMinute(5), ratelimit.NewLimit(100, 24*time.Hour, 100)},
		{ratelimit.NewLimit(1, time.Microsecond, 1)},
		{{Capacity: 1 << 32, RefillTokens: 3, RefillPeriod: 1 << 20 * time.Microsecond}},
		{ratelimit.PerSecond(7), ratelimit.PerSecond(10)},
		{ratelimit.PerDay(1_000_000)},
		{ratelimit.PerHour(10_000_000)},
		{ratelimit.NewLimit(7, 24*time.Hour, 104_249)},
		{ratelimit.NewLimit(3, 7*time.Microsecond, 11), ratelimit.PerDay(1_000_000)},
		{{Capacity: 10, RefillTokens: 1, RefillPeriod: 100 * time.Millisecond}}, // PerSecond(10) in other terms
	}
	policies := quotaPolicies
	for _, l := range limitPolicies {
		policies = append(policies, diffPolicy{limits: l})
	}
	// The transactions below cannot react to a server that lacks the
	// script: a first check loads it (and turns the Store to EVALSHA on a
	// server without functions).
	if _, err := rs.Apply(ctx, "diff-first", ratelimit.Request{Limits: limitPolicies[0], Cost: 1}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	for seq := range *differentialSequences {
		key := fmt.Sprintf("diff-%d", seq)
		var pure tokenbucket.State
		holds := map[string][]tokenbucket.Hold{} // the open reservations, by id
		now := testkit.Start.UnixMicro()
		pol := policies[rng.IntN(len(policies))]
		// One sequence in three is about reservations: the clock mostly
		// stands still, so that an overrun's debt is still there when
		// other reservations are settled or cancelled, and reserves and
		// settles are most of its steps.
		reservations := seq%3 == 0
		for step := range 60 {
			switch x := rng.IntN(100); {
			case reservations && x >= 20:
			case x < 8:
				pol = policies[rng.IntN(len(policies))]
				if rng.IntN(3) == 0 {
					// A policy change behind the clock, onto a bucket
					// that may be full.
					now -= rng.Int64N(30_000_000)
				}
			case x < 12:
				now -= rng.Int64N(2_000_000)
			case x < 60:
				now += rng.Int64N(400_000)
			case x < 64:
				now += rng.Int64N(1 << 40)
			case x < 70 && len(pol.quotas) > 0:
				// To just before, or just after, the end of a quota's
				// window.
				q := pol.quotas[rng.IntN(len(pol.quotas))]
				_, end := q.Window(time.UnixMicro(now))
				now = end.UnixMicro() + rng.Int64N(2_000_000) - 1_500_000
			}
			policy := pol.limits
			minCap := policy[0].Capacity
			for _, l := range policy {
				minCap = min(minCap, l.Capacity)
			}
			for _, q := range pol.quotas {
				minCap = min(minCap, q.Allowance)
			}
			r := ratelimit.Request{Limits: policy, Quotas: pol.quotas, Cost: 1 + rng.Int64N(min(minCap, 12)), Now: time.UnixMicro(now)}
			switch rng.IntN(10) {
			case 0:
				r.Cost = minCap
			case 1, 2, 3:
				r.Cost = 1 // (a check or a peek of 1: the script's shortest path, for a policy of one limit and a quota at most)
			}
			what := fmt.Sprintf("seq %d step %d (%+v at %d)", seq, step, r, now)
			op := rng.IntN(100)
			if reservations && op >= 20 {
				op = 20 + op%22 // reserves and settles only
			}
			switch x := op; {
			case x < 4:
				pure = tokenbucket.State{}
				if err := ms.Reset(ctx, key); err != nil {
					t.Fatal(err)
				}
				if err := rs.Reset(ctx, key); err != nil {
					t.Fatal(err)
				}
				continue
			case x < 20:
				r.Peek = true
			case x < 32:
				// A reserve, with a cost per limit when there are several;
				// one in four of each limit's costs is its whole capacity.
				if caps := pol.caps(); len(caps) > 1 {
					r.Costs = make([]int64, len(caps))
					for i, c := range caps {
						r.Costs[i] = 1 + rng.Int64N(min(c, 40))
						if rng.IntN(4) == 0 {
							r.Costs[i] = c
						}
					}
				} else if rng.IntN(4) == 0 {
					r.Cost = minCap
				}
				reserveDiff(t, what, ctx, client, call, ms, &pure, key, fmt.Sprint(step), r, now, holds)
				continue
			case x < 42 && len(holds) > 0:
				// Any open reservation, in any order; used counts from a
				// cancel (0) to an overrun of twice the capacity, into debt,
				// so that refunds and cancels of other reservations land on
				// a bucket in debt.
				ids := slices.Sorted(maps.Keys(holds))
				id := ids[rng.IntN(len(ids))]
				caps := pol.caps()
				actual := make([]int64, len(caps))
				for i, c := range caps {
					switch rng.IntN(4) {
					case 0:
						actual[i] = 0
					case 1:
						actual[i] = c + rng.Int64N(c+1)
					default:
						actual[i] = rng.Int64N(2*min(c, 40) + 1)
					}
				}
				settleDiff(t, what, ctx, client, call, ms, &pure, key, id, ratelimit.Request{Limits: policy, Quotas: pol.quotas, Now: r.Now}, actual, now, holds)
				continue
			}
			want, ttl, write := pure.Step(r, now)
			got, err := ms.Apply(ctx, key, r)
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: memstore %+v %v, Step %+v", what, got, err, want)
			}
			// The script, its key's expiry and the removal of that expiry
			// run in one MULTI, so that no real time passes between them.
			pipe := client.TxPipeline()
			check := rs.Queue(ctx, pipe, key, r)
			pttl := pipe.PTTL(ctx, key)
			pipe.Persist(ctx, key)
			if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
				t.Fatalf("%s: %v", what, err)
			}
			got, err = check.Result()
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: redis %+v %v, Step %+v", what, got, err, want)
			}
			if write && (pttl.Val() > ttl || pttl.Val() < ttl-time.Second) {
				t.Fatalf("%s: PTTL %v, Step's ttl %v", what, pttl.Val(), ttl)
			}
			if got, err := rs.Apply(ctx, key+"-apply", r); err != nil || got.Allowed != want.Allowed && step == 0 {
				t.Fatalf("%s: Apply on a fresh key: %+v %v", what, got, err)
			}
		}
	}
}

// diffPolicy is one of TestDifferential's policies: limits and quotas.
type diffPolicy struct {
	limits []ratelimit.Limit
	quotas []ratelimit.Quota
}

// caps returns the policy's capacities, then its allowances: the most each
// limit and quota takes at once.
func (p diffPolicy) caps() []int64 {
	var caps []int64
	for _, l := range p.limits {
		caps = append(caps, l.Capacity)
	}
	for _, q := range p.quotas {
		caps = append(caps, q.Allowance)
	}
	return caps
}

// diffEncoder builds the script arguments of TestDifferential's reserves and
// settles, which it runs in a MULTI of its own.
var diffEncoder script.Encoder

// reserveDiff reserves r as id on the pure state, memstore and the script,
// and compares their decisions and the bucket's expiry.
func reserveDiff(t *testing.T, what string, ctx context.Context, client redis.UniversalClient, call callFunc, ms *memstore.Store, pure *tokenbucket.State, key, id string, r ratelimit.Request, now int64, holds map[string][]tokenbucket.Hold) {
	t.Helper()
	want, ttl, write := pure.Step(r, now)
	if want.Allowed {
		holds[id] = tokenbucket.Held(r, pure.Last)
	}
	got, err := ms.Reserve(ctx, key, id, r, time.Hour)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: memstore reserve %+v %v, Step %+v", what, got, err, want)
	}
	pipe := client.TxPipeline()
	res := call(ctx, pipe, []string{key, keyfmt.Record(key, id)}, diffEncoder.ReserveArgs(r, time.Hour))
	pttl := pipe.PTTL(ctx, key)
	pipe.Persist(ctx, key)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("%s: %v", what, err)
	}
	got, err = script.ParseReply(r, res.Val())
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: redis reserve %+v %v, Step %+v", what, got, err, want)
	}
	if write && (pttl.Val() > ttl || pttl.Val() < ttl-time.Second) {
		t.Fatalf("%s: PTTL %v, Step's ttl %v", what, pttl.Val(), ttl)
	}
	if n, _ := client.Exists(ctx, keyfmt.Record(key, id)).Result(); (n == 1) != want.Allowed {
		t.Fatalf("%s: a record exists: %v, the reserve allowed: %v", what, n == 1, want.Allowed)
	}
}

// settleDiff settles reservation id on the pure state, memstore and the
// script, and compares their decisions and the bucket's expiry.
func settleDiff(t *testing.T, what string, ctx context.Context, client redis.UniversalClient, call callFunc, ms *memstore.Store, pure *tokenbucket.State, key, id string, r ratelimit.Request, actual []int64, now int64, holds map[string][]tokenbucket.Hold) {
	t.Helper()
	want, ttl, write := pure.Settle(r, holds[id], actual, now)
	delete(holds, id)
	got, err := ms.Settle(ctx, key, id, r, actual)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: memstore settle %v: %+v %v, Settle %+v", what, actual, got, err, want)
	}
	pipe := client.TxPipeline()
	res := call(ctx, pipe, []string{key, keyfmt.Record(key, id)}, diffEncoder.SettleArgs(r, actual))
	pttl := pipe.PTTL(ctx, key)
	pipe.Persist(ctx, key)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("%s: %v", what, err)
	}
	got, found, err := script.ParseSettle(r, res.Val())
	if err != nil || !reflect.DeepEqual(got, want) || !found {
		t.Fatalf("%s: redis settle %v: %+v found %v %v, Settle %+v", what, actual, got, found, err, want)
	}
	if write && (pttl.Val() > ttl || pttl.Val() < ttl-time.Second) {
		t.Fatalf("%s: PTTL %v, Settle's ttl %v", what, pttl.Val(), ttl)
	}
	// Settled once: the second finds nothing, and changes nothing.
	again, err := ms.Settle(ctx, key, id, r, actual)
	if !errors.Is(err, ratelimit.ErrNotReserved) {
		t.Fatalf("%s: memstore's second settle %+v %v", what, again, err)
	}
	res2, err := call(ctx, client, []string{key, keyfmt.Record(key, id)}, diffEncoder.SettleArgs(r, actual)).Result()
	if _, found, err := script.ParseSettle(r, res2); err != nil || found {
		t.Fatalf("%s: the script's second settle found %v, %v", what, found, err)
	}
}

func TestPing(t *testing.T) {
	srv, client := standalone(t)
	store := redisstore.New(client)
	defer store.Close()
	ctx := context.Background()
	received := func() int {
		info, _ := client.Info(ctx, "stats").Result()
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		t.Fatal("no total_connections_received in INFO stats")
		return 0
	}
	before := received()
	for range 5 {
		if err := store.Ping(ctx); err != nil {
			t.Fatalf("Ping of a live server: %v", err)
		}
	}
	// The probe keeps its one connection from ping to ping.
	if n := received() - before; n != 1 {
		t.Fatalf("5 pings opened %d connections, want 1", n)
	}
	srv.Kill()
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := store.Ping(short); err == nil {
		t.Fatal("Ping of a killed server returned nil")
	}
	// Many failed checks trip the pool's dial breaker; Ping, on its own
	// connection, sees the server back at once.
	for range 30 {
		store.Apply(short, "k", ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(1)}, Cost: 1})
	}
	srv.Restart(t)
	if err := store.Ping(ctx); err != nil {
		t.Fatalf("Ping right after the restart: %v", err)
	}

	cluster := redistest.StartCluster(t, 3, 0)
	cc := redistest.NewClusterClient(cluster.Addrs()...)
	defer cc.Close()
	if err := redisstore.New(cc).Ping(ctx); err != nil {
		t.Fatalf("Ping of a cluster: %v", err)
	}
}

func TestSuiteSentinel(t *testing.T) {
	master := redistest.StartServer(t)
	sentinel := redistest.StartSentinel(t, "limiter", master)
	o := redistest.ClientOptions(sentinel.Addr())
	o.MasterName = "limiter"
	client := redis.NewUniversalClient(o) // a failover client: the master found through Sentinel
	t.Cleanup(func() { client.Close() })
	if _, ok := client.(*redis.Client); !ok {
		t.Fatalf("UniversalOptions with MasterName gave a %T, want a failover *redis.Client", client)
	}
	store := redisstore.New(client)
	defer store.Close()
	storetest.Run(t, func(*testing.T) ratelimit.Store { return store })
	if err := store.Ping(context.Background()); err != nil {
		t.Fatalf("Ping through Sentinel: %v", err)
	}
}

// TestManyPoliciesOnOneServer checks the library's memo of decoded policies,
// which starts again past 64: checks of 150 policies, twice over, each
// decided by its own policy.
func TestManyPoliciesOnOneServer(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	store := redisstore.New(client)
	now := testkit.Start
	for round := range 2 {
		for i := range 150 {
			limit := ratelimit.NewLimit(int64(10+i), time.Hour, int64(10+i)) // (no key expires meanwhile)
			r := ratelimit.Request{Limits: []ratelimit.Limit{limit}, Cost: 1, Now: now}
			d, err := store.Apply(ctx, fmt.Sprintf("many:%d", i), r)
			if want := int64(10+i) - 1 - int64(round); err != nil || !d.Allowed || d.Remaining != want {
				t.Fatalf("round %d, policy %d: %+v, %v; want allowed, %d left", round, i, d, err, want)
			}
		}
	}
}

// TestTheReplysWidthOfSeveralKeys: a call of several keys whose policies
// have standings gives the reply's width after them; a width that is not
// one is refused, and a key whose standings do not fit the width given is
// refused alone, taking nothing.
func TestTheReplysWidthOfSeveralKeys(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	var enc script.Encoder
	plain := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(5)}, Cost: 1}
	quota := plain
	quota.Quotas = []ratelimit.Quota{ratelimit.CalendarQuota(10, ratelimit.Day, nil), ratelimit.CalendarQuota(100, ratelimit.Month, nil)}
	args := func(width ...any) []any {
		a := script.CallArgs(plain, script.Each, 2)
		a = enc.AppendRequest(a, plain)
		a = enc.AppendRequest(a, quota)
		return append(a, width...)
	}
	keys := []string{"width-plain", "width-quota"}
	const malformed = "ratelimit: invalid argument: malformed argument"
	for _, w := range []any{6, 5, 23, "x"} {
		if _, err := client.Eval(ctx, script.Source, keys, args(w)...).Result(); err == nil || !strings.Contains(err.Error(), malformed) {
			t.Errorf("width %v: %v, want the call refused", w, err)
		}
	}
	// Too narrow for the quota key's 3 standings (11), and none given (5).
	for _, a := range [][]any{args(9), args()} {
		res, err := client.Eval(ctx, script.Source, keys, a...).Result()
		if err != nil {
			t.Fatal(err)
		}
		rp, err := script.ParseCall(res, 2)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := rp.Decision(plain, 0); err != nil || !d.Allowed {
			t.Errorf("width %v: the plain key %+v %v", a, d, err)
		}
		if _, err := rp.Decision(quota, 1); err == nil || !strings.Contains(err.Error(), malformed) {
			t.Errorf("width %v: the quota key's error %v, want malformed", a, err)
		}
	}
	if n, _ := client.Exists(ctx, "width-quota").Result(); n != 0 {
		t.Fatal("a refused key was written")
	}
	res, err := client.Eval(ctx, script.Source, keys, args(11)...).Result()
	if err != nil {
		t.Fatal(err)
	}
	rp, err := script.ParseCall(res, 2)
	if err != nil || len(rp.Entry(1)) != 11 {
		t.Fatalf("width 11: %v %v", res, err)
	}
	if d, err := rp.Decision(quota, 1); err != nil || !d.Allowed || len(d.Standings) != 3 || d.Standings[1].Remaining != 9 {
		t.Fatalf("width 11: the quota key %+v %v", d, err)
	}
}
