package main

import (
	"fmt"
	"io"
	"math"
	"os/exec"
	"slices"
	"strings"
	"time"
)

type runKey struct {
	name     string
	conc     int
	subjects int
}

type report struct {
	cfg          config
	cmdline      string
	redisVersion string
	owned        bool
	gomaxprocs   int
	ncpu         int
	// The machine's load: the load averages at the start and end, and the
	// mean cores other processes used during the run (negative: unknown).
	loadStart, loadEnd string
	warning            string
	others             float64

	contenders   []contender
	runs         map[runKey][]result
	memory       []memResult
	server       []serverCost
	ceiling      []ceilingResult
	local        []localResult
	instructions []instructionCount
	// instrSkeleton: the skeleton's instructions per call, by EVALSHA, one key a call
	instrSkeleton float64
	scriptCosts   []scriptCost
	localNotes    []string
	leases        [2][]leaseRun // by leaseModes
}

// stat is the median over the rounds of one configuration.
type stat struct {
	rate, p50, p99, allowed, errFrac float64
	cpu                              float64 // the client's CPU per check, ns (0: not read)
	redisCPU                         float64 // redis-server's CPU per check, ns (0: not read)
	spread                           float64 // (max-min)/median of the rates
	errs                             int64
	firstErr                         string
	n                                int
}

func (rep *report) stat(name string, conc, subjects int) (stat, bool) {
	rs := rep.runs[runKey{name, conc, subjects}]
	if len(rs) == 0 {
		return stat{}, false
	}
	var rates, p50, p99, allowed, errFrac, cpu, redisCPU []float64
	var s stat
	for _, r := range rs {
		rates = append(rates, r.rate())
		p50 = append(p50, float64(r.p50))
		p99 = append(p99, float64(r.p99))
		cpu = append(cpu, float64(r.cpuPerOp()))
		if r.ops > 0 {
			redisCPU = append(redisCPU, float64(r.redisCPU)/float64(r.ops))
		}
		allowed = append(allowed, r.allowedFrac())
		errFrac = append(errFrac, float64(r.errors)/math.Max(1, float64(r.ops)))
		s.errs += r.errors
		if s.firstErr == "" {
			s.firstErr = r.firstErr
		}
	}
	s.rate, s.p50, s.p99, s.allowed, s.errFrac = median(rates), median(p50), median(p99), median(allowed), median(errFrac)
	s.cpu = median(cpu)
	if len(redisCPU) > 0 {
		s.redisCPU = median(redisCPU)
	}
	lo, hi := rates[0], rates[0]
	for _, r := range rates {
		lo, hi = math.Min(lo, r), math.Max(hi, r)
	}
	if s.rate > 0 {
		s.spread = (hi - lo) / s.rate
	}
	s.n = len(rs)
	return s, true
}

func fmtRate(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2fM", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%.1fk", r/1e3)
	}
	return fmt.Sprintf("%.0f", r)
}

func fmtDur(ns float64) string {
	d := time.Duration(ns)
	switch {
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	case d >= time.Microsecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	}
	return fmt.Sprintf("%dns", d)
}

// fmtCPU writes a CPU time per decision in µs to a tenth, or – when it
// was not read.
func fmtCPU(ns float64) string {
	if ns <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.1fµs", ns/1e3)
}

func ratio(a, b float64) string {
	if b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func (rep *report) write(w io.Writer) {
	cfg := rep.cfg
	fmt.Fprintf(w, "Command: `%s` (in bench/, on %s; library tree %s)  \n", strings.TrimSpace(rep.cmdline), time.Now().UTC().Format("2006-01-02 15:04 MST"), treeVersion())
	where := "redis-server started by the program on 127.0.0.1"
	if !rep.owned {
		where = "the Redis at " + cfg.addr
	}
	fmt.Fprintf(w, "Redis %s (%s); %d CPUs, GOMAXPROCS %d; policy %d/s, burst %d; %d rounds of %v per limiter and configuration; medians over the rounds.  \n",
		rep.redisVersion, where, rep.ncpu, rep.gomaxprocs, cfg.rate, cfg.burst, cfg.rounds, cfg.duration)
	fmt.Fprintf(w, "Load average (1, 5, 15 min) at the start: %s; at the end: %s (the end includes the bench's own load); other processes' CPU during the run: %s.\n\n",
		rep.loadStart, rep.loadEnd, fmtCores(rep.others))
	if rep.warning != "" {
		fmt.Fprintf(w, "**%s**\n\n", rep.warning)
	}

	if len(rep.runs) > 0 {
		rep.writeThroughput(w)
	}
	if len(rep.ceiling) > 0 {
		rep.writeCeiling(w)
	}
	if len(rep.server) > 0 {
		fmt.Fprintf(w, "### Server cost per decision (each limiter alone, concurrency 16, %d subjects, after CONFIG RESETSTAT)\n\n", cfg.subjects[len(cfg.subjects)-1])
		fmt.Fprintln(w, "| limiter | decisions/s | Redis CPU µs/decision | script µs/call | INFO commandstats: calls per decision × µs per call |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---|")
		for _, s := range rep.server {
			script := "–"
			if s.scriptUs > 0 {
				script = fmt.Sprintf("%.1f", s.scriptUs)
			}
			fmt.Fprintf(w, "| %s | %s | %.1f | %s | %s |\n", s.name, fmtRate(s.rate), s.cpuUs, script, s.commands)
		}
		fmt.Fprintln(w)
	}
	if len(rep.scriptCosts) > 0 {
		fmt.Fprintf(w, "### Script cost inside Redis (each script's body, without the round trip)\n\n")
		fmt.Fprintf(w, "Each body, with the ARGV of the in-Redis table above, run %d times in a Lua loop inside one EVAL (no round trip, parsing or reply), µs per run from INFO commandstats, least of 5 EVALs. The time is frozen inside a script, so on one key (hot) the runs after the burst are denials; \"missing\" gives each run a key of its own. Ours is timed as the EVAL body it is on a server without functions, which makes its functions and tables on every run; as the function it ships as on Redis 7 it costs less (see the instructions section).\n\n", harnessIters)
		fmt.Fprintln(w, "| body | hot key µs | missing key µs |")
		fmt.Fprintln(w, "|---|---:|---:|")
		for _, c := range rep.scriptCosts {
			fmt.Fprintf(w, "| %s | %.2f | %.2f |\n", c.name, c.hot, c.miss)
		}
		fmt.Fprintln(w)
	}
	if len(rep.memory) > 0 {
		fmt.Fprintf(w, "### Redis memory per live subject\n\n")
		fmt.Fprintf(w, "MEMORY USAGE of the keys one subject creates, and the growth of used_memory (less mem_clients_normal, the clients' buffers) per subject: on an emptied server with active expiry paused, %[1]d subjects are checked once each, then %[1]d more, and the growth over the second %[1]d is divided by %[1]d (so one-off costs of the traffic cancel; the key and expiry tables double once on the way, about 26 B per subject). Each check spends %[2]d tokens, so every key is live for at least half a second.\n\n", cfg.memSubjects, memCost(policy{cfg.rate, cfg.burst}))
		fmt.Fprintln(w, "| limiter | keys/subject | MEMORY USAGE B | used_memory growth B/subject | stored |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---|")
		for _, m := range rep.memory {
			fmt.Fprintf(w, "| %s | %d | %d | %s | %s |\n", m.name, m.keys, m.usage, fmtGrowth(m.growth), mdEscape(m.value))
		}
		fmt.Fprintln(w)
	}
	if len(rep.instructions) > 0 {
		rep.writeInstructions(w)
	}
	if len(rep.local) > 0 {
		rep.writeLocal(w)
	}
	if len(rep.leases[0]) > 0 {
		rep.writeLeases(w)
	}
	rep.writeTargets(w)
}

// treeVersion returns the library's commit, marked when the work tree has
// changes, or "unknown" outside a git checkout.
func treeVersion() string {
	out, err := exec.Command("git", "-C", "..", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	v := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", "..", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench").Output(); err == nil && len(st) > 0 {
		v += " with uncommitted changes"
	}
	return v
}

func fmtCores(c float64) string {
	if c < 0 {
		return "not measured"
	}
	return fmt.Sprintf("%.2f cores", c)
}

func fmtGrowth(g float64) string {
	if g < 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", g)
}

func mdEscape(s string) string {
	s = strings.ReplaceAll(s, "|", "\\|")
	return strings.ReplaceAll(s, "\n", " ")
}

func (rep *report) writeThroughput(w io.Writer) {
	cfg := rep.cfg
	fmt.Fprintf(w, "### Decisions per second\n\n")
	fmt.Fprintln(w, "| conc | subjects | limiter | decisions/s | × floor | × redis_rate | p50 | p99 | client CPU | Redis CPU | allowed | errors | spread |")
	fmt.Fprintln(w, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	var errNotes []string
	for _, conc := range cfg.conc {
		for _, n := range cfg.subjects {
			floor, _ := rep.stat("floor (go-redis)", conc, n)
			rr, _ := rep.stat("redis_rate v10", conc, n)
			for _, c := range rep.contenders {
				s, ok := rep.stat(c.name, conc, n)
				if !ok {
					continue
				}
				errs := "0"
				if s.errs > 0 {
					errs = fmt.Sprintf("%.1f%%", 100*s.errFrac)
					errNotes = append(errNotes, fmt.Sprintf("%s at %d×%d: %s", c.name, conc, n, s.firstErr))
				}
				fmt.Fprintf(w, "| %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %.3f | %s | ±%.0f%% |\n",
					conc, n, c.name, fmtRate(s.rate), ratio(s.rate, floor.rate), ratio(s.rate, rr.rate),
					fmtDur(s.p50), fmtDur(s.p99), fmtCPU(s.cpu), fmtCPU(s.redisCPU), s.allowed, errs, 50*s.spread)
			}
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "client CPU: this process's CPU time (user and system) per decision over the run, the median of the rounds: the client's work, and the driver's own timing of each check, which every limiter pays alike. Redis CPU: the redis-server's CPU time (user and system, read from /proc to the 10 ms tick) per decision over the run, the median of the rounds, when the run started the server (– otherwise, and for an in-process limiter). spread: half the range of the rounds' decisions/s, relative to the median. Limiters:")
	fmt.Fprintln(w)
	for _, c := range rep.contenders {
		fmt.Fprintf(w, "- %s: %s\n", c.name, c.note)
	}
	if len(errNotes) > 0 {
		fmt.Fprintln(w, "\nFirst error of each configuration with errors:")
		fmt.Fprintln(w)
		for _, e := range errNotes {
			fmt.Fprintf(w, "- %s\n", mdEscape(e))
		}
	}
	fmt.Fprintln(w)
}

// ceilingStat is the median over the rounds of one script's
// redis-benchmark runs on one subject count.
type ceilingStat struct {
	rps, p50, spread float64
	n                int
	args             string
}

func (rep *report) ceilingStat(name string, subjects int) (ceilingStat, bool) {
	var rps, p50 []float64
	var cs ceilingStat
	for _, c := range rep.ceiling {
		if c.name == name && c.subjects == subjects {
			rps, p50 = append(rps, c.rps), append(p50, c.p50)
			cs.args = c.args
		}
	}
	if len(rps) == 0 {
		return cs, false
	}
	cs.rps, cs.p50, cs.n = median(rps), median(p50), len(rps)
	if cs.rps > 0 {
		cs.spread = (slices.Max(rps) - slices.Min(rps)) / cs.rps
	}
	return cs, true
}

func (rep *report) writeCeiling(w io.Writer) {
	fmt.Fprintf(w, "### In Redis: 50 connections × pipelines of 16, EVALSHA\n\n")
	fmt.Fprintf(w, "Each script by EVALSHA with the ARGV its library sends for one check of %d/s, burst %d (ours: the ARGV redisstore sends for a one-limit check on the server's TIME; redis_rate: the script and ARGV its AllowN sends; the skeleton: the expiry our script sets after one token). Interleaved: in each round, for each subject count, every script in turn; requests/s and p50 are medians over the rounds.\n\n", rep.cfg.rate, rep.cfg.burst)
	fmt.Fprintln(w, "| script | subjects | requests/s | ours ÷ this | p50 | spread | rounds | command |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---|")
	for _, n := range rep.cfg.subjects {
		ours, _ := rep.ceilingStat(scriptOurs, n)
		for _, name := range []string{scriptOurs, scriptOursQuota, scriptRedisRate, scriptSkeleton, scriptFloor} {
			c, ok := rep.ceilingStat(name, n)
			if !ok {
				continue
			}
			fmt.Fprintf(w, "| %s | %d | %s | %s | %.2fms | ±%.0f%% | %d | `%s` |\n", name, n, fmtRate(c.rps), ratio(ours.rps, c.rps), c.p50, 50*c.spread, c.n, c.args)
		}
	}
	fmt.Fprintln(w)
}

func (rep *report) writeInstructions(w io.Writer) {
	fmt.Fprintf(w, "### Inside Redis: instructions per decision (callgrind)\n\n")
	quota := ""
	if rep.cfg.instrQuota {
		quota = " and a quota of a calendar month (-instr-quota)"
	}
	rate := rep.cfg.rate
	if rep.cfg.instrRate > 0 {
		rate = rep.cfg.instrRate
	}
	how := "by FCALL, as the function it ships as"
	if rep.cfg.instrEval {
		how = "by EVALSHA of its body, as on a server without functions (-instr-eval)"
	}
	fmt.Fprintf(w, "Our script %s, one limit of %d/s, bursting to %d%s, %d subjects cycling, calls of K keys in mode \"each\" on the server's TIME: (instructions at %d calls − at %d) ÷ (%d·K). Independent of the machine's load.\n\n", how, rate, rep.cfg.burst, quota, instrSubjects, instrMany, instrFew, instrMany-instrFew)
	fmt.Fprintln(w, "| K | instructions per decision |")
	fmt.Fprintln(w, "|---:|---:|")
	for _, c := range rep.instructions {
		fmt.Fprintf(w, "| %d | %.0f |\n", c.k, c.perOp)
	}
	fmt.Fprintln(w)
	if rep.instrSkeleton > 0 {
		fmt.Fprintf(w, "The skeleton (TIME, GET, SET PX; deciding nothing) by EVALSHA, one key a call, the same subjects and expiry: %.0f instructions a call", rep.instrSkeleton)
		for _, c := range rep.instructions {
			if c.k == 1 {
				fmt.Fprintf(w, " (ours at K=1 costs %.2f× as many: the skeleton ÷ ours %.2f)", c.perOp/rep.instrSkeleton, rep.instrSkeleton/c.perOp)
			}
		}
		fmt.Fprintln(w, ".")
		fmt.Fprintln(w)
	}
}

func (rep *report) writeLocal(w io.Writer) {
	n := rep.local[0].subjects
	fmt.Fprintf(w, "### In-process, GOMAXPROCS=2\n\n")
	fmt.Fprintf(w, "ns/op is wall time over all checks of 2 goroutines (as b.RunParallel reports it); allocs and bytes are per check; heap B/subject is the live heap after one check on each of %d subjects (each a freshly allocated string), divided by %d.\n\n", n, n)
	fmt.Fprintf(w, "| limiter | hot: ns/op | allocs/op | B/op | %d subjects: ns/op | allocs/op | B/op | heap B/subject |\n", n)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rep.local {
		fmt.Fprintf(w, "| %s | %.0f | %.2f | %.0f | %.0f | %.2f | %.0f | %.0f |\n", r.name, r.hotNs, r.hotAllocs, r.hotB, r.manyNs, r.manyAllocs, r.manyB, r.bytesPerSubject)
	}
	fmt.Fprintln(w)
	for _, note := range rep.localNotes {
		fmt.Fprintf(w, "- %s\n", note)
	}
	fmt.Fprintln(w)
}

// oursRedis names our limiters over Redis, as shipped and the prototypes.
var oursRedis = []string{"ours: redisstore", "ours: redisstore WithoutCoalescing", "ours: rueidis (prototype)"}
