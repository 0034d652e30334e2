package rewrite

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/hotkey"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// Request is one command for Redis, routed by the slot of Key.
type Request struct {
	Key  []byte
	Args [][]byte
}

// Upstream is how the engine reaches Redis.
type Upstream interface {
	// Do sends each request to the master serving its key's slot, all at
	// once, and returns the raw replies in order; a request that could
	// not be sent gets an error reply.
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

	mu   sync.Mutex
	keys map[string]*hotKey
	// learned are the keys no rule names that were found held as
	// buckets; copied on write, as keys are learned seldom and looked up
	// on every command.
	learned atomic.Pointer[map[string]bool]
}

// settings are the parts of the config the engine follows live.
type settings struct {
	registry   *hotkey.Registry
	scripts    map[string]*config.Script // declared deduct scripts by SHA1
	soldoutTTL time.Duration
}

// New returns an engine for cfg's hot keys and deduct scripts.
func New(up Upstream, cfg *config.Config) *Engine {
	e := &Engine{
		up:         up,
		standalone: cfg.Upstream.Mode == config.ModeStandalone,
		keys:       make(map[string]*hotKey),
	}
	e.Reload(cfg)
	return e
}

// Reload applies cfg's hot-key rules, deduct scripts and soldout_ttl; the
// upstream mode is fixed at New. A key that a rule no longer names keeps
// its buckets and stays hot while it holds a layout, as a learned key
// does: dropping a rule never strands stock (PROXY UNSHARD merges it).
func (e *Engine) Reload(cfg *config.Config) {
	st := &settings{
		registry:   hotkey.NewRegistry(cfg.Hotkeys.Keys),
		scripts:    make(map[string]*config.Script, len(cfg.Scripts)),
		soldoutTTL: cfg.Hotkeys.SoldoutTTL.Duration(),
	}
	for i := range cfg.Scripts {
		sc := cfg.Scripts[i]
		st.scripts[sc.SHA1()] = &sc
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

// keyConf is what the rules say of key now.
func (e *Engine) keyConf(key []byte) *keyConf {
	rule, ok := e.settings.Load().registry.Lookup(key)
	if !ok {
		rule = config.KeyRule{Match: string(key), Route: config.RouteRandom}
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
// layout, or another proxy said it made one (contract 9). Its rule is the default
// one: random route, bucket count as the layout says.
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

// DeductScript reports whether args is EVAL or EVALSHA (or their _RO
// forms) of a deduct script declared in the config.
func (e *Engine) DeductScript(args [][]byte) bool {
	if len(args) < 2 {
		return false
	}
	switch name := strings.ToLower(string(args[0])); name {
	case "evalsha", "evalsha_ro":
		return e.settings.Load().scripts[strings.ToLower(string(args[1]))] != nil
	case "eval", "eval_ro":
		return e.scriptByBody(args[1]) != nil
	}
	return false
}

// scriptByBody is the declared deduct script with this body, if any.
func (e *Engine) scriptByBody(body []byte) *config.Script {
	sum := sha1.Sum(body)
	return e.settings.Load().scripts[hex.EncodeToString(sum[:])]
}

// hotKey is what the engine keeps of one hot key. Redis holds the truth;
// all of this only saves round trips.
type hotKey struct {
	name   string
	conf   atomic.Pointer[keyConf] // replaced by Reload
	layout atomic.Pointer[Layout]  // nil until read or made
	// last is the last value seen of each bucket, room for any layout's:
	// never reallocated, so readers need no lock.
	last []atomic.Int64
	seen atomic.Int64 // unix nanos of the last full read
	// Sold out: a deduct of soldAmount found no stock at soldAt (nanos).
	soldAt     atomic.Int64
	soldAmount atomic.Int64
	count      keyCounters
	// slow serialises this proxy's deducts that move stock between
	// buckets or conclude "sold out", so they do not race each other.
	slow sync.Mutex
}

func (e *Engine) key(k []byte) *hotKey {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.keyLocked(k)
}

func (e *Engine) keyLocked(k []byte) *hotKey {
	h := e.keys[string(k)]
	if h == nil {
		h = &hotKey{name: string(k), last: make([]atomic.Int64, config.MaxBuckets)}
		h.conf.Store(e.keyConf(k))
		e.keys[h.name] = h
	}
	return h
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

// errReply is an error reply for a hot key, naming it.
func errReply(key, why string) []byte {
	return resp.AppendError(nil, "ERR hotkeyproxy: '"+key+"' is a hot key held as buckets; "+why)
}

// state of a hot key in Redis, as load finds it.
type state int

const (
	stateMissing state = iota // the key does not exist
	stateHot                  // it holds a layout
	stateOther                // it holds something that is not an integer
	stateFailed               // Redis could not be asked
)

// load reads the key and makes sure it is held as buckets: a layout is
// read (and completed, when a conversion left it pending); a plain
// integer is converted; a missing key gets a layout when create is set
// (INCR, SET…), which is what a first write does to a plain key. fail is
// the reply to give when the state is stateFailed.
func (e *Engine) load(h *hotKey, create bool) (l *Layout, st state, fail []byte) {
	return e.loadAs(h, create, h.conf.Load().configured, 0)
}

// loadAs is load for a key that may be converted (or made) when convert is
// set, into n buckets (0: the default count). A key that may not, because
// it was only learned, is hot only while it holds a layout: otherwise fail
// is errPlain.
func (e *Engine) loadAs(h *hotKey, create, convert bool, n int) (l *Layout, st state, fail []byte) {
	if l = h.layout.Load(); l != nil {
		seen := h.seen.Load()
		// One caller rechecks the layout when it is old; the others go
		// on with it meanwhile.
		if time.Since(time.Unix(0, seen)) < recheck || !h.seen.CompareAndSwap(seen, time.Now().UnixNano()) {
			return l, stateHot, nil
		}
	}
	key := []byte(h.name)
	for range 3 {
		r := e.send(h, []Request{{Key: key, Args: [][]byte{[]byte("GET"), key}}})[0]
		v, ok := resp.BulkValue(r)
		switch {
		case resp.IsError(r):
			return nil, stateFailed, r
		case ok && IsMarker(v):
			l, err := ParseMarker(h.name, v)
			if err != nil {
				return nil, stateOther, nil
			}
			if l.Pending {
				if fail := e.complete(h, l); bytes.Equal(fail, errGone) {
					continue
				} else if fail != nil {
					return nil, stateFailed, fail
				}
			}
			e.adopt(h, l)
			return l, stateHot, nil
		case !convert:
			h.layout.Store(nil)
			return nil, stateFailed, errPlain
		case !ok && !create:
			h.layout.Store(nil)
			return nil, stateMissing, nil
		}
		// A plain value, or a missing key to create: a layout for it,
		// made atomic with the value's move into bucket 0; read back to
		// spread the rest.
		masters, owner := e.up.Placement()
		if n == 0 {
			n = e.buckets(h)
		}
		l = Place(h.name, n, masters, owner)
		mk := []byte("0")
		if create {
			mk[0] = '1'
		}
		r = e.eval(h, scriptConvert, key, [][]byte{key, l.Bucket(0)}, l.Marker(), []byte(MarkerPrefix), mk, strconv.AppendInt(nil, int64(l.N()), 10))
		switch code, _, ok := pair(r); {
		case !ok:
			return nil, stateFailed, r
		case code == -1:
			return nil, stateOther, nil
		case code == 1:
			e.publish(h, '+')
		}
	}
	// Made and gone again three times over: the key is being deleted as
	// fast as it is made.
	return nil, stateFailed, resp.AppendError(nil, "ERR hotkeyproxy: '"+h.name+"' keeps changing; try again")
}

// complete makes the buckets a conversion left to make, each with its
// share of the value and the key's TTL, then marks the layout complete.
// Any proxy that reads a pending layout does this, so a proxy that died
// half way loses nothing: the value to spread is in the marker, and a
// bucket already made is left as it is (SET NX).
func (e *Engine) complete(h *hotKey, l *Layout) []byte {
	key := []byte(l.Key)
	r := e.send(h, []Request{{Key: key, Args: [][]byte{[]byte("PTTL"), key}}})[0]
	ttl, ok := resp.IntValue(r)
	switch {
	case !ok:
		return r
	case ttl == -2:
		return errGone
	}
	var reqs []Request
	for i := 1; i < l.N(); i++ {
		b := l.Bucket(i)
		args := [][]byte{[]byte("SET"), b, strconv.AppendInt(nil, l.Share(l.Fill, i), 10), []byte("NX")}
		if ttl > 0 {
			args = append(args, []byte("PX"), strconv.AppendInt(nil, ttl, 10))
		}
		reqs = append(reqs, Request{Key: b, Args: args})
	}
	made := e.send(h, reqs)
	for _, r := range made {
		if resp.IsError(r) {
			return r
		}
	}
	pending := l.Marker()
	l.Pending = false
	r = e.eval(h, scriptComplete, key, [][]byte{key}, pending, l.Marker())
	done, _, ok := pair(r)
	if !ok {
		return r
	}
	if done == 0 {
		// Someone completed it first, or the key changed meanwhile
		// (deleted, unsharded, made again): then the buckets this call
		// made belong to no layout, and their stock to no one.
		v, isBulk := resp.BulkValue(e.send(h, []Request{{Key: key, Args: [][]byte{[]byte("GET"), key}}})[0])
		if !isBulk || !bytes.Equal(v, l.Marker()) {
			var del []Request
			for i, r := range made {
				if string(r) == "+OK\r\n" {
					del = append(del, Request{Key: reqs[i].Key, Args: [][]byte{[]byte("DEL"), reqs[i].Key}})
				}
			}
			e.send(h, del)
			return errGone
		}
	}
	return nil
}

// errPlain is what load gives for a learned key that no longer holds a
// layout: the command is to be relayed as for any plain key.
var errPlain = []byte("-ERR hotkeyproxy: the key is not held as buckets\r\n")

// errGone is returned by bucket operations that found a bucket missing:
// the key expired or was deleted since this proxy read its layout.
var errGone = []byte("-ERR hotkeyproxy: the key is gone\r\n")

// forget drops what h remembers, after its key was found gone.
func (h *hotKey) forget() {
	h.layout.Store(nil)
	h.soldAt.Store(0)
}

// bucketOp runs a bucket script and reads its {a, b} reply; a missing
// bucket comes back as errGone, with h forgotten.
func (e *Engine) bucketOp(h *hotKey, s *bucketScript, key []byte, arg int64) (a, b int64, fail []byte) {
	r := e.eval(h, s, key, [][]byte{key}, strconv.AppendInt(nil, arg, 10))
	a, b, ok := pair(r)
	switch {
	case !ok:
		return 0, 0, r
	case a == -2:
		h.forget()
		return 0, 0, errGone
	}
	return a, b, nil
}

// adopt takes l as h's layout and reads every bucket's value.
func (e *Engine) adopt(h *hotKey, l *Layout) {
	h.layout.Store(l)
	e.readBuckets(h, l)
}

// readBuckets refreshes what h knows of every bucket and returns the sum.
func (e *Engine) readBuckets(h *hotKey, l *Layout) (sum int64, fail []byte) {
	for i, r := range e.send(h, l.requests(nil, []byte("GET"))) {
		if resp.IsError(r) {
			// The others are still read: a deduct can go on with them,
			// though it cannot conclude "sold out" (fail is set).
			if fail == nil {
				fail = r
			}
			h.last[i].Store(0)
			continue
		}
		b, ok := resp.BulkValue(r)
		if !ok {
			// A bucket gone: the layout ended (merged back, expired,
			// deleted). Counting it as empty would conclude "sold out"
			// from a layout that no longer holds the stock.
			h.forget()
			fail = errGone
			continue
		}
		v, _ := resp.ParseInt(b)
		h.last[i].Store(v)
		sum += v
	}
	h.seen.Store(time.Now().UnixNano())
	if fail == nil && sum > 0 && sum >= h.soldAmount.Load() {
		h.soldAt.Store(0)
	}
	return sum, fail
}

// estimate is the sum of the last values seen of l's buckets.
func (h *hotKey) estimate(l *Layout) int64 {
	var sum int64
	for i := range l.N() {
		sum += h.last[i].Load()
	}
	return sum
}

// eval runs a bucket script on the node of route: EVALSHA, then EVAL when
// the node has not got it.
func (e *Engine) eval(h *hotKey, s *bucketScript, route []byte, keys [][]byte, argv ...[]byte) []byte {
	args := append([][]byte{[]byte("EVALSHA"), s.sha, []byte(strconv.Itoa(len(keys)))}, keys...)
	args = append(args, argv...)
	r := e.send(h, []Request{{Key: route, Args: args}})[0]
	if bytes.HasPrefix(r, []byte("-NOSCRIPT")) {
		args[0], args[1] = []byte("EVAL"), s.body
		r = e.send(h, []Request{{Key: route, Args: args}})[0]
	}
	return r
}

// pair reads a script's {a, b} reply.
func pair(r []byte) (a, b int64, ok bool) {
	elems, ok := resp.ArrayElems(r, nil)
	if !ok || len(elems) != 2 {
		return 0, 0, false
	}
	a, ok1 := resp.IntValue(elems[0])
	b, ok2 := resp.IntValue(elems[1])
	return a, b, ok1 && ok2
}

// startBucket is where a deduct begins: random, or fixed per client.
func (h *hotKey) startBucket(n int, client uint64) int {
	if h.conf.Load().rule.Route == config.RouteClient {
		return int(client % uint64(n))
	}
	return rand.IntN(n)
}

// soldOut reports whether a deduct of amount can be answered "sold out"
// without Redis: one was, within soldout_ttl. When that has expired, one
// caller goes to Redis to find out again while the others keep the
// answer, so a storm of requests after the sell-out costs one round trip
// per ttl, not one each.
func (e *Engine) soldOut(h *hotKey, amount int64) bool {
	at := h.soldAt.Load()
	ttl := e.settings.Load().soldoutTTL
	if at == 0 || ttl <= 0 || amount < h.soldAmount.Load() {
		return false
	}
	// Once expired, the caller that moves soldAt on checks; the rest wait
	// on its answer, which comes within one round trip.
	return time.Since(time.Unix(0, at)) < ttl || !h.soldAt.CompareAndSwap(at, time.Now().UnixNano())
}

// deduct takes amount from one bucket that holds it: first the buckets
// last seen holding enough, in ring order from the start bucket, without
// waiting on anyone. When none does, the slow path reads every bucket
// afresh; when no bucket alone holds the amount but together they do, it
// moves stock into bucket 0 until that one does. Stock is never held
// aside, so concurrent deducts (on any proxy) cannot each hold a part and
// all fail; and "sold out" is concluded only from Redis: two fresh reads,
// a moment apart so that a move in flight on another proxy is seen, both
// short of the amount. ok is false when sold out.
func (e *Engine) deduct(h *hotKey, l *Layout, amount int64, client uint64) (ok bool, fail []byte) {
	if e.soldOut(h, amount) {
		return false, nil
	}
	n := l.N()
	start := h.startBucket(n, client)
	// A bucket whose node does not answer is passed over: the stock of
	// the others is still for sale.
	var unreachable []byte
	ring := func() (bool, []byte) {
		for i := 0; i < n; i++ {
			b := (start + i) % n
			if h.last[b].Load() < amount {
				continue
			}
			ok, fail := e.tryDeduct(h, l, b, amount)
			switch {
			case ok || bytes.Equal(fail, errGone):
				return ok, fail
			case fail != nil:
				unreachable = fail
			}
		}
		return false, nil
	}
	if ok, fail := ring(); ok || fail != nil {
		return ok, fail
	}
	h.slow.Lock()
	defer h.slow.Unlock()
	if e.soldOutSeen(h, amount) {
		return false, nil // concluded by the deduct that held the lock before
	}
	short := 0
	for attempt := 0; attempt < 4 && short < 2; attempt++ {
		sum, fail := e.readBuckets(h, l)
		switch {
		case bytes.Equal(fail, errGone):
			return false, fail
		case fail != nil:
			unreachable = fail
		}
		if ok, fail := ring(); ok || fail != nil {
			return ok, fail
		}
		if sum < amount {
			if unreachable != nil {
				return false, unreachable // stock may sit where we cannot see
			}
			short++
			time.Sleep(moveGap)
			continue
		}
		if fail := e.consolidate(h, l, amount); fail != nil {
			return false, fail
		}
		if ok, fail := e.tryDeduct(h, l, 0, amount); ok || fail != nil {
			return ok, fail
		}
	}
	h.soldAmount.Store(amount)
	h.soldAt.Store(time.Now().UnixNano())
	return false, nil
}

// soldOutSeen reports whether a deduct of amount was concluded sold out
// within soldout_ttl (or, without memory, within moveGap): a deduct that
// waited for another's conclusion takes it.
func (e *Engine) soldOutSeen(h *hotKey, amount int64) bool {
	at := h.soldAt.Load()
	return at != 0 && amount >= h.soldAmount.Load() && time.Since(time.Unix(0, at)) < max(e.settings.Load().soldoutTTL, moveGap)
}

// moveGap is how long a proxy that found too little stock waits before it
// looks again: longer than a move between two buckets takes.
const moveGap = 5 * time.Millisecond

// tryDeduct runs the deduct script on bucket b.
func (e *Engine) tryDeduct(h *hotKey, l *Layout, b int, amount int64) (bool, []byte) {
	h.count.ringHops.Add(1)
	got, v, fail := e.bucketOp(h, scriptDeduct, l.Bucket(b), amount)
	if fail != nil {
		return false, fail
	}
	h.last[b].Store(v)
	return got == 1, nil
}

// consolidate moves stock from the other buckets into bucket 0 until it
// holds want (or everything is there): take from one, add to the other.
func (e *Engine) consolidate(h *hotKey, l *Layout, want int64) []byte {
	for b := 1; b < l.N() && h.last[0].Load() < want; b++ {
		need := want - h.last[0].Load()
		t, v, fail := e.bucketOp(h, scriptTake, l.Bucket(b), need)
		if fail != nil {
			return fail
		}
		h.last[b].Store(v)
		if t == 0 {
			continue
		}
		_, v, fail = e.bucketOp(h, scriptAdd, l.Bucket(0), t)
		if fail != nil {
			// Bucket 0 is gone (the key was merged back, or deleted) or
			// its node failed: the stock taken goes back where it was,
			// which PROXY UNSHARD drains only after every proxy has
			// stopped using the layout.
			e.bucketOp(h, scriptAdd, l.Bucket(b), t)
			return fail
		}
		h.last[0].Store(v)
	}
	return nil
}

// decrBy takes amount (> 0) from the buckets that have stock; when they
// cannot cover it all, everything left is moved into bucket 0 and the
// amount taken from there, so bucket 0 goes negative and no other bucket
// holds stock while the sum is below zero: the sum changes exactly as a
// plain key's would (contract 4). covered is false when there was a
// shortfall.
func (e *Engine) decrBy(h *hotKey, l *Layout, amount int64, client uint64) (covered bool, fail []byte) {
	if ok, fail := e.deduct(h, l, amount, client); ok || fail != nil {
		return ok, fail
	}
	h.slow.Lock()
	defer h.slow.Unlock()
	// What the other buckets hold goes to bucket 0 first, so that none
	// holds stock while the sum is below zero; skipped when the reads
	// that just concluded "sold out" found them empty.
	empty := true
	for b := 1; b < l.N(); b++ {
		empty = empty && h.last[b].Load() <= 0
	}
	if !empty {
		if fail := e.consolidate(h, l, 1<<62); fail != nil {
			return false, fail
		}
	}
	_, v, fail := e.bucketOp(h, scriptAdd, l.Bucket(0), -amount)
	if fail != nil {
		return false, fail
	}
	h.last[0].Store(v)
	return v >= 0, nil
}

// incrBy gives amount (>= 0) back, to bucket 0: a debt there (another
// proxy's, too) is repaid first, in the same step, and stock added
// elsewhere while the sum is below zero could be sold although a plain
// key would have none. One call; INCRs do not spread over the buckets.
func (e *Engine) incrBy(h *hotKey, l *Layout, amount int64) (fail []byte) {
	_, v, fail := e.bucketOp(h, scriptAdd, l.Bucket(0), amount)
	if fail != nil {
		return fail
	}
	h.last[0].Store(v)
	h.soldAt.Store(0) // stock is back
	return nil
}

// keyConf is what the config says of one key.
type keyConf struct {
	rule config.KeyRule
	// configured: a hotkeys.keys rule names the key, so this proxy makes
	// it hot (converts it, makes it) whatever it holds. Otherwise it was
	// learned, and is hot only while it holds a layout.
	configured bool
}
