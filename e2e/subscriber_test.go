package e2e

import (
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// TestSubscriberLeavesStream: a client whose last subscription is gone is
// an ordinary client again, as in Redis: its hot keys are rewritten and
// the proxy answers CLIENT for it, rather than Redis on the connection
// that carried the subscription (which would show the layout, Redis's
// ids and Redis's view of the proxy's connections). While a RESP3 client
// is subscribed, the proxy answers its CLIENT commands and rewrites its
// hot keys too, and refuses a transaction it could not run in order.
func TestSubscriberLeavesStream(t *testing.T) {
	const k = "stock:subscriber"
	e := startEnv(t, func(c *config.Config) { c.Hotkeys.Keys = hkRules() })
	setup := dialRaw(t, e.ProxyAddr())
	if got := setup.do("SET", k, "100"); got != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}

	t.Run("resp2", func(t *testing.T) {
		c := dialRaw(t, e.ProxyAddr())
		id := c.do("CLIENT", "ID")
		steps := []struct {
			args []string
			want string
		}{
			{[]string{"SUBSCRIBE", "ch"}, "*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n"},
			{[]string{"GET", k}, "-ERR Can't execute 'get': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n"},
			{[]string{"UNSUBSCRIBE"}, "*3\r\n$11\r\nunsubscribe\r\n$2\r\nch\r\n:0\r\n"},
			{[]string{"GET", k}, "$3\r\n100\r\n"},
			{[]string{"DECR", k}, ":99\r\n"},
			{[]string{"CLIENT", "ID"}, id},
			{[]string{"INCR", k}, ":100\r\n"},
		}
		for _, s := range steps {
			if got := c.do(s.args...); got != s.want {
				t.Errorf("%s: %q, want %q", strings.Join(s.args, " "), got, s.want)
			}
		}
		if info := c.do("CLIENT", "INFO"); !strings.Contains(info, "laddr="+e.ProxyAddr()) {
			t.Errorf("CLIENT INFO after the stream shows another connection: %q", info)
		}
	})

	t.Run("resp3", func(t *testing.T) {
		c := dialRaw(t, e.ProxyAddr())
		id := c.do("CLIENT", "ID")
		if got := c.do("HELLO", "3"); !strings.HasPrefix(got, "%7\r\n") {
			t.Fatalf("HELLO 3: %q", got)
		}
		steps := []struct {
			args []string
			want string
		}{
			{[]string{"SUBSCRIBE", "ch"}, ">3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n"},
			{[]string{"CLIENT", "ID"}, id},
			{[]string{"GET", k}, "$3\r\n100\r\n"},
			{[]string{"DECRBY", k, "2"}, ":98\r\n"},
			{[]string{"MULTI"}, "-ERR hotkeyproxy: MULTI is not supported while subscribed; unsubscribe first\r\n"},
			{[]string{"PING"}, "+PONG\r\n"},
			{[]string{"INCRBY", k, "2"}, ":100\r\n"},
			{[]string{"UNSUBSCRIBE"}, ">3\r\n$11\r\nunsubscribe\r\n$2\r\nch\r\n:0\r\n"},
			{[]string{"MULTI"}, "+OK\r\n"},
			{[]string{"DECR", k}, "+QUEUED\r\n"},
			{[]string{"EXEC"}, "*1\r\n:99\r\n"},
		}
		for _, s := range steps {
			if got := c.do(s.args...); got != s.want {
				t.Errorf("%s: %q, want %q", strings.Join(s.args, " "), got, s.want)
			}
		}
		if info := c.do("CLIENT", "INFO"); !strings.Contains(info, "laddr="+e.ProxyAddr()) {
			t.Errorf("CLIENT INFO while subscribed shows another connection: %q", info)
		}
	})
}

// TestHotKeyInMultiRefusedWhenJournaled: a transaction's step on a hot
// key has no journal entry and no WAIT of its own, so a change of a
// journaled key, or of one whose rule sets wait_replicas, is refused
// inside MULTI (EXEC aborts) rather than made unknown to the journal; a
// read is queued as for any hot key.
func TestHotKeyInMultiRefusedWhenJournaled(t *testing.T) {
	e := startEnv(t, func(c *config.Config) {
		c.Hotkeys.Keys = []config.KeyRule{{Match: "stock:*", Buckets: hkBucketCount, Route: config.RouteRandom, Journal: true}}
	})
	const k = "stock:journaled-tx"
	c := dialRaw(t, e.ProxyAddr())
	steps := []struct {
		args []string
		want string
	}{
		{[]string{"SET", k, "10"}, "+OK\r\n"},
		{[]string{"MULTI"}, "+OK\r\n"},
		{[]string{"GET", k}, "+QUEUED\r\n"},
		{[]string{"DECRBY", k, "3"}, "-ERR hotkeyproxy: '" + k + "' is a hot key held as buckets; DECRBY of it is not supported inside MULTI: it is journaled\r\n"},
		{[]string{"EXEC"}, "-EXECABORT Transaction discarded because of previous errors.\r\n"},
		{[]string{"MULTI"}, "+OK\r\n"},
		{[]string{"GET", k}, "+QUEUED\r\n"},
		{[]string{"EXEC"}, "*1\r\n$2\r\n10\r\n"},
	}
	for _, s := range steps {
		if got := c.do(s.args...); got != s.want {
			t.Errorf("%s: %q, want %q", strings.Join(s.args, " "), got, s.want)
		}
	}
}
