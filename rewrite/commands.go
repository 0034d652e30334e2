package rewrite

import (
	"bytes"
	"cmp"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// Do answers a command on the hot key args[keyAt], as a plain key holding
// the sum of the buckets would answer it, or with a clear error. client
// identifies the connection, for route: client. The caller has split
// multi-key commands so that the hot key is their only key. nil means the
// key turned out not to be hot any more (it was learned, and holds no
// layout now): the caller relays the command as for a plain key.
func (e *Engine) Do(args [][]byte, keyAt int, client uint64) []byte {
	r, err := e.do(args, keyAt, client)
	switch {
	case errors.Is(err, errPlain):
		e.Forget(args[keyAt])
		return nil
	case err != nil:
		return errorReply(err)
	}
	return r
}

// do is Do with its failures as errors; a reply is never an error reply.
func (e *Engine) do(args [][]byte, keyAt int, client uint64) ([]byte, error) {
	var buf [24]byte
	name := resp.LowerName(args[0], &buf)
	h := e.key(args[keyAt])
	switch string(name) {
	case "get":
		return e.get(h)
	case "set":
		return e.set(h, args)
	case "incr", "decr", "incrby", "decrby":
		return e.add(h, string(name), args, client)
	case "eval", "evalsha", "eval_ro", "evalsha_ro":
		return e.script(h, args, client)
	case "del", "unlink":
		return e.del(h, args)
	case "exists", "touch", "ttl", "pttl", "expiretime", "pexpiretime", "type":
		return e.relay(h, Request{Key: args[keyAt], Args: args})
	case "expire", "pexpire", "expireat", "pexpireat", "persist":
		return e.expire(h, args)
	case "incrbyfloat":
		return nil, refused(h.name, "INCRBYFLOAT is not supported on it: its buckets hold integers")
	}
	return nil, refused(h.name, strings.ToUpper(string(args[0]))+" is not supported on it")
}

// relay sends one request for h and returns Redis's reply, an error reply
// as a redisError.
func (e *Engine) relay(h *hotKey, req Request) ([]byte, error) {
	r := e.send(h, []Request{req})[0]
	if err := replyErr(r); err != nil {
		return nil, err
	}
	return r, nil
}

// get answers GET: the sum, a bulk string as Redis gives a counter's
// value. The key is read with its buckets, in the same round, so a key
// that expired or changed behind this proxy's back is seen; within
// read_staleness of such a read, the sum comes from memory instead: what
// that read saw, with this proxy's changes since.
func (e *Engine) get(h *hotKey) ([]byte, error) {
	if bound := e.settings.Load().staleness; bound > 0 {
		l, at := h.layout.Load(), h.summed.Load()
		if l != nil && at != 0 && e.since(at) < bound {
			h.count.readsLocal.Add(1)
			return redcon.AppendBulk(nil, strconv.AppendInt(nil, h.estimate(l), 10)), nil
		}
	}
	for range 3 {
		if r, err := e.getOnce(h); !errors.Is(err, errGone) {
			return r, err
		}
	}
	return nil, &keyError{key: h.name, reason: "keeps changing; try again"}
}

// getOnce is get on the layout as loaded; errGone when the key turned out
// to hold another layout, to be read again.
func (e *Engine) getOnce(h *hotKey) ([]byte, error) {
	l, st, err := e.load(h, false)
	key := []byte(h.name)
	get := Request{Key: key, Args: [][]byte{[]byte("GET"), key}}
	switch {
	case err != nil:
		return nil, err
	case st == stateMissing, st == stateOther:
		return e.relay(h, get)
	}
	at := e.now()
	replies := e.send(h, l.requests([]Request{get}, []byte("GET")))
	if err := replyErr(replies[0]); err != nil {
		return nil, err
	}
	switch v, ok := resp.BulkValue(replies[0]); {
	case !ok || !IsMarker(v):
		h.forget() // gone, or a plain value written by a proxy that did not know
		return replies[0], nil
	case !bytes.Equal(v, l.Marker()):
		h.forget() // made again with another layout
		return nil, errGone
	}
	var sum int64
	var missing []int
	for i, r := range replies[1:] {
		if err := replyErr(r); err != nil {
			h.summed.Store(0)
			return nil, err
		}
		n := int64(0)
		if b, ok := resp.BulkValue(r); ok {
			n, _ = resp.ParseInt(b)
		} else if !h.isLost(l, i) {
			missing = append(missing, i)
			continue
		}
		h.last[i].Store(n)
		sum += n
	}
	// A bucket missing while the key names the layout: lost (the others'
	// sum is the value), or about to expire with the key (counted as
	// empty, as it will be in a moment); else the layout just ended.
	if len(missing) > 0 {
		if err := e.lose(h, l, missing...); !isLost(err) && !errors.Is(err, errExpiring) {
			return nil, err
		}
	}
	h.summed.Store(at)
	return redcon.AppendBulk(nil, strconv.AppendInt(nil, sum, 10)), nil
}

// set answers SET k n [options]: n is split over the buckets, n/N each and
// the remainder one each on the first buckets (contract 1). The options
// are Redis's to check and apply, on the key itself, whose layout the SET
// writes; the buckets get the same expiry.
func (e *Engine) set(h *hotKey, args [][]byte) ([]byte, error) {
	if len(args) < 3 {
		return nil, newRedisError(rediserr.WrongArity("set"))
	}
	total, ok := resp.ParseInt(args[2])
	if !ok {
		return nil, refused(h.name, "its value must be an integer")
	}
	if total > MaxValue || total < -MaxValue {
		return nil, refused(h.name, "its value must be an integer below 2^53 in absolute value")
	}
	var nx, xx, get bool
	var expiry [][]byte
	for i := 3; i < len(args); i++ {
		switch o := strings.ToUpper(string(args[i])); o {
		case "NX":
			nx = true
		case "XX":
			xx = true
		case "GET":
			get = true
		case "KEEPTTL":
			expiry = append(expiry, args[i])
		case "EX", "PX", "EXAT", "PXAT":
			if i+1 < len(args) {
				expiry = append(expiry, args[i], args[i+1])
				i++
			}
		}
	}
	prev, st, err := e.load(h, false)
	if err != nil {
		return nil, err
	}
	// Always a new layout, its buckets written before the key names it:
	// no proxy ever reads a layout with buckets missing or half written,
	// and a gather or PROXY UNSHARD still at work on the old one moves
	// stock only among the old buckets, which go with the value the SET
	// replaces. If the SET does not apply (NX, XX), the new ones go.
	n := e.buckets(h)
	if st == stateHot {
		n = prev.N()
	}
	masters, owner := e.up.Placement()
	l := Place(h.name, n, masters, owner)
	l.Journal = h.conf.Load().rule.Journal || st == stateHot && prev.Journal
	var old []byte
	if get && st == stateHot {
		if old, err = e.get(h); err != nil {
			return nil, err
		}
	}
	key := []byte(h.name)
	bucketExpiry := expiry
	if slices.ContainsFunc(expiry, func(o []byte) bool { return strings.EqualFold(string(o), "KEEPTTL") }) {
		// New bucket keys have no TTL to keep: they get the key's.
		bucketExpiry = nil
		if ttl, ok := resp.IntValue(e.send(h, []Request{{Key: key, Args: [][]byte{[]byte("PTTL"), key}}})[0]); ok && ttl > 0 {
			bucketExpiry = [][]byte{[]byte("PX"), strconv.AppendInt(nil, ttl, 10)}
		}
	}
	unacked, err := e.writeShares(h, l, total, bucketExpiry)
	if err != nil {
		return nil, err
	}
	setMarker := append([][]byte{[]byte("SET"), key, l.Marker()}, args[3:]...)
	r, markUnacked := e.sendChange(h, Request{Key: key, Args: setMarker})
	if err := replyErr(r); err != nil {
		e.discard(h, l)
		return nil, err
	}
	unacked = cmp.Or(unacked, markUnacked)
	var wasSet bool // with GET, the reply is the old value: NX and XX say
	switch {
	case !get:
		wasSet = string(r) == "+OK\r\n"
	case nx:
		wasSet = string(r) == "$-1\r\n"
	case xx:
		wasSet = string(r) != "$-1\r\n"
	default:
		wasSet = true
	}
	if get && st != stateHot {
		old = r // the plain value it held, or nil
	}
	if !wasSet {
		e.discard(h, l)
	} else {
		e.adopt(h, l)
		h.soldAt.Store(0)
		e.publish(h, '+')
		if st == stateHot {
			e.dropBuckets(h, prev)
		}
	}
	switch {
	case wasSet && unacked != nil:
		return nil, unacked
	case get:
		return old, nil
	case wasSet:
		return []byte("+OK\r\n"), nil
	}
	return redcon.AppendNull(nil), nil
}

// writeShares writes total over the buckets of l, each with expiry;
// unacked is the first write short of the replicas the rule waits for.
func (e *Engine) writeShares(h *hotKey, l *Layout, total int64, expiry [][]byte) (unacked, err error) {
	calls := make([]scriptCall, l.N())
	for i := range calls {
		calls[i] = e.shareCall(l, i, l.Share(total, i), expiry...)
	}
	// Each share stands once written: one short of the replicas is said
	// in SET's reply, not taken for a failed write.
	send := func(h *hotKey, reqs []Request) [][]byte {
		replies, short := e.sendChanges(h, reqs)
		for _, u := range short {
			unacked = cmp.Or(unacked, u)
		}
		return replies
	}
	for _, r := range e.evalAllBy(h, calls, send) {
		if err := replyErr(r); err != nil {
			return nil, err
		}
	}
	return unacked, nil
}

// dropBuckets deletes the buckets of a layout that no key names, with
// their records; its journals are kept journalKeep for their consumers.
func (e *Engine) dropBuckets(h *hotKey, l *Layout) {
	e.send(h, l.retireJournals(l.dropRequests(nil, []byte("DEL"))))
}

// discard deletes the buckets of a layout no key ever named (its SET did
// not apply), with their records and journals: nothing happened to the
// key, so the journal has nothing to say.
func (e *Engine) discard(h *hotKey, l *Layout) {
	e.send(h, l.journalRequests(l.dropRequests(nil, []byte("DEL")), []byte("DEL")))
}

// add answers INCR, DECR, INCRBY, DECRBY: the sum changes exactly as a
// plain key's (contract 4), and the reply is the new sum as this proxy
// sees it. Its sign is always right for this command: a decrement the
// buckets covered never looks negative, one they could not always does,
// so "DECR; if < 0, INCR back" stays exact.
func (e *Engine) add(h *hotKey, name string, args [][]byte, client uint64) ([]byte, error) {
	delta := int64(1)
	switch name {
	case "incrby", "decrby":
		if len(args) != 3 {
			return nil, newRedisError(rediserr.WrongArity(name))
		}
		var ok bool
		if delta, ok = resp.ParseInt(args[2]); !ok {
			return nil, newRedisError(rediserr.NotInteger)
		}
	default:
		if len(args) != 2 {
			return nil, newRedisError(rediserr.WrongArity(name))
		}
	}
	if name == "decr" || name == "decrby" {
		if delta == -1<<63 {
			return nil, newRedisError(rediserr.DecrOverflow)
		}
		delta = -delta
	}
	for try := 0; ; try++ {
		r, err := e.addOnce(h, delta, client)
		if !errors.Is(err, errGone) || try == 2 {
			return r, err
		}
	}
}

// addOnce is add on the layout as loaded; errGone when the key turned out
// to be gone, to be tried again on a new one.
func (e *Engine) addOnce(h *hotKey, delta int64, client uint64) ([]byte, error) {
	l, st, err := e.load(h, true)
	switch {
	case err != nil:
		return nil, err
	case st == stateOther:
		return nil, newRedisError(rediserr.NotInteger)
	}
	if sum := h.estimate(l); delta > 0 && delta > MaxValue-sum || delta < 0 && delta < -MaxValue-sum {
		return nil, refused(h.name, "the increment or decrement would take it to 2^53 in absolute value or more")
	}
	if delta >= 0 {
		// Also for 0: the call on bucket 0 is what finds a key that expired.
		if err := e.incrBy(h, l, delta); err != nil {
			return nil, err
		}
		return intReply(h.estimate(l)), nil
	}
	covered, err := e.decrBy(h, l, -delta, client)
	switch {
	case err != nil:
		h.count.deductsFailed.Add(1)
		return nil, err
	case covered:
		h.count.deductsOK.Add(1)
		h.count.unitsSold.Add(uint64(-delta))
	default:
		h.count.deductsSoldOut.Add(1)
	}
	sum := h.estimate(l)
	if covered {
		sum = max(sum, 0)
	} else {
		sum = min(sum, -1)
	}
	return intReply(sum), nil
}

// deductScript is the declared deduct script args runs: EVAL or EVALSHA
// (or their _RO forms) of a script the config declares; nil for any other
// command or script.
func (e *Engine) deductScript(args [][]byte) *declaredScript {
	if len(args) < 2 {
		return nil
	}
	var buf [24]byte
	switch string(resp.LowerName(args[0], &buf)) {
	case "evalsha", "evalsha_ro":
		scripts := e.settings.Load().scripts
		if sc, ok := scripts[string(args[1])]; ok {
			return sc // as clients send it, lowercase: no copy
		}
		return scripts[strings.ToLower(string(args[1]))]
	case "eval", "eval_ro":
		sum := sha1.Sum(args[1])
		var sha [2 * sha1.Size]byte
		hex.Encode(sha[:], sum[:])
		return e.settings.Load().scripts[string(sha[:])]
	}
	return nil
}

// script answers EVAL/EVALSHA of a declared deduct script on the hot key:
// remaining stock on success, the declared sold-out value otherwise, as
// the script would on a plain key holding the sum (contract 3).
func (e *Engine) script(h *hotKey, args [][]byte, client uint64) ([]byte, error) {
	s := e.deductScript(args)
	if s == nil {
		return nil, refused(h.name, "only the deduct scripts declared in proxy.yaml can run on it")
	}
	if n, ok := resp.ParseInt(args[2]); !ok || n != 1 {
		return nil, refused(h.name, "a deduct script must name it as its only key")
	}
	if err := e.heldCheck(h, s, args); err != nil {
		return nil, err
	}
	amount := s.Amount.Const
	if s.Amount.ArgvIndex > 0 {
		i := 3 + s.Amount.ArgvIndex
		var ok bool
		if i >= len(args) {
			return nil, refused(h.name, "script "+s.Name+" needs ARGV["+strconv.Itoa(s.Amount.ArgvIndex)+"], the amount")
		}
		if amount, ok = resp.ParseInt(args[i]); !ok || amount < 1 {
			return nil, refused(h.name, "script "+s.Name+" needs a positive integer amount in ARGV["+strconv.Itoa(s.Amount.ArgvIndex)+"]")
		}
	}
	var order []byte // the journal's order id, when the script names one
	if i := 3 + int(s.OrderID); s.OrderID > 0 && i < len(args) {
		order = args[i]
	}
	soldout := s.soldout
	if e.soldOut(h, amount) {
		h.count.soldOutLocal.Add(1)
		return h.counted(soldout, nil, soldout, amount)
	}
	for try := 0; ; try++ {
		r, err := e.deductOnce(h, amount, soldout, client, order)
		if !errors.Is(err, errGone) || try == 2 {
			return h.counted(r, err, soldout, amount)
		}
	}
}

// deductOnce is the deduct script on the layout as loaded; errGone when
// the key turned out to be gone, to be tried again.
func (e *Engine) deductOnce(h *hotKey, amount int64, soldout []byte, client uint64, order []byte) ([]byte, error) {
	l, st, err := e.load(h, false)
	switch {
	case err != nil:
		return nil, err
	case st == stateMissing:
		return soldout, nil
	case st == stateOther:
		return nil, refused(h.name, "it holds a value that is not an integer below 2^53 in absolute value")
	}
	ok, err := e.deduct(h, l, amount, client, order)
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return soldout, nil
	}
	return intReply(max(h.estimate(l), 0)), nil
}

// intReply is n as a RESP integer, in one allocation: the reply of every
// deduct.
func intReply(n int64) []byte {
	b := append(make([]byte, 0, len(":-9223372036854775808\r\n")), ':')
	return append(strconv.AppendInt(b, n, 10), '\r', '\n')
}

// del answers DEL and UNLINK: the key goes, then its buckets with their
// records (in that order: a bucket missing while the key still names the
// layout would be a lost bucket).
func (e *Engine) del(h *hotKey, args [][]byte) ([]byte, error) {
	l, st, err := e.load(h, false)
	if err != nil {
		return nil, err
	}
	key := []byte(h.name)
	r := e.send(h, []Request{{Key: key, Args: [][]byte{args[0], key}}})[0]
	h.forget()
	if err := replyErr(r); err != nil {
		return nil, err
	}
	if st == stateHot {
		e.send(h, l.retireJournals(l.dropRequests(nil, args[0])))
	}
	return r, nil
}

// expire answers EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT and PERSIST: on the
// key, whose reply it is, then the same on the buckets and their records
// when it applied, so that they go with the key.
func (e *Engine) expire(h *hotKey, args [][]byte) ([]byte, error) {
	key := []byte(h.name)
	l, st, err := e.load(h, false)
	if err != nil {
		return nil, err
	}
	r, err := e.relay(h, Request{Key: key, Args: args})
	h.summed.Store(0) // an expiry in the past deletes the key
	if err != nil || st != stateHot || string(r) != ":1\r\n" {
		return r, err
	}
	reqs := l.requests(nil, args[0], args[2:]...)
	for _, br := range e.send(h, l.recordRequests(reqs, args[0], args[2:]...)) {
		if err := replyErr(br); err != nil {
			return nil, err
		}
	}
	return r, nil
}
