package hotkey

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// coolDownWindows is how many windows a hot key's rate must stay below the
// threshold before it cools. A sampled estimate dips now and then, and keys
// under a sale often pulse; without this margin such a key would flap
// between hot and cold, logging (and promoting or demoting) each time.
const coolDownWindows = 3

// Detected is one key's estimated load, as Top and Changes report it.
type Detected struct {
	Key string
	// ReadRate and WriteRate are the estimated reads and writes of Key per
	// second (ops/s), counted apart: a read-hot key and a write-hot key
	// need different cures.
	ReadRate, WriteRate float64
	// ReadHot (WriteHot) is true from the moment ReadRate (WriteRate)
	// reached the threshold until it has stayed below it for the
	// cool-down, three windows.
	ReadHot, WriteHot bool
	// Hot is ReadHot || WriteHot.
	Hot bool
	// Since is when the key turned hot (ReadHot or WriteHot, whichever
	// came first); zero when it is not hot.
	Since time.Time
}

// Detector finds hot keys by counting a sample of commands. It is safe for
// concurrent use.
//
// Sampling is the only cost every command pays: Observe draws one random
// number (math/rand/v2, per-thread state, no lock, no allocation) and
// compares it with the sample rate. Only sampled commands take the mutex
// and touch the LRU of counted keys, which holds at most capacity keys
// (least recently sampled dropped first).
//
// Each key has a read rate and a write rate in ops/s, decaying
// exponentially with time constant window: a sample adds
// 1 ÷ sample_rate ÷ window to its rate, and the rate is multiplied by
// e^(−Δt/window) as time passes. That is the sampled count ÷ sample rate ÷
// window where older samples count less, with no window edge at which
// counts reset, and two floats per key. A key whose traffic goes from none
// to k × threshold is hot after window·ln(k/(k−1)) (0.69 window at 2×,
// 0.1 window at 10×), give or take the sampling noise.
//
// A key cools once both its rates have stayed below the threshold for
// three windows. Between samples a rate only decays, so the moment it fell
// through the threshold is computed exactly, however late it is looked at;
// but someone must look: a sampled command on the key, Top, or Changes.
// A hot key dropped from the LRU is reported cooled at once.
type Detector struct {
	// Every command reads cut and rnd; the padding keeps them off the
	// cache line of mu, which every sampled command writes, so that
	// unsampled commands on other cores do not miss on it.
	cut atomic.Uint64 // sample when a 53-bit random number is below cut = sample_rate·2^53; 0 while disabled
	rnd func() uint64 // nil means math/rand/v2; tests set a seeded source
	_   [64]byte

	now func() time.Time

	mu        sync.Mutex // guards the fields below
	lru       *simplelru.LRU[string, *entry]
	hot       map[string]*entry // the entries that are hot, so that Changes does not walk the whole LRU
	changes   []Detected        // hot and cool events not yet taken by Changes, oldest first
	unit      float64           // what one sample adds to a rate, ops/s: 1 ÷ sample_rate ÷ window
	tau       float64           // window, seconds
	threshold float64           // ops/s
	coolDown  time.Duration
	capacity  int
}

// entry is a key's state in the LRU.
type entry struct {
	key         string
	at          time.Time // the time read.rate and write.rate are for
	read, write side
	since       time.Time // Detected.Since
}

// side is one of a key's two rates.
type side struct {
	rate  float64   // ops/s at entry.at
	below time.Time // since when rate has been below the threshold; zero while it is not
	hot   bool
}

// Option configures a Detector at construction.
type Option func(*Detector)

// WithClock makes the Detector read the time from now instead of
// time.Now, so that tests can drive it with a fake clock. now must be safe
// for concurrent use.
func WithClock(now func() time.Time) Option {
	return func(d *Detector) { d.now = now }
}

// NewDetector returns a Detector configured by cfg. It returns an error
// naming the field when cfg has a value config.Validate refuses. With
// cfg.Enabled false it samples nothing until SetConfig enables it.
func NewDetector(cfg config.Detect, opts ...Option) (*Detector, error) {
	if err := checkDetect(cfg); err != nil {
		return nil, err
	}
	d := &Detector{now: time.Now, hot: make(map[string]*entry)}
	for _, o := range opts {
		o(d)
	}
	lru, err := simplelru.NewLRU(cfg.Capacity, d.evicted)
	if err != nil {
		return nil, fmt.Errorf("hotkey: %w", err)
	}
	d.lru = lru
	d.apply(cfg)
	return d, nil
}

// SetConfig replaces the settings of d live (a config reload), keeping the
// keys counted so far and their rates. A new threshold applies at once:
// keys above it turn hot, and keys below it start their cool-down. A
// smaller capacity drops the least recently sampled keys; a hot key
// dropped is reported cooled. Disabling stops sampling; rates then decay
// and hot keys cool as Changes or Top look at them. On an error, d is
// unchanged.
func (d *Detector) SetConfig(cfg config.Detect) error {
	if err := checkDetect(cfg); err != nil {
		return err
	}
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	// Bring every rate up to now under the old threshold first, so that
	// the moment each fell below it is not lost.
	for _, e := range d.lru.Values() {
		d.advance(e, now)
	}
	d.apply(cfg)
	for _, e := range d.lru.Values() {
		d.settle(e, now)
	}
	return nil
}

// apply sets d's settings from a checked cfg. d.mu is held, or d is new.
func (d *Detector) apply(cfg config.Detect) {
	window := cfg.Window.Duration()
	d.tau = window.Seconds()
	d.unit = 1 / cfg.SampleRate / d.tau
	d.threshold = cfg.Threshold
	d.coolDown = coolDownWindows * window
	if cfg.Capacity != d.capacity {
		d.capacity = cfg.Capacity
		d.lru.Resize(cfg.Capacity)
	}
	var cut uint64
	if cfg.Enabled {
		// At least 1, so that a tiny positive rate still samples.
		cut = max(1, uint64(cfg.SampleRate*(1<<53)))
	}
	d.cut.Store(cut)
}

// checkDetect refuses what config.Validate refuses, so that a Detector
// never divides by zero or samples at a rate it cannot estimate from.
func checkDetect(cfg config.Detect) error {
	switch {
	case !(cfg.SampleRate > 0 && cfg.SampleRate <= 1):
		return fmt.Errorf("hotkey: hotkeys.detect.sample_rate must be in (0, 1], got %v", cfg.SampleRate)
	case cfg.Window <= 0:
		return fmt.Errorf("hotkey: hotkeys.detect.window must be > 0, got %v", cfg.Window)
	case !(cfg.Threshold > 0) || math.IsInf(cfg.Threshold, 0):
		return fmt.Errorf("hotkey: hotkeys.detect.threshold must be a number > 0, got %v", cfg.Threshold)
	case cfg.Capacity < 1:
		return fmt.Errorf("hotkey: hotkeys.detect.capacity must be >= 1, got %d", cfg.Capacity)
	}
	return nil
}

// Observe counts one read (write false) or write of key, if this command
// is sampled. It is the call for every keyed command: unsampled, it costs
// one random number and takes no lock. A command on several keys calls
// it once per key (or Sample once and Add per key). key is copied if
// kept, never retained.
func (d *Detector) Observe(key []byte, write bool) {
	if d.Sample() {
		d.Add(key, write)
	}
}

// Sample reports whether to count a command, true with probability
// sample_rate. It takes no lock.
func (d *Detector) Sample() bool {
	cut := d.cut.Load()
	if cut == 0 {
		return false // disabled: not even a random draw
	}
	var x uint64
	if d.rnd != nil {
		x = d.rnd()
	} else {
		x = rand.Uint64()
	}
	return x>>11 < cut
}

// Add counts one sampled read (write false) or write of key: call it only
// when Sample said true, or the key's rate comes out 1 ÷ sample_rate times
// too high. key is copied if kept, never retained.
func (d *Detector) Add(key []byte, write bool) {
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.lru.Get(string(key))
	if !ok {
		e = &entry{key: string(key), at: now}
		d.lru.Add(e.key, e)
	}
	d.advance(e, now)
	if write {
		e.write.rate += d.unit
	} else {
		e.read.rate += d.unit
	}
	d.settle(e, now)
}

// Top returns at most n of the keys counted now, highest
// max(ReadRate, WriteRate) first (ties by key), with their state as of
// now; n <= 0 returns none. It holds the lock for a walk of all tracked
// keys, so sampled commands wait a little while it runs: call it for
// reports, not per command.
func (d *Detector) Top(n int) []Detected {
	if n <= 0 {
		return nil
	}
	now := d.now()
	d.mu.Lock()
	all := make([]Detected, 0, d.lru.Len())
	for _, e := range d.lru.Values() {
		d.advance(e, now)
		d.settle(e, now)
		all = append(all, e.detected())
	}
	d.mu.Unlock()
	slices.SortFunc(all, func(a, b Detected) int {
		if c := cmp.Compare(max(b.ReadRate, b.WriteRate), max(a.ReadRate, a.WriteRate)); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return all[:min(n, len(all))]
}

// Changes returns each change of a key's ReadHot or WriteHot since the
// previous call, oldest first, with the key's state when it changed: a
// key turning hot (Hot true, Since set), a hot key's other side turning
// hot or cooling (Hot still true), or a key cooling (Hot false, Since
// zero). Changes are queued under the Detector's lock as they happen, so
// their order is the order of events, and no callback runs inside the
// Detector. Changes first cools the hot keys whose cool-down is over,
// which nothing else does for a key that gets no more commands: poll it
// on a ticker (once a window or more often) to log the changes and act on
// them. If more than 2 × capacity changes wait, the oldest are dropped.
func (d *Detector) Changes() []Detected {
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range d.hot {
		d.advance(e, now)
		d.settle(e, now) // may delete e from d.hot, which a range allows
	}
	out := d.changes
	d.changes = nil
	return out
}

// Tracked returns how many keys are counted now, at most capacity.
func (d *Detector) Tracked() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lru.Len()
}

// advance decays e's rates from e.at to now. d.mu is held.
func (d *Detector) advance(e *entry, now time.Time) {
	dt := now.Sub(e.at)
	if dt <= 0 {
		// Add reads the clock before taking the lock, so a sample may
		// arrive a little behind one already counted.
		return
	}
	f := math.Exp(-dt.Seconds() / d.tau)
	d.decay(&e.read, e.at, f)
	d.decay(&e.write, e.at, f)
	e.at = now
}

// decay multiplies s.rate, as of from, by f; if that takes it below the
// threshold, it records when: rate·e^(−t/τ) = threshold at t =
// τ·ln(rate/threshold).
func (d *Detector) decay(s *side, from time.Time, f float64) {
	if s.below.IsZero() && s.rate*f < d.threshold {
		t := d.tau * math.Log(s.rate/d.threshold)
		s.below = from.Add(time.Duration(max(0, t) * float64(time.Second)))
	}
	s.rate *= f
}

// settle turns e's sides hot or cold as their rates at now say, and
// records a change if either flipped. d.mu is held.
func (d *Detector) settle(e *entry, now time.Time) {
	readHot, writeHot := e.read.hot, e.write.hot
	d.settleSide(&e.read, now)
	d.settleSide(&e.write, now)
	if e.read.hot == readHot && e.write.hot == writeHot {
		return
	}
	if e.read.hot || e.write.hot {
		if e.since.IsZero() {
			e.since = now
			d.hot[e.key] = e
		}
	} else {
		e.since = time.Time{}
		delete(d.hot, e.key)
	}
	d.record(e.detected())
}

// settleSide turns s hot at the threshold and cold after the cool-down.
func (d *Detector) settleSide(s *side, now time.Time) {
	if s.rate >= d.threshold {
		s.below = time.Time{}
		s.hot = true
		return
	}
	if s.below.IsZero() {
		// A new key, or a threshold raised by SetConfig.
		s.below = now
	}
	if s.hot && now.Sub(s.below) >= d.coolDown {
		s.hot = false
	}
}

// evicted is the LRU's eviction callback; it runs inside lru.Add or
// lru.Resize, so d.mu is held.
func (d *Detector) evicted(key string, e *entry) {
	if !e.read.hot && !e.write.hot {
		return
	}
	delete(d.hot, key)
	e.read.hot, e.write.hot, e.since = false, false, time.Time{}
	d.record(e.detected())
}

// record queues a change for Changes. d.mu is held.
func (d *Detector) record(c Detected) {
	if len(d.changes) >= 2*d.capacity {
		d.changes = slices.Delete(d.changes, 0, 1)
	}
	d.changes = append(d.changes, c)
}

// detected returns e's state as reported.
func (e *entry) detected() Detected {
	return Detected{
		Key:       e.key,
		ReadRate:  e.read.rate,
		WriteRate: e.write.rate,
		ReadHot:   e.read.hot,
		WriteHot:  e.write.hot,
		Hot:       e.read.hot || e.write.hot,
		Since:     e.since,
	}
}
