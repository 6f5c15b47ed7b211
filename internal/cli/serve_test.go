package cli

import (
	"context"
	"net/http"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/service"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// served is serve running in this process.
type served struct {
	svc    *service.Service
	stderr *testkit.Buffer
	done   chan int // serve's exit status
	stop   context.CancelFunc
}

// startServe runs serve with args in this process, with the environment
// variables vars, and returns it once it listens, from Env.ServeStarted:
// its addresses are the service's. It stops when the test ends, and the
// test fails if it exits with an error then.
func startServe(t *testing.T, vars map[string]string, args ...string) *served {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{stderr: &testkit.Buffer{}, done: make(chan int, 1), stop: cancel}
	started := make(chan *service.Service, 1)
	env := Env{Stdout: &testkit.Buffer{}, Stderr: s.stderr, Getenv: func(k string) string { return vars[k] },
		ServeStarted: func(svc *service.Service) { started <- svc }}
	go func() { s.done <- Main(ctx, append([]string{"serve"}, args...), env) }()
	select {
	case s.svc = <-started:
	case code := <-s.done:
		cancel()
		t.Fatalf("serve exited %d: %s", code, s.stderr.String())
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("serve did not start within 10 s: %s", s.stderr.String())
	}
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-s.done:
			if code != 0 {
				t.Errorf("serve exited %d: %s", code, s.stderr.String())
			}
			s.done <- code
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop within 10 s of its context ending")
		}
	})
	return s
}

// TestServeInProcess runs serve in this process, so that the race detector
// sees its wiring, and ends it by cancelling its context as a signal would.
func TestServeInProcess(t *testing.T) {
	s := startServe(t, nil, "--listen", "127.0.0.1:0")
	addr := s.svc.Addrs().HTTP.String()
	// Without GOGC, serve sets the collector's target to --gc-percent.
	if got := debug.SetGCPercent(100); got != defaultGCPercent {
		t.Errorf("the GC percent while serving is %d, want %d", got, defaultGCPercent)
	}
	var wg sync.WaitGroup
	codes := make([]int, 30)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := http.Post("http://"+addr+"/v1/acquire", "application/json", strings.NewReader(`{"subject":"x"}`))
			if err != nil {
				t.Error(err)
				return
			}
			res.Body.Close()
			codes[i] = res.StatusCode
		}()
	}
	wg.Wait()
	denied := 0
	for _, c := range codes {
		if c == 429 {
			denied++
		} else if c != 200 {
			t.Errorf("status %d", c)
		}
	}
	if denied == 0 {
		t.Errorf("30 concurrent acquires against 10 per second: none denied")
	}
	s.stop()
	select {
	case code := <-s.done:
		if code != 0 || !strings.Contains(s.stderr.String(), "msg=stopped") {
			t.Errorf("exit %d after shutdown:\n%s", code, s.stderr.String())
		}
		s.done <- code
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop within 10 s of its context ending")
	}
}

// TestServeConfigWatch: with --config-watch, an edit of --config is put in
// force without SIGHUP.
func TestServeConfigWatch(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "ns.yaml")
	testkit.WriteFile(t, cfg, "namespaces:\n  - name: default\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	s := startServe(t, nil, "--listen", "127.0.0.1:0", "--config", cfg, "--config-watch", "10ms")
	testkit.WriteFile(t, cfg, "namespaces:\n  - name: default\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - name: edited\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	waitLog(t, s.stderr, s.done, regexp.MustCompile(`msg="config reloaded"`))
	if _, ok := s.svc.API().Policies()["edited"]; !ok {
		t.Errorf("after the edit: namespaces %v", s.svc.API().Policies().Names())
	}
}
