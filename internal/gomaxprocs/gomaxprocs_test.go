package gomaxprocs

import (
	"bytes"
	"context"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeRuntime stands in for the Go runtime and the process's clocks: each
// tick adds its cores to the CPU time and tickEvery to the wall clock.
type fakeRuntime struct {
	width, def int
	cpu        time.Duration
	now        time.Time
	log        bytes.Buffer
	s          *sizer
}

func newFake(width, def int) *fakeRuntime {
	f := &fakeRuntime{width: width, def: def, now: time.Unix(1e9, 0)}
	f.s = newSizer(slog.New(slog.NewTextHandler(&f.log, nil)),
		func() (time.Duration, bool) { return f.cpu, true },
		func() time.Time { return f.now },
		func(n int) int {
			old := f.width
			if n >= 1 {
				f.width = n
			}
			return old
		},
		func() { f.width = f.def })
	return f
}

// run feeds one tick per entry, in cores, and returns the width after
// each.
func (f *fakeRuntime) run(cores ...float64) []int {
	var widths []int
	for _, c := range cores {
		f.cpu += time.Duration(c * float64(tickEvery))
		f.now = f.now.Add(tickEvery)
		f.s.tick()
		widths = append(widths, f.width)
	}
	return widths
}

// repeat is n ticks at c cores.
func repeat(c float64, n int) []float64 { return slices.Repeat([]float64{c}, n) }

func TestWidensAfterOneFullSecond(t *testing.T) {
	f := newFake(1, 4)
	got := f.run(1.0, 0.9, 0.97, 0.9499, 1.0, 0.95)
	want := []int{1, 1, 1, 1, 1, 4}
	if !slices.Equal(got, want) {
		t.Fatalf("widths %v, want %v: one busy tick, or busy ticks apart, must not widen", got, want)
	}
	if n := strings.Count(f.log.String(), `msg="scheduler threads" from=1 to=4 cpu_cores=0.95`); n != 1 {
		t.Fatalf("log %q: want the change logged once", f.log.String())
	}
}

func TestNarrowsAfterThirtySecondsWithinOneCore(t *testing.T) {
	f := newFake(2, 2)
	const thirtySeconds = 60 // ticks
	ticks := slices.Concat(repeat(1.0499, thirtySeconds-1), repeat(1.05, 1), repeat(0.3, thirtySeconds-1))
	for i, w := range f.run(ticks...) {
		if w != 2 {
			t.Fatalf("tick %d: width %d; a tick over one core must restart the count", i, w)
		}
	}
	if got := f.run(0.3); got[0] != 1 {
		t.Fatalf("width %d after %d ticks in a row within one core, want 1", got[0], thirtySeconds)
	}
	if !strings.Contains(f.log.String(), "from=2 to=1 cpu_cores=0.3 next_widening_held=0s") {
		t.Fatalf("log %q: want the narrowing logged, with no hold (the spell used more than a core)", f.log.String())
	}
}

// A proxy that starts wide and idle narrows with no hold on its next
// widening: starting wide gained nothing, but it was no widening either.
func TestStartedWideAndIdle(t *testing.T) {
	f := newFake(2, 2)
	f.run(repeat(0.01, narrowTicks)...)
	if f.width != 1 {
		t.Fatalf("width %d after thirty idle seconds, want 1", f.width)
	}
	if got := f.run(repeat(1.0, widenTicks)...); got[widenTicks-1] != 2 {
		t.Fatal("a load that fills the one thread right after the first narrowing was held")
	}
}

// A proxy that starts wide under a load one thread can carry narrows, and
// stays narrow: the width does not depend on where it started.
func TestStartedWideUnderALoadOneThreadCarries(t *testing.T) {
	f := newFake(2, 2)
	f.run(repeat(0.85, narrowTicks)...) // two threads' cost of the load
	for i, w := range f.run(repeat(0.6, 2000)...) {
		if w != 1 {
			t.Fatalf("tick %d: width %d, want 1 for a load of 0.6 cores on one thread", i, w)
		}
	}
}

// A load that needs more than a core widens the scheduler; when it falls,
// the scheduler narrows; when it rises again, it widens again at once,
// because the spell had paid.
func TestFollowsALoadUpAndDown(t *testing.T) {
	f := newFake(1, 2)
	got := f.run(slices.Concat(repeat(1.0, 2), repeat(1.4, 10), repeat(0.1, narrowTicks), repeat(1.0, 2))...)
	want := slices.Concat([]int{1, 2}, slices.Repeat([]int{2}, 10+narrowTicks-1), []int{1, 1, 2})
	if !slices.Equal(got, want) {
		t.Fatalf("widths %v, want %v", got, want)
	}
}

// Under a CPU limit of one core (for which Go still runs two threads) a
// wide spell never uses more than a core: each such spell doubles the wait
// before the next widening, up to holdMax, and one that used more clears
// it.
func TestASpellThatGainedNothingHoldsTheNext(t *testing.T) {
	f := newFake(1, 2)
	f.run(repeat(1.0, widenTicks)...)
	var holds []time.Duration
	for range 8 {
		f.run(repeat(1.0, narrowTicks)...) // a wide spell within one core
		if f.width != 1 {
			t.Fatalf("still wide after %d ticks within one core", narrowTicks)
		}
		narrowed := f.now
		for f.width == 1 && f.now.Sub(narrowed) < time.Hour {
			f.run(1.0) // one thread full all along
		}
		holds = append(holds, f.now.Sub(narrowed))
	}
	want := []time.Duration{30, 60, 120, 240, 480, 600, 600, 600}
	for i := range want {
		want[i] *= time.Second
	}
	if !slices.Equal(holds, want) {
		t.Fatalf("one thread full for %v after each spell before widening again, want %v", holds, want)
	}
	f.run(slices.Concat(repeat(1.3, 1), repeat(0.2, narrowTicks))...)
	if f.width != 1 || f.s.hold != 0 {
		t.Fatalf("width %d, hold %v: a spell that used more than a core must clear the hold", f.width, f.s.hold)
	}
	if f.run(repeat(1.0, widenTicks)...)[widenTicks-1] != 2 {
		t.Fatal("no widening at once after a spell that paid")
	}
	f.run(repeat(1.0, narrowTicks)...)
	if f.width != 1 || f.s.hold != holdFirst {
		t.Fatalf("width %d, hold %v after a spell within one core that followed one that paid; want 1, %v",
			f.width, f.s.hold, holdFirst)
	}
	if !strings.Contains(f.log.String(), "next_widening_held=10m0s") {
		t.Fatalf("log %q: want the hold logged", f.log.String())
	}
}

// While wide, the sizer keeps to Go's default, which Go moves with a
// changed CPU limit; it never logs what it did not change.
func TestWideFollowsGoDefault(t *testing.T) {
	f := newFake(4, 4)
	f.run(repeat(2.0, 3)...)
	f.def = 3
	if got := f.run(2.0); got[0] != 3 {
		t.Fatalf("width %d, want Go's new default 3", got[0])
	}
	f.width, f.def = 1, 1 // the limit fell to one CPU
	if got := f.run(1.0, 1.0); got[1] != 1 {
		t.Fatalf("width %d, want 1: Go's default is one thread now", got[1])
	}
	if f.log.Len() != 0 {
		t.Fatalf("logged %q, though the sizer changed nothing", f.log.String())
	}
}

// A tick without a CPU time, or whose clock went back, is skipped: it
// changes nothing, and the next tick measures from the last good one.
func TestSkipsATickItCannotMeasure(t *testing.T) {
	f := newFake(1, 2)
	f.run(1.0)
	cpu := f.s.cpu
	f.s.cpu = func() (time.Duration, bool) { return 0, false }
	f.run(repeat(1.0, 10)...)
	f.s.cpu = cpu
	if f.width != 1 || f.s.busy != 1 {
		t.Fatalf("width %d, busy %d: ticks without a CPU time must change nothing", f.width, f.s.busy)
	}
	clock := f.s.clock
	f.s.clock = func() time.Time { return f.now.Add(-time.Hour) }
	f.run(1.0)
	f.s.clock = clock
	if f.width != 1 || f.s.busy != 1 {
		t.Fatalf("width %d, busy %d: a tick whose clock went back must change nothing", f.width, f.s.busy)
	}
	if f.run(1.0)[0] != 2 {
		t.Fatal("no widening after a full second, measured across the skipped ticks")
	}
}

func TestRunStopsAndLeavesGoDefault(t *testing.T) {
	f := newFake(2, 2)
	ticks := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.s.run(ctx, ticks); close(done) }()
	ticks <- time.Time{}
	f.width = 1 // as if it had narrowed
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("run still ticking after its context ended")
	}
	if f.width != 2 {
		t.Fatalf("width %d after run stopped, want Go's default 2", f.width)
	}
}

func TestFixedReadsTheEnvironmentAsTheRuntimeDoes(t *testing.T) {
	for v, want := range map[string]bool{"3": true, "1": true, "": false, "0": false, "-2": false, "auto": false, "2x": false} {
		if got := fixed(v); got != want {
			t.Errorf("fixed(%q) = %v, want %v", v, got, want)
		}
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

// cpuTime counts every thread of the process, in real units.
func TestCPUTimeCountsOtherThreads(t *testing.T) {
	// The test's goroutine stays on one thread, so that a clock of that
	// thread alone would miss the spinning one.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, ok := cpuTime()
	if !ok {
		t.Skip("no process CPU time here")
	}
	start := time.Now()
	burnt := make(chan time.Duration)
	go func() {
		runtime.LockOSThread() // a thread other than the test's
		t0 := time.Now()
		for time.Since(t0) < 200*time.Millisecond {
		}
		burnt <- time.Since(t0)
	}()
	<-burnt
	after, _ := cpuTime()
	used, wall := after-before, time.Since(start)
	if used < 50*time.Millisecond || used > wall*time.Duration(runtime.NumCPU())+50*time.Millisecond {
		t.Fatalf("CPU time %v over %v of a thread spinning on %d CPUs", used, wall, runtime.NumCPU())
	}
}
