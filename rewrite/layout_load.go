package rewrite

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// state of a hot key in Redis, as load finds it.
type state int

const (
	stateMissing state = iota // the key does not exist
	stateHot                  // it holds a layout
	stateOther                // it holds something that is not an integer
)

// load reads the key and makes sure it is held as buckets: a layout is
// read (and completed, when a conversion left it pending); a plain
// integer is converted; a missing key gets a layout when create is set
// (INCR, SET…), which is what a first write does to a plain key. The
// error is errPlain for a learned key that holds no layout now, or what
// kept Redis from answering.
func (e *Engine) load(h *hotKey, create bool) (*Layout, state, error) {
	return e.loadAs(h, create, h.conf.Load().configured, 0)
}

// loadAs is load for a key that may be converted (or made) when convert is
// set, into n buckets (0: the default count). A key that may not, because
// it was only learned, is hot only while it holds a layout: otherwise the
// error is errPlain.
func (e *Engine) loadAs(h *hotKey, create, convert bool, n int) (*Layout, state, error) {
	if l := h.layout.Load(); l != nil {
		seen := h.seen.Load()
		// One caller rechecks the layout when it is old; the others go
		// on with it meanwhile.
		if e.since(seen) < recheck || !h.seen.CompareAndSwap(seen, e.now()) {
			return l, stateHot, nil
		}
	}
	key := []byte(h.name)
	for range 3 {
		r := e.send(h, []Request{{Key: key, Args: [][]byte{[]byte("GET"), key}}})[0]
		v, ok := resp.BulkValue(r)
		switch {
		case resp.IsError(r):
			return nil, 0, replyErr(r)
		case ok && IsMarker(v):
			l, err := ParseMarker(h.name, v)
			if err != nil {
				return nil, stateOther, nil
			}
			if l.Merging {
				// Left half merged (its proxy died, or is at it now):
				// finished here, and the key read again.
				if err := e.merge(h, l); err != nil && !errors.Is(err, errGone) {
					return nil, 0, err
				}
				continue
			}
			if l.Pending {
				if err := e.complete(h, l); errors.Is(err, errGone) {
					continue
				} else if err != nil {
					return nil, 0, err
				}
			}
			e.adopt(h, l)
			return l, stateHot, nil
		case !convert:
			h.layout.Store(nil)
			return nil, 0, errPlain
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
		l := Place(h.name, n, masters, owner)
		l.Journal = h.conf.Load().rule.Journal
		mk := []byte("0")
		if create {
			mk[0] = '1'
		}
		code, _, err := e.run(h, e.bucketCall(l, 0, scriptConvert, nil, [][]byte{key, l.Bucket(0)}, l.Marker(), []byte(MarkerPrefix), mk, strconv.AppendInt(nil, int64(l.N()), 10)))
		e.step("convert")
		switch {
		case err != nil:
			return nil, 0, err
		case code == -1:
			return nil, stateOther, nil
		case code == 1:
			e.publish(h, '+')
		}
	}
	// Made and gone again three times over: the key is being deleted as
	// fast as it is made.
	return nil, 0, &keyError{key: h.name, reason: "keeps changing; try again"}
}

// complete makes the buckets a conversion left to make, each with its
// share of the value and the key's TTL, then marks the layout complete.
// Any proxy that reads a pending layout does this, so a proxy that died
// half way loses nothing: the value to spread is in the marker, and a
// bucket already made is left as it is (SET NX). errGone: the key went
// meanwhile, or holds another layout now.
func (e *Engine) complete(h *hotKey, l *Layout) error {
	key := []byte(l.Key)
	r := e.send(h, []Request{{Key: key, Args: [][]byte{[]byte("PTTL"), key}}})[0]
	ttl, ok := resp.IntValue(r)
	switch {
	case !ok:
		return &redisError{reply: r}
	case ttl == -2:
		return errGone
	}
	var calls []scriptCall
	for i := 1; i < l.N(); i++ {
		opts := [][]byte{[]byte("NX")}
		if ttl > 0 {
			opts = append(opts, []byte("PX"), strconv.AppendInt(nil, ttl, 10))
		}
		calls = append(calls, e.shareCall(l, i, l.Share(l.Fill, i), opts...))
	}
	made := e.evalAll(h, calls)
	e.step("spread")
	for _, r := range made {
		if err := replyErr(r); err != nil {
			return err
		}
	}
	pending := l.Marker()
	l.Pending = false
	done, _, err := e.eval(h, scriptSwap, key, [][]byte{key}, pending, l.Marker())
	e.step("complete")
	if err != nil {
		return err
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
					b := l.Bucket(i + 1)
					del = append(del, Request{Key: b, Args: [][]byte{[]byte("DEL"), b}})
				}
			}
			e.send(h, l.retireJournals(del))
			return errGone
		}
	}
	return nil
}

// adopt takes l as h's layout and reads every bucket's value.
func (e *Engine) adopt(h *hotKey, l *Layout) {
	_, owner := e.up.Placement()
	l.groupByMaster(owner)
	l.nameBuckets()
	h.layout.Store(l)
	e.readBuckets(h, l)
}

// readBuckets refreshes what h knows of every bucket and returns the sum.
// A bucket missing is what lose makes of it: errGone (h forgotten), or a
// lostError when it is newly found lost (one known lost counts as empty,
// without error); else the error is the first bucket's node failure. The
// sum is then of the buckets read.
func (e *Engine) readBuckets(h *hotKey, l *Layout) (sum int64, err error) {
	at := e.now()
	var missing []int
	for i, r := range e.send(h, l.requests(nil, []byte("GET"))) {
		if failed := replyErr(r); failed != nil {
			// The others are still read: a deduct can go on with them,
			// though it cannot conclude "sold out" (err is set).
			if err == nil {
				err = failed
			}
			h.last[i].Store(0)
			continue
		}
		b, ok := resp.BulkValue(r)
		if !ok {
			// A bucket gone: the layout ended (merged back, expired,
			// deleted), and counting it as empty would conclude "sold
			// out" from a layout that no longer holds the stock; or the
			// bucket alone is lost, and the others still sell.
			if h.isLost(l, i) {
				h.last[i].Store(0)
			} else {
				missing = append(missing, i)
			}
			continue
		}
		v, _ := resp.ParseInt(b)
		h.last[i].Store(v)
		sum += v
	}
	if len(missing) > 0 {
		if lerr := e.lose(h, l, missing...); err == nil || errors.Is(lerr, errGone) {
			err = lerr
		}
	}
	h.seen.Store(e.now())
	if err == nil {
		h.summed.Store(at)
	}
	if err == nil && sum > 0 && sum >= h.soldAmount.Load() {
		h.soldAt.Store(0)
	}
	return sum, err
}
