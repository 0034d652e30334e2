package e2e

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// TestHotKeyInMulti: in standalone mode a transaction naming a hot key
// runs atomically with its bucket operations and replies, byte for byte,
// as Redis does with one plain key holding the sum; in cluster mode it is
// refused with a clear error, and EXEC aborts.
func TestHotKeyInMulti(t *testing.T) {
	scripts := hkScripts(t)
	one, n := hkDeductOne(t, scripts), hkDeductN(t, scripts)
	e := startEnv(t, func(c *config.Config) {
		c.Scripts = scripts
		c.Hotkeys.Keys = hkRules()
	})
	const k = "stock:tx"
	cases := []struct {
		name string
		cmds [][]string
	}{
		{"the issue's example", [][]string{{"MULTI"}, {"DECRBY", k, "3"}, {"GET", k}, {"EXEC"}}},
		{"increments and decrements, below zero", [][]string{{"MULTI"}, {"INCR", k}, {"DECR", k}, {"INCRBY", k, "5"},
			{"DECRBY", k, "20"}, {"GET", k}, {"INCRBY", k, "6"}, {"GET", k}, {"EXEC"}}},
		{"deduct scripts", [][]string{{"MULTI"}, {"EVAL", one.Body, "1", k}, {"EVALSHA", n.SHA1(), "1", k, "4"},
			{"EVALSHA", n.SHA1(), "1", k, "100"}, {"GET", k}, {"EXEC"}}},
		{"mixed with plain keys", [][]string{{"MULTI"}, {"SET", "plain", "1"}, {"DECRBY", k, "2"}, {"INCR", "plain"},
			{"GET", k}, {"GET", "plain"}, {"EXEC"}}},
		{"a runtime error in its slot", [][]string{{"MULTI"}, {"DECRBY", k, "abc"}, {"INCRBY", k, "1.5"}, {"GET", k}, {"EXEC"}}},
		{"a wrong number of arguments: EXECABORT", [][]string{{"MULTI"}, {"DECRBY", k}, {"GET", k}, {"EXEC"}, {"GET", k}}},
		{"DISCARD", [][]string{{"MULTI"}, {"DECRBY", k, "1"}, {"DISCARD"}, {"GET", k}}},
		{"expiry", [][]string{{"MULTI"}, {"EXPIRE", k, "100"}, {"TTL", k}, {"PERSIST", k}, {"TTL", k}, {"EXISTS", k}, {"TYPE", k}, {"EXEC"}}},
		{"DEL, then the key anew", [][]string{{"MULTI"}, {"DEL", k}, {"GET", k}, {"DECRBY", k, "2"}, {"GET", k}, {"EXEC"}}},
		{"the stock left after", [][]string{{"DECRBY", k, "1"}, {"GET", k}}},
		{"WATCH, nothing changed", [][]string{{"WATCH", k}, {"GET", k}, {"MULTI"}, {"DECRBY", k, "1"}, {"EXEC"}}},
		{"WATCH, another client deducts", [][]string{{"WATCH", k, "plain"}, {"GET", k}, {"@", "DECRBY", k, "1"},
			{"MULTI"}, {"DECRBY", k, "1"}, {"EXEC"}, {"GET", k}}},
		{"WATCH, another client's transaction deducts", [][]string{{"WATCH", k}, {"@", "MULTI"}, {"@", "DECRBY", k, "4"}, {"@", "EXEC"},
			{"MULTI"}, {"DECRBY", k, "1"}, {"EXEC"}, {"GET", k}}},
		{"UNWATCH", [][]string{{"WATCH", k}, {"@", "DECRBY", k, "1"}, {"UNWATCH"}, {"MULTI"}, {"DECRBY", k, "1"}, {"EXEC"}}},
	}
	run := func(t *testing.T, addr string, cmds [][]string) string {
		t.Helper()
		c, other := dialRaw(t, addr), dialRaw(t, addr)
		c.do("DEL", k, "plain")
		c.do("SCRIPT", "LOAD", n.Body)
		if got := c.do("SET", k, "10"); got != "+OK\r\n" {
			t.Fatalf("SET: %q", got)
		}
		var out strings.Builder
		for _, cmd := range cmds {
			if cmd[0] == "@" { // another client's
				out.WriteString(other.do(cmd[1:]...))
				continue
			}
			out.WriteString(c.do(cmd...))
		}
		return out.String()
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := run(t, e.Redis.Addr(), tc.cmds)
			if got := run(t, e.ProxyAddr(), tc.cmds); got != want {
				t.Errorf("through the proxy, on a hot key:\n%q\ndirect, on a plain key:\n%q", got, want)
			}
		})
	}
	t.Run("SET inside MULTI: refused, EXECABORT", func(t *testing.T) {
		c := dialRaw(t, e.ProxyAddr())
		c.do("MULTI")
		if got := c.do("SET", k, "5"); !strings.HasPrefix(got, "-ERR hotkeyproxy: 'stock:tx' is a hot key held as buckets; SET of it is not supported inside MULTI") {
			t.Errorf("SET in MULTI: %q", got)
		}
		if got := c.do("EXEC"); got != "-EXECABORT Transaction discarded because of previous errors.\r\n" {
			t.Errorf("EXEC: %q", got)
		}
	})
}

// TestHotKeyInMultiCluster: in cluster mode, where a hot key's buckets
// are on several masters, a hot key inside MULTI is refused with an error
// that says why, and EXEC aborts.
func TestHotKeyInMultiCluster(t *testing.T) {
	s := hkStart(t, "cluster", true, true)
	c := dialRaw(t, s.a.addr)
	c.do("SET", "stock:tx", "10")
	c.do("MULTI")
	want := "-ERR hotkeyproxy: 'stock:tx' is a hot key held as buckets; it cannot be used inside MULTI in cluster mode, where its buckets are on several masters\r\n"
	if got := c.do("DECRBY", "stock:tx", "3"); got != want {
		t.Errorf("DECRBY in MULTI: %q, want %q", got, want)
	}
	if got := c.do("EXEC"); got != "-EXECABORT Transaction discarded because of previous errors.\r\n" {
		t.Errorf("EXEC: %q", got)
	}
	if got := c.do("GET", "stock:tx"); got != "$2\r\n10\r\n" {
		t.Errorf("GET after: %q", got)
	}
}

// TestHotKeyInMultiHammer: clients selling one hot key at once, by
// MULTI/DECRBY/EXEC, plain DECRBY and the deduct script, each giving back
// a unit a DECRBY took below zero ("DECR; if < 0, INCR back"), until the
// key reads 0: exactly the stock is sold, never more, and none is left.
func TestHotKeyInMultiHammer(t *testing.T) {
	scripts := hkScripts(t)
	one := hkDeductOne(t, scripts)
	e := startEnv(t, func(c *config.Config) {
		c.Scripts = scripts
		c.Hotkeys.Keys = hkRules()
	})
	const k, stock, clients = "stock:hammer", 600, 12
	setup := dialRaw(t, e.ProxyAddr())
	setup.do("SET", k, strconv.Itoa(stock))
	var sold atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan string, clients)
	for i := range clients {
		c := dialRaw(t, e.ProxyAddr())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				var r string
				switch (i + j) % 3 {
				case 0:
					c.send(command("MULTI"))
					c.send(command("DECRBY", k, "1"))
					c.send(command("EXEC"))
					got := c.readReplies(3)
					if !strings.HasPrefix(got, "+OK\r\n+QUEUED\r\n*1\r\n") {
						errs <- "MULTI/DECRBY/EXEC: " + got
						return
					}
					r = strings.TrimPrefix(got, "+OK\r\n+QUEUED\r\n*1\r\n")
				case 1:
					r = c.do("DECRBY", k, "1")
				case 2:
					r = c.do("EVAL", one.Body, "1", k)
				}
				v, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(r, ":"), "\r\n"), 10, 64)
				switch {
				case err != nil || r[0] != ':':
					errs <- "reply " + r
					return
				case v >= 0:
					sold.Add(1)
					continue
				case (i+j)%3 != 2:
					c.do("INCRBY", k, "1") // the unit a DECRBY took below zero, back
				}
				if c.do("GET", k) == "$1\r\n0\r\n" {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for msg := range errs {
		t.Error(msg)
	}
	if got := sold.Load(); got != stock {
		t.Errorf("sold %d, want exactly the stock, %d", got, stock)
	}
	if got := setup.do("GET", k); got != "$1\r\n0\r\n" {
		t.Errorf("left: %q, want 0", got)
	}
}
