package gomaxprocs

import (
	"context"
	"log/slog"
	"math"
	"os"
	"runtime"
	"strconv"
	"time"
)

// The sizing rule (package doc), in cores (CPU seconds per second) and
// ticks of tickEvery.
const (
	tickEvery   = 500 * time.Millisecond
	widenAt     = 0.95 // cores, on one thread …
	widenTicks  = 2    // … for this many ticks in a row
	oneCore     = 1.05 // cores, wide: more than one thread's worth
	narrowTicks = 60   // ticks in a row under oneCore, wide, to narrow
	holdFirst   = 30 * time.Second
	holdMax     = 10 * time.Minute
)

// Run sizes GOMAXPROCS until ctx is done, then leaves Go's default. It
// returns at once, changing nothing, when the environment fixes
// GOMAXPROCS (an integer above 0, as the runtime reads it), when Go's
// default is one thread, or where the process's CPU time cannot be read.
func Run(ctx context.Context, log *slog.Logger) {
	if v := os.Getenv("GOMAXPROCS"); fixed(v) {
		log.Info("scheduler threads fixed by the environment", "GOMAXPROCS", v)
		return
	}
	if _, ok := cpuTime(); !ok || runtime.GOMAXPROCS(0) <= 1 {
		log.Debug("scheduler threads not sized", "threads", runtime.GOMAXPROCS(0), "cpu_time_readable", ok)
		return
	}
	s := newSizer(log, cpuTime, time.Now, runtime.GOMAXPROCS, runtime.SetDefaultGOMAXPROCS)
	t := time.NewTicker(tickEvery)
	defer t.Stop()
	s.run(ctx, t.C)
}

// run ticks at each value from ticks until ctx is done, then leaves Go's
// default.
func (s *sizer) run(ctx context.Context, ticks <-chan time.Time) {
	defer s.widen()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			s.tick()
		}
	}
}

// fixed reports whether GOMAXPROCS=v sets the width, as the runtime
// reads it: an integer above 0. Anything else leaves Go's default.
func fixed(v string) bool {
	n, err := strconv.Atoi(v)
	return err == nil && n > 0
}

// sizer applies the rule to one tick at a time.
type sizer struct {
	cpu   func() (time.Duration, bool) // the process's CPU time so far
	clock func() time.Time
	procs func(n int) int // as runtime.GOMAXPROCS
	widen func()          // as runtime.SetDefaultGOMAXPROCS
	log   *slog.Logger

	used time.Duration // CPU time at the last tick
	at   time.Time     // the last tick
	busy int           // ticks in a row on one thread at widenAt or more
	calm int           // ticks in a row, wide, under oneCore
	paid bool          // this wide spell has used more than oneCore
	hold time.Duration // how long an unpaid spell keeps the next from starting
	from time.Time     // no widening before this
}

// newSizer starts measuring now, at the width the process has.
func newSizer(log *slog.Logger, cpu func() (time.Duration, bool), clock func() time.Time,
	procs func(int) int, widen func()) *sizer {
	used, _ := cpu()
	return &sizer{
		cpu: cpu, clock: clock, procs: procs, widen: widen, log: log,
		used: used, at: clock(),
		paid: true, // starting wide was no widening that gained nothing
	}
}

// tick measures the CPU used since the last tick and changes the width
// when the rule says so. The width is read each time rather than
// remembered: at Go's default, Go itself follows a changed CPU limit.
func (s *sizer) tick() {
	used, ok := s.cpu()
	now := s.clock()
	elapsed := now.Sub(s.at)
	if !ok || elapsed <= 0 {
		return
	}
	cores := float64(used-s.used) / float64(elapsed)
	s.used, s.at = used, now
	width := s.procs(0)
	if width == 1 {
		s.busy = countIf(cores >= widenAt, s.busy)
		if s.busy < widenTicks || now.Before(s.from) {
			return
		}
		s.busy, s.calm, s.paid = 0, 0, false
		s.widen()
	} else {
		// Follow Go's default while wide. This is a no-op unless the
		// default moved and the runtime's own update was lost to a
		// narrowing at the same instant.
		s.widen()
		s.paid = s.paid || cores >= oneCore
		s.calm = countIf(cores < oneCore, s.calm)
		if s.calm < narrowTicks {
			return
		}
		// A spell that never used more than one thread's worth gained
		// nothing (a CPU limit of one core, or work that costs as much
		// on one thread): wait longer before the next, each time.
		if s.paid {
			s.hold = 0
		} else {
			s.hold = min(max(2*s.hold, holdFirst), holdMax)
		}
		s.from = now.Add(s.hold)
		s.busy, s.calm = 0, 0
		s.procs(1)
	}
	if to := s.procs(0); to != width {
		s.log.Info("scheduler threads", "from", width, "to", to, "cpu_cores", math.Round(cores*100)/100,
			"next_widening_held", s.hold)
	}
}

// countIf is n+1 when cond holds, else 0: a count of ticks in a row.
func countIf(cond bool, n int) int {
	if cond {
		return n + 1
	}
	return 0
}
