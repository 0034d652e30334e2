//go:build !unix

package gomaxprocs

import "time"

// cpuTime cannot be read here without getrusage: the sizing stays off.
func cpuTime() (time.Duration, bool) { return 0, false }
