package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// ceilingResult is the rate of one script in one run of the in-Redis section.
type ceilingResult struct {
	name     string
	subjects int
	round    int
	rps      float64
	p50      float64 // ms
	args     string
}

// runCeiling loads the scripts of the in-Redis comparison, checks that each
// answers its ARGV as its library expects, and drives it as redis-benchmark -c 50
// -P 16 on each, interleaved: in every round, for every subject count, each
// script in turn (A B C … A B C …), so that a noisy stretch of the machine
// hits all of them alike. The report takes the medians over the rounds.
func runCeiling(ctx context.Context, admin *redis.Client, addr string, scripts []serverScript, cfg config, rep *report, logf func(string, ...any)) error {
	logf("ceiling: 50 connections × pipelines of 16 from Go, %d requests per run, %d rounds", cfg.ceilingN, cfg.rounds)
	for _, s := range scripts {
		if err := s.load(ctx, admin); err != nil {
			return err
		}
		if err := checkReply(ctx, admin, s); err != nil {
			return err
		}
	}
	for round := range cfg.rounds {
		for _, n := range cfg.subjects {
			for _, s := range scripts {
				errs0, errsOK := errorReplies(ctx, admin)
				r, err := redisBenchmark(addr, cfg.ceilingN, n, s, argStrings(s.args)...)
				if err != nil {
					return fmt.Errorf("%s: %w", s.name, err)
				}
				// An error reply is a request like any other to Redis's rate:
				// other: a run that drew errors measured nothing.
				if errs1, ok := errorReplies(ctx, admin); errsOK && ok && errs1 > errs0 {
					return fmt.Errorf("%s over %d subjects: %d error replies during the run", s.name, n, errs1-errs0)
				}
				r.round = round
				rep.ceiling = append(rep.ceiling, r)
				logf("  round %d %-32s %6d subjects: %.0f/s", round+1, s.name, n, r.rps)
			}
		}
	}
	return nil
}

// load loads s into the server of admin as the ceiling runs it: SCRIPT LOAD,
// which must name it by s.sha, and FUNCTION LOAD of its library when it
// runs as a function.
func (s serverScript) load(ctx context.Context, admin *redis.Client) error {
	sha, err := admin.ScriptLoad(ctx, s.body).Result()
	if err != nil {
		return fmt.Errorf("SCRIPT LOAD %s: %w", s.name, err)
	}
	if sha != s.sha {
		return fmt.Errorf("%s: SCRIPT LOAD gave %s, want %s", s.name, sha, s.sha)
	}
	if s.lib != "" {
		if err := admin.FunctionLoad(ctx, s.lib).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
			return fmt.Errorf("FUNCTION LOAD %s: %w", s.name, err)
		}
	}
	return nil
}

// checkReply runs s once on a key of its own, with its ARGV as the
// redis-benchmark command line passes them (strings), and checks the reply:
// redis-benchmark counts error replies as requests like any other.
func checkReply(ctx context.Context, admin *redis.Client, s serverScript) error {
	args := make([]any, len(s.args))
	for i, a := range argStrings(s.args) {
		args[i] = a
	}
	res, err := s.call(ctx, admin, "rb:check:"+s.tag+":"+randHex(), args).Result()
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	if s.check != nil {
		if err := s.check(res); err != nil {
			return fmt.Errorf("%s: reply %v: %w", s.name, res, err)
		}
	}
	return nil
}

// errorReplies returns INFO stats' total_error_replies (Redis 6.2 and
// later); ok is false when the server does not report it.
func errorReplies(ctx context.Context, admin *redis.Client) (n int64, ok bool) {
	info, err := admin.Info(ctx, "stats").Result()
	if err != nil {
		return 0, false
	}
	n, err = infoInt(info, "total_error_replies")
	return n, err == nil
}

// redisBenchmark drives s (see serverScript.call) with args as redis-benchmark -c 50
// -P 16 would, from Go: 50 connections, each sending pipelines of 16 calls
// one after the other, until n calls are answered, on subjects keys drawn at
// random (one hot key when subjects is 1). It returns calls per second and
// the median pipeline round trip (each call of a pipeline waits for all of
// it, as in redis-benchmark's -P). A Go client is used because the shipped
// script's policy argument holds zero bytes, which a command line cannot
// carry; every script is driven the same way, so the rates compare. Any
// error reply fails the run.
func redisBenchmark(addr string, n, subjects int, s serverScript, args ...string) (ceilingResult, error) {
	name, tag := s.name, s.tag
	const conns, depth = 50, 16
	res := ceilingResult{name: name, subjects: subjects}
	key := "rb:" + tag + ":hot"
	if subjects > 1 {
		key = "rb:" + tag + ":<random of " + strconv.Itoa(subjects) + ">"
	}
	command := "EVALSHA <sha>"
	if s.fn != "" {
		command = "FCALL " + s.fn
	}
	res.args = fmt.Sprintf("%d connections × pipelines of %d, %d calls: %s 1 %s %s", conns, depth, n, command, key, quoteArgs(args))
	// No CLIENT SETINFO or MAINT_NOTIFICATIONS handshake: each is an error
	// reply on an older Redis, and the run must see none.
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: conns, MaxRetries: -1, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer c.Close()
	argv := make([]any, len(args))
	for i, a := range args {
		argv[i] = a
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var next atomic.Int64
	var firstErr atomic.Value
	trips := make([][]time.Duration, conns)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			for next.Add(depth) <= int64(n) && ctx.Err() == nil {
				pipe := c.Pipeline()
				cmds := make([]*redis.Cmd, depth)
				for i := range cmds {
					k := "rb:" + tag + ":hot"
					if subjects > 1 {
						k = "rb:" + tag + ":" + strconv.Itoa(rng.IntN(subjects))
					}
					cmds[i] = s.call(ctx, pipe, k, argv)
				}
				t0 := time.Now()
				pipe.Exec(ctx)
				trips[w] = append(trips[w], time.Since(t0))
				for _, cmd := range cmds {
					if err := cmd.Err(); err != nil {
						firstErr.CompareAndSwap(nil, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		return res, fmt.Errorf("error reply: %w", err)
	}
	var all []time.Duration
	for _, t := range trips {
		all = append(all, t...)
	}
	if len(all) == 0 {
		return res, fmt.Errorf("no call answered")
	}
	slices.Sort(all)
	res.rps = float64(len(all)*depth) / elapsed.Seconds()
	res.p50 = float64(all[len(all)/2]) / float64(time.Millisecond)
	return res, nil
}

// quoteArgs writes args for the report: as they are when printable, quoted
// (Go syntax) when empty or binary, like our limits' signatures.
func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.IndexFunc(a, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			a = strconv.Quote(a)
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

// cmdStat is one line of INFO commandstats.
type cmdStat struct {
	calls int64
	usec  int64
}

func commandStats(ctx context.Context, admin *redis.Client) (map[string]cmdStat, error) {
	info, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	stats := map[string]cmdStat{}
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var s cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				s.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				s.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		stats[strings.TrimPrefix(name, "cmdstat_")] = s
	}
	return stats, nil
}

func serverCPU(ctx context.Context, admin *redis.Client) (float64, error) {
	info, err := admin.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	u, err := infoFloat(info, "used_cpu_user")
	if err != nil {
		return 0, err
	}
	s, err := infoFloat(info, "used_cpu_sys")
	return u + s, err
}

// serverCost is what one limiter costs Redis per decision.
type serverCost struct {
	name     string
	ops      int64
	rate     float64
	cpuUs    float64 // server CPU (user+sys) per decision, µs
	commands string  // calls per decision and µs per call of each command
	scriptUs float64 // µs per EVALSHA/EVAL call (including the commands it runs)
}

// measureServerCost runs chk alone for d (after CONFIG RESETSTAT) and reads
// INFO commandstats and INFO cpu.
func measureServerCost(ctx context.Context, admin *redis.Client, name string, chk Checker, conc int, subjects []string, d time.Duration) (serverCost, error) {
	sc := serverCost{name: name}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		return sc, err
	}
	cpu0, err := serverCPU(ctx, admin)
	if err != nil {
		return sc, err
	}
	r := runOne(chk, conc, subjects, d)
	cpu1, err := serverCPU(ctx, admin)
	if err != nil {
		return sc, err
	}
	stats, err := commandStats(ctx, admin)
	if err != nil {
		return sc, err
	}
	sc.ops, sc.rate = r.ops, r.rate()
	sc.cpuUs = (cpu1 - cpu0) * 1e6 / float64(r.ops)
	var names []string
	for n := range stats {
		if n == "config|resetstat" || n == "info" || n == "hello" || n == "client|setinfo" || n == "ping" {
			continue
		}
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	var scriptCalls, scriptUsec int64
	for _, n := range names {
		s := stats[n]
		if float64(s.calls)/float64(r.ops) < 0.001 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.2f×%.1fµs", n, float64(s.calls)/float64(r.ops), float64(s.usec)/float64(max(s.calls, 1))))
		if n == "fcall" || n == "evalsha" || n == "eval" {
			scriptCalls += s.calls
			scriptUsec += s.usec
		}
	}
	sc.commands = strings.Join(parts, ", ")
	if scriptCalls > 0 {
		sc.scriptUs = float64(scriptUsec) / float64(scriptCalls)
	}
	return sc, nil
}
