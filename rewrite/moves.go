package rewrite

import (
	"bytes"
	"slices"
	"strconv"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// appliedKeep is how long a move's applied mark is kept once its intent
// is gone: a request that applies the move again (sent by a proxy that
// read the intent before it went) may still be on its way, as TCP
// retransmits a partitioned sender's data for some 15 minutes. Its
// records also outlive their bucket's TTL by this much.
const appliedKeep = time.Hour

// keepMs is appliedKeep as the scripts take it, in milliseconds.
var keepMs = strconv.AppendInt(nil, appliedKeep.Milliseconds(), 10)

// move is one move of stock between two buckets of a layout, as its
// intent records it.
type move struct {
	id       string
	from, to int
	amount   int64
}

// startMove is a move's first step: up to want is taken from bucket from
// of l and recorded as a move to bucket to, in one step on from's slot.
// m.amount is what was taken (0: nothing, and nothing recorded); h.last
// has what from holds now. A missing bucket is what lose makes of it.
func (e *Engine) startMove(h *hotKey, l *Layout, from, to int, want int64) (m move, err error) {
	m = move{id: e.moveID(), from: from, to: to}
	b := l.Bucket(from)
	t, left, err := e.run(h, e.bucketCall(l, from, scriptTake, nil, [][]byte{b, l.IntentsKey(from)},
		strconv.AppendInt(nil, want, 10), []byte(m.id), strconv.AppendInt(nil, int64(to), 10), keepMs))
	e.step("take")
	switch {
	case err != nil:
		return m, err
	case t == -2:
		return m, e.lose(h, l, from)
	}
	h.last[from].Store(left)
	m.amount = t
	return m, nil
}

// settle ends moves whose take is done: each is applied to its target
// (twice is once), then its intent goes; one whose target is gone is
// undone, its stock given back to its source. All at once, in two rounds.
// h.last follows what Redis answered. A move a node failed stays as it
// is, for whoever looks next (the apply may have been applied: only its
// mark in the target's slot can tell); the error is then the first such
// failure, else what lose makes of a target found gone.
func (e *Engine) settle(h *hotKey, l *Layout, ms []move) (settled int, err error) {
	if len(ms) == 0 {
		return 0, nil
	}
	calls := make([]scriptCall, len(ms))
	for i, m := range ms {
		b := l.Bucket(m.to)
		calls[i] = e.bucketCall(l, m.to, scriptApply, nil, [][]byte{b, l.AppliedKey(m.to)},
			[]byte(m.id), strconv.AppendInt(nil, m.amount, 10), keepMs)
	}
	applied := e.evalAll(h, calls)
	e.step("apply")
	var ends []scriptCall
	var ended []move // ends[i] ends ended[i]
	var gone []int   // targets found gone
	for i, r := range applied {
		a, v, ok := pair(r)
		m := ms[i]
		switch {
		case !ok:
			if err == nil {
				err = &redisError{reply: r}
			}
			continue
		case a == -2:
			b := l.Bucket(m.from)
			ends = append(ends, e.bucketCall(l, m.from, scriptUndo, nil, [][]byte{b, l.IntentsKey(m.from)}, []byte(m.id)))
			if !slices.Contains(gone, m.to) {
				gone = append(gone, m.to)
			}
		default:
			h.last[m.to].Store(v)
			intents := l.IntentsKey(m.from)
			ends = append(ends, scriptCall{route: intents, args: [][]byte{[]byte("HDEL"), intents, []byte(m.id)}})
		}
		ended = append(ended, m)
	}
	for i, r := range e.evalAll(h, ends) {
		if failed := replyErr(r); failed != nil {
			if err == nil {
				err = failed
			}
			continue
		}
		settled++
		if a, v, ok := pair(r); ok && a == 1 {
			h.last[ended[i].from].Store(v) // given back
		}
	}
	e.step("finish")
	if err == nil && len(gone) > 0 {
		err = e.lose(h, l, gone...)
	}
	return settled, err
}

// finishMoves finishes the moves between l's buckets that are recorded
// and unfinished, at least minAge old by their source node's clock (0:
// all, a live one of another proxy's too: finishing twice is harmless),
// and drops the applied marks older than appliedKeep whose intent is
// gone. It also finds buckets of l that are missing (lose tells why).
// finished counts the moves settled; the error is the first node failure.
func (e *Engine) finishMoves(h *hotKey, l *Layout, minAge time.Duration) (finished int, err error) {
	n := l.N()
	calls := make([]scriptCall, n)
	for i := range n {
		calls[i] = newScriptCall(scriptMoves, l.Bucket(i), [][]byte{l.IntentsKey(i), l.AppliedKey(i), l.Bucket(i)}, keepMs)
	}
	var ms []move
	live := make(map[string]bool)
	old := make([][][]byte, n)
	var missing []int
	for i, r := range e.evalAll(h, calls) {
		var buf [4][]byte
		elems, ok := resp.ArrayElems(r, buf[:0])
		if !ok || len(elems) != 4 {
			if err == nil {
				err = &redisError{reply: r}
			}
			continue
		}
		now, _ := resp.IntValue(elems[0])
		if exists, _ := resp.IntValue(elems[1]); exists == 0 && !l.Merging && !h.isLost(l, i) {
			missing = append(missing, i)
		}
		intents, _ := resp.ArrayElems(elems[2], nil)
		for j := 0; j+1 < len(intents); j += 2 {
			id, _ := resp.BulkValue(intents[j])
			rec, _ := resp.BulkValue(intents[j+1])
			live[string(id)] = true
			m, created, ok := parseIntent(string(id), i, rec, n)
			if ok && now-created >= minAge.Milliseconds() {
				ms = append(ms, m)
			}
		}
		marks, _ := resp.ArrayElems(elems[3], nil)
		for _, mk := range marks {
			if id, ok := resp.BulkValue(mk); ok {
				old[i] = append(old[i], id)
			}
		}
	}
	// A mark can go only if no bucket holds its intent: not when a
	// bucket's intents could not be read.
	var prune []Request
	for i, ids := range old {
		if err != nil {
			break
		}
		args := [][]byte{[]byte("ZREM"), l.AppliedKey(i)}
		for _, id := range ids {
			if !live[string(id)] {
				args = append(args, id)
			}
		}
		if len(args) > 2 {
			prune = append(prune, Request{Key: args[1], Args: args})
		}
	}
	if len(prune) > 0 {
		e.send(h, prune)
	}
	finished, serr := e.settle(h, l, ms)
	if err == nil {
		err = serr
	}
	if len(missing) > 0 {
		if lerr := e.lose(h, l, missing...); err == nil {
			err = lerr
		}
	}
	return finished, err
}

// parseIntent reads an intent of bucket from, "<to> <amount> <created
// ms>", to naming another of the n buckets; ok is false for anything else
// (written by hand), which is left alone.
func parseIntent(id string, from int, rec []byte, n int) (m move, created int64, ok bool) {
	f := bytes.Fields(rec)
	if len(f) != 3 {
		return m, 0, false
	}
	to, ok1 := resp.ParseInt(f[0])
	amount, ok2 := resp.ParseInt(f[1])
	created, ok3 := resp.ParseInt(f[2])
	if !ok1 || !ok2 || !ok3 || to < 0 || to >= int64(n) || int(to) == from {
		return m, 0, false
	}
	return move{id: id, from: from, to: int(to), amount: amount}, created, true
}

// FinishMoves finishes, for every hot key this proxy knows the layout of,
// the moves between its buckets left unfinished for half of
// hotkeys.move_timeout (their proxy died, or lost Redis, half way), and
// finds its buckets that are lost. The proxy calls it every quarter of
// move_timeout; it costs one small script per bucket.
func (e *Engine) FinishMoves() {
	minAge := e.settings.Load().moveTimeout / 2
	e.mu.Lock()
	keys := make([]*hotKey, 0, len(e.keys))
	for _, h := range e.keys {
		keys = append(keys, h)
	}
	e.mu.Unlock()
	for _, h := range keys {
		if l := h.layout.Load(); l != nil {
			if n, _ := e.finishMoves(h, l, minAge); n > 0 {
				h.count.movesRecovered.Add(uint64(n))
			}
		}
	}
}

// lose tells why buckets of l were found missing, in one step on the
// key's slot: the key holds another value now, or is about to expire
// (errGone, or errExpiring; h forgets the layout), or the buckets alone
// are lost, and then they are recorded in Redis (LostKey) and here, and
// logged once; the error is then a lostError naming the first.
func (e *Engine) lose(h *hotKey, l *Layout, buckets ...int) error {
	key := []byte(l.Key)
	marker := l.Marker()
	calls := make([]scriptCall, len(buckets))
	for i, b := range buckets {
		calls[i] = newScriptCall(scriptLose, key, [][]byte{key, l.LostKey()}, marker,
			strconv.AppendInt(nil, int64(b), 10), strconv.AppendInt(nil, h.last[b].Load(), 10),
			strconv.AppendInt(nil, recheck.Milliseconds(), 10))
	}
	var lost error
	// Not waited for (wait_replicas): a record a failover loses is written
	// again by whoever finds the bucket missing next.
	for i, r := range e.evalAllBy(h, calls, e.send) {
		a, units, ok := pair(r)
		b := buckets[i]
		switch {
		case !ok:
			return &redisError{reply: r}
		case a == 0:
			h.forget()
			return errGone
		case a == -1:
			h.forget()
			return errExpiring
		}
		h.last[b].Store(0)
		if h.markLost(l, b, units) {
			h.count.bucketsLost.Add(1)
			e.log.Error("hot key bucket lost: its key is missing while the layout names it; the other buckets still sell",
				"key", l.Key, "bucket", b, "bucket_key", string(l.Bucket(b)), "units", units, "found_first", a == 1)
		}
		if lost == nil {
			lost = newLostError(l.Key, b, l.Bucket(b), units)
		}
	}
	return lost
}
