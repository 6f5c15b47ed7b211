package main

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

// The script-cost section times a script's body inside Redis, without the
// round trip, the command parsing and the reply: one EVAL runs the body
// harnessIters times in a Lua loop, and INFO commandstats gives the EVAL's
// microseconds. Redis freezes the time during a script, so on one key every
// iteration after the burst is a denial. "fresh" gives every iteration a key
// of its own (a missing bucket); "hot" reuses one, which holds a bucket
// from the start. The least of five tries
// is kept, which sheds most of the noise of a shared machine.

const harnessIters = 2000

func harness(body string, fresh bool) string {
	var b strings.Builder
	b.WriteString("local function body()\n")
	b.WriteString(body)
	b.WriteString("\nend\nlocal base = KEYS[1]\n")
	fmt.Fprintf(&b, "for i = 1, %d do\n", harnessIters)
	if fresh {
		b.WriteString("  KEYS[1] = base .. ':' .. i\n")
	}
	b.WriteString("  body()\nend\nreturn 1\n")
	return b.String()
}

// scriptCost is the time of one run of a script body inside Redis.
type scriptCost struct {
	name      string
	hot, miss float64 // µs per run on one key, and on a missing key
}

// timeBody times body. With a seed script, the hot key first gets a bucket
// from it, so that a cut that never writes still reads and decodes one.
func timeBody(ctx context.Context, admin *redis.Client, body string, fresh bool, seed string, args []any) (float64, error) {
	best := math.Inf(1)
	src := harness(body, fresh)
	for try := range 5 {
		if err := admin.ConfigResetStat(ctx).Err(); err != nil {
			return 0, err
		}
		key := fmt.Sprintf("sc:%s:%d", randHex(), try)
		if seed != "" && !fresh {
			if err := admin.Eval(ctx, seed, []string{key}, args...).Err(); err != nil {
				return 0, err
			}
		}
		if err := admin.Eval(ctx, src, []string{key}, args...).Err(); err != nil {
			return 0, err
		}
		st, err := commandStats(ctx, admin)
		if err != nil {
			return 0, err
		}
		best = math.Min(best, float64(st["eval"].usec)/harnessIters)
	}
	return best, nil
}

// scriptCuts returns the shipped script's general path cut short after each
// of its stages, so that the differences between rows are what each stage
// costs; the last row is the whole shipped script, fast path included.
func scriptCuts() []struct{ name, body string } {
	s := redisstore.Script
	if head, general, err := generalPath(s); err == nil {
		s = head + general
	}
	ret := "\nreturn {1, 1, 0, 0, 0}\n"
	var cuts []struct{ name, body string }
	// The stages after TIME are looked for in the general path, past the
	// fast path's function, which has lines of the same text.
	g := max(strings.Index(s, "-- The general path."), 0)
	index := func(anchor string, from int) int {
		if i := strings.Index(s[from:], anchor); i >= 0 {
			return from + i
		}
		return -1
	}
	add := func(name, anchor string, from int) {
		if i := index(anchor, from); i >= 0 {
			cuts = append(cuts, struct{ name, body string }{name, s[:i] + ret})
		}
	}
	add("tokenbucket.lua up to its ARGV checks (local functions)", "-- The request", 0)
	add("… + ARGV checks", "local now\n", 0)
	add("… + TIME", "-- The stored bucket.", g)
	add("… + GET and decode", "local t0, back = now, 0", g)
	if i, j := index(writeFrom, g), index(writeTo, g); i >= 0 && j > i {
		cuts = append(cuts, struct{ name, body string }{"… + arithmetic (the whole script but the SET)", s[:i] + s[j:]})
	}
	cuts = append(cuts, struct{ name, body string }{"… + encode and SET: the whole general path", s})
	cuts = append(cuts, struct{ name, body string }{"the shipped script (one-limit fast path)", redisstore.Script})
	return cuts
}

func measureScriptCosts(ctx context.Context, admin *redis.Client, p policy) ([]scriptCost, error) {
	ours := []any{"", "1", "0", p.burst, p.rate, 1000000}
	rows := []struct {
		name, body string
		args       []any
	}{
		{"empty script (return a constant)", "return 1", nil},
		{"floor: HINCRBY", FloorScript, nil},
		{"GET + SET PX (the least a bucket needs)", "local v = redis.call('GET', KEYS[1])\nredis.call('SET', KEYS[1], '0123456789abcdefghij', 'PX', 1000)\nreturn 1", nil},
	}
	for _, c := range scriptCuts() {
		rows = append(rows, struct {
			name, body string
			args       []any
		}{c.name, c.body, ours})
	}
	var out []scriptCost
	for _, r := range rows {
		seed := ""
		if r.args != nil {
			seed = redisstore.Script
		}
		hot, err := timeBody(ctx, admin, r.body, false, seed, r.args)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.name, err)
		}
		miss, err := timeBody(ctx, admin, r.body, true, "", r.args)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.name, err)
		}
		out = append(out, scriptCost{name: r.name, hot: hot, miss: miss})
	}
	return out, nil
}
