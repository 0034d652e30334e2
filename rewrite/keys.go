package rewrite

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
)

// keyConf is what the config says of one key.
type keyConf struct {
	rule config.KeyRule
	// configured: a hotkeys.keys rule names the key, so this proxy makes
	// it hot (converts it, makes it) whatever it holds. Otherwise it was
	// learned, and is hot only while it holds a layout.
	configured bool
}

// keyConf is what the rules say of key now.
func (e *Engine) keyConf(key []byte) *keyConf {
	st := e.settings.Load()
	rule, ok := st.registry.Lookup(key)
	if !ok {
		rule = config.KeyRule{Match: string(key), Route: config.RouteRandom, Journal: st.promotedJournal,
			WaitReplicas: st.unruledWait.WaitReplicas, WaitTimeout: st.unruledWait.WaitTimeout}
	}
	return &keyConf{rule: rule, configured: ok}
}

// Hot reports whether key is held as buckets: a rule names it, or it was
// learned.
func (e *Engine) Hot(key []byte) bool {
	if _, ok := e.settings.Load().registry.Lookup(key); ok {
		return true
	}
	m := e.learned.Load()
	return m != nil && (*m)[string(key)]
}

// Any reports whether some key may be hot: a rule exists, or a key was
// learned. Without, a command needs no look at its keys.
func (e *Engine) Any() bool {
	m := e.learned.Load()
	return e.settings.Load().registry.Len() > 0 || m != nil && len(*m) > 0
}

// Learn makes key hot on this proxy from now on: it was found holding a
// layout, or another proxy said it made one (contract 9). Its rule is the
// default one: random route, bucket count as the layout says.
func (e *Engine) Learn(key []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.learnLocked(key)
}

func (e *Engine) learnLocked(key []byte) {
	old := e.learned.Load()
	if old != nil && (*old)[string(key)] {
		return
	}
	m := make(map[string]bool, 1)
	if old != nil {
		maps.Copy(m, *old)
	}
	m[string(key)] = true
	e.learned.Store(&m)
	e.keyLocked(key) // listed by PROXY HOTKEYS from now on
}

// Forget stops treating a learned key as hot on this proxy; a key a rule
// names stays hot. What the proxy remembered of it goes too.
func (e *Engine) Forget(key []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if h := e.keys[string(key)]; h != nil && !h.conf.Load().configured {
		delete(e.keys, string(key))
	}
	old := e.learned.Load()
	if old == nil || !(*old)[string(key)] {
		return
	}
	m := maps.Clone(*old)
	delete(m, string(key))
	e.learned.Store(&m)
}

// hotKey is what the engine keeps of one hot key. Redis holds the truth;
// all of this only saves round trips (contract 10).
type hotKey struct {
	name   string
	conf   atomic.Pointer[keyConf] // replaced by Reload
	layout atomic.Pointer[Layout]  // nil until read or made
	// slot is name's hash slot, whose master holds the deduct scripts
	// for it (script_held.go).
	slot uint16
	// last is the last value seen of each bucket, room for any layout's:
	// never reallocated, so readers need no lock.
	last []atomic.Int64
	seen atomic.Int64 // unix nanos of the last full read
	// summed is when the last read of every bucket that all answered was
	// sent (unix nanos; 0: none since the key was forgotten): within
	// read_staleness of it, GET answers from last.
	summed atomic.Int64
	// Sold out: a deduct of soldAmount found no stock at soldAt (nanos).
	soldAt     atomic.Int64
	soldAmount atomic.Int64
	count      keyCounters
	// slow serialises this proxy's deducts that move stock between
	// buckets or conclude "sold out", so they do not race each other.
	slow sync.Mutex
	// lost are the buckets of one layout found lost; replaced whole,
	// under lostMu, when one is added.
	lostMu sync.Mutex
	lost   atomic.Pointer[lostBuckets]
}

// lostBuckets are the buckets of the layout of generation gen found lost,
// each with the units recorded for it (those the proxy that found it
// first last saw there).
type lostBuckets struct {
	gen   string
	units map[int]int64
}

// isLost reports whether bucket b of l is known lost.
func (h *hotKey) isLost(l *Layout, b int) bool {
	p := h.lost.Load()
	if p == nil || p.gen != l.Gen {
		return false
	}
	_, ok := p.units[b]
	return ok
}

// lostOf is what is known lost of l: bucket -> units; nil when none.
func (h *hotKey) lostOf(l *Layout) map[int]int64 {
	if p := h.lost.Load(); p != nil && l != nil && p.gen == l.Gen {
		return p.units
	}
	return nil
}

// markLost records bucket b of l as lost, holding units; new reports
// whether it was not known lost before.
func (h *hotKey) markLost(l *Layout, b int, units int64) (new bool) {
	h.lostMu.Lock()
	defer h.lostMu.Unlock()
	old := h.lostOf(l)
	if _, ok := old[b]; ok {
		return false
	}
	m := make(map[int]int64, len(old)+1)
	maps.Copy(m, old)
	m[b] = units
	h.lost.Store(&lostBuckets{gen: l.Gen, units: m})
	return true
}

func (e *Engine) key(k []byte) *hotKey {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.keyLocked(k)
}

func (e *Engine) keyLocked(k []byte) *hotKey {
	h := e.keys[string(k)]
	if h == nil {
		h = &hotKey{name: string(k), slot: hashslot.Of(k), last: make([]atomic.Int64, config.MaxBuckets)}
		h.conf.Store(e.keyConf(k))
		e.keys[h.name] = h
	}
	return h
}

// forget drops what h remembers, after its key was found gone.
func (h *hotKey) forget() {
	h.layout.Store(nil)
	h.soldAt.Store(0)
	h.summed.Store(0)
}
