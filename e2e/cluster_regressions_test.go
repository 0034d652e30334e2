package e2e

// Regressions of cluster mode found by attacking the proxy, on one
// cluster and one standalone reference. Where the proxy must look like a
// standalone Redis the replies are compared with the reference's byte for
// byte; where cluster mode answers otherwise by design (README, "In front
// of a Redis Cluster") the exact replies are asserted.

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

func TestClusterRegressions(t *testing.T) {
	e := startClusterEnv(t, nil)
	ref := redistest.Start(t, localredis.Options{})
	l := clusterLayoutOf(t, e)
	// One key on each master: a on the first (slot 0's, where SUBSCRIBE
	// goes), b on the second, c on the third.
	a, b, c := l.keyOn[0][0], l.keyOn[1][0], l.keyOn[2][0]
	direct := corpusTarget{addr: ref.Addr(), servers: []string{ref.Addr()}}
	proxied := corpusTarget{addr: e.ProxyAddr(), servers: l.masters}

	// same empties the reference and the masters, runs steps on both and
	// fails on any byte of difference.
	same := func(t *testing.T, steps ...corpusStep) {
		t.Helper()
		want, got := corpusRunCase(t, corpusCase{steps: steps}, direct, proxied)
		for i, s := range steps {
			corpusCompare(t, i, s, want[i], got[i])
		}
	}
	// exchange empties the masters, then sends each command of pairs (a
	// command line, then its exact reply) on one new connection to addr.
	exchange := func(t *testing.T, addr string, pairs ...string) *rawConn {
		t.Helper()
		for _, m := range l.masters {
			corpusReset(t, m)
		}
		conn := dialRaw(t, addr)
		for i := 0; i < len(pairs); i += 2 {
			args, err := corpusArgs(pairs[i])
			if err != nil {
				t.Fatal(err)
			}
			conn.send(resp.AppendCommand(nil, args...))
			if got := conn.readReplies(1); got != pairs[i+1] {
				t.Errorf("%s: %q, want %q", pairs[i], got, pairs[i+1])
			}
		}
		return conn
	}
	pubsub := func(kind, ch string, n int64) string {
		return "*3\r\n" + bulkReply(kind) + bulkReply(ch) + intReply(n)
	}
	inMulti := func(name string) string {
		return "-ERR hotkeyproxy: " + name + " inside MULTI is not supported in cluster mode\r\n"
	}

	// First, while no other client is connected: SUBSCRIBE without a
	// channel once emptied the proxy's count of subscriptions, so the
	// client hung and its session outlived it.
	t.Run("SubscribeNoArgsHang", func(t *testing.T) {
		same(t, pipe("SUBSCRIBE ch", "SUBSCRIBE", "UNSUBSCRIBE"), pipe("PING"), closeConn(0))
		waitFor(t, func() bool { return e.Proxy.Clients() == 0 })
	})

	// The last UNSUBSCRIBE sometimes closed the client (a race between
	// the end of the stream and the relay), so many times over.
	t.Run("UnsubscribeRandomClose", func(t *testing.T) {
		var steps []corpusStep
		for i := range 300 {
			steps = append(steps, on(i, pipe("SUBSCRIBE ch", "PING", "UNSUBSCRIBE ch", "SET "+a+" 1", "GET "+a))...)
			steps = append(steps, closeConn(i))
		}
		same(t, steps...)
	})

	// A shard channel on another master than the one the client streams
	// from gets CROSSSLOT and is not counted.
	t.Run("SsubscribeOtherMaster", func(t *testing.T) {
		exchange(t, e.ProxyAddr(),
			"SSUBSCRIBE "+a, pubsub("ssubscribe", a, 1),
			"SSUBSCRIBE "+b, crossSlotReply,
			"SUNSUBSCRIBE "+a, pubsub("sunsubscribe", a, 0),
			"SUNSUBSCRIBE "+b, pubsub("sunsubscribe", b, 0),
			"SET "+a+" 1", "+OK\r\n",
			"GET "+a, "$1\r\n1\r\n",
			"SET "+b+" 2", "+OK\r\n",
			"GET "+b, "$1\r\n2\r\n")
	})

	t.Run("WatchThenBlockingElsewhere", func(t *testing.T) {
		// A blocking command on another master keeps the WATCH…
		t.Run("BLPOP", func(t *testing.T) {
			same(t, cmds("WATCH "+a, "BLPOP "+b+" 0.05", "MULTI", "SET "+a+" 1", "EXEC", "GET "+a)...)
			// … which still sees another client's write.
			same(t, slices.Concat(
				cmds("WATCH "+a, "BLPOP "+b+" 0.05"),
				on(1, pipe("SET "+a+" 2")),
				cmds("MULTI", "SET "+a+" 1", "EXEC", "GET "+a))...)
		})
		// A subscription on another master takes the connection that
		// held the WATCH: the transaction fails as if a watched key had
		// changed; the next one runs.
		t.Run("SUBSCRIBE", func(t *testing.T) {
			exchange(t, e.ProxyAddr(),
				"WATCH "+b, "+OK\r\n",
				"SUBSCRIBE ch", pubsub("subscribe", "ch", 1),
				"UNSUBSCRIBE ch", pubsub("unsubscribe", "ch", 0),
				"MULTI", "+OK\r\n",
				"SET "+b+" 1", "+QUEUED\r\n",
				"EXEC", "*-1\r\n",
				"GET "+b, "$-1\r\n",
				"MULTI", "+OK\r\n",
				"SET "+b+" 2", "+QUEUED\r\n",
				"EXEC", "*1\r\n+OK\r\n",
				"GET "+b, "$1\r\n2\r\n")
		})
	})

	// SUBSCRIBE inside MULTI is refused, the transaction aborts and the
	// client is not left in subscribe mode.
	t.Run("SubscribeInsideMulti", func(t *testing.T) {
		for _, end := range []string{"EXEC", "DISCARD"} {
			endReply := execAbortReply
			if end == "DISCARD" {
				endReply = "+OK\r\n"
			}
			exchange(t, e.ProxyAddr(),
				"MULTI", "+OK\r\n",
				"SUBSCRIBE ch", inMulti("SUBSCRIBE"),
				end, endReply,
				"SET "+b+" 1", "+OK\r\n",
				"GET "+c, "$-1\r\n",
				"GET "+b, "$1\r\n1\r\n",
				"PING", "+PONG\r\n")
		}
	})

	// Commands that act on every master are refused inside MULTI (which
	// runs on one): EXEC aborts and nothing happened on any master.
	t.Run("WholeClusterInsideMulti", func(t *testing.T) {
		keys := []string{a, b, c}
		body := `"return 7"`
		for _, cmd := range []struct{ line, name string }{
			{"FLUSHALL", "FLUSHALL"}, {"FLUSHDB", "FLUSHDB"}, {"DBSIZE", "DBSIZE"}, {"KEYS *", "KEYS"},
			{"SCAN 0", "SCAN"}, {"SCRIPT LOAD " + body, "SCRIPT LOAD"}, {"RANDOMKEY", "RANDOMKEY"},
		} {
			t.Run(cmd.name, func(t *testing.T) {
				exchange(t, e.ProxyAddr(),
					"SET "+a+" 1", "+OK\r\n",
					"SET "+b+" 1", "+OK\r\n",
					"SET "+c+" 1", "+OK\r\n",
					"MULTI", "+OK\r\n",
					cmd.line, inMulti(cmd.name),
					"SET "+a+" 2", "+QUEUED\r\n",
					"EXEC", execAbortReply,
					"DBSIZE", ":3\r\n",
					"GET "+a, "$1\r\n1\r\n")
				for i, m := range l.masters {
					if r := nodeDo(t, m, "EXISTS", keys[i]); r != ":1\r\n" {
						t.Errorf("EXISTS %s on master %d: %q, want :1", keys[i], i, r)
					}
					if r := nodeDo(t, m, "SCRIPT", "EXISTS", sha1Hex("return 7")); r != "*1\r\n:0\r\n" {
						t.Errorf("SCRIPT EXISTS on master %d: %q, want the script unknown", i, r)
					}
				}
			})
		}
	})

	// ROLE once named the master's replicas; each client's master in turn.
	t.Run("RoleLeaksReplica", func(t *testing.T) {
		var steps []corpusStep
		for i := range len(l.masters) {
			steps = append(steps, on(i, pipe("ROLE"))...)
		}
		same(t, steps...)
	})

	// WATCH inside MULTI is refused and queues nothing; its key does not
	// decide the transaction's slot.
	t.Run("WatchInsideMulti", func(t *testing.T) {
		same(t, cmds("MULTI", "WATCH "+a, "SET "+b+" 1", "EXEC", "GET "+b)...)
	})

	// MSET, MGET and DEL of 100,000 keys in every slot, split and merged.
	t.Run("HundredThousandKeys", func(t *testing.T) {
		const n = 100000
		mset, mget, del := [][]byte{[]byte("MSET")}, [][]byte{[]byte("MGET")}, [][]byte{[]byte("DEL")}
		values := []byte("*" + strconv.Itoa(n) + "\r\n")
		for i := range n {
			k, v := []byte("key:"+strconv.Itoa(i)), "v"+strconv.Itoa(i)
			mset = append(mset, k, []byte(v))
			mget, del = append(mget, k), append(del, k)
			values = append(values, bulkReply(v)...)
		}
		for _, m := range l.masters {
			corpusReset(t, m)
		}
		conn := dialRaw(t, e.ProxyAddr())
		for _, step := range []struct {
			args [][]byte
			want string
		}{
			{mset, "+OK\r\n"}, {mget, string(values)}, {del, intReply(n)}, {[][]byte{[]byte("DBSIZE")}, ":0\r\n"},
		} {
			conn.send(resp.AppendCommand(nil, step.args...))
			if got := conn.readReplies(1); got != step.want {
				t.Errorf("%s of %d keys: %s, want %s (differ at byte %d)",
					step.args[0], n, corpusQuote(got), corpusQuote(step.want), firstDiff(got, step.want))
			}
		}
	})

	// Shutdown returns before its deadline, without error, whatever a
	// client holds: what it had sent is answered, then it is closed.
	t.Run("ShutdownWithClientsHeld", func(t *testing.T) {
		for _, held := range []struct {
			name  string
			pairs []string // what the client does first
			block string   // then sends, without reading the reply
			last  string   // what it reads until the proxy closes it
		}{
			{name: "MULTI", pairs: []string{"MULTI", "+OK\r\n", "SET " + a + " 1", "+QUEUED\r\n"}},
			{name: "WATCH", pairs: []string{"WATCH " + b, "+OK\r\n"}},
			{name: "SUBSCRIBE", pairs: []string{"SUBSCRIBE ch", pubsub("subscribe", "ch", 1)}},
			{name: "SSUBSCRIBE", pairs: []string{"SSUBSCRIBE " + c, pubsub("ssubscribe", c, 1)}},
			{name: "BLPOP", block: "BLPOP " + b + " 0.5", last: "*-1\r\n"},
			{name: "idle", pairs: []string{"PING", "+PONG\r\n"}},
		} {
			t.Run(held.name, func(t *testing.T) {
				srv := startProxy(t, clusterProxyConfig(t, e.Cluster.Seeds()))
				conn := exchange(t, srv.Addr().String(), held.pairs...)
				if held.block != "" {
					args, _ := corpusArgs(held.block)
					conn.send(resp.AppendCommand(nil, args...))
					corpusWaitBlocked(t, l.masters, 1)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				start := time.Now()
				if err := srv.Shutdown(ctx); err != nil {
					t.Errorf("Shutdown with a client in %s: %v after %v", held.name, err, time.Since(start))
				}
				if got := conn.readUntilClose(); got != held.last {
					t.Errorf("the client then read %q, want %q", got, held.last)
				}
				// Nothing queued ran.
				if r := nodeDo(t, l.masters[0], "EXISTS", a); r != ":0\r\n" {
					t.Errorf("EXISTS %s: %q after the proxy stopped", a, r)
				}
			})
		}
	})

	// Last, as it moves slots (and back): a transaction, a WATCH and an
	// SSUBSCRIBE whose slot moved since the proxy loaded its map follow
	// the MOVED, which never reaches the client. Each moves a slot of its
	// own, which the map, loaded at start, still puts on the first master.
	t.Run("StaleMapMovedLeaks", func(t *testing.T) {
		masters, err := e.Cluster.Masters()
		if err != nil {
			t.Fatal(err)
		}
		byAddr := map[string]*localredis.Server{}
		for _, m := range masters {
			byAddr[m.Addr()] = m
		}
		from, to := byAddr[l.masters[0]], byAddr[l.masters[1]]
		if from == nil || to == nil {
			t.Fatalf("masters %v, layout %v", masters, l.masters)
		}
		slots := []int{100, 101, 102} // served by the first master
		key := func(slot int) string { return tagFor(slot) + "k" }
		migrateSlot(t, e.Cluster, masters, slots[0], from, to)
		k := key(slots[0])
		same(t, cmds("MULTI", "SET "+k+" 1", "EXEC", "GET "+k)...)
		migrateSlot(t, e.Cluster, masters, slots[1], from, to)
		k = key(slots[1])
		same(t, cmds("WATCH "+k, "MULTI", "SET "+k+" 2", "EXEC", "GET "+k)...)
		migrateSlot(t, e.Cluster, masters, slots[2], from, to)
		k = key(slots[2])
		same(t, cmds("SSUBSCRIBE "+k, "SUNSUBSCRIBE "+k, "PING")...)
		// Back where they were, through a map stale again.
		for _, slot := range slots {
			migrateSlot(t, e.Cluster, masters, slot, to, from)
			k := key(slot)
			same(t, cmds("SET "+k+" 3", "GET "+k, "BLPOP "+k+"l 0.01")...)
		}
	})
}
