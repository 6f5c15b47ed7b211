package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// readyTimeout bounds how long a starting redis-server may take to
	// answer PING.
	readyTimeout = 10 * time.Second
	// startAttempts is how often StartServer picks a new port after losing
	// a bind race.
	startAttempts = 5
	// restartAttempts is how often Restart retries the same port.
	restartAttempts = 20
	// logTailBytes is how much of the server log a failure message shows.
	logTailBytes = 4096
)

// errPortInUse reports that redis-server exited because its port (or its
// cluster bus port) was taken.
var errPortInUse = errors.New("port already in use")

type procState int

const (
	stateDead procState = iota
	stateRunning
	stateStopped
)

// Server is one redis-server process bound to 127.0.0.1, started by
// [StartServer] or [StartCluster]. Its methods are safe for concurrent use.
type Server struct {
	serverPath string
	dir        string
	logPath    string
	port       int
	busPort    int    // cluster bus port, 0 when cluster mode is off
	configPath string // a config file given before the other arguments, or ""
	socket     string // the unix socket of StartUnixServer, or ""
	extraArgs  []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{} // closed when cmd has exited and been reaped
	state  procState
	closed bool
}

// StartServer starts a standalone redis-server on 127.0.0.1 on a free port,
// in its own t.TempDir() working directory, with no persistence
// (--save "" --appendonly no), --protected-mode yes, and extraArgs appended
// to the command line (for example "--maxmemory", "10mb"). It waits until the
// server answers PING and fails the test with the server's log if that takes
// longer than 10 s. The process is killed by t.Cleanup, and by the kernel if
// the test binary dies first.
func StartServer(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	serverPath, _ := Find(t)
	return startServer(t, serverPath, extraArgs)
}

// StartSentinel starts a Redis Sentinel (redis-server --sentinel) on
// 127.0.0.1 on a free port that monitors master under the name masterName,
// with a quorum of 1 and a master declared down after 1 s. It is killed like
// a server started by StartServer. Under go test -short it skips the test
// instead.
func StartSentinel(t testing.TB, masterName string, master *Server) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: starts no Redis Sentinel; run without -short")
	}
	serverPath, _ := Find(t)
	config := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\n",
		masterName, master.Port(), masterName)
	return startServerConfig(t, serverPath, config, []string{"--sentinel"})
}

// StartUnixServer starts a server as StartServer does that also listens on
// a unix socket (unixsocket in its config, mode 700), whose path Socket
// returns. The socket is in a short temporary directory of its own, as a
// socket's path must be shorter than about 100 bytes.
func StartUnixServer(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	serverPath, _ := Find(t)
	dir, err := os.MkdirTemp("", "redistest")
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "redis.sock")
	config := fmt.Sprintf("unixsocket %s\nunixsocketperm 700\n", sock)
	s := startServerConfig(t, serverPath, config, extraArgs)
	s.socket = sock
	return s
}

func startServer(t testing.TB, serverPath string, extraArgs []string) *Server {
	t.Helper()
	return startServerConfig(t, serverPath, "", extraArgs)
}

// startServerConfig starts a server; a non-empty config is written to a file
// in its directory and named first on its command line.
func startServerConfig(t testing.TB, serverPath, config string, extraArgs []string) *Server {
	t.Helper()
	dir := t.TempDir() // registered before the kill below, so removed after it
	s := &Server{
		serverPath: serverPath,
		dir:        dir,
		logPath:    filepath.Join(dir, "redis.log"),
		extraArgs:  append([]string(nil), extraArgs...),
	}
	if config != "" {
		s.configPath = filepath.Join(dir, "redis.conf")
		if err := os.WriteFile(s.configPath, []byte(config), 0o644); err != nil {
			t.Fatalf("redistest: %v", err)
		}
	}
	t.Cleanup(s.Close)
	cluster := hasClusterEnabled(extraArgs)
	var err error
	for attempt := 0; attempt < startAttempts; attempt++ {
		if s.port, err = freePort(); err != nil {
			break
		}
		if cluster {
			if s.busPort, err = freePort(); err != nil {
				break
			}
			if s.busPort == s.port {
				err = errPortInUse
				continue
			}
		}
		s.mu.Lock()
		err = s.startLocked()
		s.mu.Unlock()
		if !errors.Is(err, errPortInUse) {
			break
		}
	}
	if err != nil {
		t.Fatalf("redistest: starting redis-server: %v\n%s", err, s.logTail())
	}
	return s
}

// hasClusterEnabled reports whether args turn cluster mode on, in which case
// the server needs a cluster bus port too.
func hasClusterEnabled(args []string) bool {
	for i, a := range args {
		if a == "--cluster-enabled" && i+1 < len(args) && strings.EqualFold(args[i+1], "yes") {
			return true
		}
		if strings.EqualFold(a, "--cluster-enabled yes") {
			return true
		}
	}
	return false
}

// freePort returns a port that was free on 127.0.0.1 a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, err
	}
	return port, nil
}

func (s *Server) args() []string {
	var args []string
	if s.configPath != "" {
		args = append(args, s.configPath)
	}
	args = append(args,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--protected-mode", "yes",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--logfile", "",
		"--dir", s.dir,
	)
	if s.busPort != 0 {
		args = append(args, "--cluster-port", strconv.Itoa(s.busPort))
	}
	return append(args, s.extraArgs...)
}

// startLocked starts the process and waits until it answers. s.mu is held.
func (s *Server) startLocked() error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	var logStart int64
	if fi, err := logf.Stat(); err == nil {
		logStart = fi.Size()
	}
	fmt.Fprintf(logf, "### redistest: starting %s %q\n", s.serverPath, s.args())
	cmd := exec.Command(s.serverPath, s.args()...)
	cmd.Dir = s.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	s.cmd, s.done, s.state = cmd, done, stateRunning
	if err := s.waitReady(cmd.Process.Pid, done, logStart); err != nil {
		s.killLocked()
		return err
	}
	return nil
}

// waitReady polls the server until it is this process that answers on the
// port (a bind race could otherwise let another test's server answer).
func (s *Server) waitReady(pid int, done <-chan struct{}, logStart int64) error {
	deadline := time.Now().Add(readyTimeout)
	var lastErr error
	for {
		select {
		case <-done:
			if l := s.Log(); int64(len(l)) >= logStart && strings.Contains(l[logStart:], "Address already in use") {
				return fmt.Errorf("%s: %w", s.Addr(), errPortInUse)
			}
			return fmt.Errorf("redis-server on %s exited during startup", s.Addr())
		default:
		}
		info, err := doString(s.Addr(), 250*time.Millisecond, "INFO", "server")
		if err == nil && infoField(info, "process_id") == strconv.Itoa(pid) {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("another process (pid %s) answers on %s", infoField(info, "process_id"), s.Addr())
		}
		lastErr = err
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not answer within %v: %v", s.Addr(), readyTimeout, lastErr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killLocked SIGKILLs the process and waits until it is reaped. s.mu is held.
func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		// Unreachable in practice: SIGKILL cannot be ignored, and it also
		// ends a SIGSTOPped process.
	}
	s.cmd, s.state = nil, stateDead
}

// Addr returns the server's address, "127.0.0.1:<port>".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the server's TCP port. It does not change across Restart.
func (s *Server) Port() int { return s.port }

// Socket returns the path of the server's unix socket (StartUnixServer),
// or "" for a server that listens on TCP only.
func (s *Server) Socket() string { return s.socket }

// Dir returns the server's working directory (also its --dir).
func (s *Server) Dir() string { return s.dir }

// Pid returns the process id of the running server, or 0 after Kill or Close.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Log returns everything the server has logged so far, across restarts.
func (s *Server) Log() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(b)
}

func (s *Server) logTail() string {
	l := s.Log()
	if len(l) > logTailBytes {
		l = "...\n" + l[len(l)-logTailBytes:]
	}
	return "--- redis-server log " + s.logPath + " ---\n" + l
}

// running reports whether the process is alive and not stopped.
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == stateRunning
}

// Kill sends SIGKILL to the server and waits until the process is gone. It is
// a no-op when the server is not running. Its data is lost; Restart brings it
// back on the same port.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// Stop sends SIGSTOP: the process keeps its port and its connections but
// answers nothing until Cont, like a hung host. Stop waits (up to 1 s) until
// the kernel reports the process as stopped.
func (s *Server) Stop() { s.pause(true) }

// Cont sends SIGCONT, resuming a server paused by Stop.
func (s *Server) Cont() { s.pause(false) }

// pause stops (SIGSTOP) or resumes (SIGCONT) the process and waits until
// the kernel reports it so. It is a no-op when there is no process.
func (s *Server) pause(stop bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	sig, state := syscall.SIGCONT, stateRunning
	if stop {
		sig, state = syscall.SIGSTOP, stateStopped
	}
	_ = s.cmd.Process.Signal(sig)
	s.state = state
	waitProcState(s.cmd.Process.Pid, stop)
}

// waitProcState waits up to 1 s until /proc says the process is (or is no
// longer) stopped. Without /proc it returns at once.
func waitProcState(pid int, stopped bool) {
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		// The state follows the command name, which is in parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) {
			return
		}
		st := b[i+2]
		if (st == 'T' || st == 't') == stopped {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// Restart kills the server if it is running and starts it again on the same
// port with the same command line. It comes back empty, since nothing is
// persisted; a cluster node keeps its nodes.conf, so it rejoins the cluster
// with its old identity. Restart fails the test (with the server's log) when
// the server cannot be started or does not answer within 10 s.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		t.Fatalf("redistest: Restart of closed server %s", s.Addr())
		return
	}
	s.killLocked()
	var err error
	for attempt := 0; attempt < restartAttempts; attempt++ {
		if err = s.startLocked(); !errors.Is(err, errPortInUse) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("redistest: restarting redis-server: %v\n%s", err, s.logTail())
	}
}

// Close kills the server for good. It is idempotent and is called by
// t.Cleanup.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.killLocked()
}
