package cli

import (
	"context"
	"net/http"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/testkit"
)

// TestServeInProcess runs serve in this process, so that the race detector
// sees its wiring, and ends it by cancelling its context as a signal would.
func TestServeInProcess(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr testkit.Buffer
	env := Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
	done := make(chan int, 1)
	go func() { done <- Main(ctx, []string{"serve", "--listen", "127.0.0.1:0"}, env) }()
	re := regexp.MustCompile(`msg=serving addr=(\S+)`)
	var addr string
	for deadline := time.Now().Add(5 * time.Second); addr == ""; {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited %d: %s", code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start: %s", stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
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
	cancel()
	select {
	case code := <-done:
		if code != 0 || !strings.Contains(stderr.String(), "msg=stopped") {
			t.Errorf("exit %d after shutdown:\n%s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop within 10 s of its context ending")
	}
}
