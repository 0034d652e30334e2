package rewrite

import (
	"bytes"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// A declared deduct script on a hot key never runs in Redis as the client
// wrote it, yet EVALSHA of it must fail as it would on a plain key when
// Redis does not hold the script (Spring's DefaultRedisScript sends
// EVALSHA, and EVAL on NOSCRIPT). Redis holds it, for a hot key, when the
// master serving the key's slot (bucket 0's) has it: SCRIPT EXISTS there,
// a yes trusted for recheck, forgotten at once by ForgetScripts (SCRIPT
// FLUSH through this proxy). EVAL of it on a hot key loads it there, as
// it would be cached on a plain key's node. In cluster mode the proxy
// also loads a script whose body it remembers on a node that lacks it (a
// new master after a failover); so does a hot key's EVALSHA, told by
// SetScriptMemory.

// heldScripts remembers when each node was last seen holding each
// declared deduct script, in Unix ns. Few entries: the declared scripts
// times the masters. seen is replaced whole, under mu, when an entry is
// added or dropped, so that the check every deduct makes takes no lock;
// nil holds none. A time is claimed in place by the one caller that asks
// again when it is old (seenHeld).
type heldScripts struct {
	mu   sync.Mutex
	seen atomic.Pointer[map[heldAt]*atomic.Int64]
}

// heldAt names a script (its SHA1, lower case) on a node (its address).
type heldAt struct{ sha, node string }

// SetScriptMemory tells the engine which scripts the proxy would load on a
// node that lacks them (cluster mode: those it saw in EVAL or SCRIPT LOAD
// since the last SCRIPT FLUSH). nil: none.
func (e *Engine) SetScriptMemory(remembers func(sha []byte) bool) {
	if remembers == nil {
		e.remembers.Store(nil)
		return
	}
	e.remembers.Store(&remembers)
}

// ForgetScripts forgets which nodes hold which scripts: after SCRIPT
// FLUSH, an EVALSHA asks Redis again.
func (e *Engine) ForgetScripts() {
	e.held.mu.Lock()
	defer e.held.mu.Unlock()
	e.held.seen.Store(nil)
}

// scriptHeld answers for EVALSHA of the declared script s on h: nil when
// the master of h's slot holds it (or now does: loaded from what the proxy
// remembers), else Redis's NOSCRIPT.
func (e *Engine) scriptHeld(h *hotKey, s *declaredScript) error {
	at, ok := e.heldAt(h, s)
	if ok && e.seenHeld(at) {
		return nil
	}
	key := []byte(h.name)
	r := e.send(h, []Request{{Key: key, Args: [][]byte{[]byte("SCRIPT"), []byte("EXISTS"), []byte(s.sha)}}})[0]
	if err := replyErr(r); err != nil {
		e.forgetHeld(at)
		return err
	}
	var buf [1][]byte
	if elems, isArr := resp.ArrayElems(r, buf[:0]); isArr && len(elems) == 1 && string(elems[0]) == ":1\r\n" {
		e.markHeld(at, ok)
		return nil
	}
	if f := e.remembers.Load(); f != nil && (*f)([]byte(s.sha)) {
		return e.loadScript(h, s, at, ok)
	}
	e.forgetHeld(at)
	return newRedisError(rediserr.NoScript)
}

// keepScript is EVAL of the declared script s on h: the master of h's
// slot gets the script, unless it was seen holding it within recheck.
func (e *Engine) keepScript(h *hotKey, s *declaredScript) error {
	at, ok := e.heldAt(h, s)
	if ok && e.seenHeld(at) {
		return nil
	}
	return e.loadScript(h, s, at, ok)
}

// loadScript sends SCRIPT LOAD of s to the master of h's slot, where it
// is then held (at names it there, when ok).
func (e *Engine) loadScript(h *hotKey, s *declaredScript, at heldAt, ok bool) error {
	key := []byte(h.name)
	r := e.send(h, []Request{{Key: key, Args: [][]byte{[]byte("SCRIPT"), []byte("LOAD"), []byte(s.Body)}}})[0]
	if err := replyErr(r); err != nil {
		e.forgetHeld(at)
		return err
	}
	e.markHeld(at, ok)
	return nil
}

// heldAt names s on the master of h's slot, for heldScripts; not ok when
// no master serves the slot now.
func (e *Engine) heldAt(h *hotKey, s *declaredScript) (at heldAt, ok bool) {
	node := e.up.Node(h.slot)
	return heldAt{sha: s.sha, node: node}, node != "?"
}

// seenHeld reports whether at may be trusted to hold its script: it was
// seen holding it within recheck, or before that and another caller is
// asking Redis again. Of the deducts that find the time old, one claims
// it and asks; the others go on with what was seen meanwhile, so that a
// recheck costs the node one SCRIPT EXISTS, not one per deduct under way.
// The claimer records the answer (markHeld) or drops the entry
// (forgetHeld), so that a no, or no answer, is not trusted.
func (e *Engine) seenHeld(at heldAt) bool {
	m := e.held.seen.Load()
	if m == nil {
		return false
	}
	t, ok := (*m)[at]
	if !ok {
		return false
	}
	seen := t.Load()
	return e.since(seen) < recheck || !t.CompareAndSwap(seen, e.now())
}

// markHeld records at as seen held now, unless not ok (no node).
func (e *Engine) markHeld(at heldAt, ok bool) {
	if !ok {
		return
	}
	if m := e.held.seen.Load(); m != nil {
		if t, found := (*m)[at]; found {
			t.Store(e.now())
			return
		}
	}
	e.held.mu.Lock()
	defer e.held.mu.Unlock()
	var old map[heldAt]*atomic.Int64
	if p := e.held.seen.Load(); p != nil {
		old = *p
	}
	m := make(map[heldAt]*atomic.Int64, len(old)+1)
	maps.Copy(m, old)
	t := new(atomic.Int64)
	t.Store(e.now())
	m[at] = t
	e.held.seen.Store(&m)
}

// forgetHeld drops what was seen of at: the node said it lacks the
// script, or did not answer.
func (e *Engine) forgetHeld(at heldAt) {
	e.held.mu.Lock()
	defer e.held.mu.Unlock()
	p := e.held.seen.Load()
	if p == nil {
		return
	}
	if _, found := (*p)[at]; !found {
		return
	}
	m := maps.Clone(*p)
	delete(m, at)
	e.held.seen.Store(&m)
}

// heldCheck is what script does before a deduct: for EVALSHA, check that
// Redis holds s; for EVAL, make it hold s.
func (e *Engine) heldCheck(h *hotKey, s *declaredScript, args [][]byte) error {
	if bytes.EqualFold(args[0], []byte("evalsha")) || bytes.EqualFold(args[0], []byte("evalsha_ro")) {
		return e.scriptHeld(h, s)
	}
	return e.keepScript(h, s)
}
