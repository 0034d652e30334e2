//go:build linux

package localredis

import "syscall"

// sysProcAttr asks the kernel to SIGKILL the child when its parent thread
// exits, so a crashed test binary does not leak redis-server processes.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
