// Command bench compares this module's limiter with its peers on one Redis,
// in one run: decisions per second, latency, allowed fraction and errors at
// several concurrencies and subject counts, Redis memory per subject, the
// server's cost per decision, the server-side ceiling of our script
// (50 connections × pipelines of 16), and in-process ns/op, allocations and heap bytes
// per subject. It prints a markdown report on stdout and its progress on
// stderr. See README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

type config struct {
	addr          string
	rounds        int
	duration      time.Duration
	conc          []int
	subjects      []int
	only          *regexp.Regexp
	sections      map[string]bool
	instrKeys     []int // the instructions section's keys per call
	instrQuota    bool  // the instructions section's policy has a monthly quota
	instrEval     bool  // the instructions section runs the script by EVALSHA, not FCALL
	instrRate     int64 // the instructions section's refill per second (its burst is the policy's)
	pool          int
	memSubjects   int
	localSubjects int
	localDuration time.Duration
	ceilingN      int
	rate, burst   int64
}

const allSections = "memory,script,throughput,server,ceiling,local,lease"

func defaultConfig() config {
	c := config{
		rounds: 5, duration: 500 * time.Millisecond,
		conc: []int{1, 16, 64}, subjects: []int{1, 10000},
		memSubjects: 10000, localSubjects: 1_000_000, localDuration: 2 * time.Second,
		ceilingN: 300_000, rate: 1000, burst: 1000,
	}
	c.sections = parseSections(allSections)
	return c
}

// quickConfig is the CI smoke test: every section, small and short.
func quickConfig() config {
	c := defaultConfig()
	c.rounds, c.duration = 1, 100*time.Millisecond
	c.memSubjects, c.localSubjects, c.localDuration = 1000, 20_000, 100*time.Millisecond
	c.ceilingN = 20_000
	return c
}

func parseSections(s string) map[string]bool {
	m := map[string]bool{}
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			m[x] = true
		}
	}
	return m
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, x := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(x))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad list %q", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func main() {
	quick := flag.Bool("quick", false, "CI smoke test: 1 round of 100ms, 1,000/20,000 subjects for memory/in-process, a short in-Redis section; takes well under a minute")
	addr := flag.String("addr", "", "use this Redis (host:port) instead of starting redis-server on a free port of 127.0.0.1; it is not flushed, so the used_memory growth is skipped")
	rounds := flag.Int("rounds", 0, "rounds of the interleaved throughput runs (default 5)")
	duration := flag.Duration("duration", 0, "length of one run of one limiter (default 500ms)")
	conc := flag.String("conc", "", "concurrencies (default 1,16,64)")
	subjects := flag.String("subjects", "", "subject counts (default 1,10000)")
	only := flag.String("only", "", "regexp: run only the limiters whose names match (the floor and redis_rate always run, for the ratios)")
	sections := flag.String("sections", allSections, "sections to run (and instructions, which needs valgrind)")
	instrKeys := flag.String("instr-keys", "1,4,16", "instructions section: the keys per call to count")
	instrRate := flag.Int64("instr-rate", 0, "instructions section: the limit's refill per second (default the policy's); 1 keeps every bucket's key between its checks")
	instrQuota := flag.Bool("instr-quota", false, "instructions section: add a quota of a calendar month to the policy, which the checks never exhaust")
	instrEval := flag.Bool("instr-eval", false, "instructions section: run the script by EVALSHA of its body, as redisstore does on a server without functions, rather than by FCALL")
	pool := flag.Int("pool", 0, "go-redis pool size for every go-redis client (0: go-redis's default, 10 per GOMAXPROCS)")
	memSubjects := flag.Int("mem-subjects", 0, "subjects for the used_memory growth (default 10000)")
	localSubjects := flag.Int("local-subjects", 0, "subjects for the in-process heap and ns/op (default 1000000)")
	localDuration := flag.Duration("local-duration", 0, "length of each in-process measurement (default 2s)")
	ceilingN := flag.Int("ceiling-n", 0, "requests per run of the in-Redis section (default 300000)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatal(err)
		}
		defer pprof.StopCPUProfile()
	}

	cfg := defaultConfig()
	if *quick {
		cfg = quickConfig()
	}
	cfg.addr, cfg.pool = *addr, *pool
	setIf := func(dst *int, v int) {
		if v > 0 {
			*dst = v
		}
	}
	setIf(&cfg.rounds, *rounds)
	setIf(&cfg.memSubjects, *memSubjects)
	setIf(&cfg.localSubjects, *localSubjects)
	setIf(&cfg.ceilingN, *ceilingN)
	if *duration > 0 {
		cfg.duration = *duration
	}
	if *localDuration > 0 {
		cfg.localDuration = *localDuration
	}
	var err error
	if *conc != "" {
		if cfg.conc, err = parseInts(*conc); err != nil {
			fatal(err)
		}
	}
	if *subjects != "" {
		if cfg.subjects, err = parseInts(*subjects); err != nil {
			fatal(err)
		}
	}
	if *only != "" {
		if cfg.only, err = regexp.Compile(*only); err != nil {
			fatal(err)
		}
	}
	cfg.sections = parseSections(*sections)
	cfg.instrQuota, cfg.instrRate, cfg.instrEval = *instrQuota, *instrRate, *instrEval
	if cfg.instrKeys, err = parseInts(*instrKeys); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cmdline := "go run . " + strings.Join(os.Args[1:], " ")
	if err := run(cfg, cmdline, os.Stdout, os.Stderr); err != nil {
		pprof.StopCPUProfile()
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// run runs the sections of cfg and writes the report to out.
func run(cfg config, cmdline string, out, progress io.Writer) error {
	logf := func(format string, args ...any) { fmt.Fprintf(progress, format+"\n", args...) }
	ctx := context.Background()
	p := policy{rate: cfg.rate, burst: cfg.burst}

	loadText, load1, loadOK := loadAverage()
	logf("load average (1, 5, 15 min) at the start: %s", loadText)
	if w := loadWarning(load1, loadOK, -1); w != "" {
		logf("%s", w)
	}
	addr, owned, redisPID := cfg.addr, false, 0
	if addr == "" {
		srv, err := startServer()
		if err != nil {
			return err
		}
		defer srv.stop()
		addr, owned, redisPID = srv.addr, true, srv.cmd.Process.Pid
	}
	cpu0, t0 := sampleCPU(redisPID), time.Now()
	admin := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer admin.Close()
	version := "?"
	if info, err := admin.Info(ctx, "server").Result(); err == nil {
		for _, l := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(l, "redis_version:"); ok {
				version = v
			}
		}
	} else {
		return fmt.Errorf("redis at %s: %w", addr, err)
	}
	e := env{addr: addr, pool: cfg.pool, policy: p, redisPID: redisPID}
	rep := &report{cfg: cfg, cmdline: cmdline, redisVersion: version, owned: owned, gomaxprocs: runtime.GOMAXPROCS(0), ncpu: runtime.NumCPU(), loadStart: loadText}

	var cs []contender
	for _, c := range contenders() {
		if cfg.only == nil || cfg.only.MatchString(c.name) || c.name == "floor (go-redis)" || c.name == "skeleton (go-redis)" || c.name == "redis_rate v10" {
			cs = append(cs, c)
		}
	}
	rep.contenders = cs
	scripts, err := serverScripts(p)
	if err != nil {
		return err
	}

	if cfg.sections["memory"] {
		logf("memory: MEMORY USAGE, and used_memory growth over %d subjects after %d", cfg.memSubjects, cfg.memSubjects)
		for _, c := range cs {
			if !c.remote || strings.Contains(c.name, "prototype") {
				continue
			}
			r, err := measureMemory(ctx, admin, owned, c.name, func() (Checker, error) { return c.build(e) }, p, cfg.memSubjects)
			if err != nil {
				return fmt.Errorf("memory of %s: %w", c.name, err)
			}
			r.note = c.note
			rep.memory = append(rep.memory, r)
			logf("  %-34s keys %d, MEMORY USAGE %d B, growth %.0f B", c.name, r.keys, r.usage, r.growth)
		}
	}

	if cfg.sections["script"] {
		logf("script cost: bodies timed inside Redis, %d runs per EVAL, least of 5", harnessIters)
		sc, err := measureScriptCosts(ctx, admin, scripts)
		if err != nil {
			return fmt.Errorf("script cost: %w", err)
		}
		rep.scriptCosts = sc
		for _, c := range sc {
			logf("  %-58s hot %5.2f µs, missing key %5.2f µs", c.name, c.hot, c.miss)
		}
	}

	if cfg.sections["throughput"] {
		if err := runThroughput(ctx, cs, e, cfg, rep, logf); err != nil {
			return err
		}
	}

	if cfg.sections["server"] {
		logf("server cost: each Redis limiter alone, concurrency 16, %d subjects", max(cfg.subjects[len(cfg.subjects)-1], 1))
		subj := makeSubjects("sc", cfg.subjects[len(cfg.subjects)-1])
		for _, c := range cs {
			if !c.remote {
				continue
			}
			chk, err := c.build(e)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			runOne(chk, 16, subj, cfg.duration/4) // warm the pool
			sc, err := measureServerCost(ctx, admin, c.name, chk, 16, subj, cfg.duration)
			chk.Close()
			if err != nil {
				return fmt.Errorf("server cost of %s: %w", c.name, err)
			}
			rep.server = append(rep.server, sc)
			logf("  %-34s %.1f µs CPU/decision; %s", c.name, sc.cpuUs, sc.commands)
		}
	}

	if cfg.sections["ceiling"] {
		if err := runCeiling(ctx, admin, addr, scripts, cfg, rep, logf); err != nil {
			return fmt.Errorf("ceiling: %w", err)
		}
	}

	if cfg.sections["instructions"] {
		logf("instructions: redis-server under callgrind, our script, calls of K keys")
		ip := p
		if cfg.instrRate > 0 {
			ip.rate = cfg.instrRate
		}
		ic, err := measureInstructions(ctx, ip, cfg.instrKeys, instrScript{quota: cfg.instrQuota, eval: cfg.instrEval})
		if err != nil {
			return fmt.Errorf("instructions: %w", err)
		}
		rep.instructions = ic
		for _, c := range ic {
			logf("  K=%-2d %8.0f instructions per decision", c.k, c.perOp)
		}
		if rep.instrSkeleton, err = instructionsPerDecision(ctx, ip, 1, instrScript{skeleton: true}); err != nil {
			return fmt.Errorf("instructions, the skeleton: %w", err)
		}
		logf("  the skeleton %8.0f instructions per call", rep.instrSkeleton)
	}

	if cfg.sections["lease"] {
		logf("lease: one subject, %d limiters × %d goroutines, plain and WithLeases, %d rounds of %v", leaseProcs, leaseGoroutines, cfg.rounds, cfg.duration)
		if err := runLeases(ctx, admin, e, cfg, rep, logf); err != nil {
			return fmt.Errorf("lease: %w", err)
		}
	}

	if cfg.sections["local"] {
		prev := runtime.GOMAXPROCS(2)
		logf("in-process: GOMAXPROCS=2, hot subject and %d subjects, %v each", cfg.localSubjects, cfg.localDuration)
		for _, lc := range localContenders() {
			if cfg.only != nil && !cfg.only.MatchString(lc.name) && !strings.HasPrefix(lc.name, "x/time") && !strings.HasPrefix(lc.name, "go-limiter") {
				continue
			}
			r, err := measureLocal(lc, p, cfg.localSubjects, cfg.localDuration)
			if err != nil {
				return fmt.Errorf("%s: %w", lc.name, err)
			}
			rep.local = append(rep.local, r)
			rep.localNotes = append(rep.localNotes, lc.name+": "+lc.note)
			logf("  %-36s hot %.0f ns %.1f allocs; %d subjects %.0f ns %.1f allocs; %.0f B/subject",
				lc.name, r.hotNs, r.hotAllocs, r.subjects, r.manyNs, r.manyAllocs, r.bytesPerSubject)
		}
		runtime.GOMAXPROCS(prev)
	}

	rep.others = othersCores(cpu0, sampleCPU(redisPID), time.Since(t0).Seconds())
	rep.loadEnd, _, _ = loadAverage()
	rep.warning = loadWarning(load1, loadOK, rep.others)
	logf("load average at the end: %s; other processes' CPU during the run: %s", rep.loadEnd, fmtCores(rep.others))
	if rep.warning != "" {
		logf("%s", rep.warning)
	}
	rep.write(out)
	return nil
}

func makeSubjects(tag string, n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = tag + ":" + strconv.Itoa(i)
	}
	return s
}

// runThroughput builds every contender once, warms it, and then runs the
// rounds: in each round every configuration, and in each configuration every
// contender in turn (A B C ...), so that a noisy stretch of the machine hits
// all of them alike. Each run uses fresh subjects.
func runThroughput(ctx context.Context, cs []contender, e env, cfg config, rep *report, logf func(string, ...any)) error {
	chks := make([]Checker, len(cs))
	for i, c := range cs {
		chk, err := c.build(e)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		defer chk.Close()
		chks[i] = chk
		runOne(chk, slices.Max(cfg.conc), makeSubjects("warm", 100), min(cfg.duration, 200*time.Millisecond))
	}
	rep.runs = map[runKey][]result{}
	start := time.Now()
	for round := range cfg.rounds {
		for _, conc := range cfg.conc {
			for _, n := range cfg.subjects {
				for i, c := range cs {
					subj := makeSubjects(fmt.Sprintf("r%dc%d", round, conc), n)
					redis0, ok0 := redisTicks(e.redisPID)
					r := runOne(chks[i], conc, subj, cfg.duration)
					if redis1, ok1 := redisTicks(e.redisPID); ok0 && ok1 && c.remote {
						r.redisCPU = time.Duration(redis1-redis0) * time.Second / clockTicks
					}
					k := runKey{c.name, conc, n}
					rep.runs[k] = append(rep.runs[k], r)
				}
			}
		}
		logf("throughput: round %d/%d done (%v)", round+1, cfg.rounds, time.Since(start).Round(time.Second))
	}
	return nil
}
