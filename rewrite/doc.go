// Package rewrite is everything a hot key does differently from a plain
// key: its layout (the buckets' names, chosen so that they spread over the
// masters, kept in Redis in the key itself), the Lua scripts that act on
// one bucket atomically, and the commands rewritten onto the buckets so
// that clients still see one key whose value is the sum of its buckets.
//
// The package reaches Redis only through Upstream, which the proxy's
// standalone or cluster upstream satisfies; it never imports the proxy.
// Its failures are Go errors inside and RESP error replies at its
// boundary (Engine.Do, Shard, Unshard, Report).
//
// # Hot-key contract
//
// The value of a hot key is the sum of its buckets. Every command on a hot
// key behaves as it would on one plain key holding that sum, or fails with
// an error that names the key; none acts on leftover or internal state.
// The comments "contract N" in this repository refer to these points.
//
//  1. SET k n, n an integer below 2^53 in absolute value, writes a new
//     layout: n/N in each bucket, the remainder one each on the first
//     buckets (Layout.Share); a negative n stays whole on bucket 0. Redis
//     applies the options (EX, PX, EXAT, PXAT, KEEPTTL, NX, XX, GET) to
//     the key, which holds the layout, and the buckets get the same
//     expiry. Any other value is refused.
//  2. GET k is the sum, a bulk string as Redis gives a counter, read with
//     the key in one round; nil when the key does not exist. The proxy
//     answers MGET key by key.
//  3. EVAL or EVALSHA (and their _RO forms) of a deduct script declared in
//     the config, naming the key as its only key, takes the script's
//     amount from one bucket that covers it: from a random start bucket,
//     or one fixed per client (route: client), round the ring. When no
//     bucket alone covers it but the buckets together do, stock is moved
//     into bucket 0 (a take, then an add; given back to its bucket when
//     the add fails) and taken there. The reply is the stock left as this
//     proxy sees it, or the script's declared sold-out value. Any other
//     script on a hot key is refused.
//  4. DECR and DECRBY change the sum exactly as a plain key's: what the
//     buckets cannot cover is moved into bucket 0 and taken there, so
//     bucket 0 goes negative and the reply is the negative sum. INCR and
//     INCRBY add to bucket 0, which repays its debt first. So "DECR; if
//     < 0, INCR back" stays exact and no stock appears from nowhere.
//  5. DEL, UNLINK, EXISTS, TOUCH, TYPE, TTL, PTTL, EXPIRETIME, PEXPIRETIME
//     are answered by the key itself; DEL, UNLINK, EXPIRE, PEXPIRE,
//     EXPIREAT, PEXPIREAT and PERSIST are applied to the buckets too.
//  6. Any other command on a hot key (HSET, LPUSH, INCRBYFLOAT…) is
//     refused with an error that names the key.
//  7. No oversell: stock leaves a bucket only by a Lua step that never
//     takes it below zero, or by the debt of point 4. No false sold-out:
//     "sold out" is concluded only from Redis, by two fresh reads of
//     every bucket a moment apart, both short of the amount, and never
//     while a bucket's node does not answer (its error is the reply).
//  8. Bucket 0 shares the key's slot, so a plain value is converted in
//     one step; bucket i lives on the master i places after the key's, so
//     each of M masters holds ⌊N/M⌋ or ⌈N/M⌉ buckets (Place). A bucket's
//     name, "{tag}key#i.gen", contains the key, and its own hash tag
//     decides its slot, whatever tag the key has.
//  9. The layout lives in the key, as a value that is not an integer
//     (MarkerPrefix). A proxy that does not know the key is hot gets it
//     from GET, and has INCR fail "not an integer" and a declared deduct
//     script fail before it writes (MayShowLayout, LayoutFailure): it
//     learns the key and answers again, never acting on a stale value.
//     Proxies also announce keys made hot or plain on LayoutChannel.
//  10. What a proxy remembers (the layout, for a second; the buckets' last
//     values, which order the ring; "sold out", for soldout_ttl) only
//     saves round trips: Redis holds the truth, so a proxy restarted, or
//     one that never heard, loses nothing.
package rewrite
