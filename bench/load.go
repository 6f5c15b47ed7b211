package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// quietLoad is the largest load average at which the figures are worth
// quoting: above it, other work on the machine takes CPU from the
// client and from Redis, and the run measures that as much as the limiters.
const quietLoad = 0.5

// loadAverage returns the 1-, 5- and 15-minute load averages as
// /proc/loadavg gives them, and the 1-minute one as a number; ok is false
// when they cannot be read.
func loadAverage() (text string, one float64, ok bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?", 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?", 0, false
	}
	one, err = strconv.ParseFloat(f[0], 64)
	if err != nil {
		return "?", 0, false
	}
	return strings.Join(f[:3], " "), one, true
}

// loadWarning returns the WARNING line for a run whose 1-minute load
// average at the start, or whose other processes' CPU during the run (in
// cores, negative when unknown), was above quietLoad; "" for a quiet run.
// The load average at the end is not held against the run: the bench's own
// client and Redis raise it.
func loadWarning(start float64, startOK bool, others float64) string {
	var why []string
	if !startOK {
		why = append(why, "the load average could not be read")
	} else if start > quietLoad {
		why = append(why, fmt.Sprintf("load average %.2f at the start", start))
	}
	if others > quietLoad {
		why = append(why, fmt.Sprintf("other processes used %.2f cores during the run", others))
	}
	if len(why) == 0 {
		return ""
	}
	return fmt.Sprintf("WARNING: %s (above %.1f): figures taken under load are noise; quote only a run on a quiet machine.",
		strings.Join(why, ", "), quietLoad)
}

// cpuSample is the CPU time used so far by the whole machine and by this
// run's own processes (this program, the children it has waited for, such
// as redis-benchmark, and the redis-server it started), in clock ticks.
type cpuSample struct {
	busy, own int64
	ok        bool
}

// clockTicks is USER_HZ, the unit of /proc/stat and /proc/<pid>/stat: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// sampleCPU reads the machine's busy time from /proc/stat and the own
// processes' from /proc/self/stat and /proc/<redisPID>/stat (redisPID 0:
// none). ok is false off Linux or when a file cannot be parsed.
func sampleCPU(redisPID int) cpuSample {
	var s cpuSample
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return s
	}
	// user nice system idle iowait irq softirq steal: all but idle and
	// iowait are busy (steal too: another guest had the core).
	for i, v := range f[1:9] {
		if i == 3 || i == 4 {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return s
		}
		s.busy += n
	}
	self, ok := procTicks("/proc/self/stat", true)
	if !ok {
		return s
	}
	s.own = self
	if redisPID > 0 {
		r, ok := procTicks("/proc/"+strconv.Itoa(redisPID)+"/stat", false)
		if !ok {
			return s
		}
		s.own += r
	}
	s.ok = true
	return s
}

// redisTicks returns the CPU time, in ticks, of the redis-server this run
// started (pid 0: none, and ok false).
func redisTicks(pid int) (int64, bool) {
	if pid <= 0 {
		return 0, false
	}
	return procTicks("/proc/"+strconv.Itoa(pid)+"/stat", false)
}

// procTicks returns utime+stime of a /proc/<pid>/stat file, and with
// children also cutime+cstime (the children waited for).
func procTicks(path string, children bool) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14, stime 15, cutime 16, cstime 17.
	if len(f) < 15 {
		return 0, false
	}
	last := 13
	if children {
		last = 15
	}
	var t int64
	for _, v := range f[11:last] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false
		}
		t += n
	}
	return t, true
}

// othersCores returns the mean number of cores that processes other than
// this run's own were busy between a and b, over seconds; negative when
// unknown.
func othersCores(a, b cpuSample, seconds float64) float64 {
	if !a.ok || !b.ok || seconds <= 0 {
		return -1
	}
	others := float64((b.busy-a.busy)-(b.own-a.own)) / clockTicks / seconds
	return max(others, 0)
}
