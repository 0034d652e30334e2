package gomaxprocs

import (
	"context"
	"log/slog"
	"math"
	"os"
	"runtime"
	"time"
)

// The sizing rule's bounds, in cores (CPU seconds per second) and in
// windows of one second in a row.
const (
	window        = time.Second
	widenAt       = 0.95
	widenWindows  = 2
	narrowAt      = 0.75
	narrowWindows = 5
)

// Run sizes GOMAXPROCS every second until ctx is done. It returns at once,
// changing nothing, when the environment sets GOMAXPROCS, when Go's
// default is one thread, or where the process's CPU time cannot be read.
func Run(ctx context.Context, log *slog.Logger) {
	if v := os.Getenv("GOMAXPROCS"); v != "" {
		log.Info("scheduler threads fixed by the environment", "GOMAXPROCS", v)
		return
	}
	used, ok := cpuTime()
	if !ok || runtime.GOMAXPROCS(0) <= 1 {
		return
	}
	s := &sizer{
		cpu: cpuTime, procs: runtime.GOMAXPROCS, widen: runtime.SetDefaultGOMAXPROCS,
		log: log, used: used, at: time.Now(),
	}
	defer s.widen() // leave the process as Go would have it
	t := time.NewTicker(window)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.tick(now)
		}
	}
}

// sizer applies the rule (package doc) to one window at a time.
type sizer struct {
	cpu   func() (time.Duration, bool) // the process's CPU time so far
	procs func(n int) int              // as runtime.GOMAXPROCS
	widen func()                       // as runtime.SetDefaultGOMAXPROCS
	log   *slog.Logger

	used time.Duration // CPU time at the last tick
	at   time.Time     // the last tick
	busy int           // windows in a row at one thread past widenAt
	calm int           // windows in a row, wider, under narrowAt
}

// tick measures the window that ends at now and changes the width when
// the rule says so. The width is read each time rather than remembered:
// at Go's default, Go itself follows a changed container limit.
func (s *sizer) tick(now time.Time) {
	used, ok := s.cpu()
	elapsed := now.Sub(s.at)
	if !ok || elapsed <= 0 {
		return
	}
	cores := float64(used-s.used) / float64(elapsed)
	s.used, s.at = used, now
	from := s.procs(0)
	if from == 1 {
		s.calm = 0
		s.busy = countIf(cores >= widenAt, s.busy)
		if s.busy < widenWindows {
			return
		}
		s.busy = 0
		s.widen()
	} else {
		s.busy = 0
		s.calm = countIf(cores < narrowAt, s.calm)
		if s.calm < narrowWindows {
			return
		}
		s.calm = 0
		s.procs(1)
	}
	if to := s.procs(0); to != from {
		s.log.Info("scheduler threads", "from", from, "to", to, "cpu_cores", math.Round(cores*100)/100)
	}
}

// countIf is n+1 when cond holds, else 0: a count of windows in a row.
func countIf(cond bool, n int) int {
	if cond {
		return n + 1
	}
	return 0
}
