package proxy

import (
	"bytes"
	"slices"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// command is everything the proxy knows about one Redis command (or one
// subcommand: CLIENT ID, SCRIPT LOAD…): where it goes, whether it may run
// before AUTH, how it runs in cluster mode and how its replies merge, how
// it meets a hot key, its metrics label. The zero value is an ordinary
// command: relayed on a shared connection, routed by its keys' slot.
type command struct {
	name string // lower case; a subcommand's is its command's
	// metric is the index of the command's label among commandLabels.
	metric uint16

	route route
	// noAuth: Redis 7.0 flags it no-auth; it runs before AUTH.
	noAuth bool
	// upstreamWhen: a routeLocal command that goes to Redis instead in
	// that state, because Redis holds what it acts on.
	upstreamWhen upstreamCond
	// blockForm, when set, is the command as it is with a BLOCK option
	// (XREAD, XREADGROUP): it then needs a connection of its own.
	blockForm *command

	cluster clusterRoute
	// merge says how the replies of the parts become one, for a command
	// split by slot (splits) or sent to every master.
	merge mergeKind
	// splits: keys in several slots are sent one request per slot and
	// merged, as a standalone Redis answers them; others get CROSSSLOT.
	splits bool
	// pairs: the keys are followed by a value each (MSET).
	pairs bool
	// spans: it acts on every master, so it cannot run inside a
	// transaction, which is on one.
	spans bool
	// script: which argument names a script: its body (EVAL, SCRIPT
	// LOAD), remembered for a node that lacks it, or its SHA1 (EVALSHA),
	// loaded from what was remembered on NOSCRIPT.
	script scriptArg
	// flushesScripts: the bodies remembered for script are forgotten.
	flushesScripts bool
	// aside: Redis runs it while a script keeps it busy (allow-busy) and
	// it acts on no db, so in standalone mode, from a client without a
	// connection of its own, it goes on a db 0 connection of its own: a
	// busy Redis refuses the SELECT that a new connection of another db
	// begins with, and the shared ones wait behind the script.
	aside bool

	// held: Redis flags it write or may-replicate, so a CLIENT PAUSE
	// WRITE holds it (heldCommands); a batch with it in is marked Held.
	held bool
	// rerun: it only reads (rerunCommands), so a batch of such commands
	// written behind a stalled request may run again on another
	// connection (upstream.Batch.Rerun).
	rerun bool
	// pauses: CLIENT PAUSE or UNPAUSE, whose +OK tells the node's pools
	// a pause began or ended (clientPause).
	pauses bool

	// hotPerKey: with a hot key among several keys, it is answered key by
	// key and put together (MGET: the values; DEL, EXISTS…: the sum).
	hotPerKey bool

	subs map[string]*command // subcommands with rules of their own

	// noMulti: the proxy answers it about its own clients, so it is
	// refused inside a transaction, where Redis would queue it and answer
	// about its connections.
	noMulti bool
	// shown is the name CLIENT LIST shows after it (Redis's full name,
	// "client|list"); for a container command, container gives its
	// subcommands' by lower-case name.
	shown     string
	container map[string]string
}

// route says where a command goes; the zero value relays it on a shared
// upstream connection.
type route uint8

const (
	routeShared route = iota // any connection in the client's db will do
	routeLocal               // answered by the proxy: connection state it owns
	routeOwn                 // needs an upstream connection of the client's own
	routeStream              // replies are not one per request: pub/sub, MONITOR
	routeRefuse              // cannot be relayed through a proxy
)

// upstreamCond is when a command the proxy answers goes to Redis instead.
type upstreamCond uint8

const (
	never             upstreamCond = iota
	whenPinned                     // the client's own connection has the name and db
	whenInMulti                    // the transaction queues it
	whenNoUpstreamPwd              // nothing to hide in the reply (CONFIG GET)
)

// clusterRoute says how a command runs in cluster mode, where the proxy
// looks like one standalone Redis; the zero value routes it by the slot of
// its keys, a keyless one to the client's home master.
type clusterRoute uint8

const (
	byKeys       clusterRoute = iota
	everyMaster               // sent to every master, replies merged
	firstMaster               // PUBLISH, PUBSUB: where subscriptions are made
	onKeyNode                 // on the client's own connection to its keys' node: WATCH, blocking commands
	clusterMulti              // a transaction, moved to the node of its first key
	killAll                   // SCRIPT KILL, FUNCTION KILL: every master, at once
	answerPing
	answerEcho
	answerRole      // one master without replicas
	answerSelect    // only db 0 exists
	answerNoCluster // the cluster commands a client probes with: "cluster support disabled"
	scanMasters     // SCAN: the cursor names the master
	scriptExists    // every master's answer, and what the proxy can load
	shardNumSub     // PUBSUB SHARDNUMSUB: split by the channels' slots
	infoMerge       // one node's INFO with the proxy's section
	unwatch         // leaves the WATCH's node when one is held
	// refusedInCluster: it needs per-connection state that would have to
	// follow the client to every node.
	refusedInCluster
)

// scriptArg says which argument of a command names a script.
type scriptArg uint8

const (
	noScript scriptArg = iota
	bodyAt1            // EVAL body …
	bodyAt2            // SCRIPT LOAD body
	sha1At1            // EVALSHA sha1 …
)

// blockingCmd is a command that blocks the connection it runs on.
var blockingCmd = command{route: routeOwn, cluster: onKeyNode}

// ownOnlyCmd needs the client's own connection and cannot follow it
// around a cluster.
var ownOnlyCmd = command{route: routeOwn, cluster: refusedInCluster}

// aboutClients is a CLIENT subcommand the proxy answers about its own
// clients.
var aboutClients = command{route: routeLocal, noMulti: true}

// commandTable lists the commands with rules of their own; every other
// name in commandLabels is an ordinary command. Names not listed at all
// are relayed too, so commands newer than this table still work.
var commandTable = map[string]*command{
	"auth":   {route: routeLocal, noAuth: true, upstreamWhen: whenInMulti},
	"hello":  {route: routeLocal, noAuth: true},
	"quit":   {route: routeLocal, noAuth: true},
	"reset":  {route: routeLocal, noAuth: true},
	"select": {route: routeLocal, upstreamWhen: whenPinned, cluster: answerSelect},
	"proxy":  {route: routeLocal},
	"acl": {subs: map[string]*command{
		"whoami": {route: routeLocal, upstreamWhen: whenInMulti}, // the client's user, not the connection's
	}},
	"client": {subs: map[string]*command{
		"setname": {route: routeLocal, upstreamWhen: whenPinned},
		"getname": {route: routeLocal, upstreamWhen: whenPinned},
		// About the proxy's clients and their ids (clients.go).
		"id": &aboutClients, "info": &aboutClients, "list": &aboutClients,
		"kill": &aboutClients, "unblock": &aboutClients, "getredir": &aboutClients,
		"trackinginfo": &aboutClients, "reply": &aboutClients,
		"no-evict": &aboutClients, "no-touch": &aboutClients,
		// Tracking is per connection: the client's own (see tracking).
		"tracking": {route: routeLocal, noMulti: true},
		// Redis's refusal when not tracking, else on the own connection.
		"caching": {route: routeLocal, upstreamWhen: whenPinned},
		"pause":   {pauses: true}, "unpause": {pauses: true},
	}},
	"config": {subs: map[string]*command{
		// The reply is masked: the upstream password must not show.
		"get": {route: routeLocal, upstreamWhen: whenNoUpstreamPwd},
	}},

	// Transactions keep state on the connection until EXEC or UNWATCH.
	"multi":   {route: routeOwn, cluster: clusterMulti},
	"watch":   &blockingCmd,
	"unwatch": {cluster: unwatch},
	// Blocking commands would stall every client sharing the connection.
	"blpop": &blockingCmd, "brpop": &blockingCmd, "brpoplpush": &blockingCmd,
	"blmove": &blockingCmd, "blmpop": &blockingCmd, "bzpopmin": &blockingCmd,
	"bzpopmax": &blockingCmd, "bzmpop": &blockingCmd,
	"xread": {blockForm: &blockingCmd}, "xreadgroup": {blockForm: &blockingCmd},
	// WAIT counts the replicas of the connection's own writes.
	"wait": &ownOnlyCmd, "waitaof": &ownOnlyCmd,
	// SHUTDOWN, like SCRIPT KILL and FUNCTION KILL, must reach Redis while
	// a script keeps it busy: not behind that script on a shared
	// connection.
	"shutdown": &ownOnlyCmd,

	"subscribe": {route: routeStream}, "psubscribe": {route: routeStream},
	"ssubscribe": {route: routeStream}, "unsubscribe": {route: routeStream},
	"punsubscribe": {route: routeStream}, "sunsubscribe": {route: routeStream},
	"monitor": {route: routeStream},
	"publish": {cluster: firstMaster},
	"pubsub": {cluster: firstMaster, subs: map[string]*command{
		"shardchannels": {cluster: everyMaster, merge: mergeConcat},
		"shardnumsub":   {cluster: shardNumSub, merge: mergeArray},
	}},

	// Replication streams are not request/reply.
	"sync": {route: routeRefuse}, "psync": {route: routeRefuse},

	"mget":   {splits: true, merge: mergeArray, hotPerKey: true},
	"mset":   {splits: true, merge: mergeAll, pairs: true},
	"del":    {splits: true, merge: mergeSum, hotPerKey: true},
	"unlink": {splits: true, merge: mergeSum, hotPerKey: true},
	"exists": {splits: true, merge: mergeSum, hotPerKey: true},
	"touch":  {splits: true, merge: mergeSum, hotPerKey: true},

	"dbsize":    {cluster: everyMaster, merge: mergeSum, spans: true},
	"keys":      {cluster: everyMaster, merge: mergeConcat, spans: true},
	"randomkey": {cluster: everyMaster, merge: mergeRandom, spans: true},
	"flushall":  {cluster: everyMaster, merge: mergeAll, spans: true},
	"flushdb":   {cluster: everyMaster, merge: mergeAll, spans: true},
	"scan":      {cluster: scanMasters, spans: true},
	"info":      {cluster: infoMerge},

	"eval": {script: bodyAt1}, "eval_ro": {script: bodyAt1},
	"evalsha": {script: sha1At1}, "evalsha_ro": {script: sha1At1},
	"script": {subs: map[string]*command{
		"load":   {cluster: everyMaster, merge: mergeAll, spans: true, script: bodyAt2},
		"flush":  {cluster: everyMaster, merge: mergeAll, spans: true, flushesScripts: true},
		"exists": {cluster: scriptExists, spans: true},
		"kill":   {route: routeOwn, cluster: killAll, aside: true},
		"debug":  {route: routeRefuse},
	}},
	"function": {subs: map[string]*command{
		"load":    {cluster: everyMaster, merge: mergeAll, spans: true},
		"delete":  {cluster: everyMaster, merge: mergeAll, spans: true},
		"flush":   {cluster: everyMaster, merge: mergeAll, spans: true},
		"restore": {cluster: everyMaster, merge: mergeAll, spans: true},
		"kill":    {route: routeOwn, cluster: killAll, aside: true},
		"stats":   {aside: true},
	}},

	"ping": {cluster: answerPing}, "echo": {cluster: answerEcho},
	"role":    {cluster: answerRole},
	"cluster": {cluster: answerNoCluster}, "readonly": {cluster: answerNoCluster},
	"readwrite": {cluster: answerNoCluster}, "asking": {cluster: answerNoCluster},
}

// commandLabels are the values of the metrics' command label: Redis 7.0's
// commands (COMMAND LIST without subcommands), WAITAOF (7.2), the hash
// field commands of 7.4 and 8.0, and the proxy's own; "other" for the rest.
var commandLabels = strings.Fields(`
	acl append asking auth bgrewriteaof bgsave bitcount bitfield bitfield_ro
	bitop bitpos blmove blmpop blpop brpop brpoplpush bzmpop bzpopmax bzpopmin
	client cluster command config copy dbsize debug decr decrby del discard
	dump echo eval eval_ro evalsha evalsha_ro exec exists expire expireat
	expiretime failover fcall fcall_ro flushall flushdb function geoadd
	geodist geohash geopos georadius georadius_ro georadiusbymember
	georadiusbymember_ro geosearch geosearchstore get getbit getdel getex
	getrange getset hdel hello hexists hexpire hexpireat hexpiretime hget
	hgetall hgetdel hgetex hincrby hincrbyfloat hkeys hlen hmget hmset
	hpersist hpexpire hpexpireat hpexpiretime hpttl hrandfield hscan hset
	hsetex hsetnx hstrlen httl hvals incr incrby incrbyfloat info keys
	lastsave latency lcs lindex linsert llen lmove lmpop lolwut lpop lpos
	lpush lpushx lrange lrem lset ltrim memory mget migrate module monitor
	move mset msetnx multi object persist pexpire pexpireat pexpiretime pfadd
	pfcount pfdebug pfmerge pfselftest ping proxy psetex psubscribe psync
	pttl publish pubsub punsubscribe quit randomkey readonly readwrite rename
	renamenx replconf replicaof reset restore restore-asking role rpop
	rpoplpush rpush rpushx sadd save scan scard script sdiff sdiffstore
	select set setbit setex setnx setrange shutdown sinter sintercard
	sinterstore sismember slaveof slowlog smembers smismember smove sort
	sort_ro spop spublish srandmember srem sscan ssubscribe strlen subscribe
	substr sunion sunionstore sunsubscribe swapdb sync time touch ttl type
	unlink unsubscribe unwatch wait waitaof watch xack xadd xautoclaim xclaim
	xdel xgroup xinfo xlen xpending xrange xread xreadgroup xrevrange xsetid
	xtrim zadd zcard zcount zdiff zdiffstore zincrby zinter zintercard
	zinterstore zlexcount zmpop zmscore zpopmax zpopmin zrandmember zrange
	zrangebylex zrangebyscore zrangestore zrank zrem zremrangebylex
	zremrangebyrank zremrangebyscore zrevrange zrevrangebylex
	zrevrangebyscore zrevrank zscan zscore zunion zunionstore
	other`)

// heldCommands are the commands, and subcommands (as "function|load"),
// that a CLIENT PAUSE WRITE holds: those Redis 7.0.15 flags write or
// may-replicate (COMMAND INFO; commands.c), and the hash field writes of
// 7.4 and 8.0. XGROUP stands for its subcommands, of which only HELP
// reads; EVAL, EVALSHA and FCALL are held unless their script says
// no-writes, which the proxy does not look at: sent where a pause would
// hold no other client, a command Redis does not hold only costs a
// connection. A name the table does not know (a module's) is held too.
var heldCommands = strings.Fields(`
	append bitfield bitop blmove blmpop blpop brpop brpoplpush bzmpop
	bzpopmax bzpopmin copy decr decrby del eval evalsha expire expireat fcall
	flushall flushdb function|delete function|flush function|load
	function|restore geoadd georadius georadiusbymember geosearchstore
	getdel getex getset hdel hexpire hexpireat hgetdel hgetex hincrby
	hincrbyfloat hmset hpersist hpexpire hpexpireat hset hsetex hsetnx incr
	incrby incrbyfloat linsert lmove lmpop lpop lpush lpushx lrem lset ltrim
	migrate move mset msetnx persist pexpire pexpireat pfadd pfcount pfdebug
	pfmerge psetex publish rename renamenx restore restore-asking rpop
	rpoplpush rpush rpushx sadd sdiffstore set setbit setex setnx setrange
	sinterstore smove sort spop spublish srem sunionstore swapdb unlink xack
	xadd xautoclaim xclaim xdel xgroup xreadgroup xsetid xtrim zadd
	zdiffstore zincrby zinterstore zmpop zpopmax zpopmin zrangestore zrem
	zremrangebylex zremrangebyrank zremrangebyscore zunionstore`)

// rerunCommands are the commands that change nothing Redis keeps when
// they run a second time: Redis 7.0.15's readonly commands (commands.c)
// without the read-only scripts and KEYS, which are what stalls a
// connection, or the subcommands (MEMORY USAGE, OBJECT, XINFO), which have
// no entries of their own; and PING, ECHO, TIME, LASTSAVE and INFO, which read no key.
// A batch of them written behind another client's stalled request (a
// busy script, a write a CLIENT PAUSE holds) is sent again elsewhere,
// where Redis answers it (BUSY, or the reply), rather than wait up to the
// read timeout and fail with the stalled one.
var rerunCommands = strings.Fields(`
	bitcount bitfield_ro bitpos dbsize dump echo exists expiretime geodist
	geohash geopos georadius_ro georadiusbymember_ro geosearch get getbit
	getrange hexists hget hgetall hkeys hlen hmget hrandfield hscan hstrlen
	hvals info lastsave lcs lindex llen lolwut lpos lrange mget
	pexpiretime ping pttl randomkey scan scard sdiff sinter sintercard
	sismember smembers smismember sort_ro srandmember sscan strlen substr
	sunion time touch ttl type xlen xpending xrange xread xrevrange zcard
	zcount zdiff zinter zintercard zlexcount zmscore zrandmember zrange
	zrangebylex zrangebyscore zrank zrevrange zrevrangebylex
	zrevrangebyscore zrevrank zscan zscore zunion`)

// otherCommand is the entry of a name the table does not know.
var otherCommand = &command{name: "other", metric: uint16(len(commandLabels) - 1), shown: "NULL", held: true}

// containerSubs are Redis 7.0.15's commands with subcommands, and their
// subcommands (commands.c), for the cmd field of CLIENT LIST: Redis shows
// "client|list", the container alone, or "NULL" for a subcommand it does
// not know.
var containerSubs = map[string]string{
	"acl":      "cat deluser dryrun genpass getuser help list load log save setuser users whoami",
	"client":   "caching getname getredir help id info kill list no-evict pause reply setname tracking trackinginfo unblock unpause",
	"cluster":  "addslots addslotsrange bumpepoch count-failure-reports countkeysinslot delslots delslotsrange failover flushslots forget getkeysinslot help info keyslot links meet myid nodes replicas replicate reset saveconfig set-config-epoch setslot shards slaves slots",
	"command":  "count docs getkeys getkeysandflags help info list",
	"config":   "get help resetstat rewrite set",
	"function": "delete dump flush help kill list load restore stats",
	"latency":  "doctor graph help histogram history latest reset",
	"memory":   "doctor help malloc-stats purge stats usage",
	"module":   "help list load loadex unload",
	"object":   "encoding freq help idletime refcount",
	"pubsub":   "channels help numpat numsub shardchannels shardnumsub",
	"script":   "debug exists flush help kill load",
	"slowlog":  "get help len reset",
	"xgroup":   "create createconsumer delconsumer destroy help setid",
	"xinfo":    "consumers groups help stream",
}

// shownName is the name CLIENT LIST shows for a command with args, whose
// entry is c.
func (c *command) shownName(args [][]byte) string {
	if c.container == nil || len(args) == 1 {
		return c.shown
	}
	var buf [24]byte
	if name, ok := c.container[string(lowerName(args[1], &buf))]; ok {
		return name
	}
	return "NULL"
}

// commands is the table by lower-case name, every label's command in it.
var commands = func() map[string]*command {
	m := make(map[string]*command, len(commandLabels))
	held, rerun := names(heldCommands), names(rerunCommands)
	for i, name := range commandLabels[:len(commandLabels)-1] {
		c := commandTable[name]
		if c == nil {
			c = &command{}
		} else {
			// Shared entries (blockingCmd…) are copied, so each has its
			// own name and label.
			c = new(*c)
		}
		c.name, c.metric, c.shown, c.held, c.rerun = name, uint16(i), name, held[name], rerun[name]
		if subs, ok := containerSubs[name]; ok {
			c.container = make(map[string]string)
			for sub := range strings.FieldsSeq(subs) {
				c.container[sub] = name + "|" + sub
			}
		}
		if c.blockForm != nil {
			c.blockForm = new(*c.blockForm)
			c.blockForm.name, c.blockForm.metric, c.blockForm.shown, c.blockForm.held, c.blockForm.rerun = name, c.metric, name, c.held, false
		}
		for sub, sc := range c.subs {
			sc = new(*sc)
			sc.name, sc.metric, sc.shown, sc.held, sc.rerun = name, c.metric, name+"|"+sub, held[name+"|"+sub], rerun[name+"|"+sub]
			c.subs[sub] = sc
		}
		m[name] = c
	}
	for name := range commandTable {
		if m[name] == nil {
			panic("proxy: command " + name + " has no metrics label")
		}
	}
	for _, name := range append(heldCommands, rerunCommands...) {
		cmd, sub, _ := strings.Cut(name, "|")
		if c := m[cmd]; c == nil || sub != "" && c.subs[sub] == nil {
			panic("proxy: held or rerun command " + name + " is not in the table")
		}
	}
	return m
}()

// names is a set of list's names.
func names(list []string) map[string]bool {
	m := make(map[string]bool, len(list))
	for _, name := range list {
		m[name] = true
	}
	return m
}

// lowerName lower-cases a command name into buf without allocating; names
// longer than buf cannot be in the table and come back empty.
func lowerName(b []byte, buf *[24]byte) []byte { return resp.LowerName(b, buf) }

// lookup returns the table's entry for a command: its subcommand's when it
// has rules of its own, the blocking form of XREAD with BLOCK. name is the
// command's lower-case name, valid until buf is reused.
func lookup(args [][]byte, buf *[24]byte) (c *command, name []byte) {
	name = lowerName(args[0], buf)
	c = commands[string(name)]
	if c == nil {
		return otherCommand, name
	}
	if c.subs != nil && len(args) > 1 {
		var sub [24]byte
		if sc := c.subs[string(lowerName(args[1], &sub))]; sc != nil {
			return sc, name
		}
	}
	if c.blockForm != nil {
		if _, ok := blockOption(args); ok {
			return c.blockForm, name
		}
	}
	return c, name
}

// blockOption finds the BLOCK option of XREAD/XREADGROUP and its value
// (nil when BLOCK is the last argument): options come before STREAMS, and
// XREADGROUP's GROUP takes two values that may be any word, "block" and
// "streams" included.
func blockOption(args [][]byte) (value []byte, ok bool) {
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case bytes.EqualFold(a, []byte("block")):
			if i+1 < len(args) {
				value = args[i+1]
			}
			return value, true
		case bytes.EqualFold(a, []byte("streams")):
			return nil, false
		case bytes.EqualFold(a, []byte("group")):
			i += 2
		case bytes.EqualFold(a, []byte("count")):
			i++
		}
	}
	return nil, false
}

// refusedName is the command as a refusal names it: with its subcommand
// for CLIENT and SCRIPT.
func refusedName(args [][]byte) string {
	name := strings.ToUpper(string(args[0]))
	if len(args) > 1 && slices.Contains([]string{"CLIENT", "SCRIPT"}, name) {
		name += " " + strings.ToUpper(string(args[1]))
	}
	return name
}
