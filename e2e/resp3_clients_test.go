package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// resp3HotKey is the hot key of the RESP3 client sessions.
const resp3HotKey = "stock:resp3:1"

// withRESP3HotKey marks resp3HotKey hot, in 4 buckets.
func withRESP3HotKey(c *config.Config) {
	c.Hotkeys.Keys = append(c.Hotkeys.Keys, config.KeyRule{Match: resp3HotKey, Buckets: 4, Route: config.RouteRandom})
}

// resp3Proxy starts a proxy over an upstream of mode, with resp3HotKey
// hot, and returns its address.
func resp3Proxy(t *testing.T, mode string) string {
	t.Helper()
	if mode == config.ModeCluster {
		return startClusterEnv(t, withRESP3HotKey).ProxyAddr()
	}
	return startEnv(t, withRESP3HotKey).ProxyAddr()
}

// TestClientsGoRedisRESP3: go-redis v9 with its default options, which
// negotiate RESP3 (HELLO 3 at connect), runs the usual session and what
// RESP3 changes (maps, doubles, sets, nulls, the proxy's own replies, a
// hot key, pub/sub) through the proxy, in both upstream modes.
func TestClientsGoRedisRESP3(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		e := startEnv(t, withRESP3HotKey)
		direct := redis.NewClient(&redis.Options{Addr: e.Redis.Addr(), Protocol: 2})
		t.Cleanup(func() { direct.Close() })
		goRedisRESP3(t, e.ProxyAddr(), direct)
	})
	t.Run("cluster", func(t *testing.T) {
		e := startClusterEnv(t, withRESP3HotKey)
		direct := redis.NewClusterClient(&redis.ClusterOptions{Addrs: e.Cluster.Seeds(), Protocol: 2, MaxRetries: -1})
		t.Cleanup(func() { direct.Close() })
		goRedisRESP3(t, e.ProxyAddr(), direct)
	})
}

func goRedisRESP3(t *testing.T, addr string, direct redis.UniversalClient) {
	rec := &cmdRecorder{}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	rdb.AddHook(rec)
	t.Cleanup(func() { rdb.Close() })
	goRedisSession(t, rdb, direct)
	hello := rec.find("hello")
	if len(hello) == 0 || strings.Contains(hello[0], "->") || !strings.HasPrefix(hello[0], "hello 3") {
		t.Fatalf("go-redis connect-time HELLO: %q; want HELLO 3 accepted", hello)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	t.Run("hello", func(t *testing.T) {
		m, err := rdb.Do(ctx, "HELLO", "3").Result()
		mustOK(t, "HELLO 3", err)
		fields, ok := m.(map[any]any)
		if !ok {
			t.Fatalf("HELLO 3 = %T %v, want a map", m, m)
		}
		equal(t, "HELLO 3 proto", fields["proto"], int64(3))
		equal(t, "HELLO 3 mode", fields["mode"], "standalone")
		id, err := rdb.ClientID(ctx).Result()
		mustOK(t, "CLIENT ID", err)
		if fields["id"] != id {
			t.Errorf("HELLO id %v, CLIENT ID %d on another connection of the pool: want the proxy's ids", fields["id"], id)
		}
	})
	t.Run("types", func(t *testing.T) {
		mustOK(t, "HSET", rdb.HSet(ctx, "r3:h", "a", "1", "b", "2").Err())
		h, err := rdb.HGetAll(ctx, "r3:h").Result()
		mustOK(t, "HGETALL", err)
		equal(t, "HGETALL", h, map[string]string{"a": "1", "b": "2"})
		mustOK(t, "ZADD", rdb.ZAdd(ctx, "r3:z", redis.Z{Score: 1.5, Member: "m"}).Err())
		score, err := rdb.ZScore(ctx, "r3:z", "m").Result()
		mustOK(t, "ZSCORE", err)
		equal(t, "ZSCORE", score, 1.5)
		zs, err := rdb.ZRangeWithScores(ctx, "r3:z", 0, -1).Result()
		mustOK(t, "ZRANGE WITHSCORES", err)
		equal(t, "ZRANGE WITHSCORES", zs, []redis.Z{{Score: 1.5, Member: "m"}})
		raw, err := rdb.Do(ctx, "ZSCORE", "r3:z", "m").Result()
		mustOK(t, "ZSCORE raw", err)
		equal(t, "ZSCORE as a RESP3 double", raw, 1.5)
		mustOK(t, "SADD", rdb.SAdd(ctx, "r3:s", "x").Err())
		set, err := rdb.SMembers(ctx, "r3:s").Result()
		mustOK(t, "SMEMBERS", err)
		equal(t, "SMEMBERS", set, []string{"x"})
		if err := rdb.HGet(ctx, "r3:h", "nope").Err(); err != redis.Nil {
			t.Errorf("HGET of a missing field: %v, want redis.Nil", err)
		}
		cfg, err := rdb.ConfigGet(ctx, "maxmemory-policy").Result()
		mustOK(t, "CONFIG GET", err)
		equal(t, "CONFIG GET", cfg, map[string]string{"maxmemory-policy": "noeviction"})
		info, err := rdb.Info(ctx, "server").Result()
		mustOK(t, "INFO", err)
		if !strings.Contains(info, "redis_version:") || strings.Contains(info, "# Proxy") {
			t.Errorf("INFO server = %.200q", info)
		}
		all, err := rdb.Info(ctx).Result()
		mustOK(t, "INFO", err)
		if !strings.Contains(all, "# Proxy\r\n") || strings.HasPrefix(all, "txt:") {
			t.Errorf("INFO = %.200q…, want Redis's text with the proxy's section", all)
		}
	})
	t.Run("hot-key", func(t *testing.T) {
		if err := rdb.Get(ctx, resp3HotKey).Err(); err != redis.Nil {
			t.Errorf("GET of a missing hot key: %v, want redis.Nil", err)
		}
		mustOK(t, "SET", rdb.Set(ctx, resp3HotKey, 100, 0).Err())
		n, err := rdb.DecrBy(ctx, resp3HotKey, 7).Result()
		mustOK(t, "DECRBY", err)
		equal(t, "DECRBY", n, int64(93))
		v, err := rdb.Get(ctx, resp3HotKey).Result()
		mustOK(t, "GET", err)
		equal(t, "GET", v, "93")
		vals, err := rdb.MGet(ctx, resp3HotKey, "r3:missing").Result()
		mustOK(t, "MGET", err)
		equal(t, "MGET", vals, []any{"93", nil})
		rep, err := rdb.Do(ctx, "PROXY", "HOTKEYS").Result()
		mustOK(t, "PROXY HOTKEYS", err)
		keys, ok := rep.([]any)
		if !ok || len(keys) != 1 {
			t.Fatalf("PROXY HOTKEYS = %v, want one key", rep)
		}
		if m, ok := keys[0].(map[any]any); !ok || m["key"] != resp3HotKey || m["sum"] != "93" {
			t.Errorf("PROXY HOTKEYS key = %v, want a map with key %s, sum 93", keys[0], resp3HotKey)
		}
		pc, err := rdb.Do(ctx, "PROXY", "CONFIG", "GET", "upstream.mode").Result()
		mustOK(t, "PROXY CONFIG GET", err)
		if m, ok := pc.(map[any]any); !ok || len(m) != 1 {
			t.Errorf("PROXY CONFIG GET upstream.mode = %v, want a map of one", pc)
		}
	})
	t.Run("pubsub", func(t *testing.T) {
		ps := rdb.Subscribe(ctx, "r3:ch")
		defer ps.Close()
		if _, err := ps.Receive(ctx); err != nil {
			t.Fatalf("SUBSCRIBE: %v", err)
		}
		ch := ps.Channel()
		mustOK(t, "PUBLISH", rdb.Publish(ctx, "r3:ch", "hi").Err())
		select {
		case m := <-ch:
			equal(t, "message", m.Payload, "hi")
		case <-time.After(clientTimeout):
			t.Fatal("no message")
		}
		// RESP3: a command on the subscribed connection is answered.
		mustOK(t, "PING while subscribed", ps.Ping(ctx, "x"))
	})
}

// TestClientsGoRedisClientSideCache: go-redis v9's client-side cache
// (CLIENT TRACKING on its RESP3 connections) serves a key it read from
// memory and drops it when another client changes the key, with only its
// background drainer reading the idle connection: the invalidation must
// reach the client without it sending anything. No staleness bound backs
// it up. Directly and through the proxy, standalone.
func TestClientsGoRedisClientSideCache(t *testing.T) {
	e := startEnv(t, nil)
	for _, s := range []struct{ what, addr string }{{"direct", e.Redis.Addr()}, {"proxy", e.ProxyAddr()}} {
		t.Run(s.what, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
			defer cancel()
			key := "csc:" + s.what
			w := redis.NewClient(&redis.Options{Addr: s.addr, Protocol: 2, MaxRetries: -1})
			t.Cleanup(func() { w.Close() })
			mustOK(t, "SET", w.Set(ctx, key, "v1", 0).Err())
			csc := redis.NewClient(&redis.Options{Addr: s.addr, Protocol: 3, MaxRetries: -1, PoolSize: 1,
				ClientSideCacheConfig: &redis.ClientSideCacheConfig{MaxEntries: 64}})
			t.Cleanup(func() { csc.Close() })
			for csc.CSCStats().Hits == 0 {
				v, err := csc.Get(ctx, key).Result()
				mustOK(t, "GET", err)
				equal(t, "GET", v, "v1")
			}
			mustOK(t, "SET", w.Set(ctx, key, "v2", 0).Err())
			for {
				v, err := csc.Get(ctx, key).Result()
				mustOK(t, "GET after another client's SET (no invalidation came)", err)
				if v == "v2" {
					break
				}
				equal(t, "GET before the invalidation", v, "v1")
				time.Sleep(time.Millisecond) // the drainer reads meanwhile
			}
		})
	}
}

// TestClientsNodeRedisRESP3 runs clients/node/node_redis_session.js, a
// node-redis session with RESP: 3, through the proxy, both modes.
func TestClientsNodeRedisRESP3(t *testing.T) {
	dir := filepath.Join("clients", "node")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@redis", "client", "package.json")); err != nil {
		t.Fatalf("@redis/client is not installed in e2e/clients/node (%v): run `npm ci --prefix e2e/clients/node` from the repository root", err)
	}
	node := lookTool(t, "node", "Node.js 20 or later")
	for _, mode := range []string{config.ModeStandalone, config.ModeCluster} {
		t.Run(mode, func(t *testing.T) {
			addr := resp3Proxy(t, mode)
			c := newClientCmd(t, node, "node_redis_session.js", proxyPort(t, addr), resp3HotKey)
			c.Dir = dir
			if out := c.run(t); !strings.Contains(out, "\nOK\n") {
				t.Fatal(c.describe(errors.New("exited 0 without printing OK")))
			}
		})
	}
}

// TestRESP3SubscriberHotKey: a RESP3 subscriber's commands on a hot key
// are served with its buckets, between the pushes, both modes.
func TestRESP3SubscriberHotKey(t *testing.T) {
	for _, mode := range []string{config.ModeStandalone, config.ModeCluster} {
		t.Run(mode, func(t *testing.T) {
			addr := resp3Proxy(t, mode)
			c, pub := dialRaw(t, addr), dialRaw(t, addr)
			if r := c.do("HELLO", "3"); !strings.HasPrefix(r, "%7\r\n") {
				t.Fatalf("HELLO 3: %q", r)
			}
			steps := []struct{ args, want string }{
				{"SET " + resp3HotKey + " 10", "+OK\r\n"},
				{"SUBSCRIBE ch", ">3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n"},
				{"DECRBY " + resp3HotKey + " 3", ":7\r\n"},
				{"GET " + resp3HotKey, "$1\r\n7\r\n"},
				{"MGET " + resp3HotKey + " r3:none", "*2\r\n$1\r\n7\r\n_\r\n"},
				{"GET r3:none", "_\r\n"},
				{"DEL " + resp3HotKey, ":1\r\n"},
				{"GET " + resp3HotKey, "_\r\n"},
			}
			for _, s := range steps {
				if got := c.do(strings.Fields(s.args)...); got != s.want {
					t.Errorf("%s while subscribed: %q, want %q", s.args, got, s.want)
				}
			}
			if r := pub.do("PUBLISH", "ch", "m"); r != ":1\r\n" {
				t.Errorf("PUBLISH: %q", r)
			}
			if got := c.readReplies(1); got != ">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nm\r\n" {
				t.Errorf("message: %q", got)
			}
		})
	}
}
