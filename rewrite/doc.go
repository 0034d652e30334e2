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
//     into bucket 0 (moves between buckets, below) and taken there. The
//     reply is the stock left as this proxy sees it, or the script's
//     declared sold-out value. Any other script on a hot key is refused.
//     EVALSHA answers NOSCRIPT, nothing taken, when Redis does not hold
//     the script, as on a plain key (script_held.go says what "hold"
//     means with buckets on several masters); EVAL makes it hold it.
//  4. DECR and DECRBY change the sum exactly as a plain key's: what the
//     buckets cannot cover is moved into bucket 0 and taken there, so
//     bucket 0 goes negative and the reply is the negative sum. INCR and
//     INCRBY add to bucket 0, which repays its debt first. So "DECR; if
//     < 0, INCR back" stays exact and no stock appears from nowhere.
//  5. DEL, UNLINK, EXISTS, TOUCH, TYPE, TTL, PTTL, EXPIRETIME, PEXPIRETIME
//     are answered by the key itself; DEL, UNLINK, EXPIRE, PEXPIRE,
//     EXPIREAT, PEXPIREAT and PERSIST are applied to the buckets too.
//  6. Any other command on a hot key (HSET, LPUSH, INCRBYFLOAT…) is
//     refused with an error that names the key. Inside MULTI, in
//     standalone mode, the commands of 2 to 5 but SET are queued as one
//     Lua step over the key and its buckets (TxStep, tx.go); in cluster
//     mode a hot key inside MULTI is refused.
//  7. No oversell: stock leaves a bucket only by a Lua step that never
//     takes it below zero, or by the debt of point 4. No false sold-out:
//     "sold out" is concluded only from Redis, by two fresh reads of
//     every bucket a moment apart, both short of the amount, each after
//     every move between buckets found in flight was finished (so no unit
//     on its way between two buckets is missed), and never while a
//     bucket's node does not answer (its error is the reply).
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
//  11. Stock moved between buckets (a gather into bucket 0, the drains of
//     a merge, a conversion's spread) survives the proxy moving it being
//     killed at any instant: no unit lost, none doubled, nothing left
//     behind (below).
//  12. A bucket lost on its own (its key missing while the key still
//     holds the layout naming it: a failover promoted a replica that
//     never had it, or it was deleted behind the proxy) stops only what
//     reaches it: the other buckets keep selling; the deducts that meet
//     it get an error naming it; it is logged once and counted, shown by
//     PROXY HOTKEYS, and recorded in Redis (Layout.LostKey) with the
//     units last seen in it, for reconciliation.
//
// # Waiting for replicas
//
// A rule's wait_replicas makes every request that changes a bucket of its
// keys (the bucket scripts, a SET's writes) be followed by WAIT on the same
// connection (Request.Follows), so that the client is answered only once
// that many replicas have the change; WAIT counts what its own connection
// wrote, and nothing else covers it. A change short of them stands on its
// master: a deduct or give back is answered with an unackedError that
// says so (the ring does not go on to another bucket: the unit is taken),
// and a step of a move is treated as a node failure, left for whoever
// looks next, so that no apply rests on a take a failover may undo and no
// intent ends on an apply it may undo.
//
// # Moves between buckets
//
// Buckets sit on different masters, so no one Lua step covers both ends
// of a move. A move of t units from bucket s to bucket d of a layout is
// three steps, each one Lua step (or command) on one slot:
//
//  1. take, on s's slot: up to t is taken from s (never below zero) and,
//     in the same step, the move's intent is written in s's intents
//     (Layout.IntentsKey: a hash, id -> "<d> <t> <created ms>", the time
//     of s's node). The id is random, 64 bits, so that the moves of all
//     proxies never share one.
//  2. apply, on d's slot: unless d's applied marks (Layout.AppliedKey: a
//     sorted set of ids, scored by the time of d's node) hold the id, t
//     is added to d and the id marked, in one step. Applying a move twice
//     is applying it once. If d does not exist, nothing is done.
//  3. finish, on s's slot: the intent is deleted (HDEL); or, when the
//     apply found d gone, undo: the intent's amount goes back to s and the
//     intent is deleted, in one step (so it is given back once; to
//     nothing if s is gone too: the stock went with the layout).
//
// Whoever finds an intent can finish it by steps 2 and 3 with the same
// outcome as its mover, any number of times, concurrently with the mover
// or with each other; so a proxy killed between any two steps loses
// nothing and doubles nothing. A proxy finishes the intents it finds of a
// layout it knows: every quarter of hotkeys.move_timeout, those older
// than half of it (by the source node's clock; Engine.FinishMoves); on
// the slow path of a deduct, before a read short of the amount counts,
// all of them; on a merge, all of them. The intents a proxy must find are
// few keys at fixed names, one per bucket: no SCAN. A node failure
// between the steps leaves the move as it is for whoever looks next: an
// apply whose reply was lost may have been applied, and only its mark can
// tell. An applied mark is dropped (by the sweep) only once its intent is
// gone and it is older than an hour (appliedKeep: a request applying the
// move again may still be on its way; TCP retransmits a partitioned
// sender's data for some 15 minutes), so whoever finds an intent finds
// its mark if it was applied. Intents and marks keep their bucket's TTL
// plus that hour, and go with the key on DEL, SET and EXPIRE.
// Buckets are never made again once gone (their names carry the layout's
// random generation), which is what makes "d is gone" final for an undo;
// bucket 0 of a merging layout is the one exception, made empty by the
// merge's first step so that the drains have somewhere to go.
//
// A merge (PROXY UNSHARD) is a layout marked merging in the key itself
// (one step on the key's slot, which also makes bucket 0 if it is
// missing), each other bucket drained into bucket 0 by a move whose take
// deletes the bucket, every intent of the layout then finished (after the
// drains no move of the layout can begin, so none is missed), and in one
// step on the key's slot the key takes bucket 0's value while bucket 0
// and the layout's records go. Every proxy that reads a merging layout
// finishes the merge by the same steps, so nothing waits on a lease and a
// proxy killed half way blocks nothing.
//
// A conversion (contract 1's plain value made hot) was crash-safe before
// moves had intents: its one step on the key's slot leaves the value to
// spread in the pending layout, and any proxy that reads a pending layout
// makes the missing buckets with SET NX and marks it complete; doing so
// twice is harmless. One hazard is left, for a proxy that stalls (not
// dies) between reading a pending layout and its SET NX for as long as
// it takes another to complete the layout and then lose one of its
// buckets: it would make that bucket again with its first share.
//
// # Journal
//
// A layout made for a key whose rule says journal (or hotkeys.detect.journal,
// for a key made hot without a rule) is marked journaled in its marker,
// so every proxy that reads it journals it. Each script that changes one
// of its buckets then appends an entry to that bucket's stream (the
// bucket's key + ":journal", in its slot) in the same step: an entry
// exists if and only if its change happened, whether the proxy, the client
// or the reply survives. The entries' format is in journal.go. Reconcile
// (PROXY RECONCILE) reads each bucket in one step with its stream's last
// entry id, then the stream up to it, so it needs no pause in the sale;
// it replays each stream from its oldest entry kept, whose value after is
// exact, so a trimmed journal still reconciles what it holds. A journal
// outlives its layout by a day once a proxy ends the layout (DEL, SET,
// the flip of a merge), for its consumers; a SET that did not apply
// deletes the journals it started.
package rewrite
