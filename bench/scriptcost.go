package main

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The script-cost section times a script's body inside Redis, without the
// round trip, the command parsing and the reply: one EVAL runs the body
// harnessIters times in a Lua loop, and INFO commandstats gives the EVAL's
// microseconds. Redis freezes the time during a script, so on one key every
// iteration after the burst is a denial. "fresh" gives every iteration a key
// of its own (a missing bucket); "hot" reuses one, which holds a bucket
// from the start. The least of five tries
// is kept, which sheds most of the noise of a shared machine. Each body is
// the whole script, as shipped by its library.

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

// measureScriptCosts times, inside Redis, an empty script and the scripts
// of the in-Redis comparison (serverScripts), each with its own ARGV.
func measureScriptCosts(ctx context.Context, admin *redis.Client, scripts []serverScript) ([]scriptCost, error) {
	rows := append([]serverScript{{name: "empty script (return a constant)", body: "return 1"}}, scripts...)
	var out []scriptCost
	for _, r := range rows {
		hot, err := timeBody(ctx, admin, r.body, false, r.body, r.args)
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
