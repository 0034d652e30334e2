//go:build unix

package gomaxprocs

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time the process has used so far, user and system,
// over all its threads (getrusage RUSAGE_SELF).
func cpuTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
