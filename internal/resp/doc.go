// Package resp reads and writes the Redis serialization protocol, RESP2 and
// RESP3.
//
// CommandReader parses what clients send exactly as Redis 7.0's networking.c
// does (processMultibulkBuffer and processInlineBuffer): the same limits, the
// same error texts, the same tolerance (a multibulk count of zero or less is
// skipped silently, inline lines are split like sdssplitargs). A proxy that is
// stricter or looser than Redis here is visible to clients, so the differences
// are deliberate only where Redis has none to copy: the query buffer bound
// answers with an error before closing, where Redis closes silently.
//
// ReadReply frames one reply from an upstream server without interpreting it,
// so a proxy can forward the exact bytes: a status reply stays a status reply,
// a nil bulk stays nil, an error keeps its text, and RESP3's maps, sets,
// doubles, booleans, big numbers, verbatim strings, nulls and pushes are
// framed as they came (an attribute together with the reply it precedes).
// Proto builds the replies a proxy makes itself in the client's protocol.
//
// We keep our own parser rather than redcon's because redcon rejects "*0",
// splits inline commands differently from Redis, has no bulk length limit and
// no bound on what one client may buffer.
package resp
