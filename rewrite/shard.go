package rewrite

import (
	"errors"
	"strconv"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// LayoutChannel is the pub/sub channel on which a proxy announces the keys
// it made hot ("+key") and turned back into plain keys ("-key"), so that
// the other proxies learn within a round trip; the layout held in the key
// itself stays the safety net for one that missed the news (contract 9).
const LayoutChannel = "hotkeyproxy:layouts"

// publish announces on LayoutChannel that h became hot (op '+') or plain
// ('-'). Best effort: a proxy that misses it learns from the key.
func (e *Engine) publish(h *hotKey, op byte) {
	ch := []byte(LayoutChannel)
	msg := append([]byte{op}, h.name...)
	e.send(h, []Request{{Key: ch, Args: [][]byte{[]byte("PUBLISH"), ch, msg}}})
}

// News applies a message of LayoutChannel: "+key" learns key, "-key"
// forgets it. Any client can publish there, so a key is learned only once
// Redis shows it holds a layout: junk costs a GET, not memory. Other
// messages are ignored.
func (e *Engine) News(msg []byte) {
	if len(msg) < 2 {
		return
	}
	key := msg[1:]
	switch msg[0] {
	case '+':
		v, ok := resp.BulkValue(e.up.Do([]Request{{Key: key, Args: [][]byte{[]byte("GET"), key}}})[0])
		if ok && IsMarker(v) {
			if _, err := ParseMarker(string(key), v); err == nil {
				e.Learn(key)
			}
		}
	case '-':
		e.Forget(key)
	}
}

// Shard makes key a hot key now, live: a plain integer is converted into
// n buckets (0: the default count), without losing or doubling a unit
// while clients deduct; a missing key is made, holding 0, so that the SET
// of the stock that follows is split; a key already held as buckets is
// left as it is, whatever n. The other proxies are told. Replies: +OK; an
// error when the key does not hold an integer or Redis cannot be asked.
func (e *Engine) Shard(key []byte, n int) []byte {
	if err := e.shard(key, n); err != nil {
		return errorReply(err)
	}
	return []byte("+OK\r\n")
}

func (e *Engine) shard(key []byte, n int) error {
	h := e.key(key)
	_, st, err := e.loadAs(h, true, true, n)
	switch {
	case err != nil:
		return err
	case st == stateOther:
		return &keyError{key: h.name, reason: "does not hold an integer below 2^53 in absolute value; only counters can be held as buckets"}
	}
	if !h.conf.Load().configured {
		e.Learn(key)
	}
	return nil
}

// Unshard turns a hot key back into one plain key holding the sum, live.
// One proxy at a time (a lease next to bucket 0, 30 s at most): first
// every bucket's stock is moved into bucket 0 while the key still holds
// its layout, so deducts through any proxy go on; then, in one step on
// the key's slot, the key takes bucket 0's value and bucket 0 goes; the
// other proxies hear it, or find bucket 0 gone and read the key, and
// relay as for a plain key. Once every proxy must have stopped using the
// layout (the recheck interval, about a second, which the call waits),
// each other bucket is deleted and whatever was given back to it meanwhile
// is added to the key. A key that a rule of this proxy names is refused:
// the proxy would convert it again at once.
func (e *Engine) Unshard(key []byte) []byte {
	if err := e.unshard(key); err != nil {
		return errorReply(err)
	}
	return []byte("+OK\r\n")
}

func (e *Engine) unshard(key []byte) error {
	h := e.key(key)
	if h.conf.Load().configured {
		return &keyError{key: h.name, reason: "is marked hot by hotkeys.keys in proxy.yaml; remove it there first"}
	}
	h.seen.Store(0) // what Redis holds now
	l, st, err := e.load(h, false)
	switch {
	case errors.Is(err, errPlain), err == nil && st != stateHot:
		e.Forget(key)
		return &keyError{key: h.name, reason: "is not held as buckets"}
	case err != nil:
		return err
	}
	lease := append(l.Bucket(0), ":unshard"...)
	r, err := e.relay(h, Request{Key: lease, Args: [][]byte{[]byte("SET"), lease, []byte("1"), []byte("NX"), []byte("PX"), []byte("30000")}})
	switch {
	case err != nil:
		return err
	case string(r) != "+OK\r\n":
		return &keyError{key: h.name, reason: "is being merged back by another proxy"}
	}
	defer e.send(h, []Request{{Key: lease, Args: [][]byte{[]byte("DEL"), lease}}})
	h.slow.Lock()
	defer h.slow.Unlock()
	if err := e.consolidate(h, l, 1<<62); err != nil {
		return err
	}
	code, _, err := e.eval(h, scriptMerge, key, [][]byte{key, l.Bucket(0)}, l.Marker())
	switch {
	case err != nil:
		return err
	case code == 0:
		e.Forget(key)
		return &keyError{key: h.name, reason: "changed meanwhile (deleted or made again); nothing done"}
	}
	e.Forget(key)
	e.publish(h, '-')
	e.clock.Sleep(recheck + 100*time.Millisecond)
	for i := 1; i < l.N(); i++ {
		b := l.Bucket(i)
		v, _, err := e.eval(h, scriptDrain, b, [][]byte{b})
		if err != nil {
			return err
		}
		if v != 0 {
			// "Not an integer": a SET made the key hot again meanwhile,
			// replacing the value these units were part of.
			_, err := e.relay(h, Request{Key: key, Args: [][]byte{[]byte("INCRBY"), key, strconv.AppendInt(nil, v, 10)}})
			if err != nil && err.Error() != rediserr.NotInteger {
				return err
			}
		}
	}
	return nil
}
