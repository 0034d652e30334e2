package proxy

import "bytes"

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

// routes classifies commands by lower-case name (cf. codis mapper.go). Names
// not listed are relayed, so commands newer than this table still work.
var routes = map[string]route{
	"auth": routeLocal, "hello": routeLocal, "quit": routeLocal,
	"select": routeLocal, "reset": routeLocal, "client": routeLocal,
	"config": routeLocal, "proxy": routeLocal,

	// Transactions keep state on the connection until EXEC or UNWATCH.
	"multi": routeOwn, "watch": routeOwn,
	// Blocking commands would stall every client sharing the connection.
	"blpop": routeOwn, "brpop": routeOwn, "brpoplpush": routeOwn,
	"blmove": routeOwn, "blmpop": routeOwn, "bzpopmin": routeOwn,
	"bzpopmax": routeOwn, "bzmpop": routeOwn, "wait": routeOwn,
	"waitaof": routeOwn,

	"subscribe": routeStream, "psubscribe": routeStream,
	"ssubscribe": routeStream, "unsubscribe": routeStream,
	"punsubscribe": routeStream, "sunsubscribe": routeStream,
	"monitor": routeStream,

	// SHUTDOWN, like SCRIPT KILL and FUNCTION KILL below, must reach Redis
	// while a script keeps it busy: not behind that script on a shared
	// connection.
	"shutdown": routeOwn,

	// Replication streams are not request/reply.
	"sync": routeRefuse, "psync": routeRefuse,
}

// clientRoutes classifies CLIENT subcommands; unlisted ones are relayed.
var clientRoutes = map[string]route{
	"id": routeLocal, "setname": routeLocal, "getname": routeLocal,
	// Per-connection modes: they must not leak to other clients.
	"tracking": routeOwn, "caching": routeOwn, "no-evict": routeOwn,
	"no-touch": routeOwn,
	// Switching replies off breaks the one-reply-per-request framing.
	"reply": routeRefuse,
}

// lowerName lower-cases a command name into buf without allocating; names
// longer than buf cannot be in any table and come back empty.
func lowerName(b []byte, buf *[24]byte) []byte {
	if len(b) > len(buf) {
		return nil
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	return buf[:len(b)]
}

// classify returns the route of a command and its lower-case name.
func classify(args [][]byte, buf *[24]byte) (route, []byte) {
	name := lowerName(args[0], buf)
	r := routes[string(name)]
	switch {
	case r == routeLocal && string(name) == "client":
		if len(args) < 2 {
			return routeShared, name // Redis answers the arity error
		}
		var sub [24]byte
		return clientRoutes[string(lowerName(args[1], &sub))], name
	case r == routeLocal && string(name) == "config":
		if len(args) < 2 || !bytes.EqualFold(args[1], []byte("get")) {
			return routeShared, name
		}
	case r == routeShared && (string(name) == "xread" || string(name) == "xreadgroup"):
		if hasBlockOption(args) {
			return routeOwn, name
		}
	case r == routeRefuse, string(name) == "script" && len(args) > 1 && bytes.EqualFold(args[1], []byte("debug")):
		return routeRefuse, name
	case (string(name) == "script" || string(name) == "function") && len(args) > 1 && bytes.EqualFold(args[1], []byte("kill")):
		return routeOwn, name
	}
	return r, name
}

// hasBlockOption reports whether XREAD/XREADGROUP has a BLOCK option:
// options come before STREAMS, and XREADGROUP's GROUP takes two values that
// may be any word, "block" and "streams" included.
func hasBlockOption(args [][]byte) bool {
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case bytes.EqualFold(a, []byte("block")):
			return true
		case bytes.EqualFold(a, []byte("streams")):
			return false
		case bytes.EqualFold(a, []byte("group")):
			i += 2
		case bytes.EqualFold(a, []byte("count")):
			i++
		}
	}
	return false
}
