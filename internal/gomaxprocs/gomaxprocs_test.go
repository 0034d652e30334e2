package gomaxprocs

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeRuntime stands in for the Go runtime and the process's CPU clock:
// each window adds its cores to the CPU time and one second to the clock.
type fakeRuntime struct {
	width, def int
	cpu        time.Duration
	now        time.Time
	log        bytes.Buffer
	s          *sizer
}

func newFake(width, def int) *fakeRuntime {
	f := &fakeRuntime{width: width, def: def, now: time.Unix(1e9, 0)}
	f.s = &sizer{
		cpu: func() (time.Duration, bool) { return f.cpu, true },
		procs: func(n int) int {
			old := f.width
			if n >= 1 {
				f.width = n
			}
			return old
		},
		widen: func() { f.width = f.def },
		log:   slog.New(slog.NewTextHandler(&f.log, nil)),
		used:  f.cpu, at: f.now,
	}
	return f
}

// run feeds one window per entry, in cores, and returns the width after
// each.
func (f *fakeRuntime) run(cores ...float64) []int {
	var widths []int
	for _, c := range cores {
		f.cpu += time.Duration(c * float64(window))
		f.now = f.now.Add(window)
		f.s.tick(f.now)
		widths = append(widths, f.width)
	}
	return widths
}

// repeat is n windows at c cores.
func repeat(c float64, n int) []float64 { return slices.Repeat([]float64{c}, n) }

func TestWidensAfterTwoBusyWindowsInARow(t *testing.T) {
	f := newFake(1, 4)
	got := f.run(1.0, 0.9, 0.97, 0.94, 1.0, 1.02)
	want := []int{1, 1, 1, 1, 1, 4}
	if !slices.Equal(got, want) {
		t.Fatalf("widths %v, want %v: one busy window, or busy windows apart, must not widen", got, want)
	}
	if n := strings.Count(f.log.String(), `msg="scheduler threads" from=1 to=4 cpu_cores=1.02`); n != 1 {
		t.Fatalf("log %q: want the change logged once", f.log.String())
	}
}

func TestNarrowsAfterFiveCalmWindowsInARow(t *testing.T) {
	f := newFake(2, 2)
	for i, w := range f.run(slices.Concat(repeat(0.6, 4), repeat(0.8, 1), repeat(0.3, 4))...) {
		if w != 2 {
			t.Fatalf("window %d: width %d; a busy window must restart the count", i, w)
		}
	}
	if got := f.run(0.3); got[0] != 1 {
		t.Fatalf("width %d after five calm windows in a row, want 1", got[0])
	}
	if !strings.Contains(f.log.String(), "from=2 to=1 cpu_cores=0.3") {
		t.Fatalf("log %q: want the narrowing logged", f.log.String())
	}
}

// Between the bounds the width stays where it is, narrow or wide, however
// long the load stays there: the rule never flaps.
func TestKeepsWidthBetweenTheBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, width := range []int{1, 8} {
		f := newFake(width, 8)
		for range 1000 {
			f.run(narrowAt + r.Float64()*(widenAt-narrowAt-0.001))
			if f.width != width {
				t.Fatalf("width %d moved to %d between the bounds", width, f.width)
			}
		}
		if f.log.Len() != 0 {
			t.Fatalf("logged %q without a change", f.log.String())
		}
	}
}

// A load that widened the scheduler and then fell narrows it again, and
// one that rises again widens it again: each change needs its windows anew.
func TestFollowsALoadUpAndDown(t *testing.T) {
	f := newFake(1, 2)
	got := f.run(slices.Concat(repeat(1.0, 2), repeat(1.4, 10), repeat(0.1, 5), repeat(1.0, 2))...)
	want := slices.Concat([]int{1, 2}, slices.Repeat([]int{2}, 14), []int{1, 1, 2})
	if !slices.Equal(got, want) {
		t.Fatalf("widths %v, want %v", got, want)
	}
}

// Go follows a changed container limit by itself while the width is its
// default; the sizer reads the width each window rather than trusting its
// own last move.
func TestReadsTheWidthEachWindow(t *testing.T) {
	f := newFake(4, 4)
	f.run(repeat(0.2, 3)...)
	f.width, f.def = 1, 1 // the limit fell to one CPU
	if got := f.run(1.0, 1.0); got[1] != 1 {
		t.Fatalf("width %d, want 1: Go's default is one thread now", got[1])
	}
	if f.log.Len() != 0 {
		t.Fatalf("logged %q, though the width never changed", f.log.String())
	}
}

func TestSkipsAWindowItCannotMeasure(t *testing.T) {
	f := newFake(1, 2)
	f.s.cpu = func() (time.Duration, bool) { return 0, false }
	f.run(repeat(5, 10)...)
	f.s.at = f.now.Add(time.Hour) // a clock that went back
	f.s.cpu = func() (time.Duration, bool) { return f.cpu, true }
	f.run(repeat(5, 1)...)
	if f.width != 1 || f.s.busy != 0 {
		t.Fatalf("width %d, busy %d: unmeasured windows must change nothing", f.width, f.s.busy)
	}
}

func TestRunLeavesAWidthSetInTheEnvironment(t *testing.T) {
	t.Setenv("GOMAXPROCS", "3")
	before := runtime.GOMAXPROCS(0)
	var log bytes.Buffer
	done := make(chan struct{})
	go func() {
		Run(context.Background(), slog.New(slog.NewTextHandler(&log, nil)))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run still sizing with GOMAXPROCS set")
	}
	if after := runtime.GOMAXPROCS(0); after != before {
		t.Fatalf("GOMAXPROCS %d → %d", before, after)
	}
	if !strings.Contains(log.String(), "GOMAXPROCS=3") {
		t.Fatalf("log %q: want the fixed width said", log.String())
	}
}
