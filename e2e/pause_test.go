package e2e

// CLIENT PAUSE through the proxy holds what Redis holds and nothing more:
// each client a pause holds waits on its own, the other clients' reads go
// on, and nothing it holds times out while the pause lasts.

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// pauseReadTimeout is the proxy's read timeout in these tests: the pauses
// last longer.
const pauseReadTimeout = time.Second

// startPauseEnv is a proxy with one shared connection per db, so that
// every client's requests would queue on it, and a short read timeout.
func startPauseEnv(t *testing.T) *env {
	return startEnv(t, func(c *config.Config) {
		c.Upstream.ReadTimeout = config.Duration(pauseReadTimeout)
		c.Upstream.ConnsPerNode = 1
	})
}

// commands is the RESP of the commands given, each as its words.
func commands(cmds ...string) []byte {
	var req []byte
	for _, c := range cmds {
		var args [][]byte
		for _, w := range strings.Fields(c) {
			args = append(args, []byte(w))
		}
		req = resp.AppendCommand(req, args...)
	}
	return req
}

// TestClientPauseWrite: during CLIENT PAUSE … WRITE, Redis holds each
// client that writes (a pipeline, a transaction's EXEC, a PUBLISH) on its
// own, as it would without the proxy, past the proxy's read timeout; the
// other clients' reads are answered meanwhile; after CLIENT UNPAUSE the
// held clients get their replies, in their order.
func TestClientPauseWrite(t *testing.T) {
	e := startPauseEnv(t)
	direct := dialRaw(t, e.Redis.Addr())
	admin := dialRaw(t, e.ProxyAddr())
	// Redis holds a write queued in MULTI during the pause: queue it before.
	tx := dialRaw(t, e.ProxyAddr())
	if got := tx.do("MULTI") + tx.do("SET", "k2", "v2"); got != "+OK\r\n+QUEUED\r\n" {
		t.Fatalf("MULTI, SET: %q", got)
	}
	if got := admin.do("CLIENT", "PAUSE", "60000", "WRITE"); got != "+OK\r\n" {
		t.Fatalf("CLIENT PAUSE: %q", got)
	}
	t.Cleanup(func() { direct.do("CLIENT", "UNPAUSE") })
	blocked := func(n int) {
		t.Helper()
		want := "\r\nblocked_clients:" + strconv.Itoa(n) + "\r\n"
		waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), want) })
	}

	w := dialRaw(t, e.ProxyAddr())
	w.send(commands("SET k v", "GET k"))
	blocked(1)
	tx.send(commands("EXEC"))
	blocked(2)
	pub := dialRaw(t, e.ProxyAddr())
	pub.send(commands("PUBLISH ch m"))
	blocked(3)

	r := dialRaw(t, e.ProxyAddr())
	for start := time.Now(); time.Since(start) < 2*pauseReadTimeout; time.Sleep(10 * time.Millisecond) {
		if got := r.do("GET", "k"); got != "$-1\r\n" {
			t.Fatalf("GET during the pause: %q, want nil at once", got)
		}
		if got := admin.do("EXISTS", "k2"); got != ":0\r\n" {
			t.Fatalf("EXISTS during the pause: %q, want 0", got)
		}
	}
	if got := admin.do("CLIENT", "UNPAUSE"); got != "+OK\r\n" {
		t.Fatalf("CLIENT UNPAUSE: %q", got)
	}
	for _, c := range []struct {
		name string
		conn *rawConn
		n    int
		want string
	}{
		{"SET, GET", w, 2, "+OK\r\n$1\r\nv\r\n"},
		{"EXEC", tx, 1, "*1\r\n+OK\r\n"},
		{"PUBLISH", pub, 1, ":0\r\n"},
	} {
		if got := c.conn.readReplies(c.n); got != c.want {
			t.Errorf("%s held by the pause: %q, want %q", c.name, got, c.want)
		}
	}
	if got := r.do("GET", "k2"); got != "$2\r\nv2\r\n" {
		t.Errorf("GET k2 after the pause: %q", got)
	}
}

// TestClientPauseAll: CLIENT PAUSE ALL holds every command, CLIENT
// UNPAUSE too, until it ends; what it held then gets Redis's reply, not
// the proxy's timeout, though the pause outlasts the read timeout.
func TestClientPauseAll(t *testing.T) {
	e := startPauseEnv(t)
	admin := dialRaw(t, e.ProxyAddr())
	pause := 5 * pauseReadTimeout / 2
	if got := admin.do("CLIENT", "PAUSE", strconv.Itoa(int(pause.Milliseconds()))); got != "+OK\r\n" {
		t.Fatalf("CLIENT PAUSE: %q", got)
	}
	r := dialRaw(t, e.ProxyAddr())
	r.send(commands("SET k v", "GET k"))
	other := dialRaw(t, e.ProxyAddr())
	other.send(commands("PING"))
	if got := r.readReplies(2); got != "+OK\r\n$1\r\nv\r\n" {
		t.Errorf("SET, GET held by the pause: %q", got)
	}
	if got := other.readReplies(1); got != "+PONG\r\n" {
		t.Errorf("PING held by the pause: %q", got)
	}
}
