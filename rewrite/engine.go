package rewrite

import (
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/hotkey"
	"github.com/tidwall/redcon"
)

// Request is one command for Redis, routed by the slot of Key.
type Request struct {
	Key  []byte
	Args [][]byte
	// Follows sends the request (Key unused) on the connection of the
	// request before it in the same Do, right after it, and again after
	// it whenever that one is sent again (a redirection, a retry): for
	// WAIT, which counts what its own connection wrote.
	Follows bool
	// Blocks: Redis runs nothing else from the request's connection until
	// it answers (WAIT, until replicas acknowledge). Do sends the requests
	// of a call that holds one on connections of their own, so that they
	// hold up no one else's.
	Blocks bool
}

// Upstream is how the engine reaches Redis.
type Upstream interface {
	// Do sends each request to the master serving its key's slot, all at
	// once, and returns the raw replies in order; a request that could
	// not be sent gets an error reply. The requests to one master go on
	// one connection, in order. Do keeps nothing of reqs once it returns:
	// the engine reuses them.
	Do(reqs []Request) [][]byte
	// Placement reports the masters serving slots now: how many, and the
	// index of the one serving a slot (-1 for none). A standalone server
	// is one master serving every slot.
	Placement() (masters int, owner func(slot uint16) int)
	// Node names the node serving slot, for PROXY HOTKEYS.
	Node(slot uint16) string
}

// recheck bounds how long the engine trusts what it last saw of the
// buckets (their values, "sold out"): another proxy's give-back is seen
// within it.
const recheck = time.Second

// Engine answers the commands on hot keys. Safe for concurrent use.
type Engine struct {
	up         Upstream
	standalone bool
	settings   atomic.Pointer[settings] // replaced whole by Reload
	// clock is the time the engine trusts what it saw by and waits on;
	// intN draws a deduct's start bucket in [0, n). New sets real time
	// and math/rand/v2; tests set their own before the first command.
	clock clock
	intN  func(n int) int
	// moveID names a new move between buckets: random, 16 hex digits, so
	// that moves of all proxies never share one. Tests set their own.
	moveID func() string
	// moveHook, when set, is told each step of a move, merge or
	// conversion once Redis has answered it (SetMoveHook).
	moveHook atomic.Pointer[func(step string)]
	log      *slog.Logger
	// held: which nodes hold which declared deduct scripts, as last
	// seen; remembers: SetScriptMemory's (script_held.go).
	held      heldScripts
	remembers atomic.Pointer[func(sha []byte) bool]
	// scratch holds the *opScratch of bucket calls done, for the next.
	scratch sync.Pool

	mu   sync.Mutex
	keys map[string]*hotKey
	// learned are the keys no rule names that were found held as
	// buckets; copied on write, as keys are learned seldom and looked up
	// on every command.
	learned atomic.Pointer[map[string]bool]
}

// clock is the engine's time: the real one, or a test's that moves only
// when told.
type clock interface {
	Now() time.Time
	// Sleep waits d; a test's clock moves on by d at once.
	Sleep(d time.Duration)
}

type realClock struct{}

func (realClock) Now() time.Time        { return time.Now() }
func (realClock) Sleep(d time.Duration) { time.Sleep(d) }

// now is the clock's time in Unix nanoseconds, as the engine stores times.
func (e *Engine) now() int64 { return e.clock.Now().UnixNano() }

// since is how long ago the clock's time was at (Unix nanoseconds).
func (e *Engine) since(at int64) time.Duration { return e.clock.Now().Sub(time.Unix(0, at)) }

// settings are the parts of the config the engine follows live.
type settings struct {
	registry   *hotkey.Registry
	scripts    map[string]*declaredScript // declared deduct scripts by SHA1
	soldoutTTL time.Duration
	staleness  time.Duration // hotkeys.read_staleness
	// moveTimeout is hotkeys.move_timeout: a move between buckets left
	// unfinished is finished by any proxy within it.
	moveTimeout time.Duration
	// unruledWait is hotkeys.detect's wait_replicas and wait_timeout, for
	// the keys hot without a rule.
	unruledWait config.Detect
	// promotedJournal is hotkeys.detect.journal: a key made hot without
	// a rule gets a journaled layout; journalMaxlen hotkeys.journal_maxlen.
	promotedJournal bool
	journalMaxlen   int64
}

// declaredScript is a deduct script of the config, with what a deduct of
// it needs made once rather than per deduct.
type declaredScript struct {
	*config.Script
	sha     string // SHA1 of the body, lower case
	soldout []byte // the sold-out reply, shared: clipped, so an append copies it
}

// New returns an engine for cfg's hot keys and deduct scripts; it logs to
// log what ops must know of (a bucket found lost).
func New(up Upstream, cfg *config.Config, log *slog.Logger) *Engine {
	e := &Engine{
		up:         up,
		standalone: cfg.Upstream.Mode == config.ModeStandalone,
		clock:      realClock{},
		intN:       rand.IntN,
		moveID:     func() string { return strconv.FormatUint(rand.Uint64()|1<<63, 16) },
		log:        log,
		keys:       make(map[string]*hotKey),
	}
	e.scratch.New = func() any { return new(opScratch) }
	e.Reload(cfg)
	return e
}

// Reload applies cfg's hot-key rules, deduct scripts, soldout_ttl,
// read_staleness, move_timeout, the detect settings' wait_replicas and
// wait_timeout and the journal settings (for the layouts made from then
// on; journal_maxlen at once); the upstream mode is fixed at New. A key
// that a rule no
// longer names keeps its buckets and stays hot while it holds a layout, as
// a learned key does: dropping a rule never strands stock (PROXY UNSHARD
// merges it).
func (e *Engine) Reload(cfg *config.Config) {
	st := &settings{
		registry:    hotkey.NewRegistry(cfg.Hotkeys.Keys),
		scripts:     make(map[string]*declaredScript, len(cfg.Scripts)),
		soldoutTTL:  cfg.Hotkeys.SoldoutTTL.Duration(),
		staleness:   cfg.Hotkeys.ReadStaleness.Duration(),
		moveTimeout: cfg.Hotkeys.MoveTimeout.Duration(),
		unruledWait: cfg.Hotkeys.Detect,

		promotedJournal: cfg.Hotkeys.Detect.Journal,
		journalMaxlen:   cfg.Hotkeys.JournalMaxlen,
	}
	for i := range cfg.Scripts {
		sc := cfg.Scripts[i]
		sha := sc.SHA1()
		st.scripts[sha] = &declaredScript{Script: &sc, sha: sha, soldout: slices.Clip(redcon.AppendInt(nil, sc.Soldout))}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.settings.Store(st)
	for name, h := range e.keys {
		was := h.conf.Load().configured
		h.conf.Store(e.keyConf([]byte(name)))
		if was && !h.conf.Load().configured && h.layout.Load() != nil {
			e.learnLocked([]byte(name))
		}
	}
	for _, r := range cfg.Hotkeys.Keys {
		if !strings.ContainsAny(r.Match, `*?[\`) {
			e.keyLocked([]byte(r.Match)) // listed by PROXY HOTKEYS from the start
		}
	}
}

// buckets is the number of buckets a new layout of h gets.
func (e *Engine) buckets(h *hotKey) int {
	if n := h.conf.Load().rule.Buckets; n > 0 {
		return n
	}
	if e.standalone {
		return config.DefaultStandaloneBuckets
	}
	m, _ := e.up.Placement()
	return max(m, config.MinBuckets)
}

// SetMoveHook makes the engine call hook after each step of every move of
// stock between buckets, of every merge (PROXY UNSHARD) and of every
// conversion, once Redis has answered it, with the step's name: "take",
// "drain", "apply", "finish", "mark", "flip", "convert", "spread",
// "complete". nil removes it. For tests of crash safety: a hook that
// stops the engine's upstream dead at a step stands in for a proxy killed
// there.
func (e *Engine) SetMoveHook(hook func(step string)) {
	if hook == nil {
		e.moveHook.Store(nil)
		return
	}
	e.moveHook.Store(&hook)
}

// step tells the move hook that step is done.
func (e *Engine) step(name string) {
	if f := e.moveHook.Load(); f != nil {
		(*f)(name)
	}
}
