package redistest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

const helperEnv = "REDISTEST_PDEATHSIG_HELPER"

// TestPdeathsigHelper is not a test of its own: TestServerDiesWithTestBinary
// runs the test binary again with helperEnv set, and this function then
// starts a server, reports it, and waits to be SIGKILLed.
func TestPdeathsigHelper(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return // run normally: nothing to do
	}
	s := StartServer(t)
	fmt.Printf("SERVER %d %s\n", s.Pid(), s.Addr())
	time.Sleep(time.Minute) // the parent kills us long before
}

func TestServerDiesWithTestBinary(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestPdeathsigHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	var pid int
	var addr string
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "SERVER ") {
				lines <- sc.Text()
				break
			}
		}
		for sc.Scan() { // drain so the child never blocks on stdout
		}
	}()
	select {
	case line, ok := <-lines:
		if !ok {
			t.Fatal("helper exited without starting a server")
		}
		if _, err := fmt.Sscanf(line, "SERVER %d %s", &pid, &addr); err != nil {
			t.Fatalf("bad helper line %q: %v", line, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("helper did not start a server within 20 s")
	}
	if got, err := doString(addr, time.Second, "PING"); err != nil || got != "PONG" {
		t.Fatalf("helper's server %s: PING = %q, %v", addr, got, err)
	}

	// SIGKILL the "test binary": no cleanup runs in it.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	deadline := time.Now().Add(5 * time.Second)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL) // do not leak it
			t.Fatalf("redis-server pid %d outlived the killed test binary", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := do(addr, 200*time.Millisecond, "PING"); err == nil {
		t.Fatalf("%s still answers after its test binary died", addr)
	}
}

// processGone reports whether pid no longer exists or is a zombie (dead but
// not yet reaped by whoever inherited it).
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}
