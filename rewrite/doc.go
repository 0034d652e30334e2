// Package rewrite is everything a hot key does differently from a plain
// key: its layout (the buckets' names, chosen so that they spread over the
// masters, kept in Redis in the key itself), the Lua scripts that act on
// one bucket atomically, and the commands rewritten onto the buckets so
// that clients still see one key whose value is the sum of its buckets
// (the hot-key contract in DESIGN.md).
//
// The package reaches Redis only through Upstream, which the proxy's
// standalone or cluster upstream satisfies; it never imports the proxy.
package rewrite
