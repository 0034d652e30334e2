// Package seckill is a flash-sale load generator ("seckill", 秒杀, in the
// articles this project starts from). It sells one stock key with many
// concurrent clients against any Redis-protocol address — a plain Redis, a
// Redis behind hotkeyproxy, another proxy — and checks the sale as it
// measures it: throughput, latency, units sold, oversell, and false
// sold-outs. `hotkeyproxy bench seckill` is its command line.
//
// Each client holds one connection of its own, as a buyer would, and deducts
// in a loop in one of two ways:
//
//   - ModeScript runs the deduct script shipped in proxy.yaml (deduct-one,
//     or deduct-n with ARGV[1] = Amount) with EVALSHA, falling back to EVAL
//     on NOSCRIPT; a reply of -1 is "sold out".
//   - ModeDecr decrements the key (DECR, or DECRBY Amount) and, when the
//     reply is negative, gives the amount back with INCR/INCRBY — the common
//     "DECR, and INCR back if negative" pattern.
//
// The sale ends when every client has been told "sold out" at least once, or
// Options.Duration passes, or Options.Requests deducts have been sent, or the
// caller's context ends. Clients keep buying after their own first sold-out
// reply: a buyer that succeeds after someone else was told "sold out" is
// exactly what the false sold-out check looks for.
//
// # What is checked
//
//   - Oversell: units sold beyond Options.Stock.
//   - False sold-out: a successful deduct whose request started after the
//     end of the earliest sold-out reply any client received. With a single
//     amount, the give-backs of ModeDecr cannot reopen a sale: the first
//     negative reply happens when the units left are fewer than the amount
//     (nothing was pending before it), units left only shrink after that,
//     and a give-back only returns what was taken from a key already short.
//     So the check is exact in both modes — unless something else writes the
//     key during the run (a restock), which makes it meaningless. A success
//     is compared with the sold-out replies recorded by the time it
//     completes, so a client descheduled between reading a sold-out reply
//     and recording it can make the count low, never high.
//   - Stock left after sold out: the sale ended because every client was
//     told "sold out", yet the final value could still cover a deduct. On a
//     plain key this cannot happen; behind a proxy it means "sold out" was
//     answered while stock remained, the other face of a false sold-out, and
//     the only one visible when every client is told at about the same time.
//   - Unaccounted units: start value - units sold - final value. Not zero
//     means units were lost or created; after transport errors it may be
//     innocent, since a request whose reply was lost may have been applied.
//   - The journal, with Options.Journal, on a hotkeyproxy hot key with
//     journal: true: the entries its streams (PROXY JOURNAL) gained since
//     the sale began must deduct, less what they give back, exactly the
//     units sold; with Options.OrderIDs, entry for entry by order id (the
//     script's last ARGV): no deduct entry without a success, no success
//     without one. The sale must be the only writer of the key meanwhile,
//     and a SET of it by someone else (a new layout, new streams) or a lost
//     reply makes the check fail as the unaccounted units would.
//
// # Measurement
//
// Latency is the round trip of the deduct command alone (in ModeDecr the
// give-back is not included, but its time counts against throughput). It
// goes into a log-linear histogram per client (64 sub-buckets per power of
// two, so a reported quantile is an upper bound at most 1/64 above the
// true one) rather than a slice of samples, so a long run against a fast
// deployment takes fixed memory. Units per second are measured over the
// sale itself: from the start to the end of the last successful deduct.
//
// # Warnings
//
//   - Unless Options.NoSetup is set, Run overwrites the key with SET. Point
//     it at a key that is not selling anything real.
//   - The client never retries (go-redis MaxRetries -1): a retried deduct
//     whose first attempt was applied would sell a unit twice and show up as
//     a false alarm. A transport error is counted, and the client pauses
//     briefly (so a dead server is not hammered) and reconnects before its
//     next deduct, so a sale survives a failover or a proxy restart.
package seckill
