package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strings"
	"time"
)

type runKey struct {
	name     string
	conc     int
	subjects int
}

type variantResult struct {
	name, value string
	mem         memResult
	cost        serverCost
	diffSteps   int
	diffErr     error
	hot, miss   float64 // µs inside Redis, as in the script-cost section
}

type report struct {
	cfg          config
	cmdline      string
	redisVersion string
	owned        bool
	gomaxprocs   int
	ncpu         int
	loadStart    string

	contenders                      []contender
	runs                            map[runKey][]result
	memory                          []memResult
	variants                        []variantResult
	variantErrs                     []string
	server                          []serverCost
	ceiling                         []ceilingResult
	local                           []localResult
	scriptCosts                     []scriptCost
	localNotes                      []string
	coalesceBatches, coalesceChecks int64
}

// stat is the median over the rounds of one configuration.
type stat struct {
	rate, p50, p99, allowed, errFrac float64
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
	var rates, p50, p99, allowed, errFrac []float64
	var s stat
	for _, r := range rs {
		rates = append(rates, r.rate())
		p50 = append(p50, float64(r.p50))
		p99 = append(p99, float64(r.p99))
		allowed = append(allowed, r.allowedFrac())
		errFrac = append(errFrac, float64(r.errors)/math.Max(1, float64(r.ops)))
		s.errs += r.errors
		if s.firstErr == "" {
			s.firstErr = r.firstErr
		}
	}
	s.rate, s.p50, s.p99, s.allowed, s.errFrac = median(rates), median(p50), median(p99), median(allowed), median(errFrac)
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
	fmt.Fprintf(w, "Redis %s (%s); %d CPUs, GOMAXPROCS %d; policy %d/s, burst %d; %d rounds of %v per limiter and configuration; medians over the rounds. Load average at the start and end: %s / %s; the ratios, taken within each configuration, are steadier than the absolute figures.\n\n",
		rep.redisVersion, where, rep.ncpu, rep.gomaxprocs, cfg.rate, cfg.burst, cfg.rounds, cfg.duration, rep.loadStart, loadAvg())

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
		fmt.Fprintf(w, "### Script cost inside Redis (profile of tokenbucket.lua)\n\n")
		fmt.Fprintf(w, "Each body run %d times in a Lua loop inside one EVAL (no round trip, parsing or reply), µs per run from INFO commandstats, least of 5 EVALs. The time is frozen inside a script, so on one key (hot) the runs after the burst are denials; \"missing\" gives each run a key of its own. The cuts end the shipped script early: each row's increase over the one before is what that stage costs.\n\n", harnessIters)
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
	if len(rep.variants) > 0 {
		fmt.Fprintf(w, "### Stored-value variants of our script (modified copies run by bench)\n\n")
		fmt.Fprintln(w, "Memory as in the section above; in-Redis µs as in the script-cost section (one key, and a missing key each run); Redis CPU per decision and µs per EVALSHA from a run alone at concurrency 16 on 10,000 subjects (noisier).")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| variant | stored value | MEMORY USAGE B | growth B/subject | in-Redis µs, hot | in-Redis µs, missing | Redis CPU µs/decision | µs/EVALSHA | replies equal to the shipped script's |")
		fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---|")
		for _, v := range rep.variants {
			diff := "(reference)"
			if v.diffSteps > 0 || v.diffErr != nil {
				diff = fmt.Sprintf("%d of %d random requests", v.diffSteps, v.diffSteps)
				if v.diffErr != nil {
					diff = "NO: " + v.diffErr.Error()
				}
			}
			fmt.Fprintf(w, "| %s | %s | %d | %s | %.2f | %.2f | %.1f | %.1f | %s |\n", v.name, mdEscape(v.value), v.mem.usage, fmtGrowth(v.mem.growth), v.hot, v.miss, v.cost.cpuUs, v.cost.scriptUs, mdEscape(diff))
		}
		for _, e := range rep.variantErrs {
			fmt.Fprintf(w, "\n%s\n", e)
		}
		fmt.Fprintln(w)
	}
	if len(rep.local) > 0 {
		rep.writeLocal(w)
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

// loadAvg returns the 1-minute load average, or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
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
	fmt.Fprintln(w, "| conc | subjects | limiter | decisions/s | × floor | × redis_rate | p50 | p99 | allowed | errors | spread |")
	fmt.Fprintln(w, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
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
				fmt.Fprintf(w, "| %d | %d | %s | %s | %s | %s | %s | %s | %.3f | %s | ±%.0f%% |\n",
					conc, n, c.name, fmtRate(s.rate), ratio(s.rate, floor.rate), ratio(s.rate, rr.rate),
					fmtDur(s.p50), fmtDur(s.p99), s.allowed, errs, 50*s.spread)
			}
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "spread: half the range of the rounds' decisions/s, relative to the median. Limiters:")
	fmt.Fprintln(w)
	for _, c := range rep.contenders {
		fmt.Fprintf(w, "- %s: %s\n", c.name, c.note)
	}
	if rep.coalesceChecks > 0 {
		fmt.Fprintf(w, "\nThe coalescing prototype (flushers %d, batch ≤ %d) sent %d pipelines carrying %d queued checks (%.1f per pipeline) over the whole run.\n",
			cfg.flushers, cfg.batch, rep.coalesceBatches, rep.coalesceChecks, float64(rep.coalesceChecks)/math.Max(1, float64(rep.coalesceBatches)))
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

func (rep *report) writeCeiling(w io.Writer) {
	fmt.Fprintf(w, "### Server-side ceiling: redis-benchmark -c 50 -P 16\n\n")
	fmt.Fprintln(w, "| script | subjects | requests/s | p50 | command |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|")
	for _, c := range rep.ceiling {
		fmt.Fprintf(w, "| %s | %d | %s | %.2fms | `%s` |\n", c.name, c.subjects, fmtRate(c.rps), c.p50, c.args)
	}
	fmt.Fprintln(w)
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

// writeTargets checks the measured figures against issue 5's targets.
func (rep *report) writeTargets(w io.Writer) {
	type row struct{ target, measured, verdict string }
	var rows []row
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	maxConc := 0
	for _, c := range rep.cfg.conc {
		maxConc = max(maxConc, c)
	}
	many := rep.cfg.subjects[len(rep.cfg.subjects)-1]
	if len(rep.runs) > 0 {
		rr, _ := rep.stat("redis_rate v10", maxConc, many)
		floor, _ := rep.stat("floor (go-redis)", maxConc, many)
		for _, name := range oursRedis {
			if s, ok := rep.stat(name, maxConc, many); ok && rr.rate > 0 {
				rows = append(rows, row{fmt.Sprintf("1. conc %d, %d subjects: ≥ 2.5× redis_rate (%s)", maxConc, many, name),
					fmt.Sprintf("%.2f× redis_rate, %.2f× floor", s.rate/rr.rate, s.rate/floor.rate), verdict(s.rate >= 2.5*rr.rate)})
			}
		}
		for _, n := range rep.cfg.subjects {
			for _, name := range oursRedis[:2] {
				f1, ok1 := rep.stat("floor (go-redis)", 1, n)
				o1, ok2 := rep.stat(name, 1, n)
				if ok1 && ok2 && f1.p50 > 0 {
					rows = append(rows, row{fmt.Sprintf("1. conc 1, %d subjects: p50 ≤ 1.2× the floor's (%s)", n, name),
						fmt.Sprintf("%s vs %s: %.2f×", fmtDur(o1.p50), fmtDur(f1.p50), o1.p50/f1.p50), verdict(o1.p50 <= 1.2*f1.p50)})
				}
			}
		}
		for _, c := range rep.ceiling {
			if c.name != "ours: tokenbucket.lua" || c.subjects != many {
				continue
			}
			for _, name := range oursRedis {
				if s, ok := rep.stat(name, maxConc, many); ok {
					rows = append(rows, row{fmt.Sprintf("2. conc %d, %d subjects: ≥ 0.5× redis-benchmark -P 16 of our script (%s)", maxConc, many, name),
						fmt.Sprintf("%s of %s: %.2f×", fmtRate(s.rate), fmtRate(c.rps), s.rate/c.rps), verdict(s.rate >= 0.5*c.rps)})
				}
			}
		}
	}
	var ours, rr *memResult
	for i := range rep.memory {
		switch rep.memory[i].name {
		case "ours: redisstore":
			ours = &rep.memory[i]
		case "redis_rate v10":
			rr = &rep.memory[i]
		}
	}
	if ours != nil && rr != nil {
		rows = append(rows, row{"3. MEMORY USAGE per subject ≤ redis_rate's",
			fmt.Sprintf("%d B vs %d B", ours.usage, rr.usage), verdict(ours.usage <= rr.usage)})
		if ours.growth >= 0 && rr.growth >= 0 {
			rows = append(rows, row{"3. used_memory growth per subject ≤ redis_rate's",
				fmt.Sprintf("%.0f B vs %.0f B", ours.growth, rr.growth), verdict(ours.growth <= rr.growth)})
		}
	}
	if len(rep.local) > 0 {
		var mem, live *localResult
		best := math.Inf(1)
		for i := range rep.local {
			r := &rep.local[i]
			switch {
			case r.name == "ours: memstore":
				mem = r
			case r.name == "ours: memstore, all subjects live":
				live = r
			case !strings.HasPrefix(r.name, "ours"):
				best = math.Min(best, r.manyNs)
			}
		}
		if mem != nil {
			rows = append(rows, row{"4. memstore hot subject ≤ 100 ns/check", fmt.Sprintf("%.0f ns", mem.hotNs), verdict(mem.hotNs <= 100)})
			rows = append(rows, row{"4. memstore 0 allocations per check (string subjects)", fmt.Sprintf("hot %.2f, %d subjects %.2f", mem.hotAllocs, mem.subjects, mem.manyAllocs),
				verdict(mem.hotAllocs < 0.01 && mem.manyAllocs < 0.01)})
			if !math.IsInf(best, 1) {
				rows = append(rows, row{fmt.Sprintf("4. memstore at %d subjects ≤ half the best peer's ns/op", mem.subjects),
					fmt.Sprintf("%.0f ns (live: %s) vs best peer %.0f ns", mem.manyNs, liveNs(live), best), verdict(mem.manyNs <= best/2)})
			}
		}
		if live != nil {
			rows = append(rows, row{"4. memstore ≤ 100 heap bytes per live subject", fmt.Sprintf("%.0f B", live.bytesPerSubject), verdict(live.bytesPerSubject <= 100)})
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "### Against issue 5's targets (this run)\n\n")
	fmt.Fprintln(w, "| target | measured | |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s |\n", r.target, r.measured, r.verdict)
	}
	fmt.Fprintln(w)
}

var oursRedis = []string{"ours: redisstore", "ours: redisstore WithoutCoalescing", "ours: coalescing (prototype)", "ours: rueidis (prototype)"}

func liveNs(l *localResult) string {
	if l == nil {
		return "–"
	}
	return fmt.Sprintf("%.0f ns", l.manyNs)
}
