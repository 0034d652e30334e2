package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// TestBlockedStreamReaders: a client blocked in XREAD or XREADGROUP BLOCK
// through the proxy gets, byte for byte, what a direct client gets when
// the stream is deleted, changes type, or the db is flushed under it:
// XREADGROUP is unblocked with an error, XREAD goes on blocking.
func TestBlockedStreamReaders(t *testing.T) {
	e := startEnv(t, nil)
	group := [][]string{{"XADD", "s", "666", "f", "v"}, {"XGROUP", "CREATE", "s", "g", "$"}}
	readGroup := []string{"XREADGROUP", "GROUP", "g", "alice", "BLOCK", "0", "STREAMS", "s", ">"}
	read := []string{"XREAD", "BLOCK", "0", "STREAMS", "s", "$"}
	xadd := []string{"XADD", "s", "667", "f", "w"}
	cases := []struct {
		name    string
		setup   [][]string
		block   []string
		changes [][]string
	}{
		{"XREADGROUP, stream deleted", group, readGroup, [][]string{{"DEL", "s"}}},
		{"XREADGROUP, type changed by SET", group, readGroup, [][]string{{"SET", "s", "x"}}},
		{"XREADGROUP, type changed in a transaction", group, readGroup,
			[][]string{{"MULTI"}, {"DEL", "s"}, {"SADD", "s", "e"}, {"EXEC"}}},
		{"XREADGROUP, FLUSHALL", group, readGroup, [][]string{{"FLUSHALL"}}},
		{"XREADGROUP, FLUSHDB", group, readGroup, [][]string{{"FLUSHDB"}}},
		{"XREADGROUP, group destroyed", group, readGroup, [][]string{{"XGROUP", "DESTROY", "s", "g"}, {"XADD", "s", "667", "f", "w"}}},
		{"XREADGROUP BLOCK 2000, stream deleted", group,
			[]string{"XREADGROUP", "GROUP", "g", "alice", "BLOCK", "2000", "STREAMS", "s", ">"}, [][]string{{"DEL", "s"}}},
		{"XREAD, stream deleted, then added to", group[:1], read, [][]string{{"DEL", "s"}, xadd}},
		{"XREAD, type changed by SET, then a stream again", group[:1], read, [][]string{{"SET", "s", "x"}, {"DEL", "s"}, xadd}},
		{"XREAD, FLUSHALL, then added to", group[:1], read, [][]string{{"FLUSHALL"}, xadd}},
		{"XREAD BLOCK 100, stream deleted", group[:1], []string{"XREAD", "BLOCK", "100", "STREAMS", "s", "$"}, [][]string{{"DEL", "s"}}},
	}
	admin := dialRaw(t, e.Redis.Addr())
	run := func(t *testing.T, addr string, setup [][]string, block []string, changes [][]string) string {
		t.Helper()
		admin.do("FLUSHALL")
		for _, c := range setup {
			admin.do(c...)
		}
		c := dialRaw(t, addr)
		c.send(command(block...))
		waitFor(t, func() bool { return strings.Contains(admin.do("INFO", "clients"), "\r\nblocked_clients:1\r\n") })
		for _, ch := range changes {
			admin.do(ch...)
		}
		return c.readReplies(1) + c.do("PING")
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := run(t, e.Redis.Addr(), tc.setup, tc.block, tc.changes)
			if got := run(t, e.ProxyAddr(), tc.setup, tc.block, tc.changes); got != want {
				t.Errorf("through the proxy %q, direct %q", got, want)
			}
		})
	}
}

// TestBlockingCommandWaitsForNoDial: a client's first blocking command
// goes on a connection the proxy dialed before the client sent it, so it
// reaches Redis as soon as a direct client's would, ahead of a command
// another client sends after it on a shared connection. (It used to wait
// for a dial, and a DEL sent after an XREADGROUP BLOCK overtook it: the
// client got NOGROUP instead of UNBLOCKED.)
func TestBlockingCommandWaitsForNoDial(t *testing.T) {
	for _, db := range []string{"0", "9"} {
		t.Run("db "+db, func(t *testing.T) {
			e := startEnv(t, func(c *config.Config) { c.Upstream.ConnsPerNode = 1 })
			admin := dialRaw(t, e.Redis.Addr())
			other := dialRaw(t, e.ProxyAddr())
			other.do("SELECT", db)
			other.do("XADD", "s", "666", "f", "v")
			other.do("XGROUP", "CREATE", "s", "g", "$")
			// The spare of db: a connection of the proxy's in db that ran
			// no command but the dial's SELECT.
			spare := regexp.MustCompile(`(?m) db=` + db + ` .* cmd=(NULL|select) `)
			var before int
			waitFor(t, func() bool {
				list := admin.do("CLIENT", "LIST")
				before = maxClientID(t, list)
				return spare.MatchString(list)
			})
			c := dialRaw(t, e.ProxyAddr())
			c.do("SELECT", db)
			c.send(command("XREADGROUP", "GROUP", "g", "alice", "BLOCK", "0", "STREAMS", "s", ">"))
			var blocked int
			waitFor(t, func() bool {
				blocked = blockedClientID(t, admin.do("CLIENT", "LIST"))
				return blocked > 0
			})
			if blocked > before {
				t.Errorf("the blocked command went on connection %d, dialed after it came (the last before it: %d)", blocked, before)
			}
			other.do("DEL", "s")
			if got, want := c.readReplies(1), "-UNBLOCKED the stream key no longer exists\r\n"; got != want {
				t.Errorf("got %q, want %q", got, want)
			}
		})
	}
}

var clientIDRe = regexp.MustCompile(`(?m)^id=(\d+) .* flags=(\S+) `)

// maxClientID is the highest id in a raw CLIENT LIST reply.
func maxClientID(t *testing.T, list string) int {
	t.Helper()
	top := 0
	for _, m := range clientIDRe.FindAllStringSubmatch(list, -1) {
		id, _ := strconv.Atoi(m[1])
		top = max(top, id)
	}
	return top
}

// blockedClientID is the id of the client flagged blocked in a raw CLIENT
// LIST reply, 0 for none.
func blockedClientID(t *testing.T, list string) int {
	t.Helper()
	for _, m := range clientIDRe.FindAllStringSubmatch(list, -1) {
		if strings.Contains(m[2], "b") {
			id, _ := strconv.Atoi(m[1])
			return id
		}
	}
	return 0
}

// command is args as a RESP request.
func command(args ...string) []byte {
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	return resp.AppendCommand(nil, bs...)
}

// TestSpareClosedByRedis: a spare connection Redis closed while idle (its
// timeout) is not used; the blocking command dials instead.
func TestSpareClosedByRedis(t *testing.T) {
	e := startEnv(t, func(c *config.Config) { c.Upstream.ConnsPerNode = 1 })
	admin := dialRaw(t, e.Redis.Addr())
	c := dialRaw(t, e.ProxyAddr())
	c.do("RPUSH", "l", "a") // the shared connection, and db 0's spare
	waitFor(t, func() bool { return strings.Contains(admin.do("INFO", "clients"), "connected_clients:3\r\n") })
	admin.do("CONFIG", "SET", "timeout", "1")
	waitFor(t, func() bool { return strings.Contains(admin.do("INFO", "clients"), "connected_clients:1\r\n") })
	admin.do("CONFIG", "SET", "timeout", "0")
	if got, want := c.do("BLPOP", "l", "0"), "*2\r\n$1\r\nl\r\n$1\r\na\r\n"; got != want {
		t.Errorf("BLPOP after Redis closed the spare: %q, want %q", got, want)
	}
}
