package rewrite

import (
	"errors"
	"strconv"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// Inside MULTI, in standalone mode, a command on a hot key is queued as
// one Lua step over the key and all its buckets, which live on the one
// server: it runs at EXEC, atomically with the rest of the transaction,
// and replies as the command would on one plain key holding the sum, so
// EXEC's array needs no rewriting. The step reads the key first: the
// layout the step was made for, and it acts on the buckets; no layout (a
// plain value, or none), and it runs the command on the key as it is;
// another layout (made since the step was queued), and it fails in its
// slot, naming the key, acting on nothing. A step finishes every move
// between buckets it finds in flight before it reads them, as any proxy
// may (doc.go, "Moves between buckets"), so no unit on its way is missed:
// no false sold-out, and never below what the buckets hold: no oversell.

// scriptTx is the step. KEYS: the key, then the N buckets, their
// intents, their applied marks, and the layout's lost record. ARGV: the
// marker the step was made for ("" for none), N, the command (lower
// case), appliedKeep in ms, MarkerPrefix, the start bucket of the ring,
// then the command's own: the amount (incrby: signed; decrby and deduct:
// positive), the deduct's sold-out reply, or EXPIRE's arguments.
var scriptTx = newBucketScript(luaMoveLib + `local key, n, op = KEYS[1], tonumber(ARGV[2]), ARGV[3]
local keepms, prefix, start = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local function bucket(b) return KEYS[2 + b] end
local function intents(b) return KEYS[2 + n + b] end
local function applied(b) return KEYS[2 + 2 * n + b] end
local function fail(why) return redis.error_reply("ERR hotkeyproxy: '" .. key .. "' " .. why) end
local hot = false
if redis.call('type', key).ok == 'string' then
  local v = redis.call('get', key)
  if string.sub(v, 1, #prefix) == prefix then
    if v ~= ARGV[1] then return fail('changed its layout while the transaction was queued; try again') end
    hot = true
  end
end
if not hot then
  if ARGV[1] ~= '' then return fail('changed while the transaction was queued; try again') end
  local args = {}
  for i = 7, #ARGV do args[#args + 1] = ARGV[i] end
  return redis.pcall(op, key, unpack(args))
end
if op == 'del' or op == 'unlink' then
  redis.call(op, key)
  for b = 0, n - 1 do redis.call(op, bucket(b), intents(b), applied(b)) end
  redis.call(op, KEYS[2 + 3 * n])
  return 1
end
if string.find(op, 'expire') or op == 'persist' then
  local args = {}
  for i = 7, #ARGV do args[#args + 1] = ARGV[i] end
  local r = redis.pcall(op, key, unpack(args))
  if r == 1 then
    for b = 0, n - 1 do
      for _, k in ipairs({bucket(b), intents(b), applied(b)}) do redis.call(op, k, unpack(args)) end
    end
    redis.call(op, KEYS[2 + 3 * n], unpack(args))
  end
  return r
end
-- Moves in flight are finished: applied where not yet, undone where
-- their target is gone, their intents deleted.
for b = 0, n - 1 do
  local all = redis.call('hgetall', intents(b))
  for j = 1, #all, 2 do
    local id = all[j]
    local to, amount = string.match(all[j + 1], '^(%S+) (%S+)')
    to = tonumber(to)
    if not redis.call('zscore', applied(to), id) then
      if redis.call('exists', bucket(to)) == 1 then
        redis.call('incrby', bucket(to), amount)
        redis.call('zadd', applied(to), nowms(), id)
        keep(applied(to), redis.call('pttl', bucket(to)), keepms)
      elseif redis.call('exists', bucket(b)) == 1 then
        redis.call('incrby', bucket(b), amount)
      end
    end
    redis.call('hdel', intents(b), id)
  end
end
local vals, sum = {}, 0
for b = 0, n - 1 do
  vals[b] = tonumber(redis.call('get', bucket(b)) or '0')
  sum = sum + vals[b]
end
if op == 'get' then return string.format('%d', sum) end
local amount = tonumber(ARGV[7])
if op == 'incrby' then
  if math.abs(sum + amount) >= 2^53 then return fail('is a hot key held as buckets; the increment or decrement would take it to 2^53 in absolute value or more') end
  if redis.call('exists', bucket(0)) == 0 then return fail('lost bucket 0: its key is missing while the layout names it') end
  redis.call('incrby', bucket(0), amount)
  return sum + amount
end
if op == 'deduct' and sum < amount then return tonumber(ARGV[8]) end
if op == 'decrby' and math.abs(sum - amount) >= 2^53 then return fail('is a hot key held as buckets; the increment or decrement would take it to 2^53 in absolute value or more') end
local left = amount
for k = 0, n - 1 do
  local b = (start + k) % n
  local t = math.min(math.max(vals[b], 0), left)
  if t > 0 then
    redis.call('decrby', bucket(b), t)
    left = left - t
  end
end
if left > 0 then
  if redis.call('exists', bucket(0)) == 0 then return fail('lost bucket 0: its key is missing while the layout names it') end
  redis.call('decrby', bucket(0), left)
end
return sum - amount`)

// TxStep is what a session queues inside MULTI, in standalone mode, for
// a command on the hot key args[keyAt]: the arguments of the command to
// send in its place (the Lua step above, or a command whose reply at EXEC
// is the error Redis would give there), or, with queued false, the error
// reply to give now, as Redis refuses a command it will not queue (EXEC
// then fails with EXECABORT). Commands that only read the key itself
// (TTL, EXISTS…) are queued as they are. deleted: a DEL or UNLINK of the
// key is queued before it in the same transaction, so the step acts on
// the key as a plain one, which it then is (Deletes says which do).
func (e *Engine) TxStep(args [][]byte, keyAt int, deleted bool) (step [][]byte, reply []byte, queued bool) {
	name := strings.ToLower(string(args[0]))
	h := e.key(args[keyAt])
	switch name {
	case "exists", "touch", "ttl", "pttl", "expiretime", "pexpiretime", "type":
		return args, nil, true
	}
	step, err := e.txStep(h, name, args, deleted)
	if err != nil {
		return nil, errorReply(err), false
	}
	return step, nil, true
}

// Deletes reports whether the command named name deletes its key.
func Deletes(name []byte) bool {
	return strings.EqualFold(string(name), "del") || strings.EqualFold(string(name), "unlink")
}

func (e *Engine) txStep(h *hotKey, name string, args [][]byte, deleted bool) ([][]byte, error) {
	var opArgs [][]byte
	op := name
	switch name {
	case "get", "del", "unlink":
		if len(args) != 2 && name == "get" {
			return nil, newRedisError(rediserr.WrongArity(name))
		}
		if len(args) != 2 {
			return nil, refused(h.name, strings.ToUpper(name)+" of it with other keys is not supported inside MULTI")
		}
	case "incr", "decr", "incrby", "decrby":
		delta, err := txDelta(name, args)
		switch {
		case err == errDecrOverflow:
			return runtimeError(rediserr.DecrOverflow), nil
		case err != nil:
			return nil, err
		case delta == nil:
			return runtimeError(rediserr.NotInteger), nil
		}
		op, opArgs = "incrby", [][]byte{delta}
		if delta[0] == '-' {
			op, opArgs = "decrby", [][]byte{delta[1:]}
		}
	case "expire", "pexpire", "expireat", "pexpireat", "persist":
		opArgs = args[2:]
	case "eval", "evalsha", "eval_ro", "evalsha_ro":
		s := e.deductScript(args)
		if s == nil {
			return nil, refused(h.name, "only the deduct scripts declared in proxy.yaml can run on it")
		}
		if n, ok := resp.ParseInt(args[2]); !ok || n != 1 {
			return nil, refused(h.name, "a deduct script must name it as its only key")
		}
		amount := s.Amount.Const
		if i := 3 + s.Amount.ArgvIndex; s.Amount.ArgvIndex > 0 {
			var ok bool
			if i >= len(args) {
				return nil, refused(h.name, "script "+s.Name+" needs ARGV["+strconv.Itoa(s.Amount.ArgvIndex)+"], the amount")
			}
			if amount, ok = resp.ParseInt(args[i]); !ok || amount < 1 {
				return nil, refused(h.name, "script "+s.Name+" needs a positive integer amount in ARGV["+strconv.Itoa(s.Amount.ArgvIndex)+"]")
			}
		}
		if err := e.heldCheck(h, s, args); err != nil {
			if re, ok := err.(*redisError); ok && strings.HasPrefix(re.Error(), "NOSCRIPT") {
				return runtimeError(rediserr.NoScript), nil // Redis's answer at EXEC
			}
			return nil, err
		}
		op = "deduct"
		opArgs = [][]byte{strconv.AppendInt(nil, amount, 10), strconv.AppendInt(nil, s.Soldout, 10)}
	case "set":
		return nil, refused(h.name, "SET of it is not supported inside MULTI")
	default:
		return nil, refused(h.name, strings.ToUpper(name)+" is not supported on it")
	}
	l, st, err := e.load(h, false)
	if deleted {
		l, st, err = nil, stateMissing, nil
	}
	switch {
	case errors.Is(err, errPlain):
		return args, nil // not hot after all: as for a plain key
	case err != nil:
		return nil, err
	case op == "deduct" && st != stateHot:
		return args, nil // the script itself, on the plain key as it is
	}
	if st == stateHot && l.Pending || st == stateHot && l.Merging {
		return nil, &keyError{key: h.name, reason: "is changing its layout; try again"}
	}
	// The step has no journal entries and no WAIT of its own: refused
	// rather than a change the journal or the replicas would not know of.
	if st == stateHot && l.Journal && name != "get" {
		return nil, refused(h.name, strings.ToUpper(name)+" of it is not supported inside MULTI: it is journaled")
	}
	if h.conf.Load().rule.WaitReplicas > 0 && name != "get" {
		return nil, refused(h.name, strings.ToUpper(name)+" of it is not supported inside MULTI: its rule sets wait_replicas")
	}
	var marker []byte
	if st == stateHot {
		marker = l.Marker()
	} else {
		l = &Layout{}
	}
	n := l.N()
	keys := make([][]byte, 0, 2+3*n)
	keys = append(keys, []byte(h.name))
	for i := range n {
		keys = append(keys, l.Bucket(i))
	}
	for i := range n {
		keys = append(keys, l.IntentsKey(i))
	}
	for i := range n {
		keys = append(keys, l.AppliedKey(i))
	}
	if n > 0 {
		keys = append(keys, l.LostKey())
	} else {
		keys = append(keys, []byte(h.name)) // no record; the step never reaches it
	}
	start := 0
	if n > 0 {
		start = e.intN(n)
	}
	argv := append([][]byte{marker, strconv.AppendInt(nil, int64(n), 10), []byte(op), keepMs,
		[]byte(MarkerPrefix), strconv.AppendInt(nil, int64(start), 10)}, opArgs...)
	step := append([][]byte{[]byte("EVAL"), scriptTx.body, strconv.AppendInt(nil, int64(len(keys)), 10)}, keys...)
	return append(step, argv...), nil
}

// txDelta is the signed amount of INCR, DECR, INCRBY or DECRBY, in
// decimal; nil when it is not an integer (Redis says so at EXEC). The
// error is a wrong number of arguments, which Redis refuses to queue.
func txDelta(name string, args [][]byte) ([]byte, error) {
	switch name {
	case "incr", "decr":
		if len(args) != 2 {
			return nil, newRedisError(rediserr.WrongArity(name))
		}
		if name == "decr" {
			return []byte("-1"), nil
		}
		return []byte("1"), nil
	}
	if len(args) != 3 {
		return nil, newRedisError(rediserr.WrongArity(name))
	}
	d, ok := resp.ParseInt(args[2])
	if !ok {
		return nil, nil
	}
	if name == "decrby" {
		if d == -1<<63 {
			return nil, errDecrOverflow
		}
		d = -d
	}
	return strconv.AppendInt(nil, d, 10), nil
}

// errDecrOverflow is DECRBY of -2^63, which Redis fails at EXEC.
var errDecrOverflow = newRedisError(rediserr.DecrOverflow)

// runtimeError is a command whose reply, when EXEC runs it, is the error
// msg: a queued command's failure Redis reports in its slot of EXEC's
// array.
func runtimeError(msg string) [][]byte {
	return [][]byte{[]byte("EVAL"), []byte("return redis.error_reply('" + msg + "')"), []byte("0")}
}

// Changed tells the engine that key was changed where it did not see
// (a transaction's step): what it remembers of its buckets and of "sold
// out" is dropped, so the next command asks Redis.
func (e *Engine) Changed(key []byte) {
	h := e.key(key)
	h.soldAt.Store(0)
	h.summed.Store(0)
}

// WatchKeys are the keys WATCH of key watches: key, and its buckets while
// it is held as buckets. The error is an error reply.
func (e *Engine) WatchKeys(key []byte) ([][]byte, []byte) {
	h := e.key(key)
	l, st, err := e.load(h, false)
	switch {
	case errors.Is(err, errPlain):
		return [][]byte{key}, nil
	case err != nil:
		return nil, errorReply(err)
	}
	keys := [][]byte{key}
	if st == stateHot {
		for i := range l.N() {
			keys = append(keys, l.Bucket(i))
		}
	}
	return keys, nil
}
