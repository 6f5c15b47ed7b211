package redistest

import (
	"bufio"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/testkit"
)

func TestProxyForwardsStallsAndDrops(t *testing.T) {
	s := StartServer(t)
	p := StartProxy(t, s.Addr())
	if p.Addr() == s.Addr() || p.Target() != s.Addr() {
		t.Fatalf("proxy Addr %s Target %s for server %s", p.Addr(), p.Target(), s.Addr())
	}
	c := NewClient(p.Addr())
	defer c.Close()

	// Forwarding.
	if err := pingWith(c, 2*time.Second); err != nil {
		t.Fatalf("PING through proxy: %v", err)
	}
	if _, err := do(p.Addr(), time.Second, "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if v, err := doString(s.Addr(), time.Second, "GET", "k"); err != nil || v != "v" {
		t.Fatalf("GET k from the server = %q, %v", v, err)
	}

	// Stall: a blackhole, the client times out.
	p.Stall()
	start := time.Now()
	err := pingWith(c, 200*time.Millisecond)
	if err == nil {
		t.Fatal("PING through a stalled proxy succeeded")
	}
	if elapsed := time.Since(start); elapsed < 150*time.Millisecond || testkit.Timed(t) && elapsed > time.Second {
		t.Errorf("PING through a stalled proxy failed after %v (%v); want about 200 ms", elapsed, err)
	}
	if _, err := do(p.Addr(), 200*time.Millisecond, "PING"); !isTimeout(err) {
		t.Errorf("raw PING through a stalled proxy: %v; want a timeout", err)
	}

	p.Resume()
	if err := pingWith(c, 2*time.Second); err != nil {
		t.Fatalf("PING after Resume from Stall: %v", err)
	}

	// Drop: connections are closed, quickly, not timed out.
	p.Drop()
	start = time.Now()
	err = pingWith(c, 2*time.Second)
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("PING through a dropping proxy succeeded")
	}
	if testkit.Timed(t) && elapsed > 500*time.Millisecond {
		t.Errorf("PING through a dropping proxy took %v (%v); want a fast failure", elapsed, err)
	}
	t.Logf("PING through dropping proxy failed after %v: %v", elapsed, err)
	if _, err := do(p.Addr(), time.Second, "PING"); err == nil || isTimeout(err) {
		t.Errorf("raw PING through a dropping proxy: %v; want the connection closed", err)
	}

	p.Resume()
	if err := pingWith(c, 2*time.Second); err != nil {
		t.Fatalf("PING after Resume from Drop: %v", err)
	}
}

// TestProxyStallKeepsConnectionsOpen checks that a stalled connection stays
// open and that what was sent during the stall arrives after Resume.
func TestProxyStallKeepsConnectionsOpen(t *testing.T) {
	s := StartServer(t)
	p := StartProxy(t, s.Addr())
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	roundTrip := func(timeout time.Duration) (string, error) {
		if _, err := io.WriteString(conn, "PING\r\n"); err != nil {
			return "", err
		}
		_ = conn.SetReadDeadline(time.Now().Add(timeout))
		return r.ReadString('\n')
	}
	if line, err := roundTrip(time.Second); err != nil || line != "+PONG\r\n" {
		t.Fatalf("PING = %q, %v", line, err)
	}
	p.Stall()
	if line, err := roundTrip(200 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("PING while stalled = %q, %v; want a timeout", line, err)
	}
	p.Resume()
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	if line, err := r.ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("reply to the PING sent while stalled = %q, %v", line, err)
	}
	if line, err := roundTrip(time.Second); err != nil || line != "+PONG\r\n" {
		t.Fatalf("PING after Resume = %q, %v", line, err)
	}
}

func TestProxyToDeadTargetClosesConnections(t *testing.T) {
	s := StartServer(t)
	p := StartProxy(t, s.Addr())
	s.Kill()
	start := time.Now()
	_, err := do(p.Addr(), 2*time.Second, "PING")
	if err == nil || isTimeout(err) || testkit.Timed(t) && time.Since(start) > time.Second {
		t.Fatalf("PING through proxy to a dead server: %v after %v; want a fast close", err, time.Since(start))
	}
}

func TestProxyCloseLeaksNoGoroutines(t *testing.T) {
	s := StartServer(t)
	before := runtime.NumGoroutine()

	p := StartProxy(t, s.Addr())
	var conns []net.Conn
	for i := range 6 {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if i == 3 {
			p.Stall()
		}
		if _, err := io.WriteString(c, "PING\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // let the stalled pumps block
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5 s")
	}
	p.Close() // idempotent
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := io.ReadAll(c); isTimeout(err) {
			t.Errorf("connection still open after proxy Close: %v", err)
		}
		c.Close()
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Error("proxy still accepts connections after Close")
	}

	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
