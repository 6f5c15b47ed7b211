//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns nil outside Linux: there is no Pdeathsig, so servers
// are only killed by t.Cleanup.
func sysProcAttr() *syscall.SysProcAttr { return nil }
