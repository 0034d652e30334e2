package e2e

import (
	"context"
	"testing"

	"sync"

	"github.com/redis/go-redis/v9"
)

// TestScriptFlush: after SCRIPT FLUSH through the proxy, EVALSHA answers
// NOSCRIPT, in Redis's words, on a plain key and on a hot key alike (the
// proxy forgets what it remembered; in cluster mode the flush reaches
// every master); EVAL then works and makes EVALSHA work again, so a
// client that falls back to EVAL (go-redis's Script.Run, Spring's
// DefaultRedisScript) runs unchanged.
func TestScriptFlush(t *testing.T) {
	const noScript = "-NOSCRIPT No matching script. Please use EVAL.\r\n" // Redis 7.0's shared.noscripterr
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			s := hkStart(t, mode, true, true)
			deduct := hkDeductOne(t, hkScripts(t))
			sha := deduct.SHA1()
			ctx := context.Background()
			c := dialRaw(t, s.a.addr)
			for _, k := range []string{"plain", "stock:flush"} {
				if got := c.do("SET", k, "10"); got != "+OK\r\n" {
					t.Fatalf("SET %s: %q", k, got)
				}
			}
			heldAnywhere := func() bool {
				t.Helper()
				var mu sync.Mutex
				held := false
				forEachMaster(t, s.direct, func(m *redis.Client) error {
					ok, err := m.ScriptExists(ctx, sha).Result()
					mu.Lock()
					defer mu.Unlock()
					held = held || err != nil || ok[0]
					return err
				})
				return held
			}
			for _, flush := range [][]string{{"SCRIPT", "FLUSH"}, {"SCRIPT", "FLUSH", "ASYNC"}, {"SCRIPT", "FLUSH", "SYNC"}} {
				for _, k := range []string{"plain", "stock:flush"} {
					if got := c.do("EVAL", deduct.Body, "1", k); got[0] != ':' {
						t.Fatalf("EVAL on %s: %q", k, got)
					}
					if got := c.do("EVALSHA", sha, "1", k); got[0] != ':' {
						t.Fatalf("EVALSHA on %s before %v: %q", k, flush, got)
					}
				}
				if got := c.do(flush...); got != "+OK\r\n" {
					t.Fatalf("%v: %q", flush, got)
				}
				if heldAnywhere() {
					t.Fatalf("a master still holds the script after %v", flush)
				}
				before := c.do("GET", "stock:flush")
				for _, k := range []string{"plain", "stock:flush"} {
					if got := c.do("EVALSHA", sha, "1", k); got != noScript {
						t.Errorf("EVALSHA on %s after %v: %q, want %q", k, flush, got, noScript)
					}
				}
				if after := c.do("GET", "stock:flush"); after != before {
					t.Errorf("the hot key's NOSCRIPT took stock: %q, then %q", before, after)
				}
				if got := c.do("SCRIPT", "EXISTS", sha); got != "*1\r\n:0\r\n" {
					t.Errorf("SCRIPT EXISTS after %v: %q", flush, got)
				}
				for _, k := range []string{"plain", "stock:flush"} {
					if got := c.do("EVAL", deduct.Body, "1", k); got[0] != ':' {
						t.Fatalf("EVAL on %s after %v: %q", k, flush, got)
					}
					if got := c.do("EVALSHA", sha, "1", k); got[0] != ':' {
						t.Errorf("EVALSHA on %s after EVAL: %q", k, got)
					}
				}
			}
			// A real client's fallback: EVALSHA, NOSCRIPT, EVAL.
			gc := redis.NewClient(&redis.Options{Addr: s.a.addr, Protocol: 2, MaxRetries: -1})
			t.Cleanup(func() { gc.Close() })
			script := redis.NewScript(deduct.Body)
			for _, k := range []string{"plain", "stock:flush"} {
				if err := gc.Set(ctx, k, 10, 0).Err(); err != nil {
					t.Fatal(err)
				}
				if err := gc.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				if n, err := script.Run(ctx, gc, []string{k}).Int64(); err != nil || n != 9 {
					t.Errorf("Script.Run on %s after SCRIPT FLUSH: %d, %v; want 9", k, n, err)
				}
			}
		})
	}
}

// TestScriptFlushClusterNodeLacks: in cluster mode, where the proxy loads
// a script it remembers on a node that lacks it (a new master after a
// failover), a hot key's EVALSHA does as a plain key's does: the script
// flushed behind the proxy's back on the key's master only, both run.
func TestScriptFlushClusterNodeLacks(t *testing.T) {
	s := hkStart(t, "cluster", true, true)
	deduct := hkDeductOne(t, hkScripts(t))
	ctx := context.Background()
	c := dialRaw(t, s.a.addr)
	c.do("SCRIPT", "LOAD", deduct.Body)
	for _, k := range []string{"plain", "stock:lacks"} {
		c.do("SET", k, "10")
		cc := s.direct.(*redis.ClusterClient)
		m, err := cc.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		// The hot key's node was seen holding it a moment ago, by none:
		// the proxy asks it now.
		if got := c.do("EVALSHA", deduct.SHA1(), "1", k); got != ":9\r\n" {
			t.Errorf("EVALSHA on %s, its node flushed behind the proxy: %q, want :9", k, got)
		}
	}
}

// forEachMaster calls f, concurrently, with a client of each master of
// the upstream that direct reads (the one server in standalone mode).
func forEachMaster(t *testing.T, direct redis.UniversalClient, f func(*redis.Client) error) {
	t.Helper()
	var err error
	switch d := direct.(type) {
	case *redis.ClusterClient:
		err = d.ForEachMaster(context.Background(), func(_ context.Context, m *redis.Client) error { return f(m) })
	case *redis.Client:
		err = f(d)
	}
	if err != nil {
		t.Fatal(err)
	}
}
