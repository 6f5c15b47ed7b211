package main

import "syscall"

// sysProcAttr makes the kernel kill the redis-server this program started
// when the program dies without stopping it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
