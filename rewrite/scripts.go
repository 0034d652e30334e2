package rewrite

import (
	"crypto/sha1"
	"encoding/hex"
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

	// repay pays up to ARGV[1] of a negative bucket back: {repaid, now}.
	scriptRepay = newBucketScript(`local v = redis.call('get', KEYS[1])
if not v then return {-2, 0} end
v = tonumber(v)
if v >= 0 then return {0, v} end
local r = math.min(-v, tonumber(ARGV[1]))
return {r, redis.call('incrby', KEYS[1], r)}`)

	// add adds ARGV[1], which may be negative, to a bucket: {1, now}.
	scriptAdd = newBucketScript(`if redis.call('exists', KEYS[1]) == 0 then return {-2, 0} end
return {1, redis.call('incrby', KEYS[1], ARGV[1])}`)

	// convert turns a key that holds a plain integer into a hot key in one
	// step: the key gets the layout (ARGV[1]) and bucket 0, in the key's
	// slot, the value, with the key's TTL. {1, value} when converted, {0,
	// 0} when the key does not exist, {2, 0} when it already holds a
	// layout, {-1, 0} when it holds something else.
	scriptConvert = newBucketScript(`local v = redis.call('get', KEYS[1])
if not v then return {0, 0} end
if string.sub(v, 1, #ARGV[2]) == ARGV[2] then return {2, 0} end
if not string.match(v, '^-?%d+$') or tonumber(v) == nil then return {-1, 0} end
local ttl = redis.call('pttl', KEYS[1])
redis.call('set', KEYS[1], ARGV[1])
redis.call('set', KEYS[2], v)
if ttl > 0 then
  redis.call('pexpire', KEYS[1], ttl)
  redis.call('pexpire', KEYS[2], ttl)
end
return {1, tonumber(v)}`)
)
