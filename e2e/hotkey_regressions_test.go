package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
)

// A proxy that cannot read the command table (COMMAND renamed away) must
// not let a command on a hot key reach Redis as a plain command.
func TestHotKeyWithoutCommandTable(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{Args: []string{"--rename-command", "COMMAND", ""}})
	cfg := testConfig(t, config.ModeStandalone, []string{rs.Addr()}, func(cfg *config.Config) {
		cfg.Hotkeys.Keys = hkRules()
		cfg.Scripts = hkScripts(t)
	})
	c := dialRaw(t, startProxy(t, cfg).Addr().String())
	for _, cmd := range [][]string{{"SET", "stock:x", "10"}, {"EVAL", cfg.Scripts[0].Body, "1", "stock:x"}, {"DECR", "stock:x"}, {"HSET", "stock:y", "f", "v"}} {
		if r := c.do(cmd...); !strings.HasPrefix(r, "-ERR hotkeyproxy: 'stock:") {
			t.Errorf("%s: %q, want the proxy's refusal", cmd[0], r)
		}
	}
	if r := c.do("SET", "plain", "1"); r != "+OK\r\n" {
		t.Errorf("a plain key: %q", r)
	}
	if r := dialRaw(t, rs.Addr()).do("KEYS", "stock:*"); r != "*0\r\n" {
		t.Errorf("hot keys written as plain keys: %q", r)
	}
}

// "DECR; if < 0, INCR back" with the DECRs through proxy B and the INCR
// through proxy A, which last saw bucket 0 holding stock: the give-back
// must repay bucket 0's debt, not add stock elsewhere, so the next DECR
// still finds nothing, as on a plain key.
func TestHotKeyGiveBackAcrossProxies(t *testing.T) {
	s := hkStart(t, "standalone", true, true)
	a, b := dialRaw(t, s.a.addr), dialRaw(t, s.b.addr)
	for round := 0; round < 10; round++ {
		key := fmt.Sprintf("stock:stale:%d", round)
		a.do("SET", key, "8")
		for i := 0; i < 8; i++ {
			b.do("DECR", key)
		}
		if r := b.do("DECR", key); r != ":-1\r\n" {
			t.Fatalf("round %d: DECR past the stock = %q, want :-1", round, r)
		}
		a.do("INCR", key)
		if r := a.do("DECR", key); r != ":-1\r\n" {
			t.Errorf("round %d: DECR after the give-back = %q, want :-1 (buckets %s)", round, r, s.readBuckets(t, key))
		}
		if r := a.do("GET", key); r != "$2\r\n-1\r\n" {
			t.Errorf("round %d: GET = %q, want -1", round, r)
		}
	}
}

// Found by an attack pass on live sharding and learning (issue 5), each
// on two proxies that share no rule for the keys.
func TestHotKeyShardRegressions(t *testing.T) {
	s := hkStart(t, "standalone", false, false)
	a, b := dialRaw(t, s.a.addr), dialRaw(t, s.b.addr)
	ctx := context.Background()
	deductOne := hkDeductOne(t, hkScripts(t))

	t.Run("malformed layouts", func(t *testing.T) {
		// A value that starts like a layout but is not one as the proxy
		// writes it: 2000 tags (a proxy crashed on it), two spaces, a
		// signed fill (a GET looped on them). Answered as the plain
		// value it is, at once.
		for i, v := range []string{
			rewrite.MarkerPrefix + "ab:" + strings.TrimSpace(strings.Repeat("1 ", 2000)),
			rewrite.MarkerPrefix + "ab:1  2", rewrite.MarkerPrefix + "ab:1 2:+5",
		} {
			k := fmt.Sprintf("odd:%d", i)
			a.do("SET", k, v)
			if r := a.do("GET", k); r != hkmBulk(v) {
				t.Errorf("GET of %.40q…: %.80q, want the value", v, r)
			}
		}
		if r := a.do("PING"); r != "+PONG\r\n" {
			t.Fatalf("the proxy after the malformed layouts: %q", r)
		}
	})

	t.Run("two UNSHARDs at once", func(t *testing.T) {
		for round := range 5 { // each UNSHARD waits about a second
			k := fmt.Sprintf("race:%d", round)
			a.do("SET", k, "1000")
			a.do("PROXY", "SHARD", k)
			b.do("GET", k) // B knows the layout too
			var wg sync.WaitGroup
			replies := make([]string, 2)
			for i, p := range []hkProxy{s.a, s.b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := hkDial(p.addr)
					if err != nil {
						replies[i] = err.Error()
						return
					}
					defer c.close()
					replies[i], _ = c.doStr("PROXY", "UNSHARD", k)
				}()
			}
			wg.Wait()
			if v := s.direct.Get(ctx, k).Val(); v != "1000" {
				t.Fatalf("round %d: %s holds %q after two UNSHARDs (%q), want 1000", round, k, v, replies)
			}
		}
	})

	t.Run("no false sold-out after UNSHARD missed", func(t *testing.T) {
		const k = "missed"
		a.do("DEL", k)
		b.do("SCRIPT", "LOAD", deductOne.Body)
		a.do("PROXY", "SHARD", k) // made, holding 0
		b.do("GET", k)            // B learns every bucket at 0
		// B misses the news of the merge (its subscription is cut).
		s.direct.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub")
		a.do("INCRBY", k, "10")
		if r := a.do("PROXY", "UNSHARD", k); r != "+OK\r\n" {
			t.Fatalf("UNSHARD: %q", r)
		}
		if r := b.do("EVALSHA", deductOne.SHA1(), "1", k); r != ":9\r\n" {
			t.Errorf("deduct through the proxy that missed the merge: %q, want :9 (the key holds 10)", r)
		}
	})

	t.Run("news is checked", func(t *testing.T) {
		// Anyone can publish on the layout channel: what names no layout
		// is not learned (it cost memory and metric series).
		for i := range 200 {
			s.direct.Publish(ctx, rewrite.LayoutChannel, fmt.Sprintf("+junk:%d", i))
		}
		b.do("PING")
		time.Sleep(200 * time.Millisecond)
		if r := b.do("PROXY", "HOTKEYS"); strings.Contains(r, "junk:") {
			t.Errorf("PROXY HOTKEYS lists keys only published: %.200q", r)
		}
	})

	t.Run("a client on its own connection learns", func(t *testing.T) {
		const k = "pinned"
		a.do("SET", k, "50")
		a.do("PROXY", "SHARD", k)
		late := dialRaw(t, startProxy(t, testConfig(t, config.ModeStandalone, []string{s.direct.(*redis.Client).Options().Addr}, nil)).Addr().String())
		late.do("MULTI")
		late.do("EXEC") // from here on, the client has an upstream connection of its own
		if r := late.do("GET", k); r != hkmBulk("50") {
			t.Errorf("GET after MULTI/EXEC on a proxy that never heard of the layout: %q, want 50", r)
		}
		if r := late.do("DECR", k); r != ":49\r\n" {
			t.Errorf("DECR after it: %q, want :49", r)
		}
	})

	t.Run("failed scripts are not run again", func(t *testing.T) {
		// A script that writes, then fails with an error that reads like
		// a layout's: the proxy must not send it again (it ran 4 times).
		a.do("SET", "cnt", "0")
		body := "redis.call('incr', KEYS[1]) return redis.error_reply('ERR value is not an integer or out of range')"
		a.do("EVAL", body, "1", "cnt")
		if v := s.direct.Get(ctx, "cnt").Val(); v != "1" {
			t.Errorf("a failing script that INCRs ran until cnt = %s, want once", v)
		}
	})

	t.Run("SET replaces the layout", func(t *testing.T) {
		const k = "reset"
		a.do("SET", k, "80")
		a.do("PROXY", "SHARD", k)
		before := s.readBuckets(t, k)
		b.do("SET", k, "1000") // B learns it from the news, and SETs it
		after := s.readBuckets(t, k)
		if after.sum != 1000 || after.layout.Gen == before.layout.Gen || len(after.strays) > 0 {
			t.Errorf("after SET 1000: %s (gen %s, was %s), want 1000 in a new layout and the old buckets gone", after, after.layout.Gen, before.layout.Gen)
		}
	})

	t.Run("SELECT on a client's own connection", func(t *testing.T) {
		c := dialRaw(t, s.a.addr)
		c.do("MULTI")
		c.do("EXEC") // own connection from here on: SELECT goes to Redis
		c.do("SELECT", "1")
		if r := c.do("PROXY", "SHARD", "y"); !strings.Contains(r, "db 0") {
			t.Errorf("PROXY SHARD after MULTI/EXEC and SELECT 1: %q, want a refusal naming db 0", r)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		a.do("SELECT", "1")
		if r := a.do("PROXY", "SHARD", "x"); !strings.Contains(r, "db 0") {
			t.Errorf("PROXY SHARD in db 1: %q, want a refusal naming db 0", r)
		}
		a.do("SELECT", "0")
		a.do("MULTI")
		if r := a.do("PROXY", "SHARD", "x"); !strings.HasPrefix(r, "-ERR PROXY SHARD is not allowed inside MULTI") {
			t.Errorf("PROXY SHARD in MULTI: %q", r)
		}
		if r := a.do("EXEC"); !strings.HasPrefix(r, "-EXECABORT") {
			t.Errorf("EXEC after a refused PROXY: %q", r)
		}
		a.do("SET", "big", "9007199254740993")
		if r := a.do("PROXY", "SHARD", "big"); !strings.Contains(r, "2^53") {
			t.Errorf("PROXY SHARD of a value beyond 2^53: %q, want a refusal", r)
		}
		a.do("SET", "zeros", "0005") // not an integer to Redis
		if r := a.do("PROXY", "SHARD", "zeros"); !strings.HasPrefix(r, "-ERR") {
			t.Errorf("PROXY SHARD of \"0005\": %q, want a refusal", r)
		}
		if r := a.do("PROXY", "CONFIG"); r != "-ERR wrong number of arguments for 'proxy|config' command\r\n" {
			t.Errorf("PROXY CONFIG: %q", r)
		}
	})
}
