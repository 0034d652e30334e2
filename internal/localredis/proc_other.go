//go:build !linux

package localredis

import "syscall"

// sysProcAttr returns nil: Pdeathsig is Linux-only, so elsewhere a child can
// outlive a parent that dies without calling Stop.
func sysProcAttr() *syscall.SysProcAttr {
	return nil
}
