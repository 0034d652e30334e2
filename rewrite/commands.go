package rewrite

import (
	"bytes"
	"slices"
	"strconv"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// Error replies with Redis 7.0's texts.
const (
	msgNotInteger = "ERR value is not an integer or out of range"
	msgSyntax     = "ERR syntax error"
)

// Do answers a command on the hot key args[keyAt], as a plain key holding
// the sum of the buckets would answer it, or with a clear error. client
// identifies the connection, for route: client. The caller has split
// multi-key commands so that the hot key is their only key. nil means the
// key turned out not to be hot any more (it was learned, and holds no
// layout now): the caller relays the command as for a plain key.
func (e *Engine) Do(args [][]byte, keyAt int, client uint64) []byte {
	r := e.do(args, keyAt, client)
	if bytes.Equal(r, errPlain) {
		e.Forget(args[keyAt])
		return nil
	}
	return r
}

func (e *Engine) do(args [][]byte, keyAt int, client uint64) []byte {
	name := strings.ToLower(string(args[0]))
	h := e.key(args[keyAt])
	switch name {
	case "get":
		return e.get(h)
	case "set":
		return e.set(h, args)
	case "incr", "decr", "incrby", "decrby":
		return e.add(h, name, args, client)
	case "eval", "evalsha", "eval_ro", "evalsha_ro":
		return e.script(h, name, args, client)
	case "del", "unlink":
		return e.del(h, args)
	case "exists", "touch", "ttl", "pttl", "expiretime", "pexpiretime", "type":
		return e.send(h, []Request{{Key: args[keyAt], Args: args}})[0]
	case "expire", "pexpire", "expireat", "pexpireat", "persist":
		return e.expire(h, args)
	case "incrbyfloat":
		return errReply(h.name, "INCRBYFLOAT is not supported on it: its buckets hold integers")
	}
	return errReply(h.name, strings.ToUpper(name)+" is not supported on it")
}

// get answers GET: the sum, a bulk string as Redis gives a counter's
// value. The key is read with its buckets, in the same round, so a key
// that expired or changed behind this proxy's back is seen.
func (e *Engine) get(h *hotKey) []byte {
	for range 3 {
		if r := e.getOnce(h); r != nil {
			return r
		}
	}
	return resp.AppendError(nil, "ERR hotkeyproxy: '"+h.name+"' keeps changing; try again")
}

// getOnce is get on the layout as loaded; nil when the key turned out to
// hold another layout, to be read again.
func (e *Engine) getOnce(h *hotKey) []byte {
	l, st, fail := e.load(h, false)
	key := []byte(h.name)
	switch st {
	case stateFailed:
		return fail
	case stateMissing, stateOther:
		return e.send(h, []Request{{Key: key, Args: [][]byte{[]byte("GET"), key}}})[0]
	}
	replies := e.send(h, l.requests([]Request{{Key: key, Args: [][]byte{[]byte("GET"), key}}}, []byte("GET")))
	v, ok := resp.BulkValue(replies[0])
	switch {
	case resp.IsError(replies[0]):
		return replies[0]
	case !ok || !IsMarker(v):
		h.forget() // gone, or a plain value written by a proxy that did not know
		return replies[0]
	case !bytes.Equal(v, l.Marker()):
		h.forget() // made again with another layout
		return nil
	}
	var sum int64
	for i, r := range replies[1:] {
		if resp.IsError(r) {
			return r
		}
		n := int64(0)
		if b, ok := resp.BulkValue(r); ok {
			n, _ = resp.ParseInt(b)
		}
		h.last[i].Store(n)
		sum += n
	}
	return resp.AppendBulk(nil, strconv.AppendInt(nil, sum, 10))
}

// set answers SET k n [options]: n is split over the buckets, n/N each and
// the remainder one each on the first buckets (contract 1). The options
// are Redis's to check and apply, on the key itself, whose layout the SET
// writes; the buckets get the same expiry.
func (e *Engine) set(h *hotKey, args [][]byte) []byte {
	if len(args) < 3 {
		return resp.AppendError(nil, "ERR wrong number of arguments for 'set' command")
	}
	total, ok := resp.ParseInt(args[2])
	if !ok {
		return errReply(h.name, "its value must be an integer")
	}
	if total > MaxValue || total < -MaxValue {
		return errReply(h.name, "its value must be an integer below 2^53 in absolute value")
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
	prev, st, fail := e.load(h, false)
	if st == stateFailed {
		return fail
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
	var old []byte
	if get && st == stateHot {
		if old = e.get(h); resp.IsError(old) {
			return old
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
	if fail := e.writeShares(h, l, total, bucketExpiry); fail != nil {
		return fail
	}
	setMarker := append([][]byte{[]byte("SET"), key, l.Marker()}, args[3:]...)
	r := e.send(h, []Request{{Key: key, Args: setMarker}})[0]
	if resp.IsError(r) {
		e.dropBuckets(h, l)
		return r
	}
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
		e.dropBuckets(h, l)
	} else {
		e.adopt(h, l)
		h.soldAt.Store(0)
		e.publish(h, '+')
		if st == stateHot {
			e.dropBuckets(h, prev)
		}
	}
	switch {
	case get:
		return old
	case wasSet:
		return []byte("+OK\r\n")
	}
	return resp.AppendNil(nil)
}

// writeShares writes total over the buckets of l, each with expiry.
func (e *Engine) writeShares(h *hotKey, l *Layout, total int64, expiry [][]byte) []byte {
	reqs := make([]Request, l.N())
	for i := range reqs {
		b := l.Bucket(i)
		reqs[i] = Request{Key: b, Args: append([][]byte{[]byte("SET"), b, strconv.AppendInt(nil, l.Share(total, i), 10)}, expiry...)}
	}
	for _, r := range e.send(h, reqs) {
		if resp.IsError(r) {
			return r
		}
	}
	return nil
}

// dropBuckets deletes the buckets of a layout that no key names.
func (e *Engine) dropBuckets(h *hotKey, l *Layout) {
	e.send(h, l.requests(nil, []byte("DEL")))
}

// add answers INCR, DECR, INCRBY, DECRBY: the sum changes exactly as a
// plain key's (contract 4), and the reply is the new sum as this proxy
// sees it. Its sign is always right for this command: a decrement the
// buckets covered never looks negative, one they could not always does,
// so "DECR; if < 0, INCR back" stays exact.
func (e *Engine) add(h *hotKey, name string, args [][]byte, client uint64) []byte {
	delta := int64(1)
	switch name {
	case "incrby", "decrby":
		if len(args) != 3 {
			return resp.AppendError(nil, "ERR wrong number of arguments for '"+name+"' command")
		}
		var ok bool
		if delta, ok = resp.ParseInt(args[2]); !ok {
			return resp.AppendError(nil, msgNotInteger)
		}
	default:
		if len(args) != 2 {
			return resp.AppendError(nil, "ERR wrong number of arguments for '"+name+"' command")
		}
	}
	if name == "decr" || name == "decrby" {
		if delta == -1<<63 {
			return resp.AppendError(nil, "ERR decrement would overflow")
		}
		delta = -delta
	}
	for try := 0; ; try++ {
		r := e.addOnce(h, delta, client)
		if !bytes.Equal(r, errGone) || try == 2 {
			return r
		}
	}
}

// addOnce is add on the layout as loaded; errGone when the key turned out
// to be gone, to be tried again on a new one.
func (e *Engine) addOnce(h *hotKey, delta int64, client uint64) []byte {
	l, st, fail := e.load(h, true)
	switch st {
	case stateFailed:
		return fail
	case stateOther:
		return resp.AppendError(nil, msgNotInteger)
	}
	if sum := h.estimate(l); delta > 0 && delta > MaxValue-sum || delta < 0 && delta < -MaxValue-sum {
		return errReply(h.name, "the increment or decrement would take it to 2^53 in absolute value or more")
	}
	if delta >= 0 {
		// Also for 0: the call on bucket 0 is what finds a key that expired.
		if fail := e.incrBy(h, l, delta); fail != nil {
			return fail
		}
		return resp.AppendInt(nil, h.estimate(l))
	}
	covered, fail := e.decrBy(h, l, -delta, client)
	switch {
	case fail != nil:
		h.count.deductsFailed.Add(1)
		return fail
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
	return resp.AppendInt(nil, sum)
}

// script answers EVAL/EVALSHA of a declared deduct script on the hot key:
// remaining stock on success, the declared sold-out value otherwise, as
// the script would on a plain key holding the sum (contract 3).
func (e *Engine) script(h *hotKey, name string, args [][]byte, client uint64) []byte {
	var s *config.Script
	if strings.HasPrefix(name, "evalsha") {
		s = e.settings.Load().scripts[strings.ToLower(string(args[1]))]
	} else {
		s = e.scriptByBody(args[1])
	}
	if s == nil {
		return errReply(h.name, "only the deduct scripts declared in proxy.yaml can run on it")
	}
	if n, ok := resp.ParseInt(args[2]); !ok || n != 1 {
		return errReply(h.name, "a deduct script must name it as its only key")
	}
	amount := s.Amount.Const
	if s.Amount.ArgvIndex > 0 {
		i := 3 + s.Amount.ArgvIndex
		var ok bool
		if i >= len(args) {
			return errReply(h.name, "script "+s.Name+" needs ARGV["+strconv.Itoa(s.Amount.ArgvIndex)+"], the amount")
		}
		if amount, ok = resp.ParseInt(args[i]); !ok || amount < 1 {
			return errReply(h.name, "script "+s.Name+" needs a positive integer amount in ARGV["+strconv.Itoa(s.Amount.ArgvIndex)+"]")
		}
	}
	soldout := resp.AppendInt(nil, s.Soldout)
	if e.soldOut(h, amount) {
		h.count.soldOutLocal.Add(1)
		return h.counted(soldout, soldout, amount)
	}
	for try := 0; ; try++ {
		r := e.deductOnce(h, amount, soldout, client)
		if !bytes.Equal(r, errGone) || try == 2 {
			return h.counted(r, soldout, amount)
		}
	}
}

// deductOnce is the deduct script on the layout as loaded; errGone when
// the key turned out to be gone, to be tried again.
func (e *Engine) deductOnce(h *hotKey, amount int64, soldout []byte, client uint64) []byte {
	l, st, fail := e.load(h, false)
	switch st {
	case stateFailed:
		return fail
	case stateMissing:
		return soldout
	case stateOther:
		return errReply(h.name, "it holds a value that is not an integer below 2^53 in absolute value")
	}
	ok, fail := e.deduct(h, l, amount, client)
	switch {
	case fail != nil:
		return fail
	case !ok:
		return soldout
	}
	return resp.AppendInt(nil, max(h.estimate(l), 0))
}

// del answers DEL and UNLINK: the key and its buckets go.
func (e *Engine) del(h *hotKey, args [][]byte) []byte {
	l, st, fail := e.load(h, false)
	key := []byte(h.name)
	reqs := []Request{{Key: key, Args: [][]byte{args[0], key}}}
	switch st {
	case stateFailed:
		return fail
	case stateHot:
		reqs = l.requests(reqs, args[0])
	}
	replies := e.send(h, reqs)
	h.layout.Store(nil)
	h.soldAt.Store(0)
	return replies[0]
}

// expire answers EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT and PERSIST: on the
// key, whose reply it is, then the same on the buckets when it applied.
func (e *Engine) expire(h *hotKey, args [][]byte) []byte {
	key := []byte(h.name)
	l, st, fail := e.load(h, false)
	if st == stateFailed {
		return fail
	}
	r := e.send(h, []Request{{Key: key, Args: args}})[0]
	if st != stateHot || !bytes.Equal(r, []byte(":1\r\n")) {
		return r
	}
	for _, br := range e.send(h, l.requests(nil, args[0], args[2:]...)) {
		if resp.IsError(br) {
			return br
		}
	}
	return r
}
