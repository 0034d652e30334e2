package rewrite

import (
	"errors"
	"strconv"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// scriptTip reads a bucket (KEYS[1]) and the id of its journal's (KEYS[2])
// last entry in one step, so that the entries up to it explain the value
// exactly while clients go on changing it: {1 | 0 (missing), value, last
// id | ""}.
var scriptTip = newBucketScript(`local v = redis.call('get', KEYS[1])
local last = redis.call('xrevrange', KEYS[2], '+', '-', 'COUNT', 1)[1]
local id = ''
if last then id = last[1] end
if not v then return {0, '0', id} end
return {1, v, id}`)

// journalPage is how many entries reconcile reads of a journal at once.
const journalPage = 1000

// Journal is the reply to PROXY JOURNAL <key>: the names of the key's
// journal streams, in bucket order; an error when the key is not held as
// buckets or not journaled.
func (e *Engine) Journal(key []byte) []byte {
	l, err := e.journaled(key)
	if err != nil {
		return errorReply(err)
	}
	out := redcon.AppendArray(nil, l.N())
	for i := range l.N() {
		out = redcon.AppendBulk(out, l.JournalKey(i))
	}
	return out
}

// journaled is the layout of key read afresh, or why it has no journal.
func (e *Engine) journaled(key []byte) (*Layout, error) {
	h := e.key(key)
	h.seen.Store(0)
	l, st, err := e.load(h, false)
	switch {
	case errors.Is(err, errPlain), err == nil && st != stateHot:
		return nil, &keyError{key: h.name, reason: "is not held as buckets"}
	case err != nil:
		return nil, err
	case !l.Journal:
		return nil, &keyError{key: h.name, reason: "is not journaled: set journal: true on its hotkeys.keys rule (hotkeys.detect.journal for keys made hot without one), then SET it"}
	}
	return l, nil
}

// Bucket statuses in PROXY RECONCILE.
const (
	reconcileOK        = "ok"         // the journal explains the bucket's value
	reconcileDiffers   = "differs"    // it does not: the difference is what no entry explains
	reconcileLost      = "lost"       // the bucket's key is missing; journal_says is what it held
	reconcileNoJournal = "no_journal" // the journal holds no entry: nothing to reconcile from
)

// bucketCheck is what reconcile found of one bucket.
type bucketCheck struct {
	status  string
	holds   int64 // the bucket's value (0 when lost)
	says    int64 // what the journal says it holds
	entries int64 // entries read, from the oldest kept to the tip
	from    string
	// trimmed: the oldest entry kept is not the bucket's set entry (the
	// ones before it were trimmed); the check starts from its value.
	trimmed bool
	// unexplained is the first entry whose value after is not what the
	// entries before it say: a change no entry records happened before.
	unexplained string
	// The units the entries set, deducted and gave back.
	set, deducted, givenBack int64
}

// Reconcile is the reply to PROXY RECONCILE <key>: it reads every bucket
// of a journaled key, each in one step with its journal's last entry id,
// then the journal up to that entry, and says whether what the journal
// says (the units set, less deducts, plus give-backs and moves in) equals
// what the buckets hold. A map-like array:
//
//	key, <key>, status, clean|differs|unknown, buckets_hold, <n>,
//	journal_says, <n>, difference, <n>, set, <n>, deducted, <n>,
//	given_back, <n>, buckets, [[bucket, <i>, status, <s>, holds, <n>,
//	journal_says, <n>, difference, <n>, entries, <n>, from, <id>,
//	trimmed, yes|no, first_unexplained, <id>|"", note, <text>]…]
//
// difference is holds less journal_says; the totals are over the buckets
// that could be reconciled. A bucket's status is ok, differs, lost (its
// key is missing: journal_says is what the journal says it held) or
// no_journal (its journal has no entry: it cannot be reconciled, and the
// key's status is then unknown unless another bucket differs). A
// journal trimmed by journal_maxlen or its consumers is reconciled from
// its oldest entry kept, whose value after is exact: trimmed says so.
// Units in a move between buckets in flight are in neither end's bucket
// nor journal, so they never make a difference.
func (e *Engine) Reconcile(key []byte) []byte {
	l, err := e.journaled(key)
	if err != nil {
		return errorReply(err)
	}
	h := e.key(key)
	checks := make([]bucketCheck, l.N())
	calls := make([]scriptCall, l.N())
	for i := range l.N() {
		calls[i] = newScriptCall(scriptTip, l.Bucket(i), [][]byte{l.Bucket(i), l.JournalKey(i)})
	}
	for i, r := range e.evalAll(h, calls) {
		var buf [3][]byte
		elems, ok := resp.ArrayElems(r, buf[:0])
		if !ok || len(elems) != 3 {
			return errorReply(&redisError{reply: r})
		}
		exists, _ := resp.IntValue(elems[0])
		v, _ := resp.BulkValue(elems[1])
		tip, _ := resp.BulkValue(elems[2])
		c := &checks[i]
		c.holds, _ = resp.ParseInt(v)
		if err := e.readJournal(h, l.JournalKey(i), string(tip), c); err != nil {
			return errorReply(err)
		}
		switch {
		case c.entries == 0:
			c.status = reconcileNoJournal
		case exists == 0:
			c.status = reconcileLost
		case c.holds != c.says, c.unexplained != "":
			// An entry its predecessors do not explain is a change the
			// journal does not hold (or a bad entry), even when the
			// buckets happen to agree with the sum.
			c.status = reconcileDiffers
		default:
			c.status = reconcileOK
		}
	}
	return reconcileReply(l, checks)
}

// readJournal reads stream up to the entry tip ("" : none) into c.
func (e *Engine) readJournal(h *hotKey, stream []byte, tip string, c *bucketCheck) error {
	if tip == "" {
		return nil
	}
	start := []byte("-")
	for {
		r := e.send(h, []Request{{Key: stream, Args: [][]byte{[]byte("XRANGE"), stream, start, []byte(tip),
			[]byte("COUNT"), strconv.AppendInt(nil, journalPage, 10)}}})[0]
		entries, ok := resp.ArrayElems(r, nil)
		if !ok {
			return &redisError{reply: r}
		}
		var id []byte
		for _, en := range entries {
			var pair [2][]byte
			parts, ok := resp.ArrayElems(en, pair[:0])
			if !ok || len(parts) != 2 {
				return &redisError{reply: r}
			}
			id, _ = resp.BulkValue(parts[0])
			fields, _ := resp.ArrayElems(parts[1], nil)
			c.add(string(id), fields)
		}
		if len(entries) < journalPage || string(id) == tip {
			return nil
		}
		start = append([]byte("("), id...)
	}
}

// add takes one journal entry (its fields as RESP bulk strings) into c.
func (c *bucketCheck) add(id string, fields [][]byte) {
	var op string
	var amount, after int64
	for j := 0; j+1 < len(fields); j += 2 {
		name, _ := resp.BulkValue(fields[j])
		v, _ := resp.BulkValue(fields[j+1])
		switch string(name) {
		case "op":
			op = string(v)
		case "amount":
			amount, _ = resp.ParseInt(v)
		case "after":
			after, _ = resp.ParseInt(v)
		}
	}
	c.entries++
	if c.entries == 1 {
		c.from, c.says = id, after
		c.trimmed = op != "set"
		if op == "set" {
			c.set += amount
		}
		return
	}
	switch op {
	case "set":
		c.says = amount
		c.set += amount
	case "deduct":
		c.says -= amount
		c.deducted += amount
	case "give_back":
		c.says += amount
		c.givenBack += amount
	case "move_out", "merged":
		c.says -= amount
	case "move_in", "move_back":
		c.says += amount
	}
	if after != c.says && c.unexplained == "" {
		c.unexplained = id
	}
}

// reconcileReply is Reconcile's reply for l's checks.
func reconcileReply(l *Layout, checks []bucketCheck) []byte {
	var holds, says, set, deducted, givenBack int64
	status := "clean"
	for _, c := range checks {
		switch c.status {
		case reconcileNoJournal:
			if status == "clean" {
				status = "unknown"
			}
			continue
		case reconcileDiffers, reconcileLost:
			status = "differs"
		}
		holds += c.holds
		says += c.says
		set += c.set
		deducted += c.deducted
		givenBack += c.givenBack
	}
	out := redcon.AppendArray(nil, 18)
	out = field(out, "key", []byte(l.Key))
	out = field(out, "status", []byte(status))
	for _, f := range []struct {
		name string
		n    int64
	}{{"buckets_hold", holds}, {"journal_says", says}, {"difference", holds - says}, {"set", set}, {"deducted", deducted}, {"given_back", givenBack}} {
		out = field(out, f.name, strconv.AppendInt(nil, f.n, 10))
	}
	out = redcon.AppendBulk(out, []byte("buckets"))
	out = redcon.AppendArray(out, len(checks))
	for i, c := range checks {
		out = redcon.AppendArray(out, 20)
		out = field(out, "bucket", strconv.AppendInt(nil, int64(i), 10))
		out = field(out, "status", []byte(c.status))
		out = field(out, "holds", strconv.AppendInt(nil, c.holds, 10))
		out = field(out, "journal_says", strconv.AppendInt(nil, c.says, 10))
		out = field(out, "difference", strconv.AppendInt(nil, c.holds-c.says, 10))
		out = field(out, "entries", strconv.AppendInt(nil, c.entries, 10))
		out = field(out, "from", []byte(c.from))
		trimmed := "no"
		if c.trimmed {
			trimmed = "yes"
		}
		out = field(out, "trimmed", []byte(trimmed))
		out = field(out, "first_unexplained", []byte(c.unexplained))
		out = field(out, "note", []byte(c.note(l, i)))
	}
	return out
}

// note says in words what c found of bucket i of l.
func (c *bucketCheck) note(l *Layout, i int) string {
	b := "bucket " + strconv.Itoa(i) + " (" + string(l.Bucket(i)) + ")"
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	var s string
	switch c.status {
	case reconcileNoJournal:
		return "journal trimmed or deleted, cannot reconcile " + b + ": its journal has no entry"
	case reconcileLost:
		s = b + " is lost (its key is missing); the journal says it held " + n(c.says) + " units"
	case reconcileDiffers:
		if c.holds == c.says {
			s = b + " holds " + n(c.holds) + ", the sum of its journal, but entry " + c.unexplained + "'s value after is not what the entries before it make"
			break
		}
		s = b + " holds " + n(c.holds) + ", the journal says " + n(c.says) + ": a difference of " + n(c.holds-c.says)
		if c.unexplained != "" {
			s += ", first seen at entry " + c.unexplained
		} else {
			s += ", made after the last entry"
		}
	default:
		s = b + " holds " + n(c.holds) + ", as the journal says"
	}
	if c.trimmed {
		s += " (journal trimmed: reconciled from entry " + c.from + ", the oldest kept)"
	}
	return s
}
