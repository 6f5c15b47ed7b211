package main

import (
	"context"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/redis/go-redis/v9"
)

// TestServerScripts loads the scripts of the in-Redis comparison into a real
// redis-server and runs each once with its ARGV as redis-benchmark passes
// them (strings), loaded as the ceiling section loads them (see
// serverScript.load): each answers as its library expects.
func TestServerScripts(t *testing.T) {
	srv := testServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.addr, MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	scripts, err := serverScripts(policy{rate: 1000, burst: 1000})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range scripts {
		names[s.name] = true
		if err := s.load(ctx, c); err != nil {
			t.Fatal(err)
		}
		if err := checkReply(ctx, c, s); err != nil {
			t.Error(err)
		}
	}
	for _, want := range []string{scriptOurs, scriptOursQuota, scriptRedisRate, scriptSkeleton, scriptFloor} {
		if !names[want] {
			t.Errorf("no %s among the server scripts", want)
		}
	}
}

// TestOurServerArgs holds the ceiling's ARGV for our script to the one
// redisstore sends for a one-limit PerSecond(1000) check, written as
// go-redis writes it, and to a bucket of 1000: on a key checked at a fixed
// time, the 1000th check is allowed and the 1001st denied.
func TestOurServerArgs(t *testing.T) {
	scripts, err := serverScripts(policy{rate: 1000, burst: 1000})
	if err != nil {
		t.Fatal(err)
	}
	r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(1000)}, Cost: 1}
	want := argStrings(new(script.Encoder).Args(r))
	got := argStrings(scripts[0].args)
	if scripts[0].name != scriptOurs || strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("%s ARGV %q, redisstore's encoder gives %q", scripts[0].name, got, want)
	}
	if len(got) != 4 || got[0] != "" || got[1] != "each" {
		t.Errorf("ARGV %q, want the server's TIME (\"\"), the mode \"each\", then cost and policy", got)
	}

	// The same ARGV with a fixed time in place of the server's: 1000 allowed, then denied.
	srv := testServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.addr, MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	args := []any{strconv.FormatInt(time.Now().UnixMicro(), 10)}
	for _, a := range got[1:] {
		args = append(args, a)
	}
	key := "args:" + randHex()
	pipe := c.Pipeline()
	cmds := make([]*redis.Cmd, 1001)
	for i := range cmds {
		cmds[i] = pipe.EvalSha(ctx, script.SHA, []string{key}, args...)
	}
	if err := c.ScriptLoad(ctx, script.Source).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, cmd := range cmds {
		res, err := cmd.Result()
		if err != nil {
			t.Fatalf("check %d: %v", i+1, err)
		}
		d, err := script.ParseReply(r, res)
		if err != nil {
			t.Fatalf("check %d: %v", i+1, err)
		}
		if d.Allowed != (i < 1000) {
			t.Fatalf("check %d: allowed %v, remaining %d", i+1, d.Allowed, d.Remaining)
		}
	}
}

// TestCaptureRedisRate checks that the redis_rate script is the module's
// GCRA script and its ARGV what AllowN passes for 1000/s, burst 1000, one
// token: burst, rate, period in seconds, cost.
func TestCaptureRedisRate(t *testing.T) {
	body, args, err := captureRedisRate(policy{rate: 1000, burst: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"emission_interval", "redis.call(\"TIME\")", "redis.call(\"GET\", rate_limit_key)", "\"SET\", rate_limit_key"} {
		if !strings.Contains(body, want) {
			t.Errorf("captured script lacks %q:\n%s", want, body)
		}
	}
	if got := strings.Join(argStrings(args), " "); got != "1000 1000 1 1" {
		t.Errorf("captured ARGV %q, want \"1000 1000 1 1\"", got)
	}
}

// TestSkeletonScript checks that the skeleton runs TIME, GET and SET ... PX
// and nothing else: the key holds the server's time and expires.
func TestSkeletonScript(t *testing.T) {
	srv := testServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.addr, MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	key := "skel:" + randHex()
	if err := c.Eval(ctx, SkeletonScript, []string{key}, "60000").Err(); err != nil {
		t.Fatal(err)
	}
	v, err := c.Get(ctx, key).Result()
	// TIME's seconds (10 digits) then its microseconds, which the script
	// does not pad: 1 to 6 digits.
	if err != nil || !regexp.MustCompile(`^[0-9]{10}[0-9]{1,6}$`).MatchString(v) {
		t.Errorf("stored %q, %v; want the server's TIME as digits", v, err)
	}
	if ttl, err := c.PTTL(ctx, key).Result(); err != nil || ttl <= 0 || ttl > time.Minute {
		t.Errorf("PTTL %v, %v; want up to 60 s", ttl, err)
	}
	st, err := commandStats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"time", "get", "set"} {
		if st[cmd].calls < 1 {
			t.Errorf("the skeleton did not run %s: %v", strings.ToUpper(cmd), st)
		}
	}
}

func TestArgStrings(t *testing.T) {
	for _, tc := range []struct {
		in   []any
		want string
	}{
		{[]any{"", 1, int64(1000), "\x01\xe8\x07"}, "|1|1000|\x01\xe8\x07"},
		{[]any{1000, 1000, 1.0, 1}, "1000|1000|1|1"},
		{[]any{0.5, int64(-1)}, "0.5|-1"},
		{nil, ""},
	} {
		if got := strings.Join(argStrings(tc.in), "|"); got != tc.want {
			t.Errorf("argStrings(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestLoadWarning(t *testing.T) {
	for _, tc := range []struct {
		name   string
		load   float64
		ok     bool
		others float64
		want   string // "" for no warning, else a part of it
	}{
		{"quiet", 0.05, true, 0.1, ""},
		{"quiet, others unknown", 0.5, true, -1, ""},
		{"loaded at the start", 0.51, true, -1, "load average 0.51 at the start"},
		{"others busy during the run", 0.1, true, 0.8, "other processes used 0.80 cores"},
		{"unreadable", 0, false, -1, "could not be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := loadWarning(tc.load, tc.ok, tc.others)
			switch {
			case tc.want == "" && got != "":
				t.Errorf("warning %q for a quiet run", got)
			case tc.want != "" && (!strings.HasPrefix(got, "WARNING: ") || !strings.Contains(got, tc.want) || !strings.Contains(got, "noise")):
				t.Errorf("warning %q, want one saying %q", got, tc.want)
			}
		})
	}
}

func TestSampleCPU(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc: Linux only")
	}
	a := sampleCPU(0)
	deadline := time.Now().Add(50 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	b := sampleCPU(0)
	if !a.ok || !b.ok {
		t.Fatalf("sampleCPU not ok: %+v %+v", a, b)
	}
	if b.own < a.own || b.busy < a.busy || b.busy-a.busy < b.own-a.own-2 {
		t.Errorf("samples %+v then %+v: own time must grow no faster than the machine's", a, b)
	}
	if c := othersCores(a, b, 0.05); c < 0 {
		t.Errorf("othersCores = %v, want ≥ 0", c)
	}
}

// TestTargets checks the targets table's arithmetic on figures made up for
// the purpose, and that a target whose section did not run is "not
// measured", never a pass.
func TestTargets(t *testing.T) {
	run := func(rate float64, p50 time.Duration) []result {
		return []result{{ops: int64(rate), elapsed: time.Second, p50: p50}}
	}
	rep := &report{cfg: defaultConfig(), runs: map[runKey][]result{
		{"ours: redisstore", 64, 10000}:           {{ops: 100_000, elapsed: time.Second, p50: time.Millisecond, redisCPU: 700 * time.Millisecond}},
		{"redis_rate v10", 64, 10000}:             {{ops: 40_000, elapsed: time.Second, p50: time.Millisecond, redisCPU: 720 * time.Millisecond}},
		{"ours: redisstore, by Plans", 64, 10000}: run(95_000, time.Millisecond),
		{"floor (go-redis)", 64, 10000}:           run(90_000, time.Millisecond),
		{"ours: redisstore", 1, 10000}:            {{ops: 10_000, elapsed: time.Second, p50: 120 * time.Microsecond, cpu: 500 * time.Millisecond}},
		{"floor (go-redis)", 1, 10000}:            {{ops: 12_000, elapsed: time.Second, p50: 100 * time.Microsecond, cpu: 480 * time.Millisecond}},
		{"skeleton (go-redis)", 1, 10000}:         {{ops: 11_000, elapsed: time.Second, p50: 110 * time.Microsecond}},
	}, ceiling: []ceilingResult{
		{name: scriptOurs, subjects: 10000, rps: 120_000}, {name: scriptOurs, subjects: 10000, rps: 100_000}, {name: scriptOurs, subjects: 10000, rps: 110_000},
		{name: scriptRedisRate, subjects: 10000, rps: 100_000},
		{name: scriptSkeleton, subjects: 10000, rps: 150_000},
	}, local: []localResult{
		{name: "ours: memstore", hotNs: 90, manyNs: 500, manyAllocs: 1, subjects: 1_000_000},
		{name: "ours: memstore, all subjects live", manyNs: 400, bytesPerSubject: 88, subjects: 1_000_000},
		{name: "go-limiter memorystore", hotNs: 100, manyNs: 400},
		{name: "x/time/rate map", hotNs: 120, manyNs: 650},
	}}
	want := []struct{ value, verdict string }{
		{"2.50×", "pass (goal 2.5× met)"},
		{"1.11×", "pass"},
		{"–", "not measured"}, // no quota run in this report
		{"0.95×", "pass"},     // by Plans: 95k against 100k
		{"0.39×", "pass"},     // 7 µs of Redis CPU a decision against 18
		{"1.20×", "FAIL"},
		{"1.10×", "pass (a yardstick: the least any bucket on the server's clock does)"},
		{"+10.0µs", "FAIL"}, // 50 µs a check against the floor's 40
		{"1.10×", "pass"},   // median of 120k, 100k, 110k over 100k
		{"0.73×", "FAIL"},
		{"0.90×", "pass"},
		{"1.25×", "FAIL"},
		{"1.00", "FAIL"},
		{"88 B", "pass"},
		{"–", "not measured"}, // 5: no lease section in this report
		{"–", "not measured"},
	}
	got := rep.targets()
	if len(got) != len(want) {
		t.Fatalf("%d targets, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].value != w.value || got[i].verdict() != w.verdict {
			t.Errorf("%s: %s %s, want %s %s", got[i].name, got[i].value, got[i].verdict(), w.value, w.verdict)
		}
	}

	empty := &report{cfg: defaultConfig()}
	for _, tg := range empty.targets() {
		if tg.verdict() != "not measured" || !strings.Contains(tg.measured, "needs -") {
			t.Errorf("%s with nothing measured: %q, %q", tg.name, tg.verdict(), tg.measured)
		}
	}
}

// TestCeilingSeesErrorReplies checks that redis-benchmark really runs the
// ARGV it is given, and that a run on an ARGV the script refuses is an error
// of the ceiling section: redis-benchmark 7 stops at an error reply, and
// runCeiling also holds total_error_replies at zero for a redis-benchmark
// that would count it as a request served.
func TestCeilingSeesErrorReplies(t *testing.T) {
	srv := testServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.addr, MaxRetries: -1, DisableIdentity: true})
	defer c.Close()
	ctx := context.Background()
	if err := c.FunctionLoad(ctx, script.Library).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	scripts, err := serverScripts(policy{rate: 1000, burst: 1000})
	if err != nil {
		t.Fatal(err)
	}
	good := argStrings(scripts[0].args)
	bad := append([]string(nil), good...)
	bad[2] = "0" // cost 0: refused
	for _, tc := range []struct {
		name string
		args []string
		fail bool
	}{{"shipped ARGV", good, false}, {"cost 0", bad, true}} {
		e0, ok0 := errorReplies(ctx, c)
		ours := scripts[0]
		ours.name, ours.tag = tc.name, "errcheck"
		_, err := redisBenchmark(srv.addr, 200, 100, ours, tc.args...)
		e1, ok1 := errorReplies(ctx, c)
		if !ok0 || !ok1 {
			t.Fatal("no total_error_replies in INFO stats")
		}
		if failed := err != nil || e1 > e0; failed != tc.fail {
			info, _ := c.Info(ctx, "errorstats").Result()
			t.Errorf("%s: run error %v, %d error replies (%s)", tc.name, err, e1-e0, strings.TrimSpace(info))
		}
	}
}
