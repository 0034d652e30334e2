// Package keyspec tells which arguments of a command are keys, so that a
// proxy in front of Redis Cluster can route each command by the slot of its
// keys.
//
// The source is the server's own reply to COMMAND (Parse), not a table
// compiled in: commands of newer Redis versions and of modules route
// correctly as long as the server describes them. For most commands the
// legacy key positions of that reply (first key, last key, step) tell every
// key. Commands flagged movablekeys have keys whose place depends on other
// arguments (EVAL's numkeys, XREAD's STREAMS, SORT's STORE, …); only those
// have hand-written grammars, one per Redis 7.0 command, each following the
// command's own parsing. A movablekeys command without a grammar — a
// module's, or one added after Redis 7.0 — falls back to its legacy
// positions, which name the keys that are always there and may miss others.
//
// Keys answers what Redis Cluster routes by. That is what COMMAND GETKEYS
// answers too, with these differences, checked against a real server by
// the tests:
//   - The channels of sharded pub/sub (SSUBSCRIBE, SUNSUBSCRIBE, SPUBLISH)
//     are keys here: Redis Cluster routes them by slot, while GETKEYS calls
//     them "not keys".
//   - A numkeys that is not an integer as Redis's commands parse it ("2x",
//     "+2", "02") gives no keys; GETKEYS reads it with atoi.
//   - Where GETKEYS uses key specs that do not follow the command's parsing
//     (XREAD and XREADGROUP with "STREAMS" as an option value, GEORADIUS
//     with several STORE options, MIGRATE with an empty KEYS list) and where
//     Redis's getkeys procedure itself misreads a valid command (SORT k STORE
//     store LIMIT 0 1), Keys names the keys the command really uses.
//
// The grammar functions say more about each case.
package keyspec
