package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
)

// The configuration the performance targets are stated in.
const (
	targetConc          = 64
	targetSubjects      = 10000
	targetLocalSubjects = 1_000_000
)

// target is one row of the targets table: what is compared, the measured
// figures, the ratio (or count) held to the bound, and the verdict.
type target struct {
	name     string
	measured string
	value    string // the ratio or count held to the bound
	bound    string
	ok       bool // measured in this run
	pass     bool
	note     string // e.g. "goal 2.5× met"
}

func (t target) verdict() string {
	switch {
	case !t.ok:
		return "not measured"
	case t.pass && t.note != "":
		return "pass (" + t.note + ")"
	case t.pass:
		return "pass"
	case t.note != "":
		return "FAIL (" + t.note + ")"
	}
	return "FAIL"
}

// ratioTarget builds a target row from the ratio a/b, held to bound from
// below (atLeast) or from above.
func ratioTarget(name, measured string, a, b, bound float64, atLeast bool) (target, float64) {
	op := "≤ "
	if atLeast {
		op = "≥ "
	}
	t := target{name: name, measured: measured, value: "–", bound: op + strconv.FormatFloat(bound, 'f', -1, 64)}
	if a <= 0 || b <= 0 {
		return t, math.NaN()
	}
	r := a / b
	t.ok, t.value = true, fmt.Sprintf("%.2f×", r)
	t.pass = r <= bound
	if atLeast {
		t.pass = r >= bound
	}
	return t, r
}

func atLeast(name, measured string, a, b, bound float64) target {
	t, _ := ratioTarget(name, measured, a, b, bound, true)
	return t
}

func atMost(name, measured string, a, b, bound float64) target {
	t, _ := ratioTarget(name, measured, a, b, bound, false)
	return t
}

func missing(name, bound, why string) target {
	return target{name: name, measured: why, value: "–", bound: bound}
}

// targets computes the performance targets 1 to 5 from the sections measured in
// this run: throughput (1, 2), ceiling (3) and local (4). A target whose
// section or configuration was not run is "not measured", with the flags
// that would measure it. Target 5 (leases) is leaseTargets'.
func (rep *report) targets() []target {
	return append(rep.storeTargets(), rep.leaseTargets()...)
}

// storeTargets computes targets 1 to 4.
func (rep *report) storeTargets() []target {
	var ts []target
	const ours, floor, rr, skel = "ours: redisstore", "floor (go-redis)", "redis_rate v10", "skeleton (go-redis)"

	// 1. Concurrency 64, 10,000 subjects: decisions/s.
	n1 := fmt.Sprintf("1. conc %d, %d subjects: ours (redisstore) ÷ redis_rate v10, decisions/s", targetConc, targetSubjects)
	n1f := fmt.Sprintf("1. conc %d, %d subjects: ours (redisstore) ÷ go-redis floor, decisions/s", targetConc, targetSubjects)
	o, okO := rep.stat(ours, targetConc, targetSubjects)
	r, okR := rep.stat(rr, targetConc, targetSubjects)
	f, okF := rep.stat(floor, targetConc, targetSubjects)
	if okO && okR && okF {
		t, ratio := ratioTarget(n1, fmtRate(o.rate)+" ÷ "+fmtRate(r.rate), o.rate, r.rate, 2, true)
		if t.ok {
			if ratio >= 2.5 {
				t.note = "goal 2.5× met"
			} else {
				t.note = "goal 2.5× not met"
			}
		}
		ts = append(ts, t, atLeast(n1f, fmtRate(o.rate)+" ÷ "+fmtRate(f.rate), o.rate, f.rate, 1))
	} else {
		why := fmt.Sprintf("needs -sections throughput -conc %d -subjects %d", targetConc, targetSubjects)
		ts = append(ts, missing(n1, "≥ 2 (goal 2.5)", why), missing(n1f, "≥ 1", why))
	}
	// What the policy's capabilities cost the same checks: a monthly quota,
	// and the policy given as a plan.
	for _, c := range []struct {
		name  string
		bound float64
	}{{"ours: redisstore, and a monthly quota", 0.85}, {"ours: redisstore, by Plans", 0.95}} {
		n := fmt.Sprintf("1. conc %d, %d subjects: %s ÷ ours (redisstore), decisions/s", targetConc, targetSubjects, c.name)
		if x, ok := rep.stat(c.name, targetConc, targetSubjects); ok && okO {
			ts = append(ts, atLeast(n, fmtRate(x.rate)+" ÷ "+fmtRate(o.rate), x.rate, o.rate, c.bound))
		} else {
			ts = append(ts, missing(n, fmt.Sprintf("≥ %.2f", c.bound), fmt.Sprintf("needs -sections throughput -conc %d -subjects %d", targetConc, targetSubjects)))
		}
	}
	// Redis's CPU per decision in the same runs.
	n1r := fmt.Sprintf("1. conc %d, %d subjects: ours (redisstore) ÷ redis_rate v10, Redis CPU per decision", targetConc, targetSubjects)
	if okO && okR && o.redisCPU > 0 && r.redisCPU > 0 {
		ts = append(ts, atMost(n1r, fmtCPU(o.redisCPU)+" ÷ "+fmtCPU(r.redisCPU), o.redisCPU, r.redisCPU, 0.4))
	} else {
		ts = append(ts, missing(n1r, "≤ 0.4", fmt.Sprintf("needs -sections throughput -conc %d -subjects %d, on Linux with the redis-server the run starts", targetConc, targetSubjects)))
	}

	// 2. Concurrency 1: p50 against the go-redis floor's.
	n2 := fmt.Sprintf("2. conc 1, %d subjects: ours (redisstore) p50 ÷ go-redis floor p50", targetSubjects)
	o, okO = rep.stat(ours, 1, targetSubjects)
	f, okF = rep.stat(floor, 1, targetSubjects)
	if okO && okF {
		ts = append(ts, atMost(n2, fmtDur(o.p50)+" ÷ "+fmtDur(f.p50), o.p50, f.p50, 1.15))
		// The skeleton held to the same bound: what a bucket on the
		// server's clock must do per check reaches it or not.
		if sk, ok := rep.stat(skel, 1, targetSubjects); ok {
			t := atMost(fmt.Sprintf("2. conc 1, %d subjects: the skeleton (TIME+GET+SET PX) p50 ÷ go-redis floor p50", targetSubjects),
				fmtDur(sk.p50)+" ÷ "+fmtDur(f.p50), sk.p50, f.p50, 1.15)
			t.note = "a yardstick: the least any bucket on the server's clock does"
			ts = append(ts, t)
		}
	} else {
		ts = append(ts, missing(n2, "≤ 1.15", fmt.Sprintf("needs -sections throughput -conc 1 -subjects %d", targetSubjects)))
	}
	// The client's CPU per check at concurrency 1, beyond the floor's.
	n2c := fmt.Sprintf("2. conc 1, %d subjects: ours (redisstore) client CPU per decision − the go-redis floor's", targetSubjects)
	if okO && okF && o.cpu > 0 && f.cpu > 0 {
		extra := o.cpu - f.cpu
		ts = append(ts, target{name: n2c, measured: fmtCPU(o.cpu) + " − " + fmtCPU(f.cpu),
			value: fmt.Sprintf("%+.1fµs", extra/1e3), bound: "≤ 5µs", ok: true, pass: extra <= 5e3})
	} else {
		ts = append(ts, missing(n2c, "≤ 5µs", fmt.Sprintf("needs -sections throughput -conc 1 -subjects %d, on unix", targetSubjects)))
	}

	// 3. In Redis: 50 connections × pipelines of 16 over 10,000 keys.
	n3r := fmt.Sprintf("3. in Redis (50 connections × pipelines of 16 over %d keys): ours ÷ redis_rate's script, requests/s", targetSubjects)
	n3s := fmt.Sprintf("3. in Redis (50 connections × pipelines of 16 over %d keys): ours ÷ skeleton (TIME+GET+SET PX), requests/s", targetSubjects)
	co, okO := rep.ceilingStat(scriptOurs, targetSubjects)
	cr, okR := rep.ceilingStat(scriptRedisRate, targetSubjects)
	cs, okS := rep.ceilingStat(scriptSkeleton, targetSubjects)
	if okO && okR && okS {
		ts = append(ts,
			atLeast(n3r, fmtRate(co.rps)+" ÷ "+fmtRate(cr.rps), co.rps, cr.rps, 1),
			atLeast(n3s, fmtRate(co.rps)+" ÷ "+fmtRate(cs.rps), co.rps, cs.rps, 0.8))
	} else {
		why := fmt.Sprintf("needs -sections ceiling -subjects %d", targetSubjects)
		ts = append(ts, missing(n3r, "≥ 1", why), missing(n3s, "≥ 0.8", why))
	}

	// 4. memstore against the fastest of go-limiter and x/time/rate.
	var mem, live, gl, xr *localResult
	for i := range rep.local {
		switch l := &rep.local[i]; l.name {
		case "ours: memstore":
			mem = l
		case "ours: memstore, all subjects live":
			live = l
		case "go-limiter memorystore":
			gl = l
		case "x/time/rate map":
			xr = l
		}
	}
	n4h := "4. memstore, one hot subject: ns/op ÷ the fastest of go-limiter memorystore and x/time/rate"
	n4m := fmt.Sprintf("4. memstore, %d subjects: ns/op ÷ the fastest of go-limiter memorystore and x/time/rate", targetLocalSubjects)
	n4a := "4. memstore: allocations per check, hot and over many subjects"
	n4b := "4. memstore: heap bytes per live subject"
	if mem == nil || gl == nil || xr == nil {
		why := "needs -sections local"
		return append(ts, missing(n4h, "≤ 1", why), missing(n4m, "≤ 1", why), missing(n4a, "0", why), missing(n4b, "≤ 100 B", why))
	}
	fastest := func(get func(*localResult) float64) (float64, string) {
		if get(gl) <= get(xr) {
			return get(gl), "go-limiter"
		}
		return get(xr), "x/time/rate"
	}
	best, who := fastest(func(l *localResult) float64 { return l.hotNs })
	ts = append(ts, atMost(n4h, fmt.Sprintf("%.0f ns ÷ %.0f ns (%s)", mem.hotNs, best, who), mem.hotNs, best, 1))
	best, who = fastest(func(l *localResult) float64 { return l.manyNs })
	t := atMost(n4m, fmt.Sprintf("%.0f ns ÷ %.0f ns (%s)", mem.manyNs, best, who), mem.manyNs, best, 1)
	if live != nil {
		t.measured += fmt.Sprintf("; all subjects live: %.0f ns", live.manyNs)
	}
	if mem.subjects != targetLocalSubjects {
		t.measured += fmt.Sprintf(" (over %d subjects: run with -local-subjects %d)", mem.subjects, targetLocalSubjects)
	}
	ts = append(ts, t)
	allocs := math.Max(mem.hotAllocs, mem.manyAllocs)
	ts = append(ts, target{name: n4a, measured: fmt.Sprintf("hot %.2f, %d subjects %.2f", mem.hotAllocs, mem.subjects, mem.manyAllocs),
		value: fmt.Sprintf("%.2f", allocs), bound: "0", ok: true, pass: allocs < 0.005})
	if live != nil {
		ts = append(ts, target{name: n4b, measured: fmt.Sprintf("%.0f B (after one check on each of %d subjects, all live)", live.bytesPerSubject, live.subjects),
			value: fmt.Sprintf("%.0f B", live.bytesPerSubject), bound: "≤ 100 B", ok: true, pass: live.bytesPerSubject <= 100})
	} else {
		ts = append(ts, missing(n4b, "≤ 100 B", "needs the local contender \"ours: memstore, all subjects live\""))
	}
	return ts
}

// writeTargets writes the table of the performance targets.
func (rep *report) writeTargets(w io.Writer) {
	ts := rep.targets()
	fmt.Fprintf(w, "### The performance targets (this run)\n\n")
	if rep.warning != "" {
		fmt.Fprintf(w, "**%s**\n\n", rep.warning)
	}
	fmt.Fprintln(w, "Ratios of figures measured above in this run: decisions/s and p50 are the throughput section's medians, in-Redis rates the ceiling section's medians, ns/op the in-process section's.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | measured | ratio | bound | verdict |")
	fmt.Fprintln(w, "|---|---|---:|---|---|")
	for _, t := range ts {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", t.name, mdEscape(t.measured), t.value, t.bound, t.verdict())
	}
	fmt.Fprintln(w)
}
