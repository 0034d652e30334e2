package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/localredis"
)

// A proxy that cannot read the command table (COMMAND renamed away) must
// not let a command on a hot key reach Redis as a plain command.
func TestHotKeyWithoutCommandTable(t *testing.T) {
	rs := localredis.StartT(t, localredis.Options{Args: []string{"--rename-command", "COMMAND", ""}})
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
