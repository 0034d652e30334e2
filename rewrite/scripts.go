package rewrite

import (
	"crypto/sha1"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// bucketScript is a Lua script the engine runs on one bucket, by EVALSHA
// with EVAL when the node does not have it (a new master after a failover).
type bucketScript struct {
	body []byte
	sha  []byte
	// journaled is the same script for a journaled layout: its jot
	// appends to the bucket's journal (see journal.go); nil for a script
	// that changes no bucket.
	journaled *bucketScript
	// bare: it answers its usual outcome, {1, b}, as the integer b (see
	// bareScript).
	bare bool
}

func newBucketScript(body string) *bucketScript {
	sum := sha1.Sum([]byte(body))
	return &bucketScript{body: []byte(body), sha: []byte(hex.EncodeToString(sum[:]))}
}

// newChangeScript is a script that changes a bucket and says so by calling
// jot(op, amount, after[, move]): a no-op in its plain form, an entry in
// the bucket's journal in its journaled one, in the same step.
func newChangeScript(body string) *bucketScript {
	s := newBucketScript(luaNoJot + body)
	s.journaled = newBucketScript(luaJot + body)
	return s
}

// bareScript marks s, and its journaled form, as answering {1, b} as the
// integer b, which Redis makes for about 0.45 µs less than a table of two:
// a hot deduct's step then costs Redis 2.2 µs rather than 2.65 (the deduct
// script of proxy.yaml on a plain key: 1.85). For the scripts every deduct
// and every INCR/DECR of a hot key runs.
func bareScript(s *bucketScript) *bucketScript {
	s.bare = true
	if s.journaled != nil {
		s.journaled.bare = true
	}
	return s
}

// Each returns {a, b}: two integers (a bare script answers b alone for
// {1, b}); a is -2 when the bucket does not exist: the hot key expired or
// was deleted behind this proxy's back (or the bucket alone is lost: lose
// tells which).
var (
	// deduct takes ARGV[1] from a bucket that holds that much: what is
	// left (for {1, left}), or {0, what it holds}.
	scriptDeduct = bareScript(newChangeScript(`local v = redis.call('get', KEYS[1])
if not v then return {-2, 0} end
v = tonumber(v)
local n = tonumber(ARGV[1])
if v >= n then
  v = redis.call('decrby', KEYS[1], n)
  jot('deduct', n, v)
  return v
end
return {0, v}`))

	// add adds ARGV[1], which may be negative, to a bucket: what it
	// holds now (for {1, now}).
	scriptAdd = bareScript(newChangeScript(`if redis.call('exists', KEYS[1]) == 0 then return {-2, 0} end
local d = tonumber(ARGV[1])
local v = redis.call('incrby', KEYS[1], d)
if d < 0 then jot('deduct', -d, v) elseif d > 0 then jot('give_back', d, v) end
return v`))

	// convert starts turning a key into a hot key, in one step on the
	// key's slot: the key gets the layout (ARGV[1]) marked pending with
	// the value to spread, and bucket 0 (KEYS[2], same slot) its share,
	// both with the key's TTL. The other buckets are made afterwards,
	// from the pending marker, by whichever proxy reads it first: made
	// with SET NX, under names no other layout uses, so doing it twice is
	// harmless. A missing key is made when ARGV[3] is 1, as a first write
	// to a plain key makes it; ARGV[4] is the bucket count. {1, 0} when
	// started, {0, 0} when the key does not exist, {2, 0} when it already
	// holds a layout, {-1, 0} when it holds something that is not an
	// integer as Redis writes them ("007" is not), or one of 2^53 or more in absolute value
	// (MaxValue: Lua numbers are doubles).
	scriptConvert = newChangeScript(`local v = redis.call('get', KEYS[1])
if v and string.sub(v, 1, #ARGV[2]) == ARGV[2] then return {2, 0} end
if not v then
  if ARGV[3] ~= '1' then return {0, 0} end
  v = '0'
elseif not (v == '0' or string.match(v, '^-?[1-9]%d*$')) or math.abs(tonumber(v)) >= 2^53 then return {-1, 0} end
local total, n = tonumber(v), tonumber(ARGV[4])
local fill, b0 = '0', v
if total > 0 then
  local q = math.floor(total / n)
  while q * n > total do q = q - 1 end
  while (q + 1) * n <= total do q = q + 1 end
  if total > q * n then q = q + 1 end
  fill, b0 = string.format('%d', total), string.format('%d', q)
end
local ttl = redis.call('pttl', KEYS[1])
redis.call('set', KEYS[1], ARGV[1] .. ':' .. fill)
redis.call('set', KEYS[2], b0)
if ttl > 0 then
  redis.call('pexpire', KEYS[1], ttl)
  redis.call('pexpire', KEYS[2], ttl)
end
jot('set', tonumber(b0), tonumber(b0))
return {1, 0}`)

	// swap replaces the marker ARGV[1] by ARGV[2], TTL kept: a pending
	// layout by the complete one once every bucket is made. {1, 0}, or
	// {0, 0} when the key holds something else by now.
	scriptSwap = newBucketScript(`if redis.call('get', KEYS[1]) ~= ARGV[1] then return {0, 0} end
redis.call('set', KEYS[1], ARGV[2], 'KEEPTTL')
return {1, 0}`)
)

// The scripts of a move of stock between two buckets of a layout (see
// "Moves between buckets" in doc.go). Each keeps its record keys (a
// bucket's intents and applied marks) to the bucket's TTL plus
// appliedKeep, or to none when the bucket has none, so that they outlive
// the bucket and never a move in flight.
const luaMoveLib = `local function nowms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function keep(record, ttl, extra)
  if ttl > 0 then redis.call('pexpire', record, ttl + extra) else redis.call('persist', record) end
end
local function intend(intents, id, to, amount, ttl, extra)
  redis.call('hset', intents, id, to .. ' ' .. string.format('%d', amount) .. ' ' .. string.format('%d', nowms()))
  keep(intents, ttl, extra)
end
`

var (
	// take is a move's first step, on its source bucket (KEYS[1]): it
	// takes up to ARGV[1] from what the bucket holds above zero and, in
	// the same step, records the move in the bucket's intents (KEYS[2]):
	// id ARGV[2] -> "<to> <amount> <created ms>", to ARGV[3], the TTL
	// ARGV[4] ms past the bucket's. {taken, left}; nothing is recorded
	// when nothing is taken.
	scriptTake = newChangeScript(luaMoveLib + `local v = redis.call('get', KEYS[1])
if not v then return {-2, 0} end
v = tonumber(v)
local t = math.min(math.max(v, 0), tonumber(ARGV[1]))
if t > 0 then
  v = redis.call('decrby', KEYS[1], t)
  intend(KEYS[2], ARGV[2], ARGV[3], t, redis.call('pttl', KEYS[1]), tonumber(ARGV[4]))
  jot('move_out', t, v, ARGV[2])
end
return {t, v}`)

	// drain is take for a merge: the whole bucket, whatever its sign, and
	// the bucket key goes, in the same step; the intent is ARGV[1] to
	// bucket ARGV[2], the TTL ARGV[3] ms past the bucket's. {value, 1},
	// nothing recorded when it held 0; {0, 0} when it does not exist
	// (drained already).
	scriptDrain = newChangeScript(luaMoveLib + `local v = redis.call('get', KEYS[1])
if not v then return {0, 0} end
local ttl = redis.call('pttl', KEYS[1])
redis.call('del', KEYS[1])
v = tonumber(v)
if v ~= 0 then
  intend(KEYS[2], ARGV[1], ARGV[2], v, ttl, tonumber(ARGV[3]))
  jot('move_out', v, 0, ARGV[1])
end
return {v, 1}`)

	// apply is a move's second step, on its target bucket (KEYS[1]): it
	// adds ARGV[2] and marks move ARGV[1] applied in the bucket's applied
	// marks (KEYS[3], a sorted set scored by the time in ms), in one step,
	// unless it is marked already: so applying a move twice is applying
	// it once. {1, now} applied, {2, now} applied before, {-2, 0} when the
	// bucket does not exist (the move is to be undone).
	scriptApply = newChangeScript(luaMoveLib + `if redis.call('zscore', KEYS[2], ARGV[1]) then return {2, tonumber(redis.call('get', KEYS[1]) or '0')} end
if redis.call('exists', KEYS[1]) == 0 then return {-2, 0} end
local v = redis.call('incrby', KEYS[1], ARGV[2])
redis.call('zadd', KEYS[2], nowms(), ARGV[1])
jot('move_in', tonumber(ARGV[2]), v, ARGV[1])
keep(KEYS[2], redis.call('pttl', KEYS[1]), tonumber(ARGV[3]))
return {1, v}`)

	// undo ends a move whose target is gone, on its source bucket
	// (KEYS[1]): the amount its intent (ARGV[1] in KEYS[2]) records goes
	// back, and the intent goes, in one step, so that it is given back
	// once. {1, now}; {0, 0} when the intent is gone (finished already);
	// {-2, 0} when the source is gone too: the stock went with the
	// layout.
	scriptUndo = newChangeScript(`local m = redis.call('hget', KEYS[2], ARGV[1])
if not m then return {0, 0} end
redis.call('hdel', KEYS[2], ARGV[1])
if redis.call('exists', KEYS[1]) == 0 then return {-2, 0} end
local t = tonumber(string.match(m, '^%S+ (%S+)'))
local v = redis.call('incrby', KEYS[1], t)
jot('move_back', t, v, ARGV[1])
return {1, v}`)

	// moves lists what a bucket (KEYS[3]) has of moves, for recovery:
	// {now ms, exists 0|1, [id, "<to> <amount> <created ms>"…] of its
	// intents (KEYS[1]), [id…] of its applied marks (KEYS[2]) older than
	// ARGV[1] ms, at most 1000}.
	scriptMoves = newBucketScript(luaMoveLib + `local now = nowms()
return {now, redis.call('exists', KEYS[3]), redis.call('hgetall', KEYS[1]),
  redis.call('zrangebyscore', KEYS[2], '-inf', string.format('%d', now - tonumber(ARGV[1])), 'LIMIT', 0, 1000)}`)

	// mark starts (or joins) merging a layout back into its key, on the
	// key's slot: the key (KEYS[1]) goes from the complete marker
	// ARGV[1] to the merging one ARGV[2], TTL kept, and bucket 0 (KEYS[2])
	// is made, empty, if it is missing (lost), so that the drains have
	// somewhere to go. {1, 0}, or {0, 0} when the key holds neither.
	scriptMark = newBucketScript(`local v = redis.call('get', KEYS[1])
if v == ARGV[1] then redis.call('set', KEYS[1], ARGV[2], 'KEEPTTL') elseif v ~= ARGV[2] then return {0, 0} end
if redis.call('exists', KEYS[2]) == 0 then redis.call('set', KEYS[2], '0') end
return {1, 0}`)

	// flip ends a merge, on the key's slot: the key (KEYS[1], holding the
	// merging marker ARGV[1]) takes bucket 0's value (KEYS[2]), TTL kept,
	// and bucket 0 goes with its applied marks (KEYS[3]) and the lost
	// record (KEYS[4]). {1, 0}, or {0, 0} when the key holds something
	// else by now (another proxy flipped it).
	scriptFlip = newChangeScript(`if redis.call('get', KEYS[1]) ~= ARGV[1] then return {0, 0} end
local v = redis.call('get', KEYS[2]) or '0'
redis.call('set', KEYS[1], v, 'KEEPTTL')
redis.call('del', KEYS[2], KEYS[3], KEYS[4])
jot('merged', tonumber(v), 0)
return {1, 0}`)

	// lose records that bucket ARGV[2] of the layout ARGV[1] is lost (its
	// key missing), on the key's slot, if the key (KEYS[1]) still holds
	// that layout and is not about to expire (PTTL -1 or ARGV[4] ms or
	// more: buckets may expire a moment before the key). The record
	// (KEYS[2], a hash: bucket -> "<units> <detected ms>") keeps the units
	// that whoever found it first last saw there (ARGV[3]), for
	// reconciliation, with the key's TTL. {1, units} recorded now, {2,
	// units} recorded before, {0, 0} when the key holds something else
	// (the layout ended), {-1, 0} when it is about to expire.
	scriptLose = newBucketScript(luaMoveLib + `if redis.call('get', KEYS[1]) ~= ARGV[1] then return {0, 0} end
local ttl = redis.call('pttl', KEYS[1])
if ttl >= 0 and ttl < tonumber(ARGV[4]) then return {-1, 0} end
if redis.call('hsetnx', KEYS[2], ARGV[2], ARGV[3] .. ' ' .. string.format('%d', nowms())) == 1 then
  if ttl > 0 then redis.call('pexpire', KEYS[2], ttl) end
  return {1, tonumber(ARGV[3])}
end
return {2, tonumber(string.match(redis.call('hget', KEYS[2], ARGV[2]), '^(%S+)'))}`)
)

// eval runs a bucket script on the node of route: EVALSHA, then EVAL when
// the node has not got it. {a, b} is the script's reply; the error is the
// node's, or a redisError holding a reply that is not a pair, or an
// unackedError with {a, b} set: the script ran, and its change is short of
// the replicas the rule waits for.
func (e *Engine) eval(h *hotKey, s *bucketScript, route []byte, keys [][]byte, argv ...[]byte) (a, b int64, err error) {
	return e.run(h, newScriptCall(s, route, keys, argv...))
}

// run is eval of one call.
func (e *Engine) run(h *hotKey, c scriptCall) (a, b int64, err error) {
	return e.runIn(h, c, make([]Request, 1))
}

// runIn is run with req, room for one request, to send it from.
func (e *Engine) runIn(h *hotKey, c scriptCall, req []Request) (a, b int64, err error) {
	args := c.args
	req[0] = Request{Key: c.route, Args: args}
	r, unacked := e.sendChangeIn(h, req)
	if noScript(r) {
		args[0], args[1] = []byte("EVAL"), c.s.body
		r, unacked = e.sendChangeIn(h, req)
	}
	if c.s != nil && c.s.bare {
		if v, isInt := resp.IntValue(r); isInt {
			return 1, v, unacked
		}
	}
	a, b, ok := pair(r)
	if !ok {
		return 0, 0, &redisError{reply: r}
	}
	return a, b, unacked
}

// scriptCall is one run of a bucket script, for evalAll; or, with s nil,
// one plain command (args).
type scriptCall struct {
	s     *bucketScript
	route []byte   // the key whose node runs it
	args  [][]byte // EVALSHA's: sha, numkeys, keys, argv
}

func newScriptCall(s *bucketScript, route []byte, keys [][]byte, argv ...[]byte) scriptCall {
	return scriptCall{s: s, route: route, args: scriptArgs(nil, s, keys, argv)}
}

// evalAll runs calls all at once: EVALSHA (a plain command as it is),
// then EVAL again, all at once, for those whose node had not got the
// script. The raw replies, in order; a call whose change is short of the
// replicas the rule waits for gets its unackedError as its reply, so that
// the step counts as failed and is left for whoever looks next.
func (e *Engine) evalAll(h *hotKey, calls []scriptCall) [][]byte {
	return e.evalAllBy(h, calls, e.sendEach)
}

// evalAllBy is evalAll sending by send: sendEach, or send for records
// that anyone writes again when a failover loses them.
func (e *Engine) evalAllBy(h *hotKey, calls []scriptCall, send func(*hotKey, []Request) [][]byte) [][]byte {
	if len(calls) == 0 {
		return nil
	}
	reqs := make([]Request, len(calls))
	for i, c := range calls {
		reqs[i] = Request{Key: c.route, Args: c.args}
	}
	replies := send(h, reqs)
	var again []Request
	var at []int
	for i, r := range replies {
		if calls[i].s != nil && noScript(r) {
			args := append([][]byte{[]byte("EVAL"), calls[i].s.body}, calls[i].args[2:]...)
			again = append(again, Request{Key: calls[i].route, Args: args})
			at = append(at, i)
		}
	}
	if len(again) > 0 {
		for j, r := range send(h, again) {
			replies[at[j]] = r
		}
	}
	return replies
}

// scriptArgs are the arguments of EVALSHA of s with keys and argv, in
// dst's room when it has enough.
func scriptArgs(dst [][]byte, s *bucketScript, keys, argv [][]byte) [][]byte {
	args := slices.Grow(dst[:0], 3+len(keys)+len(argv))
	args = append(args, evalsha, s.sha, numKeys[len(keys)])
	return append(append(args, keys...), argv...)
}

// noScript reports whether r is the error of a node that has not got the
// script (a new master after a failover, a SCRIPT FLUSH).
func noScript(r []byte) bool {
	err := replyErr(r)
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// EVALSHA's name and numkeys argument, made once: a deduct's request
// costs no allocation for them.
var (
	evalsha = []byte("EVALSHA")
	numKeys = [][]byte{[]byte("0"), []byte("1"), []byte("2"), []byte("3"), []byte("4"), []byte("5")}
)

// pair reads a script's {a, b} reply.
func pair(r []byte) (a, b int64, ok bool) {
	var buf [2][]byte
	elems, ok := resp.ArrayElems(r, buf[:0])
	if !ok || len(elems) != 2 {
		return 0, 0, false
	}
	a, ok1 := resp.IntValue(elems[0])
	b, ok2 := resp.IntValue(elems[1])
	return a, b, ok1 && ok2
}

// bucketOp runs a bucket script on bucket b of l with one argument, arg
// (journaled with order, when l is), and reads its {a, b} reply; a
// missing bucket is what lose makes of it: errGone (h forgotten), or a
// lostError when the bucket alone is lost. With an unackedError, x and y
// are the reply of the script that ran.
func (e *Engine) bucketOp(h *hotKey, l *Layout, b int, s *bucketScript, arg int64, order []byte) (x, y int64, err error) {
	sc := e.scratch.Get().(*opScratch)
	defer e.scratch.Put(sc)
	sc.keys[0], sc.argv[0] = l.Bucket(b), strconv.AppendInt(sc.num[:0], arg, 10)
	c := e.bucketCallIn(sc.args[:0], l, b, s, order, sc.keys[:], sc.argv[:]...)
	x, y, err = e.runIn(h, c, sc.req[:])
	switch {
	case err != nil && !isUnacked(err):
		return 0, 0, err
	case x == -2:
		return 0, 0, e.lose(h, l, b)
	}
	return x, y, err // an unackedError: the change stands, x and y say what it was
}

// opScratch is what bucketOp builds its call in: every deduct makes one,
// and Upstream.Do keeps none of it, so it is reused (Engine.scratch)
// rather than made anew.
type opScratch struct {
	keys [1][]byte
	argv [1][]byte
	num  [20]byte // argv[0]'s
	args [5][]byte
	req  [1]Request
}
