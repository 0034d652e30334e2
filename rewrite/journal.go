package rewrite

import (
	"strconv"
	"time"
)

// A journaled layout (Layout.Journal, recorded in the key's marker, so
// that every proxy that reads the layout journals it) has one journal per
// bucket: a Redis stream in the bucket's slot (Layout.JournalKey). Every
// script that changes a bucket calls jot in the same step as the change,
// so an entry exists if and only if the change happened, whatever becomes
// of the proxy or of the reply. A journaled script takes the bucket's
// journal as its last key and four arguments after its own: MAXLEN (0:
// none), the key, the bucket number and the order id ("" for none). An
// entry's fields, in order:
//
//	key <key> bucket <n> op <op> amount <units> after <value> [move <id>] [order <id>]
//
// op is set (the bucket's share of a SET, or of a conversion: after is
// what it holds from then on), deduct (a deduct script's or DECR's take;
// DECR's may take bucket 0 below zero), give_back (INCR), move_out and
// move_in (the two ends of a move between buckets, move naming it; a
// drain's move_out may carry a debt, amount below zero), move_back (a move
// undone, its units back in its source) and merged (PROXY UNSHARD's last
// step: bucket 0's value went to the plain key, amount units). after is
// the bucket's value once the change is done.

// luaJot is the jot of a journaled script: it appends the entry.
const luaJot = `local function jot(op, amount, after, move)
  local n = #ARGV
  local a = {'xadd', KEYS[#KEYS], '*', 'key', ARGV[n-2], 'bucket', ARGV[n-1], 'op', op,
    'amount', string.format('%d', amount), 'after', string.format('%d', after)}
  if move then a[#a+1] = 'move'; a[#a+1] = move end
  if ARGV[n] ~= '' then a[#a+1] = 'order'; a[#a+1] = ARGV[n] end
  if ARGV[n-3] ~= '0' then
    table.insert(a, 3, 'maxlen'); table.insert(a, 4, '~'); table.insert(a, 5, ARGV[n-3])
  end
  redis.call(unpack(a))
end
`

// luaNoJot is the jot of a plain script: nothing.
const luaNoJot = "local function jot() end\n"

// journalKeep is how long a journal outlives the layout it belongs to once
// a proxy ended that layout (DEL, a SET's new layout, PROXY UNSHARD): for
// its consumers to read its last entries.
const journalKeep = 24 * time.Hour

// scriptShare writes a journaled bucket's share (SET's, or a conversion's
// spread): SET KEYS[1] ARGV[1] with the options ARGV[2..] (expiry, NX),
// and when it is written, a set entry. The reply is SET's.
var scriptShare = newBucketScript(luaJot + `local r = redis.call('set', KEYS[1], ARGV[1], unpack(ARGV, 2, #ARGV - 4))
if r then jot('set', tonumber(ARGV[1]), tonumber(ARGV[1])) end
return r`)

// JournalKey is the key of bucket i's journal, in its slot: a stream.
func (l *Layout) JournalKey(i int) []byte { return append(l.Bucket(i), ":journal"...) }

// bucketCall is s run on bucket b of l, keys[0] routing it: as it is for a
// layout not journaled; for a journaled one, its journaled form, with b's
// journal after keys and the journal's arguments after argv (order the
// order id, or nil).
func (e *Engine) bucketCall(l *Layout, b int, s *bucketScript, order []byte, keys [][]byte, argv ...[]byte) scriptCall {
	return e.bucketCallIn(nil, l, b, s, order, keys, argv...)
}

// bucketCallIn is bucketCall with its arguments in dst's room when it has
// enough.
func (e *Engine) bucketCallIn(dst [][]byte, l *Layout, b int, s *bucketScript, order []byte, keys [][]byte, argv ...[]byte) scriptCall {
	if !l.Journal || s.journaled == nil {
		return scriptCall{s: s, route: keys[0], args: scriptArgs(dst, s, keys, argv)}
	}
	return e.journalCall(l, b, s.journaled, order, keys, argv...)
}

// journalCall is s, a journaled script, run on bucket b of l: b's journal
// after keys, the journal's arguments after argv.
func (e *Engine) journalCall(l *Layout, b int, s *bucketScript, order []byte, keys [][]byte, argv ...[]byte) scriptCall {
	keys = append(keys[:len(keys):len(keys)], l.JournalKey(b))
	argv = append(argv[:len(argv):len(argv)], strconv.AppendInt(nil, e.settings.Load().journalMaxlen, 10),
		[]byte(l.Key), strconv.AppendInt(nil, int64(b), 10), order)
	return newScriptCall(s, keys[0], keys, argv...)
}

// shareCall is the write of bucket b's share v of l with SET's options
// opts: a plain SET, or for a journaled layout the share script, which
// journals it.
func (e *Engine) shareCall(l *Layout, b int, v int64, opts ...[]byte) scriptCall {
	key := l.Bucket(b)
	val := strconv.AppendInt(nil, v, 10)
	if !l.Journal {
		return scriptCall{route: key, args: append([][]byte{[]byte("SET"), key, val}, opts...)}
	}
	return e.journalCall(l, b, scriptShare, nil, [][]byte{key}, append([][]byte{val}, opts...)...)
}

// retireJournals appends to dst the requests that give l's journals
// journalKeep to live, once l has ended; none when l is not journaled.
func (l *Layout) retireJournals(dst []Request) []Request {
	return l.journalRequests(dst, []byte("PEXPIRE"), strconv.AppendInt(nil, journalKeep.Milliseconds(), 10))
}

// journalRequests appends to dst "cmd journal args…" for each journal of
// l, in bucket order; none when l is not journaled.
func (l *Layout) journalRequests(dst []Request, cmd []byte, args ...[]byte) []Request {
	if !l.Journal {
		return dst
	}
	for i := range l.N() {
		j := l.JournalKey(i)
		dst = append(dst, Request{Key: j, Args: append([][]byte{cmd, j}, args...)})
	}
	return dst
}
