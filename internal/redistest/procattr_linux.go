package redistest

import "syscall"

// sysProcAttr makes the kernel SIGKILL a started redis-server when the test
// binary dies, even if t.Cleanup never runs (a panic in another goroutine, a
// test timeout, or a SIGKILL of the test binary).
//
// Pdeathsig is tied to the OS thread that forked the child. The Go runtime
// only retires threads whose goroutine exited while locked with
// runtime.LockOSThread, which the harness never does, so in practice the
// signal fires when the process exits.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
