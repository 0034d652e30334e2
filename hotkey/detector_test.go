package hotkey

import (
	"cmp"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// fakeClock is a clock that moves only when told; safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

var clockBase = time.Date(2025, 11, 11, 0, 0, 0, 0, time.UTC)

func (c *fakeClock) Now() time.Time          { return clockBase.Add(time.Duration(c.ns.Load())) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// withSeed makes the Detector sample from a seeded source, so that a test
// with a sample rate below 1 sees the same samples every run. The source
// is not safe for concurrent use.
func withSeed(seed uint64) Option {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return func(d *Detector) { d.rnd = r.Uint64 }
}

func detectConfig(rate, threshold float64, capacity int) config.Detect {
	return config.Detect{
		Enabled:    true,
		SampleRate: rate,
		Window:     config.Duration(time.Second),
		Threshold:  threshold,
		Capacity:   capacity,
	}
}

func newDetector(t testing.TB, cfg config.Detect, opts ...Option) *Detector {
	t.Helper()
	d, err := NewDetector(cfg, opts...)
	if err != nil {
		t.Fatalf("NewDetector(%+v): %v", cfg, err)
	}
	return d
}

// drive sends ops of key per second, evenly spaced, for dur, polling
// Changes every 10ms of fake time; it returns the changes seen.
func drive(d *Detector, clk *fakeClock, key string, write bool, opsPerSec float64, dur time.Duration) []Detected {
	var changes []Detected
	poll := func() { changes = append(changes, d.Changes()...) }
	end := clk.Now().Add(dur)
	nextPoll := clk.Now().Add(10 * time.Millisecond)
	if opsPerSec == 0 {
		for clk.Now().Before(end) {
			clk.Advance(10 * time.Millisecond)
			poll()
		}
		return changes
	}
	step := time.Duration(float64(time.Second) / opsPerSec)
	k := []byte(key)
	for clk.Advance(step); !clk.Now().After(end); clk.Advance(step) {
		d.Observe(k, write)
		if !clk.Now().Before(nextPoll) {
			poll()
			nextPoll = nextPoll.Add(10 * time.Millisecond)
		}
	}
	poll()
	return changes
}

// state returns key's entry in Top, or fails.
func state(t *testing.T, d *Detector, key string) Detected {
	t.Helper()
	for _, x := range d.Top(d.Tracked()) {
		if x.Key == key {
			return x
		}
	}
	t.Fatalf("key %q not tracked", key)
	return Detected{}
}

// samplingCases keep about as many samples per window at the threshold
// (rate × threshold × window) as a proxy with the defaults (50) or more,
// so that sampling noise does not decide the outcome.
var samplingCases = []struct {
	name      string
	rate      float64
	threshold float64
}{
	{"rate=1", 1, 1000},
	{"rate=0.1", 0.1, 5000},
	{"rate=0.01", 0.01, 50000},
}

func TestDetectorHotWithinOneWindow(t *testing.T) {
	for _, c := range samplingCases {
		t.Run(c.name, func(t *testing.T) {
			clk := &fakeClock{}
			d := newDetector(t, detectConfig(c.rate, c.threshold, 100), WithClock(clk.Now), withSeed(1))
			start := clk.Now()
			changes := drive(d, clk, "stock:sku:1001", true, 2*c.threshold, time.Second)
			if len(changes) != 1 {
				t.Fatalf("changes = %+v, want one (turned hot)", changes)
			}
			got := changes[0]
			if !got.Hot || !got.WriteHot || got.ReadHot || got.Key != "stock:sku:1001" {
				t.Errorf("change = %+v, want stock:sku:1001 write-hot", got)
			}
			// Noise-free, 2× the threshold reaches it after ln 2 windows.
			if s := got.Since.Sub(start); s <= 0 || s > time.Second {
				t.Errorf("hot %v after start, want within one window (1s)", s)
			}
			if st := state(t, d, "stock:sku:1001"); !st.Hot || st.Since != got.Since {
				t.Errorf("Top: %+v, want hot since %v", st, got.Since)
			}
		})
	}
}

func TestDetectorHalfThresholdNeverHot(t *testing.T) {
	for _, c := range samplingCases {
		t.Run(c.name, func(t *testing.T) {
			clk := &fakeClock{}
			d := newDetector(t, detectConfig(c.rate, c.threshold, 100), WithClock(clk.Now), withSeed(2))
			if changes := drive(d, clk, "k", false, c.threshold/2, 20*time.Second); len(changes) != 0 {
				t.Fatalf("changes = %+v, want none", changes)
			}
			st := state(t, d, "k")
			if st.Hot || !st.Since.IsZero() {
				t.Errorf("Top: %+v, want not hot", st)
			}
			if want := c.threshold / 2; math.Abs(st.ReadRate-want) > 0.2*want || st.WriteRate != 0 {
				t.Errorf("rates = %.0f read, %.0f write ops/s; want about %.0f read, 0 write", st.ReadRate, st.WriteRate, want)
			}
		})
	}
}

func TestDetectorReadsAndWritesApart(t *testing.T) {
	const threshold = 1000
	clk := &fakeClock{}
	d := newDetector(t, detectConfig(1, threshold, 100), WithClock(clk.Now))
	// Two windows of reads at 2× and writes at ¼×, interleaved.
	key := []byte("k")
	for range 2 * 2000 {
		clk.Advance(500 * time.Microsecond)
		d.Observe(key, false)
		if clk.ns.Load()%int64(4*time.Millisecond) == 0 {
			d.Observe(key, true)
		}
	}
	st := state(t, d, "k")
	wantRead := 2 * threshold * (1 - math.Exp(-2))
	wantWrite := threshold / 4 * (1 - math.Exp(-2))
	if math.Abs(st.ReadRate-wantRead) > 0.05*wantRead || math.Abs(st.WriteRate-wantWrite) > 0.05*wantWrite {
		t.Errorf("rates = %.0f read, %.0f write ops/s; want about %.0f, %.0f", st.ReadRate, st.WriteRate, wantRead, wantWrite)
	}
	if !st.Hot || !st.ReadHot || st.WriteHot {
		t.Errorf("Top: %+v, want read-hot only", st)
	}
	readSince := st.Since
	d.Changes()

	// Now writes at 2× and no reads: the write side turns hot too, while
	// the read side is in its cool-down; Since stays.
	changes := drive(d, clk, "k", true, 2*threshold, time.Second)
	if len(changes) != 1 {
		t.Fatalf("changes = %+v, want one (write-hot)", changes)
	}
	if c := changes[0]; !c.Hot || !c.ReadHot || !c.WriteHot || !c.Since.Equal(readSince) || c.WriteRate < threshold {
		t.Errorf("change = %+v, want read- and write-hot since %v", c, readSince)
	}
}

func TestDetectorCools(t *testing.T) {
	const threshold = 1000
	window := time.Second
	coolDown := coolDownWindows * window

	t.Run("stops", func(t *testing.T) {
		clk := &fakeClock{}
		d := newDetector(t, detectConfig(1, threshold, 100), WithClock(clk.Now))
		if ch := drive(d, clk, "k", false, 2*threshold, 2*window); len(ch) != 1 || !ch[0].Hot {
			t.Fatalf("changes = %+v, want one (hot)", ch)
		}
		// With no more samples the rate decays from peak and is below the
		// threshold from window·ln(peak/threshold) on; the key cools one
		// cool-down later, not a nanosecond sooner.
		peak := state(t, d, "k").ReadRate
		below := time.Duration(window.Seconds() * math.Log(peak/threshold) * float64(time.Second))
		clk.Advance(below + coolDown - time.Millisecond)
		if ch := d.Changes(); len(ch) != 0 {
			t.Errorf("cooled before the cool-down ended: %+v", ch)
		}
		clk.Advance(time.Millisecond)
		ch := d.Changes()
		if len(ch) != 1 || ch[0].Hot || ch[0].ReadHot || !ch[0].Since.IsZero() || ch[0].ReadRate >= threshold {
			t.Fatalf("at cool-down end: changes = %+v, want one (cooled)", ch)
		}
		if st := state(t, d, "k"); st.Hot {
			t.Errorf("Top: %+v, want cooled", st)
		}
	})

	t.Run("drops to a quarter", func(t *testing.T) {
		clk := &fakeClock{}
		d := newDetector(t, detectConfig(1, threshold, 100), WithClock(clk.Now))
		drive(d, clk, "k", true, 2*threshold, 2*window)
		d.Changes()
		// Sampled commands keep coming; the estimate falls below the
		// threshold within a window (0.68 s here), and the key cools a
		// cool-down after that.
		if ch := drive(d, clk, "k", true, threshold/4, coolDown); len(ch) != 0 {
			t.Fatalf("changes = %+v within the cool-down, want none", ch)
		}
		ch := drive(d, clk, "k", true, threshold/4, window)
		if len(ch) != 1 || ch[0].Hot || ch[0].WriteRate >= threshold {
			t.Fatalf("changes = %+v, want one (cooled)", ch)
		}
	})

	t.Run("dip shorter than the cool-down", func(t *testing.T) {
		clk := &fakeClock{}
		d := newDetector(t, detectConfig(1, threshold, 100), WithClock(clk.Now))
		first := drive(d, clk, "k", false, 2*threshold, 2*window)
		drive(d, clk, "k", false, 0, 2*window)
		if ch := drive(d, clk, "k", false, 2*threshold, 2*window); len(ch) != 0 {
			t.Errorf("changes = %+v, want none: the key stays hot", ch)
		}
		if st := state(t, d, "k"); !st.Hot || !st.Since.Equal(first[0].Since) {
			t.Errorf("Top: %+v, want hot since %v", st, first[0].Since)
		}
	})
}

func TestDetectorZipfTop(t *testing.T) {
	const (
		keys = 100_000
		ops  = 3_000_000
		rate = 0.02
	)
	names := make([][]byte, keys)
	for i := range names {
		names[i] = []byte("item:" + strconv.Itoa(i))
	}
	clk := &fakeClock{}
	// Capacity well below the key count: the LRU must keep the heavy
	// keys while the long tail churns through it.
	d := newDetector(t, detectConfig(rate, 1e9, 1000), WithClock(clk.Now), withSeed(3))
	zipf := rand.NewZipf(rand.New(rand.NewPCG(4, 5)), 1.1, 1, keys-1)
	count := make([]int, keys)
	for range ops {
		k := zipf.Uint64()
		count[k]++
		clk.Advance(time.Microsecond) // 1M ops/s: 3 windows
		d.Observe(names[k], k%3 == 0)
	}
	byCount := make([]int, keys)
	for i := range byCount {
		byCount[i] = i
	}
	slices.SortFunc(byCount, func(a, b int) int { return cmp.Compare(count[b], count[a]) })

	top := d.Top(20)
	reported := map[string]bool{}
	for _, x := range top {
		reported[x.Key] = true
	}
	for rank, k := range byCount[:10] {
		if !reported[string(names[k])] {
			t.Errorf("true rank %d %s (%d ops) not in the reported top 20: %+v", rank+1, names[k], count[k], top)
		}
	}
	if n := d.Tracked(); n > 1000 {
		t.Errorf("Tracked() = %d, want <= 1000", n)
	}
}

func TestDetectorMemoryBounded(t *testing.T) {
	const (
		capacity = 10_000
		distinct = 1_000_000
	)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	clk := &fakeClock{}
	d := newDetector(t, detectConfig(1, 5000, capacity), WithClock(clk.Now))
	buf := make([]byte, 0, 32)
	for i := range distinct {
		buf = strconv.AppendInt(append(buf[:0], "user:session:"...), int64(i), 10)
		clk.Advance(time.Microsecond)
		d.Observe(buf, i%2 == 0)
	}
	if n := d.Tracked(); n != capacity {
		t.Errorf("Tracked() = %d, want %d", n, capacity)
	}

	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(d)
	// A key costs its string, its entry and the LRU's list element and map
	// slot: a few hundred bytes. 1 KiB a key plus 1 MiB is generous and
	// still 100 times less than keeping every key seen.
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if limit := int64(capacity*1024 + 1<<20); grown > limit {
		t.Errorf("heap grew %d bytes for %d keys seen, want <= %d (capacity %d)", grown, distinct, limit, capacity)
	}
	t.Logf("heap grew %d bytes (%d per tracked key)", grown, grown/capacity)
}

func TestDetectorKeyNotRetained(t *testing.T) {
	d := newDetector(t, detectConfig(1, 5000, 10))
	key := []byte("abc")
	d.Observe(key, false)
	copy(key, "xyz")
	if top := d.Top(10); len(top) != 1 || top[0].Key != "abc" {
		t.Errorf("Top = %+v, want abc only", top)
	}
}

func TestDetectorUnsampledDoesNotAllocate(t *testing.T) {
	cfg := detectConfig(1e-12, 5000, 10)
	d := newDetector(t, cfg)
	key := []byte("stock:sku:1001")
	if n := testing.AllocsPerRun(10000, func() { d.Observe(key, true) }); n != 0 {
		t.Errorf("Observe allocates %v times per call, want 0", n)
	}
	if d.Tracked() > 1 {
		t.Errorf("Tracked() = %d after 10000 calls at rate 1e-12", d.Tracked())
	}
}

func TestDetectorSampleRate(t *testing.T) {
	for _, rate := range []float64{1, 0.5, 0.01} {
		d := newDetector(t, detectConfig(rate, 5000, 10), withSeed(6))
		const n = 1_000_000
		hits := 0
		for range n {
			if d.Sample() {
				hits++
			}
		}
		want := rate * n
		// Five standard deviations of a binomial count.
		if tol := 5 * math.Sqrt(n*rate*(1-rate)); math.Abs(float64(hits)-want) > tol {
			t.Errorf("rate %v: %d samples of %d, want %.0f ± %.0f", rate, hits, n, want, tol)
		}
	}
}

func TestDetectorSetConfig(t *testing.T) {
	clk := &fakeClock{}
	d := newDetector(t, detectConfig(1, 1000, 10), WithClock(clk.Now))
	if ch := drive(d, clk, "hot", true, 3000, 2*time.Second); len(ch) != 1 || ch[0].Key != "hot" || !ch[0].WriteHot {
		t.Fatalf("changes = %+v, want hot turning write-hot", ch)
	}
	// One window at 600 ops/s: warm's estimate is 379 ops/s; hot's has
	// decayed to 954, and hot is in its cool-down.
	if ch := drive(d, clk, "warm", false, 600, time.Second); len(ch) != 0 {
		t.Fatalf("changes = %+v, want none", ch)
	}

	// A lower threshold applies at once.
	cfg := detectConfig(1, 300, 10)
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if ch := d.Changes(); len(ch) != 1 || ch[0].Key != "warm" || !ch[0].ReadHot || !ch[0].Since.Equal(clk.Now()) {
		t.Errorf("after threshold 300: changes = %+v, want warm turning read-hot now", ch)
	}

	// Capacity 1 drops the least recently sampled key, hot, so it is
	// reported cooled.
	cfg.Capacity = 1
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if ch := d.Changes(); len(ch) != 1 || ch[0].Key != "hot" || ch[0].Hot {
		t.Errorf("after capacity 1: changes = %+v, want hot cooled", ch)
	}
	if n := d.Tracked(); n != 1 {
		t.Errorf("Tracked() = %d, want 1", n)
	}

	// Disabled: nothing more is counted.
	cfg.Enabled = false
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	drive(d, clk, "other", false, 1000, time.Second)
	if top := d.Top(10); len(top) != 1 || top[0].Key != "warm" {
		t.Errorf("disabled: Top = %+v, want warm only", top)
	}

	// A bad config is refused and changes nothing.
	bad := cfg
	bad.Enabled, bad.Capacity = true, 0
	if err := d.SetConfig(bad); err == nil {
		t.Error("SetConfig(capacity 0) = nil, want an error")
	}
	if d.Sample() {
		t.Error("Sample() = true after a refused SetConfig on a disabled detector")
	}
}

func TestNewDetectorRefusesBadConfig(t *testing.T) {
	good := detectConfig(0.01, 5000, 10)
	for _, c := range []struct {
		name  string
		edit  func(*config.Detect)
		field string
	}{
		{"rate 0", func(c *config.Detect) { c.SampleRate = 0 }, "sample_rate"},
		{"rate above 1", func(c *config.Detect) { c.SampleRate = 1.5 }, "sample_rate"},
		{"rate NaN", func(c *config.Detect) { c.SampleRate = math.NaN() }, "sample_rate"},
		{"window 0", func(c *config.Detect) { c.Window = 0 }, "window"},
		{"threshold 0", func(c *config.Detect) { c.Threshold = 0 }, "threshold"},
		{"threshold Inf", func(c *config.Detect) { c.Threshold = math.Inf(1) }, "threshold"},
		{"capacity 0", func(c *config.Detect) { c.Capacity = 0 }, "capacity"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.edit(&cfg)
			_, err := NewDetector(cfg)
			if err == nil {
				t.Fatalf("NewDetector(%+v) = nil error", cfg)
			}
			if want := "hotkeys.detect." + c.field; !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name %s", err, want)
			}
		})
	}
}

// TestDetectorConcurrent is for the race detector: Observe from many
// goroutines while others read reports and reload the config.
func TestDetectorConcurrent(t *testing.T) {
	clk := &fakeClock{}
	d := newDetector(t, detectConfig(0.5, 200, 50), WithClock(clk.Now))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			buf := make([]byte, 0, 16)
			for i := range 20_000 {
				k := r.IntN(200)
				if i%2 == 0 {
					k = 0 // one key gets half the traffic
				}
				buf = strconv.AppendInt(append(buf[:0], "k:"...), int64(k), 10)
				clk.Advance(time.Microsecond)
				d.Observe(buf, k%2 == 1)
			}
		})
	}
	var readers sync.WaitGroup
	for i := range 3 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				switch i {
				case 0:
					top := d.Top(10)
					if !slices.IsSortedFunc(top, func(a, b Detected) int {
						return cmp.Compare(max(b.ReadRate, b.WriteRate), max(a.ReadRate, a.WriteRate))
					}) {
						t.Errorf("Top not sorted: %+v", top)
					}
				case 1:
					d.Changes()
					// SetConfig below moves capacity within 20..59.
					if n := d.Tracked(); n > 59 {
						t.Errorf("Tracked() = %d, want <= 59", n)
					}
				case 2:
					cfg := detectConfig(0.5, 200, 20+int(clk.ns.Load()/1000)%40)
					if err := d.SetConfig(cfg); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	if top := d.Top(1); len(top) != 1 || top[0].Key != "k:0" || !top[0].Hot {
		t.Errorf("Top(1) = %+v, want k:0 hot", top)
	}
}

func BenchmarkObserveUnsampled(b *testing.B) {
	// A rate this small samples nothing in a benchmark's run, so this is
	// the cost every unsampled command pays.
	d := newDetector(b, detectConfig(1e-12, 5000, 10000))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := []byte("stock:sku:1001")
		for pb.Next() {
			d.Observe(key, true)
		}
	})
}

// BenchmarkObserveFloor is the random draw and compare alone, which
// BenchmarkObserveUnsampled cannot beat: the difference is Observe's own
// cost.
func BenchmarkObserveFloor(b *testing.B) {
	var cut atomic.Uint64
	var sampled atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		n := int64(0)
		for pb.Next() {
			if rand.Uint64()>>11 < cut.Load() {
				n++
			}
		}
		sampled.Add(n)
	})
}

func BenchmarkObserveSampled(b *testing.B) {
	keys := make([][]byte, 10_000)
	for i := range keys {
		keys[i] = []byte("stock:sku:" + strconv.Itoa(i))
	}
	// Draw the Zipf key sequence beforehand: drawing costs more than the
	// unsampled Observe being measured.
	zipf := rand.NewZipf(rand.New(rand.NewPCG(8, 9)), 1.1, 1, uint64(len(keys)-1))
	seq := make([]uint32, 1<<16)
	for i := range seq {
		seq[i] = uint32(zipf.Uint64())
	}
	for _, rate := range []float64{0.01, 1} {
		b.Run("rate="+strconv.FormatFloat(rate, 'g', -1, 64), func(b *testing.B) {
			d := newDetector(b, detectConfig(rate, 5000, 1000))
			b.ReportAllocs()
			var start atomic.Uint32
			b.RunParallel(func(pb *testing.PB) {
				i := start.Add(12345)
				for pb.Next() {
					k := seq[i%uint32(len(seq))]
					i++
					d.Observe(keys[k], k%4 == 0)
				}
			})
		})
	}
}
