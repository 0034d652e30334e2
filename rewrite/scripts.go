package rewrite

import (
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// bucketScript is a Lua script the engine runs on one bucket, by EVALSHA
// with EVAL when the node does not have it (a new master after a failover).
type bucketScript struct {
	body []byte
	sha  []byte
}

func newBucketScript(body string) *bucketScript {
	sum := sha1.Sum([]byte(body))
	return &bucketScript{body: []byte(body), sha: []byte(hex.EncodeToString(sum[:]))}
}

// Each returns {a, b}: two integers; a is -2 when the bucket does not
// exist: the hot key expired or was deleted behind this proxy's back, and
// what it remembers of the key must go.
var (
	// deduct takes ARGV[1] from a bucket that holds that much: {1, left}
	// or {0, what it holds}.
	scriptDeduct = newBucketScript(`local v = redis.call('get', KEYS[1])
if not v then return {-2, 0} end
v = tonumber(v)
local n = tonumber(ARGV[1])
if v >= n then return {1, redis.call('decrby', KEYS[1], n)} end
return {0, v}`)

	// take takes up to ARGV[1] from what a bucket holds above zero:
	// {taken, left}.
	scriptTake = newBucketScript(`local v = redis.call('get', KEYS[1])
if not v then return {-2, 0} end
v = tonumber(v)
local t = math.min(math.max(v, 0), tonumber(ARGV[1]))
if t > 0 then v = redis.call('decrby', KEYS[1], t) end
return {t, v}`)

	// add adds ARGV[1], which may be negative, to a bucket: {1, now}.
	scriptAdd = newBucketScript(`if redis.call('exists', KEYS[1]) == 0 then return {-2, 0} end
return {1, redis.call('incrby', KEYS[1], ARGV[1])}`)

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
	scriptConvert = newBucketScript(`local v = redis.call('get', KEYS[1])
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
return {1, 0}`)

	// complete replaces a pending layout (ARGV[1]) by the complete one
	// (ARGV[2]), TTL kept, once every bucket is made: {1, 0}, or {0, 0}
	// when the key holds something else by now.
	scriptComplete = newBucketScript(`if redis.call('get', KEYS[1]) ~= ARGV[1] then return {0, 0} end
redis.call('set', KEYS[1], ARGV[2], 'KEEPTTL')
return {1, 0}`)

	// merge ends a layout (ARGV[1], held by KEYS[1]): the key takes bucket
	// 0's value (KEYS[2], same slot), TTL kept, and bucket 0 goes. {1, 0},
	// or {0, 0} when the key holds something else by now.
	scriptMerge = newBucketScript(`if redis.call('get', KEYS[1]) ~= ARGV[1] then return {0, 0} end
local v = redis.call('get', KEYS[2]) or '0'
redis.call('set', KEYS[1], v, 'KEEPTTL')
redis.call('del', KEYS[2])
return {1, 0}`)

	// drain deletes a bucket and returns what it held: {value, 0} (0 when
	// it did not exist).
	scriptDrain = newBucketScript(`local v = tonumber(redis.call('get', KEYS[1]) or '0')
redis.call('del', KEYS[1])
return {v, 0}`)
)

// eval runs a bucket script on the node of route: EVALSHA, then EVAL when
// the node has not got it. {a, b} is the script's reply; the error is the
// node's, or a redisError holding a reply that is not a pair.
func (e *Engine) eval(h *hotKey, s *bucketScript, route []byte, keys [][]byte, argv ...[]byte) (a, b int64, err error) {
	args := make([][]byte, 0, 3+len(keys)+len(argv))
	args = append(args, evalsha, s.sha, numKeys[len(keys)])
	args = append(append(args, keys...), argv...)
	r := e.send(h, []Request{{Key: route, Args: args}})[0]
	if err := replyErr(r); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		args[0], args[1] = []byte("EVAL"), s.body
		r = e.send(h, []Request{{Key: route, Args: args}})[0]
	}
	a, b, ok := pair(r)
	if !ok {
		return 0, 0, &redisError{reply: r}
	}
	return a, b, nil
}

// EVALSHA's name and numkeys argument, made once: a deduct's request
// costs no allocation for them.
var (
	evalsha = []byte("EVALSHA")
	numKeys = [][]byte{[]byte("0"), []byte("1"), []byte("2")}
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

// bucketOp runs a bucket script on bucket key with one argument, arg, and
// reads its {a, b} reply; a missing bucket is errGone, with h forgotten.
func (e *Engine) bucketOp(h *hotKey, s *bucketScript, key []byte, arg int64) (a, b int64, err error) {
	a, b, err = e.eval(h, s, key, [][]byte{key}, strconv.AppendInt(nil, arg, 10))
	switch {
	case err != nil:
		return 0, 0, err
	case a == -2:
		h.forget()
		return 0, 0, errGone
	}
	return a, b, nil
}
