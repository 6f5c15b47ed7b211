// Package testkit holds small helpers shared by the module's tests and
// benchmarks: a settable clock and a sleep that does not sleep, a
// goroutine-safe log sink, a loopback HTTP server and listener, files,
// concurrent and strided load, the live heap, and the switch of the timing
// tier ([Timing], [Timed]). It imports nothing of the module, so that any
// package's tests may use it; the behaviour suite every store must pass is
// package storetest, and real Redis servers come from internal/redistest.
package testkit

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Buffer is a goroutine-safe bytes.Buffer for what a logger or a command
// writes while the test reads it. The zero value is an empty buffer ready
// to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Serve serves h on a loopback listener until the test ends and returns
// its base URL.
func Serve(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// Request returns a request of method to url with body, or fails the test.
// hdr are header names and values in turn; a "Host" sets the request's
// Host.
func Request(t testing.TB, method, url string, body io.Reader, hdr ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return req
}

// Do sends req with http.DefaultClient, or fails the test, and returns the
// response with its body read and closed.
func Do(t testing.TB, req *http.Request) (*http.Response, string) {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// Concurrently calls check each times from each of workers goroutines at
// once, w naming the goroutine and i the call, and returns how many calls
// passed. An error fails the test and ends its goroutine's calls.
func Concurrently(t testing.TB, workers, each int, check func(w, i int) (bool, error)) int64 {
	t.Helper()
	var passed atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				ok, err := check(w, i)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					passed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return passed.Load()
}

// RunStrided runs f in b.RunParallel's goroutines, each calling f(i) for i
// stepping through [0, n) by a prime stride, from a start of its own, so
// that the goroutines touch different items at any moment and every item
// in turn. n must not be a multiple of the stride, 7919.
func RunStrided(b *testing.B, n int, f func(i int)) {
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		i := int(time.Since(start).Nanoseconds())
		for pb.Next() {
			i = (i + 7919) % n
			f(i)
		}
	})
}

// LiveHeap returns the bytes of live heap objects after two garbage
// collections (the second frees what the first's finalizers released).
func LiveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// Listen returns a TCP listener on a free port of 127.0.0.1, closed when
// the test ends unless something closed it before.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// WriteFile writes content to path, making its directory first, or fails
// the test. The file is readable by the test's user only.
func WriteFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TimingEnv names the environment variable that turns the timing tier on:
// RATELIMIT_TIMING=1. That tier holds measurements (a latency, a detection
// or recovery time, a p99, a deadline kept under load) to their bounds,
// and so depends on the machine's speed and load; the default run does
// not, and holds every correctness assertion. scripts/test.sh runs the
// timing tier on its own, after the default run; docs/outages.md lists its
// bounds.
const TimingEnv = "RATELIMIT_TIMING"

// timingOn reports whether RATELIMIT_TIMING=1.
func timingOn() bool { return os.Getenv(TimingEnv) == "1" }

// Timing skips t, saying how to run it, unless RATELIMIT_TIMING=1: for a
// test that is a measurement through and through.
func Timing(t testing.TB) {
	t.Helper()
	if !timingOn() {
		t.Skipf("a timing measurement: runs with %s=1 (the timing tier of scripts/test.sh)", TimingEnv)
	}
}

// Timed reports whether t holds its measurements to their bounds: true
// with RATELIMIT_TIMING=1. Otherwise it logs that the bounds are not
// checked and returns false, for a test that checks its correctness in
// every run and measures only in the timing tier.
func Timed(t testing.TB) bool {
	t.Helper()
	if timingOn() {
		return true
	}
	t.Logf("timing bounds not checked: they are checked with %s=1 (the timing tier of scripts/test.sh)", TimingEnv)
	return false
}
