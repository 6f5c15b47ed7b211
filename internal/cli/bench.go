package cli

import (
	"context"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/latency"
)

const benchAbout = `
Bench drives a store with --concurrency goroutines, each taking --cost tokens
for a subject drawn at random among --subjects, for --duration. On a terminal
it shows live progress; at the end it prints the decisions per second, the
p50, p99 and maximum latency of a check, the fraction allowed, and how many
subjects were touched. With no --redis it measures the embedded in-process
store. SIGINT ends the run early and still prints the report.

The buckets live in namespace --namespace ("bench"): point it at a Redis that
no service shares that namespace with.`

// loadFlags are the flags of both load generators (bench and envoy-bench):
// how many at once, over how many subjects, for how long.
type loadFlags struct {
	concurrency, subjects int
	duration              time.Duration
}

// register adds the flags, with the defaults of the command.
func (f *loadFlags) register(fs *flagSet, concurrency, subjects int, inFlight, drawn string) {
	fs.IntVar(&f.concurrency, "concurrency", concurrency, inFlight)
	fs.IntVar(&f.subjects, "subjects", subjects, drawn)
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "how long to run")
}

// parse parses args into fs, which holds these flags, and refuses
// positional arguments and values out of range.
func (f *loadFlags) parse(fs *flagSet, args []string) error {
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usagef("unexpected argument %q (%s takes only flags)", pos[0], fs.Name())
	case f.concurrency < 1 || f.concurrency > 100_000:
		return usagef("--concurrency must be between 1 and 100000 (got %d)", f.concurrency)
	case f.subjects < 1 || f.subjects > 100_000_000:
		return usagef("--subjects must be between 1 and 100000000 (got %d)", f.subjects)
	case f.duration <= 0:
		return usagef("--duration must be positive (got %v)", f.duration)
	}
	return nil
}

// run returns the context of the run: it ends after --duration, or at the
// first SIGINT or SIGTERM (the report is still printed).
func (f *loadFlags) run(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, f.duration)
	return ctx, func() { cancel(); stop() }
}

type benchFlags struct {
	redis               redisFlags
	load                loadFlags
	per                 time.Duration
	rate, burst, cost   int64
	namespace, progress string
}

func runBench(ctx context.Context, env Env, args []string) error {
	var f benchFlags
	fs := newFlagSet(env, "bench", "[flags]", benchAbout)
	f.redis.register(fs)
	f.load.register(fs, 16, 1000, "goroutines checking at the same time", "distinct subjects, drawn uniformly")
	fs.Int64Var(&f.rate, "rate", 100, "tokens added to each bucket every --per")
	fs.DurationVar(&f.per, "per", time.Second, "refill period")
	fs.Int64Var(&f.burst, "burst", 0, "bucket capacity (default --rate)")
	fs.Int64Var(&f.cost, "cost", 1, "tokens each check takes")
	fs.StringVar(&f.namespace, "namespace", "bench", "namespace of the buckets")
	fs.StringVar(&f.progress, "progress", "auto", "live progress on stderr: auto (when it is a terminal), on or off")
	if err := f.load.parse(fs, args); err != nil {
		return err
	}
	if f.progress != "auto" && f.progress != "on" && f.progress != "off" {
		return usagef("--progress %q: want auto, on or off", f.progress)
	}
	if f.burst == 0 {
		f.burst = f.rate
	}
	limit := ratelimit.NewLimit(f.rate, f.per, f.burst)
	if err := limit.Validate(); err != nil {
		return usagef("--rate, --per, --burst: %v", err)
	}
	if f.cost < 1 || f.cost > limit.Capacity {
		return usagef("--cost must be between 1 and the capacity %d (got %d)", limit.Capacity, f.cost)
	}
	st, err := openStore(storeOptions{redis: f.redis})
	if err != nil {
		return err
	}
	defer st.close()
	if err := st.ping(ctx, 2*time.Second); err != nil {
		return err
	}
	lim, err := ratelimit.New[string](st.store, limit, ratelimit.WithNamespace(f.namespace))
	if err != nil {
		return err
	}

	runCtx, cancel := f.load.run(ctx)
	defer cancel()

	showProgress := f.progress == "on" || f.progress == "auto" && env.StderrTTY
	fmt.Fprintf(env.Stdout, "bench: %s, %d goroutines, %d subjects, policy (%v), cost %d, %v\n",
		st.name, f.load.concurrency, f.load.subjects, limit, f.cost, f.load.duration)
	res := bench(runCtx, lim, f, showProgress, env.Stderr)
	res.report(env.Stdout, f.load.subjects)
	if res.errors > 0 && res.passed+res.refused == 0 {
		return fmt.Errorf("every check failed; the first error: %v", res.firstErr)
	}
	return nil
}

// worker holds one load goroutine's counts, padded to its own cache lines:
// the calls that passed (allowed, or OK) and the ones refused (denied, or
// OVER_LIMIT), with their latencies, and the errors.
type worker struct {
	passed, refused, errors atomic.Int64
	hist                    *latency.Histogram
	firstErr                error
	_                       [64]byte
}

// decided counts a call answered after lat.
func (w *worker) decided(passed bool, lat time.Duration) {
	if passed {
		w.passed.Add(1)
	} else {
		w.refused.Add(1)
	}
	w.hist.Record(lat)
}

// failed counts a call that failed with err, and keeps the first error.
func (w *worker) failed(err error) {
	if w.errors.Add(1) == 1 {
		w.firstErr = err
	}
}

// loadResult is the sum of the workers' counts over a run of elapsed.
type loadResult struct {
	passed, refused, errors int64
	elapsed                 time.Duration
	hist                    *latency.Histogram
	firstErr                error
}

// sum adds up the workers' counts once they have stopped.
func sum(workers []worker, elapsed time.Duration) loadResult {
	res := loadResult{elapsed: elapsed, hist: latency.NewHistogram(benchLatency)}
	for i := range workers {
		w := &workers[i]
		res.passed += w.passed.Load()
		res.refused += w.refused.Load()
		res.errors += w.errors.Load()
		res.hist.Merge(w.hist)
		if res.firstErr == nil {
			res.firstErr = w.firstErr
		}
	}
	return res
}

type benchResult struct {
	loadResult
	touched int
}

func bench(ctx context.Context, lim *ratelimit.Limiter[string], f benchFlags, progress bool, stderr io.Writer) benchResult {
	subjects := make([]string, f.load.subjects)
	for i := range subjects {
		subjects[i] = "s" + strconv.Itoa(i)
	}
	touched := make([]atomic.Uint32, (f.load.subjects+31)/32)
	workers := newWorkers(f.load.concurrency)
	start := time.Now()
	end, _ := ctx.Deadline()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			me := &workers[w]
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			for ctx.Err() == nil {
				i := rng.IntN(len(subjects))
				t := time.Now()
				d, err := lim.TryAcquireN(ctx, subjects[i], f.cost)
				lat := time.Since(t)
				switch {
				case err != nil && (ctx.Err() != nil || !time.Now().Before(end)):
					// The run ended during the call: its deadline, not
					// the store, failed it.
					return
				case err != nil:
					me.failed(err)
					continue
				}
				me.decided(d.Allowed, lat)
				touched[i/32].Or(1 << (i % 32))
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if progress {
		tick := time.NewTicker(200 * time.Millisecond)
	loop:
		for {
			select {
			case <-done:
				break loop
			case <-tick.C:
				var a, d, e int64
				for i := range workers {
					a += workers[i].passed.Load()
					d += workers[i].refused.Load()
					e += workers[i].errors.Load()
				}
				el := time.Since(start).Seconds()
				fmt.Fprintf(stderr, "\r  %5.1fs  %10d decisions  %9.0f/s  allowed %5.1f%%  errors %d   ",
					el, a+d, float64(a+d)/el, pct(a, a+d), e)
			}
		}
		tick.Stop()
		fmt.Fprint(stderr, "\r\033[K")
	}
	<-done
	res := benchResult{loadResult: sum(workers, time.Since(start))}
	for i := range touched {
		res.touched += bits.OnesCount32(touched[i].Load())
	}
	return res
}

func (r benchResult) report(w io.Writer, subjects int) {
	n := r.passed + r.refused
	fmt.Fprintf(w, "decisions   %d in %v = %.0f/s\n", n, r.elapsed.Round(time.Millisecond), float64(n)/r.elapsed.Seconds())
	fmt.Fprintf(w, "allowed     %.1f%% (%d allowed, %d denied)\n", pct(r.passed, n), r.passed, r.refused)
	writeLatency(w, r.hist)
	fmt.Fprintf(w, "subjects    %d of %d touched\n", r.touched, subjects)
	if r.errors > 0 {
		fmt.Fprintf(w, "errors      %d (first: %v)\n", r.errors, r.firstErr)
	}
}

func pct(a, n int64) float64 {
	if n == 0 {
		return 0
	}
	return 100 * float64(a) / float64(n)
}

// benchLatency bins the bench commands' latencies: 16 bins per power of two
// (within about 6%), from 32 ns to about 18 minutes.
var benchLatency = latency.Layout{SubBits: 4, MinOctave: 5, MaxOctave: 40}

// newWorkers returns n workers, each with its histogram.
func newWorkers(n int) []worker {
	ws := make([]worker, n)
	for i := range ws {
		ws[i].hist = latency.NewHistogram(benchLatency)
	}
	return ws
}

// writeLatency writes the report's line of latencies: p50, p99 and max,
// each the upper end of its bin, rounded for printing.
func writeLatency(w io.Writer, h *latency.Histogram) {
	fmt.Fprintf(w, "latency     p50 %v  p99 %v  max %v\n", roundLatency(h.Quantile(0.50)), roundLatency(h.Quantile(0.99)), roundLatency(h.Max()))
}

func roundLatency(d time.Duration) time.Duration {
	switch {
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= time.Microsecond:
		return d.Round(10 * time.Nanosecond)
	}
	return d
}
