package e2e

// The real clients of clients_test.go, unchanged, pointed at the proxy
// over a Redis Cluster: to them it is one standalone Redis (issue 3), so
// they run the same sessions, plus what a cluster changes (keys in many
// slots, transactions on one hash tag or across slots, SELECT refused).
// Then go-redis's ClusterClient, a cluster-aware client, is pointed at the
// proxy and at a standalone Redis: it must fare the same with both, and
// never reach a backend node.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
)

func TestClusterClients(t *testing.T) {
	e := startClusterEnv(t, nil)
	addr := e.ProxyAddr()
	port := proxyPort(t, addr)
	masters, err := e.Cluster.Masters()
	if err != nil {
		t.Fatal(err)
	}
	// Each client starts from an empty cluster, as from a fresh server:
	// emptied through the proxy, so that it forgets the scripts it saw,
	// and on each master.
	reset := func(t *testing.T) {
		t.Helper()
		corpusReset(t, addr)
		for _, m := range masters {
			corpusReset(t, m.Addr())
		}
	}
	direct := redis.NewClusterClient(&redis.ClusterOptions{Addrs: e.Cluster.Seeds(), Protocol: 2, MaxRetries: -1})
	t.Cleanup(func() { direct.Close() })

	t.Run("go-redis", func(t *testing.T) {
		reset(t)
		rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, MaxRetries: -1, PoolSize: 20})
		t.Cleanup(func() { rdb.Close() })
		goRedisSession(t, rdb, direct)
		goRedisClusterSession(t, rdb, direct)
	})

	t.Run("go-redis-default-options", func(t *testing.T) {
		// HELLO 3 and CLIENT SETINFO at connect, as against standalone.
		reset(t)
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { rdb.Close() })
		goRedisSession(t, rdb, direct)
	})

	t.Run("go-redis-cluster-client", func(t *testing.T) {
		reset(t)
		clusterClientVersusStandalone(t, addr, e)
	})

	t.Run("redis-py", func(t *testing.T) {
		python := lookPython(t)
		reset(t)
		runRedisPy(t, python, port, "cluster")
	})

	t.Run("ioredis", func(t *testing.T) {
		node, dir := lookIORedis(t)
		reset(t)
		runIORedis(t, node, dir, port, "cluster")
		reset(t)
		runIORedis(t, node, dir, port, "cluster", "resp3")
	})

	t.Run("redis-cli", func(t *testing.T) {
		lookTool(t, "redis-cli", "redis-tools")
		t.Run("commands", func(t *testing.T) {
			reset(t)
			redisCLICommands(t, port, direct)
		})
		t.Run("pipe", func(t *testing.T) {
			reset(t)
			redisCLIPipe(t, port, direct)
		})
		t.Run("eval", func(t *testing.T) {
			reset(t)
			redisCLIEval(t, port)
		})
		t.Run("cluster-flag", func(t *testing.T) {
			// -c follows MOVED and ASK; through the proxy there are none,
			// and keys on every master answer at once.
			reset(t)
			for i := range 30 {
				k := "cli:c:" + strconv.Itoa(i)
				wantOutput(t, "-c set "+k, redisCLI(t, port, nil, "-c", "set", k, strconv.Itoa(i)), "OK\n")
			}
			wantOutput(t, "-c mget", redisCLI(t, port, nil, "-c", "mget", "cli:c:0", "cli:c:29", "cli:c:missing", "cli:c:7"), "0\n29\n\n7\n")
		})
		t.Run("db", func(t *testing.T) {
			// redis-cli selects the db as it connects; a cluster has db 0
			// only and says so, and redis-cli goes on in db 0, as with a
			// Redis Cluster node.
			reset(t)
			out := redisCLI(t, port, nil, "-n", "3", "set", "cli:db", "three")
			wantOutput(t, "-n 3 set over a cluster", out, "SELECT 3 failed: ERR SELECT is not allowed in cluster mode\nOK\n")
			wantOutput(t, "get in db 0", redisCLI(t, port, nil, "get", "cli:db"), "three\n")
		})
	})

	t.Run("redis-benchmark", func(t *testing.T) {
		lookTool(t, "redis-benchmark", "redis-tools")
		reset(t)
		// -r spreads the keys, and MSET's ten, over every master.
		runRedisBenchmark(t, port, []string{"SET", "GET", "MSET (10 keys)", "INCR", "LPUSH", "LPOP"},
			"-q", "-n", "20000", "-c", "20", "-r", "100000", "-t", "set,get,mset,incr,lpush,lpop", "-P", "16")
	})
}

// goRedisClusterSession is what a cluster adds to goRedisSession: keys in
// many slots in one command, pipelines over every master, transactions on
// one hash tag or refused across slots, many goroutines, SCAN.
func goRedisClusterSession(t *testing.T, rdb *redis.Client, direct *redis.ClusterClient) {
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	keys := make([]string, 500)
	for i := range keys {
		keys[i] = "go:m:" + strconv.Itoa(i)
	}

	t.Run("keys-in-many-slots", func(t *testing.T) {
		pairs := make([]any, 0, 2*len(keys))
		for i, k := range keys {
			pairs = append(pairs, k, i)
		}
		mustOK(t, "MSET of 500 keys", rdb.MSet(ctx, pairs...).Err())
		got, err := rdb.MGet(ctx, append(slices.Clone(keys), "go:m:missing", keys[7])...).Result()
		mustOK(t, "MGET of 500 keys", err)
		want := make([]any, 0, len(keys)+2)
		for i := range keys {
			want = append(want, strconv.Itoa(i))
		}
		equal(t, "MGET of 500 keys, a missing one and a repeated one", got, append(want, nil, "7"))
		n, err := direct.Get(ctx, keys[499]).Result()
		mustOK(t, "GET on the cluster", err)
		equal(t, "GET on the cluster", n, "499")

		mustOK(t, "LPUSH", rdb.LPush(ctx, "go:m:list", "x").Err())
		got, err = rdb.MGet(ctx, keys[0], "go:m:list", keys[1]).Result()
		mustOK(t, "MGET with a list among strings", err)
		equal(t, "MGET with a list among strings", got, []any{"0", nil, "1"})
		count := func(what string, cmd *redis.IntCmd, want int64) {
			t.Helper()
			n, err := cmd.Result()
			mustOK(t, what, err)
			equal(t, what, n, want)
		}
		before, err := rdb.DBSize(ctx).Result()
		mustOK(t, "DBSIZE", err)
		count("EXISTS", rdb.Exists(ctx, append(slices.Clone(keys), keys[0], "go:m:list", "go:m:missing")...), 502)
		count("TOUCH", rdb.Touch(ctx, keys[:100]...), 100)
		count("DEL", rdb.Del(ctx, append(slices.Clone(keys[:250]), keys[0], "go:m:missing")...), 250)
		count("UNLINK", rdb.Unlink(ctx, append(slices.Clone(keys), "go:m:list")...), 251)
		count("DBSIZE", rdb.DBSize(ctx), before-501)
	})

	t.Run("pipeline-over-masters", func(t *testing.T) {
		var sets []*redis.StatusCmd
		var gets []*redis.StringCmd
		var mgets []*redis.SliceCmd
		var dels []*redis.IntCmd
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				sets = append(sets, p.Set(ctx, k, i, 0))
				gets = append(gets, p.Get(ctx, k))
				if i%10 == 9 {
					mgets = append(mgets, p.MGet(ctx, keys[i-9:i+1]...))
					dels = append(dels, p.Del(ctx, keys[i-9], keys[i-8], "go:m:missing"))
				}
			}
			return nil
		})
		mustOK(t, "pipeline of 1100 commands", err)
		for i := range keys {
			if sets[i].Val() != "OK" || gets[i].Val() != strconv.Itoa(i) {
				t.Fatalf("pipeline SET/GET %s: %q, %q", keys[i], sets[i].Val(), gets[i].Val())
			}
		}
		for j, m := range mgets {
			want := make([]any, 10)
			for i := range want {
				want[i] = strconv.Itoa(10*j + i)
			}
			equal(t, fmt.Sprintf("pipeline MGET %d", j), m.Val(), want)
			equal(t, fmt.Sprintf("pipeline DEL %d", j), dels[j].Val(), int64(2))
		}
	})

	t.Run("tx-one-hash-tag", func(t *testing.T) {
		var incr *redis.IntCmd
		var mget *redis.SliceCmd
		_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.MSet(ctx, "go:{tx}a", 1, "go:{tx}b", 2)
			incr = p.Incr(ctx, "go:{tx}a")
			mget = p.MGet(ctx, "go:{tx}a", "go:{tx}b", "go:{tx}c")
			p.Del(ctx, "go:{tx}b")
			return nil
		})
		mustOK(t, "MULTI/EXEC on one hash tag", err)
		equal(t, "INCR in MULTI", incr.Val(), int64(2))
		equal(t, "MGET in MULTI", mget.Val(), []any{"2", "2", nil})

		// WATCH on the tag, and another client writes one of the keys.
		err = rdb.Watch(ctx, func(tx *redis.Tx) error {
			if err := rdb.Set(ctx, "go:{tx}c", "meddle", 0).Err(); err != nil {
				return err
			}
			_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Incr(ctx, "go:{tx}a")
				return nil
			})
			return err
		}, "go:{tx}a", "go:{tx}c")
		if err != redis.TxFailedErr {
			t.Errorf("EXEC after a watched key changed: %v, want redis.TxFailedErr", err)
		}
		v, err := direct.Get(ctx, "go:{tx}a").Result()
		mustOK(t, "GET on the cluster", err)
		equal(t, "go:{tx}a after the failed transaction", v, "2")
	})

	t.Run("tx-across-slots", func(t *testing.T) {
		var second *redis.StatusCmd
		_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "go:{a}x", 1, 0)
			second = p.Set(ctx, "go:{b}y", 2, 0)
			return nil
		})
		var rerr redis.Error
		if err == nil || !errors.As(err, &rerr) {
			t.Errorf("MULTI/EXEC across slots: %v, want a Redis error (CROSSSLOT, EXECABORT)", err)
		}
		checkRedisError(t, "SET of a second slot in MULTI", second.Err(), "CROSSSLOT")
		for _, k := range []string{"go:{a}x", "go:{b}y"} {
			n, err := direct.Exists(ctx, k).Result()
			mustOK(t, "EXISTS on the cluster", err)
			equal(t, k+" written by the refused transaction", n, int64(0))
		}
		mustOK(t, "PING after", rdb.Ping(ctx).Err())
	})

	t.Run("concurrency", func(t *testing.T) {
		const workers, n = concWorkers, concIncrs
		concurrentIncrs(t, ctx, rdb)
		for w := range workers {
			k := fmt.Sprintf("go:conc:%d", w)
			if v, err := direct.Get(ctx, k).Result(); err != nil || v != strconv.Itoa(n) {
				t.Errorf("%s on the cluster = %q, %v; want %d", k, v, err, n)
			}
		}
	})

	t.Run("scan", func(t *testing.T) {
		mustOK(t, "FLUSHALL", rdb.FlushAll(ctx).Err())
		for i := range 300 {
			mustOK(t, "SET", rdb.Set(ctx, fmt.Sprintf("go:scan:%d", i), i, 0).Err())
		}
		seen := map[string]int{}
		iter := rdb.Scan(ctx, 0, "go:scan:*", 17).Iterator()
		for iter.Next(ctx) {
			seen[iter.Val()]++
		}
		mustOK(t, "SCAN", iter.Err())
		for i := range 300 {
			if k := fmt.Sprintf("go:scan:%d", i); seen[k] != 1 {
				t.Errorf("SCAN returned %s %d times", k, seen[k])
			}
		}
		equal(t, "keys SCAN returned", len(seen), 300)
	})
}

// clusterClientVersusStandalone points go-redis's ClusterClient at the
// proxy and at a standalone Redis. Both answer CLUSTER SLOTS with "cluster
// support disabled", so the client gets the same error from both; it must
// never dial, or name, a node behind the proxy. Given the proxy as the one
// node serving every slot (ClusterOptions.ClusterSlots, go-redis's way to
// use a cluster client with a standalone server), it works as over one
// standalone Redis.
func clusterClientVersusStandalone(t *testing.T, addr string, e *clusterEnv) {
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	standalone := redistest.Start(t, localredis.Options{})
	var nodes []string
	for _, n := range e.Cluster.Nodes() {
		nodes = append(nodes, n.Addr())
	}

	// dialed records every address a client dials.
	var mu sync.Mutex
	dialed := map[string]bool{}
	dialer := func(ctx context.Context, network, a string) (net.Conn, error) {
		mu.Lock()
		dialed[a] = true
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, network, a)
	}
	newClient := func(target string, edit func(*redis.ClusterOptions)) *redis.ClusterClient {
		opt := &redis.ClusterOptions{Addrs: []string{target}, Protocol: 2, MaxRetries: -1, Dialer: dialer}
		if edit != nil {
			edit(opt)
		}
		c := redis.NewClusterClient(opt)
		t.Cleanup(func() { c.Close() })
		return c
	}
	noNodes := func(t *testing.T, what string, texts ...string) {
		t.Helper()
		for _, s := range texts {
			for _, n := range nodes {
				if strings.Contains(s, n) {
					t.Errorf("%s: names backend node %s: %q", what, n, s)
				}
			}
		}
	}
	errText := func(err error) string {
		if err == nil {
			return "<nil>"
		}
		return err.Error()
	}

	t.Run("discovery", func(t *testing.T) {
		type outcome struct{ set, get, mget, pipe, slots string }
		run := func(c *redis.ClusterClient) outcome {
			var o outcome
			o.set = errText(c.Set(ctx, "go:cc", "v", 0).Err())
			o.get = errText(c.Get(ctx, "go:cc").Err())
			o.mget = errText(c.MGet(ctx, "go:cc", "go:cc2").Err())
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.Incr(ctx, "go:cc:n")
				return nil
			})
			o.pipe = errText(err)
			o.slots = errText(c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }))
			return o
		}
		viaProxy := run(newClient(addr, nil))
		viaStandalone := run(newClient(standalone.Addr(), nil))
		t.Logf("go-redis ClusterClient: via the proxy %+v; via a standalone Redis %+v", viaProxy, viaStandalone)
		if viaProxy != viaStandalone {
			t.Errorf("ClusterClient fares differently with the proxy and with a standalone Redis:\n proxy:      %+v\n standalone: %+v", viaProxy, viaStandalone)
		}
		noNodes(t, "ClusterClient's errors via the proxy", viaProxy.set, viaProxy.get, viaProxy.mget, viaProxy.pipe, viaProxy.slots)
	})

	t.Run("read-only", func(t *testing.T) {
		// READONLY at connect: refused by both, as a standalone Redis
		// refuses it.
		viaProxy := errText(newClient(addr, func(o *redis.ClusterOptions) { o.ReadOnly = true }).Get(ctx, "go:cc").Err())
		viaStandalone := errText(newClient(standalone.Addr(), func(o *redis.ClusterOptions) { o.ReadOnly = true }).Get(ctx, "go:cc").Err())
		t.Logf("ClusterClient with ReadOnly: via the proxy %q; via a standalone Redis %q", viaProxy, viaStandalone)
		if viaProxy != viaStandalone {
			t.Errorf("ClusterClient with ReadOnly: via the proxy %q, via a standalone Redis %q", viaProxy, viaStandalone)
		}
	})

	t.Run("proxy-as-only-node", func(t *testing.T) {
		c := newClient(addr, func(o *redis.ClusterOptions) {
			o.ClusterSlots = func(context.Context) ([]redis.ClusterSlot, error) {
				return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addr}}}}, nil
			}
		})
		pairs := make([]any, 0, 200)
		keys := make([]string, 0, 100)
		for i := range 100 {
			k := "go:only:" + strconv.Itoa(i)
			keys = append(keys, k)
			pairs = append(pairs, k, i)
		}
		mustOK(t, "MSET over many slots", c.MSet(ctx, pairs...).Err())
		vals, err := c.MGet(ctx, keys...).Result()
		mustOK(t, "MGET over many slots", err)
		for i, v := range vals {
			if v != strconv.Itoa(i) {
				t.Fatalf("MGET %s = %v", keys[i], v)
			}
		}
		cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.Incr(ctx, k)
			}
			return nil
		})
		mustOK(t, "pipeline", err)
		equal(t, "last INCR of the pipeline", cmds[99].(*redis.IntCmd).Val(), int64(100))
		var incr *redis.IntCmd
		_, err = c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "go:{only}a", 5, 0)
			incr = p.Incr(ctx, "go:{only}a")
			return nil
		})
		mustOK(t, "MULTI/EXEC on one hash tag", err)
		equal(t, "INCR in MULTI", incr.Val(), int64(6))
		n, err := c.Del(ctx, keys...).Result()
		mustOK(t, "DEL over many slots", err)
		equal(t, "DEL over many slots", n, int64(100))
	})

	mu.Lock()
	defer mu.Unlock()
	for a := range dialed {
		// go-redis swaps a loopback host for the host of the node that
		// answered CLUSTER SLOTS, none with ClusterSlots: ":port".
		if strings.HasPrefix(a, ":") {
			a = "127.0.0.1" + a
		}
		if a != addr && a != standalone.Addr() {
			t.Errorf("ClusterClient dialed %s; the proxy (%s) and the standalone Redis (%s) are all it may know", a, addr, standalone.Addr())
		}
	}
}
