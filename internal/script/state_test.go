package script_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// FuzzDecodeState: any bytes are either refused (an error wrapping
// ErrCorruptState) or a state that re-encodes to the same bytes, whose every
// band holds at most its capacity; never a panic. The seed corpus is in
// testdata/fuzz/FuzzDecodeState.
func FuzzDecodeState(f *testing.F) {
	f.Add(script.EncodeState(tokenbucket.State{Last: 1_700_000_000_000_000, Bands: []tokenbucket.Band{{Limit: tokenbucket.Lowest(ratelimit.PerSecond(10)), Level: 500_000}}}))
	f.Add("")
	f.Add(script.EncodeState(tokenbucket.State{Last: 1_700_000_000_000_000, Bands: []tokenbucket.Band{{Limit: tokenbucket.Lowest(ratelimit.PerSecond(10)), Level: -500_000}}}))
	f.Fuzz(func(t *testing.T, raw string) {
		st, err := script.DecodeState(raw)
		if err != nil {
			if !errors.Is(err, tokenbucket.ErrCorruptState) {
				t.Fatalf("DecodeState(%q) = %v, want ErrCorruptState", raw, err)
			}
			return
		}
		if got := script.EncodeState(st); got != raw {
			t.Fatalf("DecodeState(%q) = %+v, which encodes to %q", raw, st, got)
		}
		for _, b := range st.Bands {
			c, p := b.Limit.Capacity, b.Limit.RefillPeriod.Microseconds()
			if b.Level > c*p || b.Level < -min(c, (tokenbucket.MaxExact-c*p)/p)*p {
				t.Fatalf("DecodeState(%q): band %+v holds more than its capacity, or owes more than its floor", raw, b)
			}
		}
	})
}

// TestTheScriptAndDecodeStateRefuseTheSameValues stores each value of the
// fuzz seeds and more at a key and checks that the script refuses it as
// malformed exactly when DecodeState does.
func TestTheScriptAndDecodeStateRefuseTheSameValues(t *testing.T) {
	client := redistest.NewClient(redistest.StartServer(t).Addr())
	t.Cleanup(func() { client.Close() })
	ctx := context.Background()
	limit := ratelimit.PerSecond(10)
	l, _ := ratelimit.New[string](redisstore.New(client), limit)
	now := time.Now().UnixMicro()
	ok := tokenbucket.Band{Limit: tokenbucket.Lowest(limit), Level: 300_000}
	valid := script.EncodeState(tokenbucket.State{Last: now, Bands: []tokenbucket.Band{ok}})
	other := script.EncodeState(tokenbucket.State{Last: now, Bands: []tokenbucket.Band{{Limit: tokenbucket.Lowest(ratelimit.PerMinute(7)), Level: 3}, ok}})
	debt := script.EncodeState(tokenbucket.State{Last: now, Bands: []tokenbucket.Band{{Limit: ok.Limit, Level: -300_000}}})
	floor := script.EncodeState(tokenbucket.State{Last: now, Bands: []tokenbucket.Band{{Limit: ok.Limit, Level: -1_000_000}}})
	beyond := script.EncodeState(tokenbucket.State{Last: now, Bands: []tokenbucket.Band{{Limit: ok.Limit, Level: -1_000_001}}})
	for _, raw := range []string{
		debt, floor, beyond,
		"\x01" + debt[1:],  // a debt in version 1
		"\x02" + valid[1:], // version 2 without a debt
		valid, other, "", "short", valid[:35], valid + "\x00", other[:len(other)-1],
		"\x03" + valid[1:], // another version
		"\x00" + valid[1:], // version 0
		valid[:8] + "\x00\x00\x00\x00\x00\x00\x05" + "\x80\x80\x80\x80\x80\x80\x80" + valid[22:],
		valid[:8] + "\x7f\xff\xff\xff\xff\xff\xff" + valid[15:],
		valid[:1] + "\x7f\xff\xff\xff\xff\xff\xff" + valid[8:],
		valid[:15] + "\x00\x00\x00\x00\x00\x00\x00" + valid[22:], // capacity 0
	} {
		key := l.Key("s")
		client.Set(ctx, key, raw, time.Minute)
		_, luaErr := l.Peek(ctx, "s")
		_, goErr := script.DecodeState(raw)
		if errors.Is(luaErr, tokenbucket.ErrCorruptState) != (goErr != nil) {
			t.Errorf("stored %q: the script says %v, DecodeState %v", raw, luaErr, goErr)
		}
	}
}

func TestAnUnexpectedReplyWrapsItsSentinel(t *testing.T) {
	r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(10)}, Cost: 1}
	entry := func(v ...any) []any { return append([]any{int64(script.ReplyLen)}, v...) }
	ok := entry(int64(1), int64(2), int64(0), int64(0), int64(0))
	for _, reply := range []any{
		nil, "OK", []any{int64(1)}, ok[1:], entry(int64(1), int64(2), "x", int64(0), int64(0)),
		entry(int64(1), int64(2), int64(0)), entry(int64(16), int64(1), int64(0), int64(0), int64(0)), entry(int64(-1), int64(1), int64(0), int64(0), int64(0)),
		append(ok, ok[1:]...), append([]any{int64(6)}, ok[1:]...),
	} {
		if _, err := script.ParseReply(r, reply); !errors.Is(err, redisstore.ErrUnexpectedReply) {
			t.Errorf("ParseReply(%v) = %v, want ErrUnexpectedReply", reply, err)
		}
	}
	// The packed form: W in a byte, then 7 bytes a value.
	pack := func(w byte, v ...int64) string {
		b := []byte{w}
		for _, x := range v {
			b = append(b, byte(x>>48), byte(x>>40), byte(x>>32), byte(x>>24), byte(x>>16), byte(x>>8), byte(x))
		}
		return string(b)
	}
	for _, reply := range []any{
		"", pack(5), pack(5, 1, 2, 0, 0), pack(5, 1, 2, 0, 0, 0, 0), pack(6, 1, 2, 0, 0, 0, 0), pack(7, 1, 2, 0, 0, 0),
		pack(5, 16, 1, 0, 0, 0), pack(5, 1, 2, 0, 0, 0) + "x",
	} {
		if _, err := script.ParseReply(r, reply); !errors.Is(err, redisstore.ErrUnexpectedReply) {
			t.Errorf("ParseReply(%q) = %v, want ErrUnexpectedReply", reply, err)
		}
	}
	for _, reply := range []any{
		entry(int64(3), int64(9), int64(100_000), int64(0), int64(5)),
		pack(5, 3, 9, 100_000, 0, 5),
	} {
		if d, err := script.ParseReply(r, reply); err != nil || !d.Allowed || !d.Converted || d.Remaining != 9 || d.ResetAfter != 100*time.Millisecond+5*time.Microsecond || d.RetryAfter != 0 {
			t.Errorf("a reply %q: %+v %v", reply, d, err)
		}
	}
	// The largest values a key's entry holds, 2^53, and a policy's standings.
	two := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(10), ratelimit.PerMinute(100)}, Cost: 1}
	d, err := script.ParseReply(two, pack(9, 16, 1<<53, 0, 1<<53, 7, 3, 10, 1<<53, 20))
	if err != nil || d.Allowed || d.Binding != 1 || d.Remaining != 1<<53 || d.RetryAfter != (1<<53+7)*time.Microsecond ||
		len(d.Standings) != 2 || d.Standings[0] != (ratelimit.Standing{Remaining: 3, ResetAfter: 17 * time.Microsecond}) || d.Standings[1].Remaining != 1<<53 {
		t.Errorf("a packed reply of two limits: %+v %v", d, err)
	}
}
