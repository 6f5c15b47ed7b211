package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit/internal/testkit"

	"github.com/redis/go-redis/v9"
)

// ping sends PING through go-redis with a deadline of d.
func ping(addr string, d time.Duration) error {
	c := NewClient(addr)
	defer c.Close()
	return pingWith(c, d)
}

func pingWith(c interface {
	Ping(context.Context) *redis.StatusCmd
}, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	got, err := c.Ping(ctx).Result()
	if err == nil && got != "PONG" {
		err = fmt.Errorf("PING answered %q", got)
	}
	return err
}

func TestServerAnswersPing(t *testing.T) {
	s := StartServer(t)
	host, port, err := net.SplitHostPort(s.Addr())
	if err != nil || host != "127.0.0.1" || port != strconv.Itoa(s.Port()) || s.Port() == 6379 {
		t.Fatalf("Addr() = %q, Port() = %d", s.Addr(), s.Port())
	}
	if got, err := doString(s.Addr(), time.Second, "PING"); err != nil || got != "PONG" {
		t.Fatalf("raw PING = %q, %v", got, err)
	}
	if err := ping(s.Addr(), 2*time.Second); err != nil {
		t.Fatalf("go-redis PING: %v", err)
	}
	// The fixed configuration is in force.
	for param, want := range map[string]string{
		"save": "", "appendonly": "no", "protected-mode": "yes", "bind": "127.0.0.1", "dir": s.Dir(),
	} {
		v, err := do(s.Addr(), time.Second, "CONFIG", "GET", param)
		if err != nil {
			t.Fatalf("CONFIG GET %s: %v", param, err)
		}
		if kv, ok := v.([]any); !ok || len(kv) != 2 || kv[1] != want {
			t.Errorf("CONFIG GET %s = %v; want %q", param, v, want)
		}
	}
}

func TestServerExtraArgs(t *testing.T) {
	s := StartServer(t, "--maxmemory", "12mb", "--maxmemory-policy", "allkeys-lru")
	v, err := do(s.Addr(), time.Second, "CONFIG", "GET", "maxmemory")
	if err != nil {
		t.Fatal(err)
	}
	if kv := v.([]any); kv[1] != strconv.Itoa(12<<20) {
		t.Errorf("maxmemory = %v; want %d", kv[1], 12<<20)
	}
}

func TestServersGetDistinctPorts(t *testing.T) {
	a, b := StartServer(t), StartServer(t)
	if a.Port() == b.Port() || a.Dir() == b.Dir() {
		t.Fatalf("two servers share port or dir: %s %s, %s %s", a.Addr(), a.Dir(), b.Addr(), b.Dir())
	}
}

func TestServerKillRestart(t *testing.T) {
	s := StartServer(t)
	port, pid := s.Port(), s.Pid()
	if _, err := do(s.Addr(), time.Second, "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if s.Pid() != 0 {
		t.Errorf("Pid() after Kill = %d; want 0", s.Pid())
	}
	if _, err := do(s.Addr(), 200*time.Millisecond, "PING"); err == nil {
		t.Fatal("PING succeeded after Kill")
	}
	s.Kill() // idempotent

	s.Restart(t)
	if s.Port() != port {
		t.Fatalf("Restart moved the server from port %d to %d", port, s.Port())
	}
	if s.Pid() == 0 || s.Pid() == pid {
		t.Errorf("Pid() after Restart = %d (was %d)", s.Pid(), pid)
	}
	if err := ping(s.Addr(), 2*time.Second); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if v, err := do(s.Addr(), time.Second, "GET", "k"); err != nil || v != nil {
		t.Errorf("GET k after Restart = %v, %v; want nil (no persistence)", v, err)
	}
	// Restart of a running server works too.
	s.Restart(t)
	if err := ping(s.Addr(), 2*time.Second); err != nil {
		t.Fatalf("PING after second Restart: %v", err)
	}
}

func TestServerStopCont(t *testing.T) {
	s := StartServer(t)
	c := NewClient(s.Addr())
	defer c.Close()
	if err := pingWith(c, 2*time.Second); err != nil {
		t.Fatalf("PING before Stop: %v", err)
	}

	s.Stop()
	start := time.Now()
	err := pingWith(c, 200*time.Millisecond)
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("PING with a 200 ms deadline succeeded against a stopped server")
	}
	if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
		t.Errorf("PING against a stopped server failed with %v; want a timeout", err)
	}
	if testkit.Timed(t) && elapsed > time.Second {
		t.Errorf("PING with a 200 ms deadline took %v", elapsed)
	}
	t.Logf("PING against stopped server failed after %v: %v", elapsed, err)

	s.Cont()
	if err := pingWith(c, 2*time.Second); err != nil {
		t.Fatalf("PING after Cont: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestServerCloseIsFinal(t *testing.T) {
	s := StartServer(t)
	s.Close()
	s.Close()
	if _, err := do(s.Addr(), 200*time.Millisecond, "PING"); err == nil {
		t.Fatal("PING succeeded after Close")
	}
	rec := &recordingTB{TB: t}
	s.Restart(rec)
	if len(rec.fatals) != 1 {
		t.Fatalf("Restart after Close: failures %q; want one", rec.fatals)
	}
}

func TestUnixServerAnswersOnItsSocket(t *testing.T) {
	s := StartUnixServer(t)
	if s.Socket() == "" {
		t.Fatal("Socket() is empty")
	}
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: s.Socket(), DialTimeout: ClientDialTimeout})
	defer c.Close()
	if err := pingWith(c, 2*time.Second); err != nil {
		t.Fatalf("PING over %s: %v", s.Socket(), err)
	}
	if got := StartServer(t).Socket(); got != "" {
		t.Errorf("a TCP server's Socket() = %q, want \"\"", got)
	}
}
