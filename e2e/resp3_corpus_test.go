package e2e

// The corpus again, with every connection in RESP3 (HELLO 3 when dialed),
// directly and through the proxy, byte for byte; then what only RESP3
// has: its types, pushes between replies, switching protocols.

import (
	"slices"
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
)

// resp2Only are corpus cases about what a RESP2 connection does, which a
// RESP3 one does differently in Redis too; resp3Cases has their RESP3
// counterparts.
var resp2Only = map[string]bool{
	"pubsub/select-client-refused":   true,
	"pubsub/hello-refused":           true,
	"pubsub/hello3-refused-in-order": true,
}

// TestCorpusRESP3 runs the corpus and resp3Cases with RESP3 connections,
// standalone.
func TestCorpusRESP3(t *testing.T) {
	e := startEnv(t, nil)
	ref := redistest.Start(t, localredis.Options{})
	direct := corpusTarget{addr: ref.Addr(), servers: []string{ref.Addr()}, resp3: true}
	proxied := corpusTarget{addr: e.ProxyAddr(), servers: []string{e.Redis.Addr()}, resp3: true}

	var cases []corpusCase
	// A push Redis sends between replies on a connection of the client's
	// own (a key invalidation) reaches it where it came. In front of a
	// cluster, the client's reads do not go on that connection.
	push := tc("resp3/push-between-replies", "CLIENT TRACKING ON", "GET k", on(1, cmds("SET k v")...), raw(corpusCmd("PING"), 2),
		"GET k", on(1, cmds("DEL k")...), raw(corpusCmd("MULTI")+corpusCmd("GET", "k")+corpusCmd("EXEC"), 4))
	for _, c := range slices.Concat(corpusCases(), resp3Cases(), []corpusCase{push}, trackingPushCases()) {
		if !resp2Only[c.name] {
			cases = append(cases, c)
		}
	}
	corpusRunAll(t, cases, direct, proxied)
}

// trackingPushCases: Redis pushes a tracking client's invalidations when
// they happen, so the client gets them without sending anything: idle,
// with its replies silenced by CLIENT REPLY (the pushes still come), for
// its own writes, and none after HELLO 2 (RESP2 has no pushes) until it is
// back in RESP3. Standalone only: in front of a cluster tracking is
// refused.
func trackingPushCases() []corpusCase {
	cmd := corpusCmd
	return []corpusCase{
		tc("resp3/tracking-push-idle", "CLIENT TRACKING ON", "MGET k1 k2", on(1, cmds("SET k1 v")...), readOn(0, 1),
			on(1, cmds("MSET k2 v k3 v", "FLUSHALL")...), readOn(0, 2), "GET k1", on(1, cmds("DEL k1", "SET k1 w")...), readOn(0, 1), "PING"),
		tc("resp3/tracking-push-bcast", "CLIENT TRACKING ON BCAST PREFIX b:", on(1, cmds("SET b:1 v", "SET x v", "SET b:2 v")...),
			readOn(0, 2), "CLIENT TRACKING OFF", on(1, cmds("SET b:1 w")...), silent(""), "PING"),
		tc("resp3/tracking-push-reply-off", "CLIENT TRACKING ON", "GET k", raw(cmd("CLIENT", "REPLY", "OFF"), 0),
			on(1, cmds("SET k v")...), readOn(0, 1),
			// Its own write: the +OK is silenced, the invalidation not;
			// SKIP changes nothing while OFF.
			raw(cmd("GET", "k")+cmd("SET", "k", "w"), 1), raw(cmd("CLIENT", "REPLY", "SKIP")+cmd("GET", "k")+cmd("SET", "k", "x")+cmd("PING"), 1),
			raw(cmd("CLIENT", "REPLY", "ON"), 1), "PING"),
		tc("resp3/tracking-push-hello2", "CLIENT TRACKING ON", "GET k", normed("HELLO 2", maskHelloID), on(1, cmds("SET k v")...),
			silent(""), "GET k", normed("HELLO 3", maskHelloID), "GET k", on(1, cmds("SET k w")...), readOn(0, 1), "PING"),
		// REDIRECT to a RESP3 client that neither tracks nor subscribes:
		// the pushes go to it, even with its replies off; none once it
		// is back in RESP2.
		tc("resp3/tracking-redirect-resp3", on(1, checked("CLIENT ID", bothInt)),
			corpusStep{build: func(prev []string) string {
				return cmd("CLIENT", "TRACKING", "ON", "REDIRECT", strings.Trim(prev[len(prev)-1], ":\r\n"))
			}, n: 1},
			"GET k", on(1, raw(cmd("CLIENT", "REPLY", "OFF"), 0)), on(2, cmds("SET k v")...), readOn(1, 1),
			on(1, raw(cmd("CLIENT", "REPLY", "ON"), 1)), on(1, cmds("PING")...), "GET k", on(1, normed("HELLO 2", maskHelloID)),
			on(2, cmds("SET k w")...), on(1, silent("")), on(1, cmds("PING")...), "PING"),
		tc("resp3/tracking-push-multi", "CLIENT TRACKING ON", "GET k", "MULTI", "GET k", on(1, cmds("SET k v")...), readOn(0, 1),
			"EXEC", on(1, cmds("SET k w")...), readOn(0, 1), "PING"),
	}
}

// TestClusterCorpusRESP3 runs the corpus, the cluster's cases and
// resp3Cases with RESP3 connections, through the proxy over a cluster.
func TestClusterCorpusRESP3(t *testing.T) {
	e := startClusterEnv(t, nil)
	ref := redistest.Start(t, localredis.Options{})
	l := clusterLayoutOf(t, e)
	var cases []corpusCase
	for _, c := range slices.Concat(corpusCases(), clusterCorpusCases(l), resp3Cases()) {
		if !resp2Only[c.name] {
			cases = append(cases, c)
		}
	}
	clusterRunCases(t, e, l, &leakWatch{addrs: l.nodes}, ref.Addr(), cases, clusterCorpusDiffs(l), true)
}

// resp3Cases are run on connections that said HELLO 3: each RESP3 type,
// Redis's or a script's, pushes and replies interleaved on a subscribed
// connection, and the way back to RESP2.
func resp3Cases() []corpusCase {
	script := func(ret string) string { return `EVAL "redis.setresp(3) return ` + ret + `" 0` }
	return []corpusCase{
		tc("resp3/map", "HSET h a 1 b 2", "HGETALL h", "HGETALL missing", "CONFIG GET maxmemory-policy", "CONFIG GET nope*",
			"XADD s 1-0 f v", "XREAD STREAMS s 0", "XINFO STREAM s", "HSET one f v", "HRANDFIELD one 1 WITHVALUES", "ZADD zone 1 m", "ZRANDMEMBER zone 1 WITHSCORES"),
		tc("resp3/set", "SADD {s}s a", "SMEMBERS {s}s", "SMEMBERS missing", "SINTER {s}s {s}s", "SDIFF {s}s {s}missing", "SMISMEMBER {s}s a b"),
		tc("resp3/double", "ZADD z 1.5 m 2 n", "ZSCORE z m", "ZSCORE z missing", "ZINCRBY z 0.25 m", "ZRANGE z 0 -1 WITHSCORES",
			"ZPOPMIN z", "ZMSCORE z m nope", "INCRBYFLOAT f 1.5", "ZADD z INCR 1 n", "ZADD z inf i", "ZSCORE z i"),
		tc("resp3/null", "GET missing", "HGET h f", "LPOP missing", "LPOP missing 2", "SPOP missing", "ZSCORE missing m",
			"CLIENT GETNAME", "OBJECT ENCODING missing", "XREAD COUNT 1 STREAMS s 0", "LPOS l x", "MGET a b", "BLPOP l 0.01", "SET k v GET"),
		tc("resp3/script-types", script("true"), script("false"), script("{double=3.5}"), script("{big_number='1234567890123456789012345678901234567890'}"),
			script("{verbatim_string={format='txt', string='Some text'}}"), script("{map={a=1}}"), script("{set={a=true}}"), script("nil"),
			`EVAL "redis.setresp(3) return redis.call('get', KEYS[1])" 1 missing`, script("{err='My error'}"),
			`EVAL "redis.call('hset', KEYS[1], 'f', 'v') redis.setresp(3) return redis.call('hgetall', KEYS[1])" 1 h`),
		tc("resp3/errors", "FOO", "GET", "SET k v", "HGETALL k", "LPUSH k x", "INCR k", "ZSCORE k m", "EVAL \"return redis.call('incr', KEYS[1])\" 1 k"),
		tc("resp3/pubsub-commands-between",
			raw(corpusCmd("SUBSCRIBE", "a", "b"), 2),
			raw(corpusCmd("SET", "k", "v")+corpusCmd("GET", "k")+corpusCmd("PING")+corpusCmd("HGETALL", "h"), 4),
			on(1, cmds("PUBLISH a hello", "PUBLISH b \"\\x00bin\\r\\n\"")...),
			readOn(0, 2),
			raw(corpusCmd("INCR", "n")+corpusCmd("PING", "x"), 2),
			on(1, cmds("PUBLISH a m2")...),
			raw(corpusCmd("GET", "k"), 2),
			raw(corpusCmd("PSUBSCRIBE", "n.*"), 1),
			on(1, cmds("PUBLISH n.x p")...),
			readOn(0, 1),
			raw(corpusCmd("UNSUBSCRIBE", "b", "a"), 2),
			raw(corpusCmd("PUNSUBSCRIBE"), 1),
			"GET k", "PING"),
		// The counterparts of the RESP2 cases where Redis refuses these.
		tc("resp3/pubsub-connection-commands",
			raw(corpusCmd("SUBSCRIBE", "a"), 1),
			raw(corpusCmd("SELECT", "0")+corpusCmd("CLIENT", "SETNAME", "x")+corpusCmd("CLIENT", "GETNAME"), 3),
			checked("CLIENT ID", bothInt),
			normed("HELLO 3", maskHelloID),
			corpusStep{raw: corpusCmd("PING") + corpusCmd("HELLO", "3", "SETNAME", "y") + corpusCmd("CLIENT", "GETNAME"), n: 3, norm: maskHelloID},
			"HELLO 3 NOPE", "HELLO 5", "SET k v", "GET k", "CLUSTER INFO"),
		tc("resp3/pubsub-unsubscribed", "UNSUBSCRIBE", "PUNSUBSCRIBE nope", "SUNSUBSCRIBE"),
		tc("resp3/pubsub-hello2-while-subscribed",
			raw(corpusCmd("SUBSCRIBE", "a"), 1),
			normed("HELLO 2", maskHelloID),
			raw(corpusCmd("GET", "k"), 1),
			raw(corpusCmd("PING"), 1),
			on(1, cmds("PUBLISH a m")...),
			readOn(0, 1),
			raw(corpusCmd("HELLO", "3"), 1),
			raw(corpusCmd("UNSUBSCRIBE"), 1),
			"PING"),
		tc("resp3/pubsub-reset", raw(corpusCmd("SUBSCRIBE", "a"), 1), raw(corpusCmd("RESET"), 1), "HGETALL h", "HSET h f v", "HGETALL h"),
		tc("resp3/hello-switching",
			"HSET h a 1", "HGETALL h", normed("HELLO 2", maskHelloID), "HGETALL h", "GET missing",
			normed("HELLO", maskHelloID), normed("HELLO 3", maskHelloID), "HGETALL h", "GET missing",
			normed("HELLO 3 SETNAME n3", maskHelloID), "CLIENT GETNAME", normed("HELLO 3 AUTH default anything", maskHelloID),
			"HELLO 4", "HELLO 1", "HELLO x", "HELLO 3 NOPE", "HELLO 3 AUTH default", "HGETALL h"),
		tc("resp3/hello-pinned", "BLPOP l 0.01", normed("HELLO 2", maskHelloID), "HGETALL h", "BLPOP l 0.01", normed("HELLO 3", maskHelloID), "HSET h f v", "HGETALL h", "BLPOP l 0.01"),
		tc("resp3/multi", "HSET {t}h f v", "MULTI", "HGETALL {t}h", "ZADD {t}z 1 m", "ZSCORE {t}z m", "GET {t}missing", "EXEC",
			"WATCH {t}h", on(1, cmds("HSET {t}h f w")...), "MULTI", "HGETALL {t}h", "EXEC"),
		tc("resp3/hello-inside-multi", "HSET h f v", "MULTI", "HELLO 2", "HGETALL h", normed("EXEC", maskHelloID), "HGETALL h", "GET missing"),
		tc("resp3/blocking", "RPUSH l a", "BLPOP l 0", "BLPOP l 0.01", "BZPOPMIN z 0.01", "ZADD z 1 m", "BZPOPMIN z 0",
			sendOnly(0, "BLMPOP 0 1 l RIGHT"), waitBlocked(1), on(1, cmds("RPUSH l x y")...), readOn(0, 1)),
		tc("resp3/keys-dbsize", "MSET a 1 b 2 c 3", normed("KEYS *", sortArray), "DBSIZE", "EXISTS a b x", "MGET a x c", "DEL a x c"),
		tc("resp3/info", checked("INFO", bulkWith("# Server\r\n", "redis_version:")), checked("INFO server", bulkWith("# Server\r\n")), "INFO nosuchsection"),
		tc("resp3/reset-to-resp2", "HSET h f v", "RESET", "HGETALL h", "GET missing"),
	}
}
