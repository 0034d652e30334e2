package rewrite

import (
	"errors"
	"time"

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

// Unshard turns a hot key back into one plain key holding the sum, live,
// by a merge that any proxy can finish: in one step on the key's slot,
// the key's layout is marked merging; then each bucket but 0 is drained
// into bucket 0 by a move (taken whole, the bucket key deleted, in one
// step with its intent; applied to bucket 0, idempotent), every move
// still in flight is finished, and in one step on the key's slot the key
// takes bucket 0's value and bucket 0 goes. A proxy that meets the
// merging layout (its recheck, a bucket gone) finishes the merge in the
// same idempotent steps and answers from the plain key; so a proxy killed
// half way leaves nothing behind and blocks nothing. The other proxies
// are told, and the call replies once every proxy must have stopped
// using the layout (the recheck interval, about a second, which it
// waits): from then on, none takes the key for hot (a SET through one
// would make it hot again). A key that a rule of this proxy names is
// refused: the proxy would convert it again at once.
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
	merging := *l
	merging.Merging = true
	err = e.merge(h, &merging)
	e.Forget(key)
	switch {
	case errors.Is(err, errGone):
		return &keyError{key: h.name, reason: "changed meanwhile (deleted or made again); nothing done"}
	case err != nil:
		return err
	}
	e.clock.Sleep(recheck + 100*time.Millisecond)
	return nil
}

// merge merges l, a merging layout, back into its key, or finishes doing
// so (see Unshard): every step may be done again, by any proxy, at any
// time, with the same outcome. errGone: the key holds neither l complete
// nor l merging (it changed, or the merge was finished by another proxy
// before this one began). The error is else the first node failure; the
// merge is then left for whoever meets it next.
func (e *Engine) merge(h *hotKey, l *Layout) error {
	key := []byte(l.Key)
	whole := *l
	whole.Merging = false
	code, _, err := e.eval(h, scriptMark, key, [][]byte{key, l.Bucket(0)}, whole.Marker(), l.Marker())
	e.step("mark")
	switch {
	case err != nil:
		return err
	case code == 0:
		return errGone
	}
	var calls []scriptCall
	var ms []move
	for b := 1; b < l.N(); b++ {
		ms = append(ms, move{id: e.moveID(), from: b, to: 0})
		bk := l.Bucket(b)
		calls = append(calls, e.bucketCall(l, b, scriptDrain, nil, [][]byte{bk, l.IntentsKey(b)}, []byte(ms[b-1].id), []byte("0"), keepMs))
	}
	replies := e.evalAll(h, calls)
	e.step("drain")
	var drained []move
	for i, r := range replies {
		v, was, ok := pair(r)
		switch {
		case !ok:
			return &redisError{reply: r}
		case was == 1 && v != 0:
			ms[i].amount = v
			drained = append(drained, ms[i])
		}
	}
	if _, err := e.settle(h, l, drained); err != nil {
		return err
	}
	// The moves of others (a gather on a proxy that has not yet seen the
	// merge, a drain of one that died) are finished too: after the
	// drains, no move of this layout can begin, so none is missed.
	if _, err := e.finishMoves(h, l, 0); err != nil {
		return err
	}
	code, _, err = e.run(h, e.bucketCall(l, 0, scriptFlip, nil, [][]byte{key, l.Bucket(0), l.AppliedKey(0), l.LostKey()}, l.Marker()))
	e.step("flip")
	switch {
	case err != nil:
		return err
	case code == 1:
		h.forget()
		e.send(h, l.retireJournals(nil))
		e.publish(h, '-')
	}
	return nil
}
