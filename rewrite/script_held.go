package rewrite

import (
	"strings"
	"sync"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
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
// declared deduct script: "<sha> <node>" -> Unix ns. Few entries: the
// declared scripts times the masters.
type heldScripts struct {
	mu   sync.Mutex
	seen map[string]int64
}

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
	e.held.seen = nil
}

// scriptHeld answers for EVALSHA of the declared script s, whose SHA1 is
// sha (lower case), on h: nil when the master of h's slot holds it (or
// now does: loaded from what the proxy remembers), else Redis's NOSCRIPT.
func (e *Engine) scriptHeld(h *hotKey, s *config.Script, sha string) error {
	key := []byte(h.name)
	at := e.heldAt(h, sha)
	if at != "" && e.seenHeld(at) {
		return nil
	}
	r := e.send(h, []Request{{Key: key, Args: [][]byte{[]byte("SCRIPT"), []byte("EXISTS"), []byte(sha)}}})[0]
	if err := replyErr(r); err != nil {
		return err
	}
	var buf [1][]byte
	if elems, ok := resp.ArrayElems(r, buf[:0]); ok && len(elems) == 1 && string(elems[0]) == ":1\r\n" {
		e.markHeld(at)
		return nil
	}
	if f := e.remembers.Load(); f != nil && (*f)([]byte(sha)) {
		return e.loadScript(h, s, at)
	}
	return newRedisError(rediserr.NoScript)
}

// keepScript is EVAL of the declared script s, whose SHA1 is sha, on h:
// the master of h's slot gets the script, unless it was seen holding it
// within recheck.
func (e *Engine) keepScript(h *hotKey, s *config.Script, sha string) error {
	at := e.heldAt(h, sha)
	if at != "" && e.seenHeld(at) {
		return nil
	}
	return e.loadScript(h, s, at)
}

// loadScript sends SCRIPT LOAD of s to the master of h's slot, where it
// is then held (at names it there).
func (e *Engine) loadScript(h *hotKey, s *config.Script, at string) error {
	key := []byte(h.name)
	r := e.send(h, []Request{{Key: key, Args: [][]byte{[]byte("SCRIPT"), []byte("LOAD"), []byte(s.Body)}}})[0]
	if err := replyErr(r); err != nil {
		return err
	}
	e.markHeld(at)
	return nil
}

// heldAt names the script with SHA1 sha on the master of h's slot, for
// heldScripts; "" when no master serves the slot now.
func (e *Engine) heldAt(h *hotKey, sha string) string {
	node := e.up.Node(hashslot.Of([]byte(h.name)))
	if node == "?" {
		return ""
	}
	return sha + " " + node
}

func (e *Engine) seenHeld(at string) bool {
	e.held.mu.Lock()
	t, ok := e.held.seen[at]
	e.held.mu.Unlock()
	return ok && e.since(t) < recheck
}

func (e *Engine) markHeld(at string) {
	if at == "" {
		return
	}
	e.held.mu.Lock()
	defer e.held.mu.Unlock()
	if e.held.seen == nil {
		e.held.seen = make(map[string]int64)
	}
	e.held.seen[at] = e.now()
}

// heldCheck is what script does before a deduct: for EVALSHA, check that
// Redis holds s; for EVAL, make it hold s.
func (e *Engine) heldCheck(h *hotKey, s *config.Script, args [][]byte) error {
	if name := string(args[0]); strings.EqualFold(name, "evalsha") || strings.EqualFold(name, "evalsha_ro") {
		return e.scriptHeld(h, s, strings.ToLower(string(args[1])))
	}
	return e.keepScript(h, s, s.SHA1())
}
