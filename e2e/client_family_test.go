package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// clientModes runs f against a standalone and a cluster upstream: addr is
// the proxy's, ref a standalone redis-server to compare with (the
// upstream itself in standalone mode), nodes the upstream servers.
func clientModes(t *testing.T, f func(t *testing.T, addr, ref string, nodes []string)) {
	t.Run("standalone", func(t *testing.T) {
		e := startEnv(t, nil)
		f(t, e.ProxyAddr(), e.Redis.Addr(), []string{e.Redis.Addr()})
	})
	t.Run("cluster", func(t *testing.T) {
		e := startClusterEnv(t, nil)
		var nodes []string
		for _, n := range e.Cluster.Nodes() {
			nodes = append(nodes, n.Addr())
		}
		f(t, e.ProxyAddr(), redistest.Start(t, localredis.Options{}).Addr(), nodes)
	})
}

// clientLines parses a CLIENT LIST or CLIENT INFO reply: one map of fields
// per line, and each line's field names in order.
func clientLines(t *testing.T, reply string) (lines []map[string]string, order [][]string) {
	t.Helper()
	body, ok := resp.BulkValue([]byte(reply))
	if !ok {
		t.Fatalf("CLIENT LIST reply %q is not a bulk string", reply)
	}
	for line := range strings.SplitSeq(strings.TrimSuffix(string(body), "\n"), "\n") {
		fields := map[string]string{}
		var names []string
		for f := range strings.FieldsSeq(line) {
			k, v, _ := strings.Cut(f, "=")
			fields[k] = v
			names = append(names, k)
		}
		lines, order = append(lines, fields), append(order, names)
	}
	return lines, order
}

// clientID is what CLIENT ID says on c.
func clientID(c *rawConn) string {
	c.t.Helper()
	return strings.TrimSuffix(strings.TrimPrefix(c.do("CLIENT", "ID"), ":"), "\r\n")
}

// byName is the line of the client named name.
func byName(t *testing.T, lines []map[string]string, name string) map[string]string {
	t.Helper()
	for _, l := range lines {
		if l["name"] == name {
			return l
		}
	}
	t.Fatalf("no client named %q in %v", name, lines)
	return nil
}

// clientStates puts clients named idle, sub, tx, blocked, monitor and bcast
// into those states on addr (the blocked one in BLPOP on key q; bcast
// tracks only when track is set) and returns a client named lister, once
// every state is set.
func clientStates(t *testing.T, addr, q string, track bool) (lister *rawConn) {
	t.Helper()
	named := func(name string) *rawConn {
		c := dialRaw(t, addr)
		if r := c.do("CLIENT", "SETNAME", name); r != "+OK\r\n" {
			t.Fatalf("CLIENT SETNAME %s: %q", name, r)
		}
		return c
	}
	named("idle").do("GET", "x")
	sub := named("sub")
	sub.send([]byte(corpusCmd("SUBSCRIBE", "c1", "c2") + corpusCmd("PSUBSCRIBE", "p*")))
	sub.readReplies(3)
	tx := named("tx")
	// PING first: in cluster mode the transaction moves to the key's node
	// with what it queued so far.
	tx.send([]byte(corpusCmd("MULTI") + corpusCmd("PING") + corpusCmd("SET", q+"x", "1") + corpusCmd("GET", q+"x")))
	tx.readReplies(4)
	named("blocked").send([]byte(corpusCmd("BLPOP", q, "0")))
	mon := named("monitor")
	mon.do("MONITOR")
	if bcast := named("bcast"); track {
		bcast.do("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "a")
	}
	lister = named("lister")
	waitFlags(t, lister, "blocked", "b")
	return lister
}

// waitFlags reads CLIENT LIST on c until the client named name shows flags.
func waitFlags(t *testing.T, c *rawConn, name, flags string) map[string]string {
	t.Helper()
	for {
		lines, _ := clientLines(t, c.do("CLIENT", "LIST"))
		for _, l := range lines {
			if l["name"] == name && l["flags"] == flags {
				return l
			}
		}
	}
}

// TestClientListFields: CLIENT LIST through the proxy lists the proxy's
// clients, each line with Redis 7.0's fields in Redis's order, and the
// values direct Redis shows for a client in the same state: named, idle,
// subscribed, in MULTI, blocked, MONITOR, tracking; CLIENT INFO is the
// client's own line.
func TestClientListFields(t *testing.T) {
	clientModes(t, func(t *testing.T, addr, ref string, nodes []string) {
		track := len(nodes) == 1 // refused in cluster mode
		// Direct first: the proxy's own connections to Redis carry its
		// clients' names.
		direct := clientStates(t, ref, "{q}direct", track)
		want, wantOrder := clientLines(t, direct.do("CLIENT", "LIST"))
		proxied := clientStates(t, addr, "{q}proxied", track)
		got, gotOrder := clientLines(t, proxied.do("CLIENT", "LIST"))
		// Through the proxy: its 7 clients, and nothing else.
		if len(got) != 7 {
			t.Fatalf("proxy lists %d clients, want its 7: %v", len(got), got)
		}
		for i := range gotOrder {
			if fmt.Sprint(gotOrder[i]) != fmt.Sprint(wantOrder[0]) {
				t.Errorf("fields %v, want Redis's %v", gotOrder[i], wantOrder[0])
			}
		}
		same := []string{"name", "flags", "db", "sub", "psub", "ssub", "multi", "obl", "oll", "omem", "events", "cmd", "user", "redir", "resp"}
		for _, name := range []string{"idle", "sub", "tx", "blocked", "monitor", "bcast", "lister"} {
			w, g := byName(t, want, name), byName(t, got, name)
			for _, f := range same {
				if g[f] != w[f] {
					t.Errorf("client %s: %s=%s, direct Redis shows %s=%s", name, f, g[f], f, w[f])
				}
			}
			if g["laddr"] != addr {
				t.Errorf("client %s: laddr=%s, want the proxy's %s", name, g["laddr"], addr)
			}
		}
		self := byName(t, got, "lister")
		if id := proxied.do("CLIENT", "ID"); id != ":"+self["id"]+"\r\n" {
			t.Errorf("CLIENT ID %q, CLIENT LIST id=%s", id, self["id"])
		}
		if self["addr"] != proxied.nc.LocalAddr().String() {
			t.Errorf("addr=%s, want the client's %s", self["addr"], proxied.nc.LocalAddr())
		}
		info, _ := clientLines(t, proxied.do("CLIENT", "INFO"))
		if len(info) != 1 || info[0]["id"] != self["id"] || info[0]["cmd"] != "client|info" {
			t.Errorf("CLIENT INFO %v, want the lister's line with cmd=client|info", info)
		}
		pubsub, _ := clientLines(t, proxied.do("CLIENT", "LIST", "TYPE", "pubsub"))
		if len(pubsub) != 1 || pubsub[0]["name"] != "sub" {
			t.Errorf("CLIENT LIST TYPE pubsub %v, want the subscriber", pubsub)
		}
		ids, _ := clientLines(t, proxied.do("CLIENT", "LIST", "ID", byName(t, got, "tx")["id"], "999999", self["id"]))
		if len(ids) != 2 || ids[0]["name"] != "tx" || ids[1]["name"] != "lister" {
			t.Errorf("CLIENT LIST ID tx 999999 lister: %v", ids)
		}
		// Unblocked, the client does not hold the proxy's shutdown.
		if r := proxied.do("CLIENT", "UNBLOCK", byName(t, got, "blocked")["id"]); r != ":1\r\n" {
			t.Errorf("CLIENT UNBLOCK of the blocked client: %q", r)
		}
	})
}

// TestClientKill: CLIENT KILL through the proxy closes the proxy's
// clients it selects, by every filter, with Redis's replies; the client
// itself only with SKIPME no or the old form, after the reply.
func TestClientKill(t *testing.T) {
	clientModes(t, func(t *testing.T, addr, _ string, _ []string) {
		killer := dialRaw(t, addr)
		killer.do("CLIENT", "SETNAME", "killer")
		dial := func(name string) (*rawConn, string) {
			c := dialRaw(t, addr)
			c.do("CLIENT", "SETNAME", name)
			return c, clientID(c)
		}
		killed := func(c *rawConn, how string) {
			t.Helper()
			if got := c.readUntilClose(); got != "" {
				t.Errorf("%s: the client read %q before it was closed", how, got)
			}
		}
		expect := func(want string, args ...string) {
			t.Helper()
			if got := killer.do(args...); got != want {
				t.Errorf("%s = %q, want %q", strings.Join(args, " "), got, want)
			}
		}

		a, aID := dial("a")
		expect(":1\r\n", "CLIENT", "KILL", "ID", aID)
		killed(a, "KILL ID")
		expect(":0\r\n", "CLIENT", "KILL", "ID", aID)

		b, _ := dial("b")
		expect(":1\r\n", "CLIENT", "KILL", "ADDR", b.nc.LocalAddr().String())
		killed(b, "KILL ADDR")
		c, _ := dial("c")
		expect("+OK\r\n", "CLIENT", "KILL", c.nc.LocalAddr().String())
		killed(c, "KILL addr:port")
		expect("-ERR No such client\r\n", "CLIENT", "KILL", c.nc.LocalAddr().String())

		sub, _ := dial("sub")
		sub.do("SUBSCRIBE", "ch")
		normal, _ := dial("normal")
		expect(":1\r\n", "CLIENT", "KILL", "TYPE", "pubsub")
		killed(sub, "KILL TYPE pubsub")
		if r := normal.do("PING"); r != "+PONG\r\n" {
			t.Errorf("a normal client after KILL TYPE pubsub: %q", r)
		}

		// MAXAGE (Redis 7.4's): the clients connected for that long; age
		// counts whole seconds, so wait until CLIENT LIST shows 1.
		for {
			lines, _ := clientLines(t, killer.do("CLIENT", "LIST", "ID", clientID(normal)))
			if lines[0]["age"] != "0" {
				break
			}
		}
		young, _ := dial("young")
		expect(":0\r\n", "CLIENT", "KILL", "MAXAGE", "100000")
		expect("-ERR maxage should be greater than 0\r\n", "CLIENT", "KILL", "MAXAGE", "0")
		expect(":1\r\n", "CLIENT", "KILL", "MAXAGE", "1", "ADDR", normal.nc.LocalAddr().String())
		killed(normal, "KILL MAXAGE")

		expect(":1\r\n", "CLIENT", "KILL", "USER", "default", "LADDR", addr)
		killed(young, "KILL USER default LADDR")
		expect(":0\r\n", "CLIENT", "KILL", "USER", "default")
		expect("-ERR No such user 'nobody'\r\n", "CLIENT", "KILL", "USER", "nobody")

		// SKIPME no: the killer too, after its reply.
		other, _ := dial("other")
		killer.send([]byte(corpusCmd("CLIENT", "KILL", "LADDR", addr, "SKIPME", "no") + corpusCmd("PING")))
		if got := killer.readUntilClose(); got != ":2\r\n" {
			t.Errorf("CLIENT KILL LADDR SKIPME no: %q, want :2 and then the close", got)
		}
		killed(other, "KILL SKIPME no")
	})
}

// TestClientInMulti: inside MULTI, the CLIENT subcommands the proxy
// answers about its own clients are refused and EXEC aborts, rather than
// queued for Redis to answer about its connections; the proxy's replies
// come back after.
func TestClientInMulti(t *testing.T) {
	clientModes(t, func(t *testing.T, addr, _ string, _ []string) {
		c := dialRaw(t, addr)
		id := clientID(c)
		c.send([]byte(corpusCmd("MULTI") + corpusCmd("CLIENT", "ID") + corpusCmd("CLIENT", "REPLY", "OFF") + corpusCmd("EXEC") + corpusCmd("CLIENT", "ID")))
		want := "+OK\r\n-ERR CLIENT ID is not allowed inside MULTI through hotkeyproxy\r\n" +
			"-ERR CLIENT REPLY is not allowed inside MULTI through hotkeyproxy\r\n" +
			"-EXECABORT Transaction discarded because of previous errors.\r\n:" + id + "\r\n"
		if got := c.readReplies(5); got != want {
			t.Errorf("got  %q\nwant %q", got, want)
		}
	})
}

// TestClientUnblock: CLIENT UNBLOCK through the proxy ends the BLPOP a
// client of the proxy waits in: with a nil reply (TIMEOUT) or Redis's
// UNBLOCKED error; a client not blocked gets :0.
func TestClientUnblock(t *testing.T) {
	clientModes(t, func(t *testing.T, addr, _ string, nodes []string) {
		ctl := dialRaw(t, addr)
		for _, tc := range []struct{ reason, want string }{
			{"", "*-1\r\n"},
			{"TIMEOUT", "*-1\r\n"},
			{"ERROR", "-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n"},
		} {
			b := dialRaw(t, addr)
			id := clientID(b)
			if r := ctl.do("CLIENT", "UNBLOCK", id); r != ":0\r\n" {
				t.Errorf("CLIENT UNBLOCK of a client not blocked: %q", r)
			}
			b.send([]byte(corpusCmd("BLPOP", "{q}unblock", "0")))
			waitBlockedUpstream(t, nodes)
			args := []string{"CLIENT", "UNBLOCK", id}
			if tc.reason != "" {
				args = append(args, tc.reason)
			}
			if r := ctl.do(args...); r != ":1\r\n" {
				t.Fatalf("%s = %q, want :1", strings.Join(args, " "), r)
			}
			if r := b.readReplies(1); r != tc.want {
				t.Errorf("after %s the blocked client got %q, want %q", strings.Join(args, " "), r, tc.want)
			}
			if r := b.do("PING"); r != "+PONG\r\n" {
				t.Errorf("the unblocked client then: %q", r)
			}
		}
	})
}

// waitBlockedUpstream waits until one of the Redis servers at addrs holds
// a client blocked: only then can CLIENT UNBLOCK find it blocked there.
func waitBlockedUpstream(t *testing.T, addrs []string) {
	t.Helper()
	var conns []*rawConn
	for _, a := range addrs {
		conns = append(conns, dialRaw(t, a))
	}
	for {
		for _, c := range conns {
			if strings.Contains(c.do("CLIENT", "LIST"), " flags=b ") {
				return
			}
		}
	}
}

// TestClientTracking: client-side caching through the proxy in RESP2,
// each mode against direct Redis: the invalidations come on the redirect
// client's __redis__:invalidate subscription, REDIRECT, GETREDIR,
// TRACKINGINFO and CLIENT LIST speak proxy ids. Cluster mode refuses
// tracking.
func TestClientTracking(t *testing.T) {
	e := startEnv(t, nil)
	for _, s := range []struct{ what, addr string }{{"direct", e.Redis.Addr()}, {"proxy", e.ProxyAddr()}} {
		t.Run(s.what, func(t *testing.T) { trackingSession(t, s.addr) })
	}
	t.Run("cluster", func(t *testing.T) {
		ce := startClusterEnv(t, nil)
		c := dialRaw(t, ce.ProxyAddr())
		want := "-ERR CLIENT TRACKING is not supported by hotkeyproxy in cluster mode\r\n"
		if r := c.do("CLIENT", "TRACKING", "ON"); r != want {
			t.Errorf("CLIENT TRACKING ON in cluster mode: %q, want %q", r, want)
		}
	})
}

// trackingSession runs the tracking modes against addr; ids are whatever
// CLIENT ID says there.
func trackingSession(t *testing.T, addr string) {
	inv := dialRaw(t, addr)
	invID := clientID(inv)
	inv.do("SUBSCRIBE", "__redis__:invalidate")
	w := dialRaw(t, addr)
	next := func(want string) {
		t.Helper()
		msg := corpusCmd("message", "__redis__:invalidate")
		got := inv.readReplies(1)
		if !strings.HasPrefix(got, "*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n") || !strings.Contains(got, want) {
			t.Errorf("invalidation %q, want one for %s (%q…)", got, want, msg)
		}
	}
	mode := func(opts ...string) *rawConn {
		t.Helper()
		c := dialRaw(t, addr)
		args := append([]string{"CLIENT", "TRACKING", "ON", "REDIRECT", invID}, opts...)
		if r := c.do(args...); r != "+OK\r\n" {
			t.Fatalf("%s: %q", strings.Join(args, " "), r)
		}
		return c
	}
	bulk := func(s string) string { return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n" }

	// Default mode: the keys the client read.
	c := mode()
	if r := c.do("CLIENT", "GETREDIR"); r != ":"+invID+"\r\n" {
		t.Errorf("CLIENT GETREDIR %q, want :%s", r, invID)
	}
	wantInfo := "*6\r\n$5\r\nflags\r\n*1\r\n$2\r\non\r\n$8\r\nredirect\r\n:" + invID + "\r\n$8\r\nprefixes\r\n*0\r\n"
	if r := c.do("CLIENT", "TRACKINGINFO"); r != wantInfo {
		t.Errorf("CLIENT TRACKINGINFO %q, want %q", r, wantInfo)
	}
	if lines, _ := clientLines(t, c.do("CLIENT", "INFO")); lines[0]["redir"] != invID || lines[0]["flags"] != "t" {
		t.Errorf("CLIENT INFO of a tracking client: %v, want flags=t redir=%s", lines[0], invID)
	}
	c.do("GET", "t:read")
	w.do("SET", "t:other", "1")
	w.do("SET", "t:read", "1")
	next(bulk("t:read"))

	// BCAST with a prefix: every key under it, read or not.
	mode("BCAST", "PREFIX", "b:")
	w.do("SET", "x:b", "1")
	w.do("SET", "b:1", "1")
	next(bulk("b:1"))

	// OPTIN: only what is read after CLIENT CACHING yes.
	o := mode("OPTIN")
	o.do("GET", "o:plain")
	if r := o.do("CLIENT", "CACHING", "yes"); r != "+OK\r\n" {
		t.Errorf("CLIENT CACHING yes: %q", r)
	}
	o.do("GET", "o:cached")
	w.do("SET", "o:plain", "1")
	w.do("SET", "o:cached", "1")
	next(bulk("o:cached"))

	// NOLOOP: not the client's own writes.
	n := mode("NOLOOP")
	n.do("MGET", "n:own", "n:other")
	n.do("SET", "n:own", "1")
	w.do("SET", "n:other", "1")
	next(bulk("n:other"))

	if r := dialRaw(t, addr).do("CLIENT", "TRACKING", "ON", "REDIRECT", "999999"); r != "-ERR The client ID you want redirect to does not exist\r\n" {
		t.Errorf("REDIRECT to no client: %q", r)
	}
	if r := c.do("CLIENT", "TRACKING", "OFF"); r != "+OK\r\n" {
		t.Errorf("CLIENT TRACKING OFF: %q", r)
	}
	if r := c.do("CLIENT", "GETREDIR"); r != ":-1\r\n" {
		t.Errorf("CLIENT GETREDIR after OFF: %q", r)
	}
}
