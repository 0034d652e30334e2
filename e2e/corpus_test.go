package e2e

import (
	"bufio"
	"flag"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// TestCorpus sends the same byte sequences to a redis-server directly and
// through the proxy (whose upstream is a second redis-server of the same
// version, emptied the same way before each case) and compares the raw
// reply bytes exactly. Replies that legitimately differ behind a proxy
// (client ids, INFO, CLIENT LIST) are checked for structure only.
func TestCorpus(t *testing.T) {
	e := startEnv(t, nil)
	ref := redistest.Start(t, localredis.Options{})
	direct := corpusTarget{addr: ref.Addr(), servers: []string{ref.Addr()}}
	proxied := corpusTarget{addr: e.ProxyAddr(), servers: []string{e.Redis.Addr()}}

	cases := corpusCases()
	corpusCheckNames(t, cases)
	ran := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ran++
			want, got := corpusRunCase(t, c, direct, proxied)
			for i, s := range c.steps {
				corpusCompare(t, i, s, want[i], got[i])
			}
			corpusCheckServes(t, proxied.addr)
		})
	}
	corpusCheckRan(t, ran, len(cases), 100)
}

// corpusCheckNames fails the test when two cases share a name.
func corpusCheckNames(t *testing.T, cases []corpusCase) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range cases {
		if seen[c.name] {
			t.Fatalf("duplicate case name %q", c.name)
		}
		seen[c.name] = true
	}
}

// corpusRunCase empties both targets' servers, then runs the case on the
// direct target and on the proxied one, and returns their replies.
func corpusRunCase(t *testing.T, c corpusCase, direct, proxied corpusTarget) (want, got [][]string) {
	t.Helper()
	if c.bad != "" {
		t.Fatal(c.bad)
	}
	for _, s := range slices.Concat(direct.servers, proxied.servers) {
		corpusReset(t, s)
	}
	return direct.run(t, c.steps), proxied.run(t, c.steps)
}

// corpusCheckServes checks that, whatever a case did to its own
// connections, the proxy still serves a new client.
func corpusCheckServes(t *testing.T, addr string) {
	t.Helper()
	if r := dialRaw(t, addr).do("PING"); r != "+PONG\r\n" {
		t.Errorf("PING on a new proxy connection after the case: %q", r)
	}
}

// corpusCheckRan checks that every case ran, and more than atLeast, unless
// -run picked some.
func corpusCheckRan(t *testing.T, ran, total, atLeast int) {
	t.Helper()
	if f := flag.Lookup("test.run"); f != nil && strings.Contains(f.Value.String(), "/") {
		return // a subset of cases was asked for
	}
	if ran != total || ran <= atLeast {
		t.Errorf("%d of %d corpus cases ran; want all of them and more than %d", ran, total, atLeast)
	}
}

// corpusUntilClose as a step's reply count reads until the server closes.
const corpusUntilClose = -1

// corpusSilence is how long a silent step waits for bytes that must not come.
const corpusSilence = 50 * time.Millisecond

// corpusStep is one action of a case on one of its connections.
type corpusStep struct {
	conn  int                        // which of the case's connections; each is dialed on first use
	raw   string                     // bytes sent as they are
	cmds  []string                   // commands sent after raw, as multibulk: see corpusArgs
	build func(prev []string) string // if set, bytes to send made from the replies so far
	n     int                        // replies to read, or corpusUntilClose

	silent  bool // after sending, nothing may arrive for corpusSilence
	peek    bool // read what arrives at once, not RESP2 replies (RESP3)
	close   bool // close the connection (before anything else)
	wait    bool // first wait until the server has `blocked` blocked clients
	blocked int

	norm  func(string) string      // applied to both sides before comparing
	check func(d, p string) string // replaces the comparison; returns a complaint
}

type corpusCase struct {
	name  string
	steps []corpusStep
	bad   string // a mistake in the table, reported when the case runs
}

// corpusTarget is where a case runs: clients connect to addr, and servers
// are the redis-servers that execute the commands (emptied before each
// case, and polled for blocked clients): one, or a cluster's masters.
type corpusTarget struct {
	addr    string
	servers []string
	resp3   bool // each connection says HELLO 3 when dialed, before the steps
}

// run executes steps and returns, per step, the replies it read.
func (tg corpusTarget) run(t *testing.T, steps []corpusStep) [][]string {
	t.Helper()
	conns := map[int]*rawConn{}
	conn := func(i int) *rawConn {
		if conns[i] == nil {
			conns[i] = dialRaw(t, tg.addr)
			if !tg.resp3 {
				return conns[i]
			}
			if r := conns[i].do("HELLO", "3"); !strings.HasPrefix(r, "%7\r\n") {
				t.Fatalf("HELLO 3 on %s: %q", tg.addr, r)
			}
		}
		return conns[i]
	}
	var prev []string
	out := make([][]string, len(steps))
	for i, s := range steps {
		if s.wait {
			corpusWaitBlocked(t, tg.servers, s.blocked)
		}
		if s.close {
			if c := conns[s.conn]; c != nil {
				c.nc.Close()
				delete(conns, s.conn)
			}
		}
		req := []byte(s.raw)
		for _, line := range s.cmds {
			args, err := corpusArgs(line)
			if err != nil {
				t.Fatalf("step %d: command %q: %v", i, line, err)
			}
			req = resp.AppendCommand(req, args...)
		}
		if s.build != nil {
			req = append(req, s.build(prev)...)
		}
		if len(req) == 0 && s.n == 0 && !s.silent {
			continue
		}
		c := conn(s.conn)
		if len(req) > 0 {
			c.send(req)
		}
		switch {
		case s.silent:
			out[i] = []string{corpusReadSilence(c)}
		case s.peek:
			out[i] = []string{corpusPeek(c)}
		case s.n == corpusUntilClose:
			out[i] = []string{c.readUntilClose()}
			c.nc.Close()
			delete(conns, s.conn)
		default:
			for range s.n {
				out[i] = append(out[i], c.readReplies(1))
			}
		}
		prev = append(prev, out[i]...)
	}
	return out
}

// corpusReadSilence returns "" if nothing arrives for corpusSilence, and
// otherwise what arrived.
func corpusReadSilence(c *rawConn) string {
	c.nc.SetReadDeadline(time.Now().Add(corpusSilence))
	buf := make([]byte, 4096)
	n, _ := c.br.Read(buf)
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("unexpected bytes: %q", buf[:n])
}

// corpusPeek waits for the first bytes and returns those that came with them.
func corpusPeek(c *rawConn) string {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.br.Peek(1); err != nil {
		c.t.Fatalf("waiting for a reply: %v", err)
	}
	b, _ := c.br.Peek(c.br.Buffered())
	c.br.Discard(len(b))
	return string(b)
}

// corpusReset empties a server: data, scripts and functions.
func corpusReset(t *testing.T, addr string) {
	t.Helper()
	c := dialRaw(t, addr)
	for _, cmd := range [][]string{{"FLUSHALL"}, {"SCRIPT", "FLUSH"}, {"FUNCTION", "FLUSH"}} {
		if r := c.do(cmd...); r != "+OK\r\n" {
			t.Fatalf("%v on %s: %q", cmd, addr, r)
		}
	}
	c.nc.Close()
}

var corpusBlockedRE = regexp.MustCompile(`blocked_clients:(\d+)`)

// corpusWaitBlocked waits until the servers at addrs have n blocked
// clients in all.
func corpusWaitBlocked(t *testing.T, addrs []string, n int) {
	t.Helper()
	conns := make([]*rawConn, len(addrs))
	for i, a := range addrs {
		conns[i] = dialRaw(t, a)
		defer conns[i].nc.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		sum, counts := 0, make([]string, len(conns))
		for i, c := range conns {
			counts[i] = "?"
			if m := corpusBlockedRE.FindStringSubmatch(c.do("INFO", "clients")); m != nil {
				counts[i] = m[1]
				k, _ := strconv.Atoi(m[1])
				sum += k
			}
		}
		if sum == n && !slices.Contains(counts, "?") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %d blocked clients on %v: have %v", n, addrs, counts)
		}
		time.Sleep(time.Millisecond)
	}
}

func corpusCompare(t *testing.T, i int, s corpusStep, want, got []string) {
	t.Helper()
	d, p := strings.Join(want, ""), strings.Join(got, "")
	if s.norm != nil {
		d, p = s.norm(d), s.norm(p)
	}
	sent := s.raw + strings.Join(s.cmds, " | ")
	if s.build != nil {
		sent += " (+ bytes built from earlier replies)"
	}
	if s.check != nil {
		if msg := s.check(d, p); msg != "" {
			t.Errorf("step %d (conn %d) sent %s: %s\n direct: %s\n proxy:  %s",
				i, s.conn, corpusQuote(sent), msg, corpusQuote(d), corpusQuote(p))
		}
		return
	}
	if d == p {
		return
	}
	at := 0
	for at < len(d) && at < len(p) && d[at] == p[at] {
		at++
	}
	t.Errorf("step %d (conn %d) sent %s: replies differ at byte %d (direct %d bytes, proxy %d bytes)\n direct: %s\n proxy:  %s",
		i, s.conn, corpusQuote(sent), at, len(d), len(p), corpusQuote(d), corpusQuote(p))
}

// corpusQuote quotes s, cut to a readable length.
func corpusQuote(s string) string {
	const max = 400
	if len(s) > max {
		return fmt.Sprintf("%q… (%d bytes)", s[:max], len(s))
	}
	return strconv.Quote(s)
}

// corpusArgs splits a command line on spaces; an argument in double quotes
// is a Go string literal, so "a b", "" and "\x00\r\n\xff" are single
// arguments.
func corpusArgs(line string) ([][]byte, error) {
	var args [][]byte
	for i := 0; i < len(line); {
		switch line[i] {
		case ' ':
			i++
		case '"':
			j := i + 1
			for ; j < len(line) && line[j] != '"'; j++ {
				if line[j] == '\\' {
					j++
				}
			}
			if j >= len(line) {
				return nil, fmt.Errorf("unterminated quote at %d", i)
			}
			a, err := strconv.Unquote(line[i : j+1])
			if err != nil {
				return nil, fmt.Errorf("argument %s: %v", line[i:j+1], err)
			}
			args = append(args, []byte(a))
			i = j + 1
		default:
			j := strings.IndexByte(line[i:], ' ')
			if j < 0 {
				j = len(line) - i
			}
			args = append(args, []byte(line[i:i+j]))
			i += j
		}
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("empty command")
	}
	return args, nil
}

// corpusCmd encodes one command given as separate arguments.
func corpusCmd(args ...string) string {
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	return string(resp.AppendCommand(nil, bs...))
}

// Step constructors.

// cmds sends each command and reads its reply, one at a time.
func cmds(lines ...string) []corpusStep {
	steps := make([]corpusStep, len(lines))
	for i, l := range lines {
		steps[i] = corpusStep{cmds: []string{l}, n: 1}
	}
	return steps
}

// pipe writes all commands at once, then reads all replies.
func pipe(lines ...string) corpusStep { return corpusStep{cmds: lines, n: len(lines)} }

// raw sends bytes and reads n replies (or corpusUntilClose).
func raw(b string, n int) corpusStep { return corpusStep{raw: b, n: n} }

// silent sends bytes that must get no reply yet.
func silent(b string) corpusStep { return corpusStep{raw: b, silent: true} }

// on moves steps to connection conn.
func on(conn int, steps ...corpusStep) []corpusStep {
	out := slices.Clone(steps)
	for i := range out {
		out[i].conn = conn
	}
	return out
}

// sendOnly sends a command without reading its reply (a blocking command).
func sendOnly(conn int, line string) corpusStep {
	return corpusStep{conn: conn, cmds: []string{line}}
}

// readOn reads n replies on conn.
func readOn(conn, n int) corpusStep { return corpusStep{conn: conn, n: n} }

// waitBlocked waits until the server has n blocked clients.
func waitBlocked(n int) corpusStep { return corpusStep{wait: true, blocked: n} }

// closeConn closes a connection of the case.
func closeConn(conn int) corpusStep { return corpusStep{conn: conn, close: true} }

// checked is one command whose reply is checked by check instead of compared.
func checked(line string, check func(d, p string) string) corpusStep {
	return corpusStep{cmds: []string{line}, n: 1, check: check}
}

// normed is one command whose replies are compared after norm.
func normed(line string, norm func(string) string) corpusStep {
	return corpusStep{cmds: []string{line}, n: 1, norm: norm}
}

// tc makes a case from commands (strings: one command, one reply) and steps.
func tc(name string, parts ...any) corpusCase {
	c := corpusCase{name: name}
	for _, p := range parts {
		switch p := p.(type) {
		case string:
			c.steps = append(c.steps, cmds(p)...)
		case corpusStep:
			c.steps = append(c.steps, p)
		case []corpusStep:
			c.steps = append(c.steps, p...)
		default:
			c.bad = fmt.Sprintf("part of type %T", p)
		}
	}
	return c
}

// Reply normalizers and checks.

// corpusElems splits an array reply into its header and raw elements.
func corpusElems(reply string) (header string, elems []string, ok bool) {
	br := bufio.NewReader(strings.NewReader(reply))
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "*") && !strings.HasPrefix(line, "~") {
		return "", nil, false
	}
	n, err := strconv.Atoi(strings.TrimSuffix(line[1:], "\r\n"))
	if err != nil {
		return "", nil, false
	}
	for range n {
		e, err := resp.ReadReply(br, nil)
		if err != nil {
			return "", nil, false
		}
		elems = append(elems, string(e))
	}
	return line, elems, br.Buffered() == 0
}

// sortArray sorts the elements of an array reply (or a RESP3 set): for SMEMBERS and KEYS,
// whose order depends on each server's random hash seed.
func sortArray(reply string) string {
	h, el, ok := corpusElems(reply)
	if !ok {
		return reply
	}
	slices.Sort(el)
	return h + strings.Join(el, "")
}

// sortScanKeys sorts the keys of a SCAN reply.
func sortScanKeys(reply string) string {
	h, el, ok := corpusElems(reply)
	if !ok || len(el) != 2 {
		return reply
	}
	return h + el[0] + sortArray(el[1])
}

var helloIDRE = regexp.MustCompile(`(\$2\r\nid\r\n:)\d+`)

// maskHelloID hides the client id in a HELLO reply.
func maskHelloID(s string) string { return helloIDRE.ReplaceAllString(s, "${1}ID") }

var intReplyRE = regexp.MustCompile(`^:\d+\r\n$`)

// bothInt checks that both replies are non-negative integers.
func bothInt(d, p string) string {
	if !intReplyRE.MatchString(d) || !intReplyRE.MatchString(p) {
		return "want an integer reply from both"
	}
	return ""
}

// bulkWith checks that both replies are bulk strings (verbatim strings in
// RESP3) containing each of subs.
func bulkWith(subs ...string) func(d, p string) string {
	return func(d, p string) string {
		for _, r := range []string{d, p} {
			if r == "" || r[0] != d[0] || d[0] != '$' && d[0] != '=' {
				return "want a bulk reply from both, or a verbatim one"
			}
			for _, s := range subs {
				if !strings.Contains(r, s) {
					return fmt.Sprintf("want %q in both", s)
				}
			}
		}
		return ""
	}
}

// sameArrayLen checks that both are arrays of the same length.
func sameArrayLen(d, p string) string {
	hd, _, okd := corpusElems(d)
	hp, _, okp := corpusElems(p)
	if !okd || !okp || hd != hp || hd == "*0\r\n" {
		return "want non-empty arrays of the same length"
	}
	return ""
}

// corpusBig is a 5 MiB value holding every byte value.
var corpusBig = func() string {
	b := make([]byte, 5<<20)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return string(b)
}()

// corpusCases is the corpus. Names are "group/what".
func corpusCases() []corpusCase {
	var cs []corpusCase
	add := func(c ...corpusCase) { cs = append(cs, c...) }

	// Strings.
	add(
		tc("string/set-get", "SET k v", "GET k", "GET missing", "SET k w", "GET k"),
		tc("string/set-ex-px", "SET k v EX 1000", "TTL k", "SET k v PX 1000000", "TTL k", "GET k"),
		tc("string/set-nx-xx", "SET k v XX", "SET k v NX", "SET k w NX", "SET k w XX", "GET k", "SET k v NX XX"),
		tc("string/set-get-option", "SET k v GET", "SET k w GET", "GET k", "LPUSH l a", "SET l v GET"),
		tc("string/set-keepttl", "SET k v EXAT 4000000000", "SET k w KEEPTTL", "EXPIRETIME k", "SET k x", "EXPIRETIME k"),
		tc("string/set-bad-expire", "SET k v EX 0", "SET k v PX -1", "SET k v EX abc", "SET k v EX 10 PX 10", "SET k v KEEPTTL EX 10"),
		tc("string/getex", "SET k v", "GETEX k EX 1000", "TTL k", "GETEX k PERSIST", "TTL k", "GETEX k EXAT 4000000000", "EXPIRETIME k", "GETEX missing", "GETEX k EX 10 PX 10"),
		tc("string/getdel", "SET k v", "GETDEL k", "GETDEL k", "EXISTS k", "RPUSH l a", "GETDEL l"),
		tc("string/append-strlen", "APPEND k hello", "APPEND k \" world\"", "GET k", "STRLEN k", "STRLEN missing", "APPEND k \"\\x00\"", "STRLEN k"),
		tc("string/incr-decr", "INCR n", "INCRBY n 10", "DECR n", "DECRBY n 20", "GET n", "INCRBY n abc", "SET s x", "INCR s"),
		tc("string/incr-overflow", "SET n 9223372036854775807", "INCR n", "SET m -9223372036854775808", "DECR m", "INCRBY n 9223372036854775808"),
		tc("string/incrbyfloat", "INCRBYFLOAT f 10.5", "INCRBYFLOAT f 0.1", "INCRBYFLOAT f -5", "SET g 5.0e3", "INCRBYFLOAT g 2.0e2", "SET h 3", "INCRBYFLOAT h 1", "INCRBYFLOAT h abc", "INCRBYFLOAT h inf"),
		tc("string/setrange-getrange", "SET k \"Hello World\"", "SETRANGE k 6 Redis", "GET k", "SETRANGE e 5 x", "GET e", "GETRANGE k 0 4", "GETRANGE k -5 -1", "GETRANGE k 100 200", "SETRANGE k -1 x", "SUBSTR k 0 2"),
		tc("string/mset-mget", "MSET a 1 b 2 c 3", "MGET a b missing c", "MSETNX a 9 d 4", "MSETNX d 4 e 5", "MGET d e", "MSET a"),
		tc("string/setnx-setex", "SETNX k v", "SETNX k w", "SETEX e 1000 v", "TTL e", "PSETEX p 1000000 v", "TTL p", "SETEX e 0 v", "SETEX e abc v"),
		tc("string/lcs", "MSET k1 ohmytext k2 mynewtext", "LCS k1 k2", "LCS k1 k2 LEN", "LCS k1 k2 IDX MINMATCHLEN 4 WITHMATCHLEN"),
		tc("string/object-encoding", "SET i 12345", "OBJECT ENCODING i", "SET e short", "OBJECT ENCODING e", "SET r "+strings.Repeat("x", 50), "OBJECT ENCODING r", "APPEND e x", "OBJECT ENCODING e", "OBJECT ENCODING missing"),
	)

	// Bitmaps.
	add(
		tc("bitmap/setbit-getbit", "SETBIT b 7 1", "SETBIT b 7 0", "SETBIT b 100 1", "GETBIT b 100", "GETBIT b 1000", "GET b", "SETBIT b 1 2", "SETBIT b -1 1"),
		tc("bitmap/bitcount-bitpos", "SET b foobar", "BITCOUNT b", "BITCOUNT b 0 0", "BITCOUNT b 1 1", "BITCOUNT b 5 30 BIT", "BITPOS b 1", "BITPOS b 0 2", "BITPOS b 1 2 -1 BYTE", "SET z \"\\x00\\x00\"", "BITPOS z 1"),
		tc("bitmap/bitop", "SET a foof", "SET b abcd", "BITOP AND d a b", "GET d", "BITOP OR d a b", "GET d", "BITOP XOR d a b", "GET d", "BITOP NOT d a", "GET d", "BITOP NOT d a b"),
		tc("bitmap/bitfield", "BITFIELD b SET u8 0 255 GET u8 0", "BITFIELD b INCRBY u8 0 10", "BITFIELD b OVERFLOW SAT INCRBY u8 0 300", "BITFIELD b OVERFLOW FAIL INCRBY u8 0 300", "BITFIELD b GET i4 0 GET u4 4", "BITFIELD_RO b GET u8 0", "BITFIELD b GET u99 0"),
	)

	// Lists.
	add(
		tc("list/push-range", "RPUSH l a b c", "LPUSH l z", "LRANGE l 0 -1", "LRANGE l 1 2", "LRANGE l -100 100", "LLEN l", "LLEN missing", "LRANGE missing 0 -1"),
		tc("list/pop", "RPUSH l a b c d e", "LPOP l", "RPOP l", "LPOP l 2", "RPOP l 10", "LPOP l", "LPOP l 0", "EXISTS l"),
		tc("list/index-set-insert", "RPUSH l a b c", "LINDEX l 1", "LINDEX l -1", "LINDEX l 9", "LSET l 1 B", "LSET l 9 x", "LSET missing 0 x", "LINSERT l BEFORE B x", "LINSERT l AFTER nope y", "LRANGE l 0 -1"),
		tc("list/rem-trim", "RPUSH l a b a c a", "LREM l 2 a", "LRANGE l 0 -1", "LREM l -1 a", "LTRIM l 0 0", "LRANGE l 0 -1", "LTRIM l 5 10", "EXISTS l"),
		tc("list/lpos", "RPUSH l a b c 1 2 3 c c", "LPOS l c", "LPOS l c RANK 2", "LPOS l c RANK -1", "LPOS l c COUNT 0", "LPOS l c COUNT 2 RANK -1", "LPOS l c COUNT 0 MAXLEN 3", "LPOS l x", "LPOS l x COUNT 2", "LPOS l c RANK 0"),
		tc("list/lmpop", "RPUSH l2 x y z", "LMPOP 2 l1 l2 LEFT", "LMPOP 2 l1 l2 RIGHT COUNT 5", "LMPOP 2 l1 l2 LEFT", "LMPOP 0 l1 LEFT", "LMPOP 1 l1 UP"),
		tc("list/lmove-rpoplpush", "RPUSH s a b c", "LMOVE s d LEFT RIGHT", "RPOPLPUSH s d", "LRANGE s 0 -1", "LRANGE d 0 -1", "LMOVE s s RIGHT LEFT", "LRANGE s 0 -1", "LMOVE missing d LEFT LEFT"),
		tc("list/pushx", "LPUSHX l a", "RPUSHX l a", "RPUSH l a", "LPUSHX l b", "RPUSHX l c", "LRANGE l 0 -1"),
		tc("list/encoding", "RPUSH l a b c", "OBJECT ENCODING l", "TYPE l"),
	)

	// Hashes: small hashes are listpacks, which keep insertion order.
	add(
		tc("hash/hset-hget", "HSET h f1 v1 f2 v2", "HGET h f1", "HGET h nope", "HMGET h f1 nope f2", "HSET h f1 w", "HGETALL h", "HGETALL missing", "HSET h f"),
		tc("hash/hincr", "HINCRBY h n 5", "HINCRBY h n -2", "HINCRBYFLOAT h f 1.5", "HINCRBYFLOAT h f 0.1", "HSET h s abc", "HINCRBY h s 1", "HINCRBYFLOAT h s 1", "HGETALL h"),
		tc("hash/misc", "HSET h a 1 b 22 c 333", "HLEN h", "HEXISTS h a", "HEXISTS h z", "HKEYS h", "HVALS h", "HSTRLEN h c", "HSETNX h a x", "HSETNX h d 4", "HDEL h a z", "HGETALL h"),
		tc("hash/hrandfield", "HSET h a 1 b 2 c 3", "HRANDFIELD h 3", "HRANDFIELD h 10 WITHVALUES", "HRANDFIELD h 0", "HRANDFIELD missing", "HRANDFIELD missing 5"),
		tc("hash/hscan-encoding", "HSET h a 1 b 2", "HSCAN h 0", "HSCAN h 0 MATCH a*", "OBJECT ENCODING h", "TYPE h"),
	)

	// Sets: integer sets are intsets, which keep members sorted.
	add(
		tc("set/intset", "SADD s 3 1 2 2", "SMEMBERS s", "SCARD s", "SISMEMBER s 2", "SISMEMBER s 9", "SMISMEMBER s 1 9 3", "SREM s 2 9", "SMEMBERS s", "OBJECT ENCODING s"),
		tc("set/algebra", "SADD a 1 2 3 4", "SADD b 3 4 5", "SINTER a b", "SUNION a b", "SDIFF a b", "SINTERCARD 2 a b", "SINTERCARD 2 a b LIMIT 1", "SINTERSTORE d a b", "SMEMBERS d", "SUNIONSTORE d a b", "SDIFFSTORE d b a", "SMEMBERS d"),
		tc("set/move-pop-single", "SADD a 7", "SMOVE a b 7", "SMOVE a b 7", "SMEMBERS b", "SRANDMEMBER b", "SRANDMEMBER b 5", "SPOP b", "SPOP b", "EXISTS b"),
		tc("set/strings", "SADD s apple banana cherry", normed("SMEMBERS s", sortArray), "SORT s ALPHA", "SORT s ALPHA DESC LIMIT 0 2", "OBJECT ENCODING s", "SSCAN s 0 MATCH b*"),
		tc("set/sscan-intset", "SADD s 5 10 15", "SSCAN s 0", "SSCAN s 0 COUNT 1"),
	)

	// Sorted sets.
	add(
		tc("zset/zadd-options", "ZADD z 1 a 2 b", "ZADD z NX 5 a 3 c", "ZADD z XX CH 10 a 9 d", "ZADD z GT 1 a", "ZADD z GT CH 20 a", "ZADD z LT CH 1 a", "ZADD z INCR 5 a", "ZADD z NX INCR 5 a", "ZRANGE z 0 -1 WITHSCORES", "ZADD z NX XX 1 a", "ZADD z GT LT 1 a", "ZADD z 1", "ZADD z nan a", "ZADD z INCR 1 a 2 b"),
		tc("zset/zrange-byscore", "ZADD z 1 a 2 b 3 c 4 d 5 e", "ZRANGE z (1 5 BYSCORE LIMIT 1 2 WITHSCORES", "ZRANGE z 5 1 BYSCORE REV", "ZRANGE z -inf +inf BYSCORE LIMIT 0 -1", "ZRANGEBYSCORE z 2 (4 WITHSCORES", "ZREVRANGEBYSCORE z +inf -inf LIMIT 1 1", "ZRANGE z 0 -1 REV WITHSCORES", "ZRANGE z 0 1 LIMIT 0 1"),
		tc("zset/zrange-bylex", "ZADD z 0 a 0 b 0 c 0 d", "ZRANGE z [b (d BYLEX", "ZRANGE z + - BYLEX REV", "ZRANGEBYLEX z - + LIMIT 1 2", "ZLEXCOUNT z [b +", "ZRANGE z b d BYLEX"),
		tc("zset/scores", "ZADD z 1.5 a 0.1 b 1e3 c -inf d", "ZSCORE z a", "ZSCORE z b", "ZSCORE z c", "ZSCORE z d", "ZMSCORE z a nope c", "ZINCRBY z 2.5 a", "ZINCRBY z 1 new", "ZSCORE missing a"),
		tc("zset/rank-count", "ZADD z 1 a 2 b 3 c", "ZRANK z b", "ZREVRANK z b", "ZRANK z nope", "ZCOUNT z 2 +inf", "ZCOUNT z (1 (3", "ZCARD z", "ZREM z a nope", "ZREMRANGEBYSCORE z 3 3", "ZRANGE z 0 -1"),
		tc("zset/pop-mpop", "ZADD z 1 a 2 b 3 c 4 d", "ZPOPMIN z", "ZPOPMAX z 2", "ZMPOP 1 z MIN COUNT 5", "ZMPOP 1 z MIN", "ZPOPMIN z"),
		tc("zset/store-ops", "ZADD a 1 x 2 y", "ZADD b 10 y 20 z", "ZUNIONSTORE u 2 a b", "ZRANGE u 0 -1 WITHSCORES", "ZINTERSTORE i 2 a b WEIGHTS 2 3 AGGREGATE MAX", "ZRANGE i 0 -1 WITHSCORES", "ZINTER 2 a b WITHSCORES", "ZUNION 2 a b", "ZDIFF 2 a b WITHSCORES", "ZRANGESTORE r a 0 0", "ZRANGE r 0 -1"),
		tc("zset/zrandmember-zscan", "ZADD z 1 a 2 b", "ZRANDMEMBER z 5 WITHSCORES", "ZSCAN z 0", "OBJECT ENCODING z", "TYPE z"),
	)

	// Streams, with fixed ids.
	add(
		tc("stream/xadd-xrange", "XADD s 1-1 a 1", "XADD s 1-2 b 2", "XADD s 2-0 c 3 d 4", "XLEN s", "XRANGE s - +", "XRANGE s 1-2 + COUNT 1", "XREVRANGE s + - COUNT 2", "XRANGE s (1-1 (2-0", "XADD s 1-0 x y", "XADD s 0-0 x y", "TYPE s"),
		tc("stream/xdel-xtrim", "XADD s 1-0 a 1", "XADD s 2-0 a 2", "XADD s 3-0 a 3", "XADD s 4-0 a 4", "XDEL s 2-0 9-0", "XTRIM s MAXLEN 2", "XRANGE s - +", "XTRIM s MINID 4-0", "XLEN s", "XADD s NOMKSTREAM 5-0 a 5", "XADD t NOMKSTREAM 5-0 a 5"),
		tc("stream/xread", "XADD s 1-0 a 1", "XADD s 2-0 b 2", "XADD t 1-0 c 3", "XREAD COUNT 1 STREAMS s t 0 0", "XREAD STREAMS s 1-0", "XREAD STREAMS s 9-0", "XREAD STREAMS s"),
		tc("stream/groups", "XADD s 1-0 a 1", "XADD s 2-0 b 2", "XADD s 3-0 c 3", "XGROUP CREATE s g 0", "XGROUP CREATE s g 0", "XREADGROUP GROUP g c1 COUNT 2 STREAMS s >", "XPENDING s g", "XACK s g 1-0 9-0", "XPENDING s g", "XREADGROUP GROUP g c1 STREAMS s 0", "XINFO GROUPS s", "XREADGROUP GROUP nope c1 STREAMS s >"),
		tc("stream/xautoclaim-xclaim", "XADD s 1-0 a 1", "XADD s 2-0 b 2", "XGROUP CREATE s g 0", "XREADGROUP GROUP g c1 STREAMS s >", "XAUTOCLAIM s g c2 0 0-0 COUNT 1", "XAUTOCLAIM s g c2 0 0-0 JUSTID", "XCLAIM s g c3 0 1-0 JUSTID", "XPENDING s g", "XGROUP DELCONSUMER s g c3", "XGROUP CREATECONSUMER s g c9", "XGROUP SETID s g $", "XREADGROUP GROUP g c1 STREAMS s >"),
		tc("stream/mkstream-setid", "XGROUP CREATE s g $", "XGROUP CREATE s g $ MKSTREAM", "XLEN s", "XSETID s 5-0", "XADD s 4-0 a 1", "XADD s 6-0 a 1", "XINFO GROUPS s", "XGROUP DESTROY s g", "XGROUP DESTROY s g"),
	)

	// HyperLogLog and geo.
	add(
		tc("hll/basic", "PFADD h a b c", "PFADD h a", "PFCOUNT h", "PFADD h2 c d e", "PFCOUNT h h2", "PFMERGE h3 h h2", "PFCOUNT h3", "GET h", "SET s x", "PFCOUNT s", "PFADD empty", "PFCOUNT empty"),
		tc("geo/basic", "GEOADD g 13.361389 38.115556 Palermo 15.087269 37.502669 Catania", "GEODIST g Palermo Catania", "GEODIST g Palermo Catania km", "GEOPOS g Palermo nope", "GEOHASH g Palermo Catania", "GEOSEARCH g FROMLONLAT 15 37 BYRADIUS 200 km ASC WITHDIST WITHCOORD", "GEOSEARCH g FROMMEMBER Palermo BYBOX 400 400 km DESC COUNT 1", "GEORADIUS g 15 37 200 km WITHDIST ASC", "GEOADD g 200 100 bad", "TYPE g"),
	)

	// Keys and expiry.
	add(
		tc("expire/ttl-none-missing", "SET k v", "TTL k", "PTTL k", "TTL missing", "PTTL missing", "EXPIRETIME k", "EXPIRETIME missing", "PEXPIRETIME k"),
		tc("expire/options", "SET k v", "EXPIRE k 100 XX", "EXPIRE k 100 NX", "EXPIRE k 200 NX", "EXPIRE k 50 GT", "EXPIRE k 300 GT", "TTL k", "EXPIRE k 400 LT", "EXPIRE k 10 LT", "TTL k", "EXPIRE k 100 NX XX", "EXPIRE k 100 GT LT", "EXPIRE missing 10", "EXPIRE k abc"),
		tc("expire/persist", "SET k v EX 100", "PERSIST k", "PERSIST k", "TTL k", "PERSIST missing"),
		tc("expire/at", "SET k v", "EXPIREAT k 4000000000", "EXPIRETIME k", "PEXPIREAT k 4000000000123", "PEXPIRETIME k", "EXPIRETIME k", "PEXPIRE k 5000000", "TTL k"),
		tc("expire/past-deletes", "SET k v", "EXPIRE k -1", "EXISTS k", "SET k v", "EXPIREAT k 1", "GET k", "SET k v", "PEXPIRE k 0", "TYPE k"),
		tc("keys/type", "SET s v", "RPUSH l a", "HSET h f v", "SADD st a", "ZADD z 1 a", "XADD x 1-0 a b", "PFADD p a", "TYPE s", "TYPE l", "TYPE h", "TYPE st", "TYPE z", "TYPE x", "TYPE p", "TYPE missing"),
		tc("keys/exists-del", "MSET a 1 b 2 c 3", "EXISTS a b missing a", "DEL a missing", "UNLINK b c", "TOUCH a b", "EXISTS a b c", "DBSIZE"),
		tc("keys/rename", "SET a 1", "RENAME a b", "GET b", "RENAME missing c", "SET c 3", "RENAMENX b c", "RENAMENX b d", "MGET a b c d", "RENAME d d"),
		tc("keys/copy", "SET a 1", "COPY a b", "GET b", "SET a 2", "COPY a b", "COPY a b REPLACE", "GET b", "COPY a c DB 1", "SELECT 1", "GET c", "SELECT 0", "COPY missing x", "COPY a a"),
		tc("keys/move-swapdb", "SET a 1", "MOVE a 1", "EXISTS a", "SELECT 1", "GET a", "SELECT 0", "MOVE a 1", "SWAPDB 0 1", "GET a", "SWAPDB 0 99"),
		tc("keys/dbsize-randomkey", "DBSIZE", "RANDOMKEY", "SET only v", "RANDOMKEY", "DBSIZE", "FLUSHDB", "DBSIZE"),
		tc("keys/keys-scan", "MSET user:1 a user:2 b user:3 c other x", "KEYS other", normed("KEYS user:*", sortArray), "SCAN 0 MATCH other COUNT 1000", normed("SCAN 0 MATCH user:* COUNT 1000", sortScanKeys), "SCAN 0 TYPE list COUNT 1000", "SCAN 0 COUNT abc", "SCAN abc"),
		tc("keys/object", "SET k v", "OBJECT ENCODING k", "OBJECT FREQ k", "OBJECT HELP", "OBJECT NOPE k", "OBJECT ENCODING missing"),
		tc("keys/sort", "RPUSH l 3 1 2", "MSET w_1 30 w_2 10 w_3 20 o_1 one o_2 two o_3 three", "SORT l", "SORT l DESC LIMIT 0 2", "SORT l BY w_* GET o_* GET #", "SORT l BY nosort GET o_*", "SORT l ALPHA", "SORT l BY w_* STORE dst", "LRANGE dst 0 -1", "HSET h_1 f x", "SORT l GET h_*->f", "SORT_RO l DESC", "RPUSH bad a", "SORT bad"),
		tc("keys/wrong-type-many", "SET s v", "LPUSH s a", "HGET s f", "SADD s a", "ZADD s 1 a", "XADD s 1-0 a b", "RPUSH l a", "GET l", "INCR l", "APPEND l x", "ZSCORE l a"),
	)

	// DUMP/RESTORE with the payload DUMP just returned.
	dumpPayload := func(prev []string) string {
		r := prev[len(prev)-1] // $n\r\npayload\r\n
		i := strings.Index(r, "\r\n")
		return r[i+2 : len(r)-2]
	}
	restore := func(key, extra string) corpusStep {
		return corpusStep{n: 1, build: func(prev []string) string {
			args := []string{"RESTORE", key, "0", dumpPayload(prev)}
			if extra != "" {
				args = append(args, extra)
			}
			return corpusCmd(args...)
		}}
	}
	add(
		tc("keys/dump-restore-string", "SET k hello", "DUMP k", restore("k2", ""), "GET k2", "DUMP k", restore("k2", ""), "DUMP k", restore("k2", "REPLACE"), "GET k2"),
		tc("keys/dump-restore-types", "RPUSH l a b", "DUMP l", restore("l2", ""), "LRANGE l2 0 -1", "HSET h f v", "DUMP h", restore("h2", ""), "HGETALL h2", "ZADD z 1 a", "DUMP z", restore("z2", ""), "ZRANGE z2 0 -1 WITHSCORES"),
		tc("keys/dump-restore-errors", "DUMP missing", "RESTORE k 0 garbage", "RESTORE k abc x", "EXISTS k"),
	)

	// Errors.
	add(
		tc("error/unknown-command", "FOO", "FOO a b", "FOO \"a b\" c d e f", "\"\""),
		tc("error/arity", "GET", "SET k", "HSET h f", "LPUSH l", "ZADD z", "PING a b", "ECHO", "DEL", "EXISTS"),
		tc("error/syntax", "SET k v XX NX", "SET k v BADOPT", "ZRANGE z 0 1 NOPE", "LPOS l a RANK", "SCAN 0 MATCH", "XADD s", "OBJECT", "CONFIG"),
		tc("error/unknown-subcommand", "OBJECT NOPE x", "CONFIG NOPE", "SCRIPT NOPE", "XINFO NOPE", "CLIENT NOPE", "COMMAND NOPE"),
		tc("error/not-integer-float", "SET s x", "INCR s", "INCRBYFLOAT s 1", "LRANGE l a b", "ZADD z abc m", "EXPIRE s 1.5", "GETRANGE s a b", "SETBIT s x 1"),
		tc("error/wrongtype-inside-script", `EVAL "redis.call('SET', KEYS[1], 'x'); return redis.call('LPUSH', KEYS[1], 'y')" 1 k`),
	)

	// Scripts and functions.
	add(
		tc("script/nested-arrays", `EVAL "return {1,{2,{3,'x'}},'y',{}}" 0`, `EVAL "return {1,2,nil,4}" 0`, `EVAL "return {}" 0`),
		tc("script/nil-bool-status", `EVAL "return nil" 0`, `EVAL "return true" 0`, `EVAL "return false" 0`, `EVAL "return {true,false,true}" 0`, `EVAL "return redis.status_reply('FOO')" 0`, `EVAL "return {ok='BAR'}" 0`),
		tc("script/numbers", `EVAL "return 42" 0`, `EVAL "return -7" 0`, `EVAL "return 3.99" 0`, `EVAL "return -3.99" 0`, `EVAL "return {1.5, 2.7}" 0`, `EVAL "return 'str'" 0`, `EVAL "return tostring(3.25)" 0`),
		tc("script/errors", `EVAL "return redis.error_reply('NOSPACE')" 0`, `EVAL "return redis.error_reply('MY error text')" 0`, `EVAL "return {err='My Error'}" 0`, `EVAL "return {err='-X y'}" 0`, `EVAL "return redis.call('NOPE')" 0`, `EVAL "error('boom')" 0`, `EVAL "return redis.pcall('INCR', KEYS[1])" 1 s`, `EVAL "syntax error here" 0`, `EVAL "return 1"`, `EVAL "return 1" -1`),
		tc("script/keys-argv", `EVAL "return {KEYS[1],KEYS[2],ARGV[1],ARGV[2]}" 2 k1 k2 a1 a2`, `EVAL "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('GET', KEYS[1])" 1 k v`, `EVAL "return redis.call('INCRBY', KEYS[1], ARGV[1])" 1 n 5`, `EVAL_RO "return redis.call('GET', KEYS[1])" 1 k`, `EVAL_RO "return redis.call('SET', KEYS[1], 'x')" 1 k`),
		tc("script/load-evalsha", `SCRIPT LOAD "return {KEYS[1], ARGV[1]}"`, "EVALSHA 5f0bd0b4e2f4b93ad4ee8e0d3ba0e0f9d95e8f0e 0", "SCRIPT EXISTS 5f0bd0b4e2f4b93ad4ee8e0d3ba0e0f9d95e8f0e",
			corpusStep{n: 1, build: func(prev []string) string {
				sha := strings.Split(prev[0], "\r\n")[1]
				return corpusCmd("EVALSHA", sha, "1", "k", "a")
			}},
			corpusStep{n: 1, build: func(prev []string) string {
				sha := strings.Split(prev[0], "\r\n")[1]
				return corpusCmd("SCRIPT", "EXISTS", sha, strings.Repeat("0", 40), strings.ToUpper(sha))
			}},
			corpusStep{n: 1, build: func(prev []string) string {
				sha := strings.Split(prev[0], "\r\n")[1]
				return corpusCmd("EVALSHA_RO", sha, "1", "k", "b")
			}},
			"SCRIPT FLUSH",
			corpusStep{n: 1, build: func(prev []string) string {
				sha := strings.Split(prev[0], "\r\n")[1]
				return corpusCmd("EVALSHA", sha, "0")
			}}),
		tc("script/noscript", "EVALSHA ffffffffffffffffffffffffffffffffffffffff 0", "EVALSHA short 0", "SCRIPT EXISTS ffffffffffffffffffffffffffffffffffffffff"),
		tc("script/function", `FUNCTION LOAD "#!lua name=mylib\nredis.register_function('echo1', function(keys, args) return args[1] end)"`, "FCALL echo1 0 hi", "FCALL_RO echo1 0 hi", "FCALL nope 0", "FUNCTION LIST LIBRARYNAME nolib", `FUNCTION LOAD "#!lua name=mylib\nredis.register_function('echo1', function(keys, args) return 1 end)"`, "FUNCTION DELETE mylib", "FCALL echo1 0 hi"),
	)

	// Transactions.
	add(
		tc("multi/exec-basic", "MULTI", "SET a 1", "INCR a", "GET a", "PING", "PING hi", "EXEC", "GET a"),
		tc("multi/runtime-error-inside", "SET s x", "MULTI", "INCR s", "SET t 1", "LPUSH s y", "EXEC", "GET t"),
		tc("multi/queued-error-execabort", "MULTI", "SET a 1", "GET", "NOSUCHCMD x", "EXEC", "GET a", "EXEC"),
		tc("multi/discard", "MULTI", "SET a 1", "DISCARD", "GET a", "DISCARD", "EXEC"),
		tc("multi/exec-without-multi", "EXEC", "DISCARD"),
		tc("multi/nested", "MULTI", "MULTI", "SET a 1", "EXEC", "GET a"),
		tc("multi/nested-then-auth", "MULTI", "MULTI", "AUTH x", "EXEC"),
		tc("multi/empty", "MULTI", "EXEC"),
		tc("multi/watch-same-client", "SET k 1", "WATCH k", "SET k 2", "MULTI", "SET k 3", "EXEC", "GET k", "WATCH k", "MULTI", "SET k 4", "EXEC", "GET k"),
		tc("multi/watch-other-client", "SET k 1", "WATCH k", on(1, cmds("SET k 2")...), "MULTI", "INCR k", "EXEC", "GET k"),
		tc("multi/watch-unwatch", "WATCH a b", "UNWATCH", "SET a 1", "MULTI", "SET b 2", "EXEC", "MULTI", "WATCH a", "DISCARD", "WATCH"),
		tc("multi/watch-missing-key-created", "WATCH k", "SET k 1", "MULTI", "GET k", "EXEC"),
		tc("multi/pipelined", pipe("MULTI", "SET a 1", "INCR a", "LRANGE a 0 -1", "EXEC", "GET a")),
		tc("multi/select-inside", "MULTI", "SELECT 1", "SET k v", "EXEC", "GET k", "SELECT 0", "GET k"),
		tc("multi/blpop-inside", "MULTI", "BLPOP l 0", "RPUSH l a", "BLPOP l 0", "EXEC"),
		tc("multi/client-name-inside", "CLIENT SETNAME before", "MULTI", "CLIENT GETNAME", "CLIENT SETNAME inside", "EXEC", "CLIENT GETNAME"),
		tc("multi/auth-inside", "MULTI", "AUTH x", "EXEC"),
		tc("multi/hello-inside", "MULTI", "HELLO 2", normed("EXEC", maskHelloID)),
		tc("multi/quit-inside", "MULTI", "SET a 1", raw(corpusCmd("QUIT"), corpusUntilClose), on(1, cmds("GET a")...)),
		tc("multi/subscribe-inside", "MULTI", "SUBSCRIBE ch", "EXEC", "PING", "UNSUBSCRIBE"),
		tc("multi/reset-inside", "MULTI", "SET a 1", "RESET", "EXEC", "GET a"),
		tc("multi/select-bad-inside", "MULTI", "SELECT 99", "SELECT abc", "SET k v", "EXEC", "GET k"),
		tc("multi/select-discarded", "MULTI", "SELECT 1", "DISCARD", "SET k v", "SELECT 0", "GET k"),
		tc("multi/long-transaction", "MULTI", pipe(slices.Repeat([]string{"INCR n"}, 1000)...), "EXEC", "GET n"),
		tc("multi/inline", raw("MULTI\r\nSET a \"x y\"\r\nGET a\r\nEXEC\r\n", 4)),
	)

	// Pipelines.
	big := make([]string, 0, 10000)
	for i := range 2500 {
		big = append(big, fmt.Sprintf("SET k:%d v%d", i, i), "INCR n", fmt.Sprintf("GET k:%d", i), fmt.Sprintf("LPUSH l %d", i))
	}
	add(
		tc("pipeline/10000", pipe(big...), "GET n", "LLEN l", "LRANGE l 0 4", "DBSIZE"),
		tc("pipeline/mixed", pipe("SET a 1", "GET a", "INCR a", "DEL a", "GET a", "LPUSH l x y z", "LRANGE l 0 -1", "INCR a", "DEL l a missing", "LRANGE l 0 -1", "SET a x", "INCR a", "PING", "ECHO done")),
		tc("pipeline/errors-between", pipe("SET a 1", "FOO", "GET a", "GET", "INCR a", "LPUSH a x", "GET a")),
		tc("pipeline/ping-storm", raw(strings.Repeat("PING\r\n", 500), 500), raw(strings.Repeat(corpusCmd("PING"), 500), 500)),
		tc("pipeline/inline-and-multibulk", raw("SET a 1\r\n"+corpusCmd("INCR", "a")+"GET a\r\n"+corpusCmd("ECHO", "x"), 4)),
		tc("pipeline/select-in-pipeline", pipe("SELECT 1", "SET k one", "SELECT 0", "SET k zero", "GET k", "SELECT 1", "GET k", "SELECT 0")),
		tc("pipeline/across-blocking", pipe("RPUSH l a", "BLPOP l 0", "BLPOP l 0.05", "GET x", "PING")),
	)

	// Pub/sub.
	add(
		tc("pubsub/subscribe-publish",
			raw(corpusCmd("SUBSCRIBE", "a", "b"), 2),
			raw(corpusCmd("PING"), 1),
			raw(corpusCmd("PING", "hi"), 1),
			on(1, cmds("PUBLISH a hello", "PUBLISH b \"\\x00bin\\r\\n\"", "PUBLISH c nobody")...),
			readOn(0, 2)),
		tc("pubsub/psubscribe",
			raw(corpusCmd("PSUBSCRIBE", "news.*"), 1),
			on(1, cmds("PUBLISH news.tech hi", "PUBLISH other x")...),
			readOn(0, 1),
			raw(corpusCmd("PUNSUBSCRIBE", "news.*"), 1),
			raw(corpusCmd("PUNSUBSCRIBE"), 1)),
		tc("pubsub/unsubscribe-all",
			raw(corpusCmd("SUBSCRIBE", "a", "b"), 2),
			raw(corpusCmd("UNSUBSCRIBE", "b"), 1),
			raw(corpusCmd("UNSUBSCRIBE"), 1),
			raw(corpusCmd("UNSUBSCRIBE"), 1),
			"GET k", "PING"),
		tc("pubsub/get-refused",
			raw(corpusCmd("SUBSCRIBE", "a"), 1),
			raw(corpusCmd("GET", "k"), 1),
			raw("PING\r\n", 1),
			raw(corpusCmd("SUBSCRIBE", "b"), 1),
			on(1, cmds("PUBSUB NUMSUB a b c", "PUBSUB CHANNELS a")...),
			raw(corpusCmd("QUIT"), corpusUntilClose)),
		tc("pubsub/publish-counts", "PUBLISH nobody x", "PUBSUB NUMPAT", "PUBSUB NUMSUB", "PUBSUB CHANNELS"),
		tc("pubsub/subscribe-arity", "SUBSCRIBE", "PSUBSCRIBE", "PING"),
		tc("pubsub/pipelined-after-subscribe", raw(corpusCmd("SUBSCRIBE", "a")+"PING\r\n"+corpusCmd("PING", "x"), 3), on(1, cmds("PUBLISH a m")...), readOn(0, 1)),
		tc("pubsub/inline-subscribe", raw("SUBSCRIBE a b\r\n", 2), on(1, cmds("PUBLISH b m")...), readOn(0, 1), raw("UNSUBSCRIBE a b\r\n", 2), "PING"),
		tc("pubsub/channel-and-pattern", raw(corpusCmd("SUBSCRIBE", "n.x")+corpusCmd("PSUBSCRIBE", "n.*"), 2), on(1, cmds("PUBLISH n.x both")...), readOn(0, 2)),
		tc("pubsub/unsubscribe-unsubscribed", "UNSUBSCRIBE", "PUNSUBSCRIBE nope", "GET k", "SET k v", "GET k"),
		tc("pubsub/select-client-refused", raw(corpusCmd("SUBSCRIBE", "a"), 1), raw(corpusCmd("SELECT", "1")+corpusCmd("CLIENT", "SETNAME", "x")+corpusCmd("CLIENT", "ID"), 3)),
		tc("pubsub/auth-refused", raw(corpusCmd("SUBSCRIBE", "a"), 1), raw(corpusCmd("AUTH", "x"), 1)),
		tc("pubsub/hello-refused", raw(corpusCmd("SUBSCRIBE", "a"), 1), raw(corpusCmd("HELLO", "2"), 1)),
		tc("pubsub/hello3-refused-in-order", raw(corpusCmd("SUBSCRIBE", "a")+corpusCmd("PING")+corpusCmd("HELLO", "3")+corpusCmd("PING"), 4)),
		tc("pubsub/reset-leaves",
			raw(corpusCmd("SUBSCRIBE", "a"), 1),
			raw(corpusCmd("RESET"), 1),
			"SET k v", "GET k",
			on(1, cmds("PUBLISH a x")...)),
	)

	// Blocking commands.
	add(
		tc("block/blpop-timeout", "BLPOP l 0.1", "BRPOP l1 l2 0.05", "LLEN l"),
		tc("block/blpop-data-present", "RPUSH l a b", "BLPOP l 0", "BRPOP l 0", "BLPOP l2 l 0.01"),
		tc("block/blpop-woken", sendOnly(0, "BLPOP l 0"), waitBlocked(1), on(1, cmds("LPUSH l x")...), readOn(0, 1), "LLEN l"),
		tc("block/brpop-woken", sendOnly(0, "BRPOP a b 5"), waitBlocked(1), on(1, cmds("RPUSH b 1 2")...), readOn(0, 1), "LRANGE b 0 -1"),
		tc("block/blmove-woken", sendOnly(0, "BLMOVE src dst LEFT RIGHT 0"), waitBlocked(1), on(1, cmds("RPUSH src a b")...), readOn(0, 1), "LRANGE dst 0 -1", "LRANGE src 0 -1"),
		tc("block/blmpop-woken", sendOnly(0, "BLMPOP 0 2 l1 l2 RIGHT COUNT 2"), waitBlocked(1), on(1, cmds("RPUSH l2 a b c")...), readOn(0, 1), "BLMPOP 0.01 1 l9 LEFT"),
		tc("block/bzpopmin-woken", sendOnly(0, "BZPOPMIN z 0"), waitBlocked(1), on(1, cmds("ZADD z 2 b 1 a")...), readOn(0, 1), "BZPOPMAX z 0", "BZPOPMIN z 0.01"),
		tc("block/xread-block-woken", "XADD s 1-0 a 1", sendOnly(0, "XREAD BLOCK 100 STREAMS s $"), waitBlocked(1), on(1, cmds("XADD s 2-0 b 2")...), readOn(0, 1)),
		tc("block/xread-block-timeout", "XADD s 1-0 a 1", "XREAD BLOCK 50 STREAMS s $", "XREAD BLOCK 10 COUNT 1 STREAMS s 0"),
		tc("block/xreadgroup-block-woken", "XGROUP CREATE s g $ MKSTREAM", sendOnly(0, "XREADGROUP GROUP g c BLOCK 5000 STREAMS s >"), waitBlocked(1), on(1, cmds("XADD s 1-0 a 1")...), readOn(0, 1), "XPENDING s g"),
		tc("block/errors", "BLPOP l -1", "BLPOP l abc", "BLPOP l", "BZPOPMIN z x", "SET s x", "BLPOP s 0"),
		tc("block/client-gone", sendOnly(0, "BLPOP l 0"), waitBlocked(1), closeConn(0), waitBlocked(0), on(1, cmds("LPUSH l x", "LLEN l")...)),
		tc("block/name-carried", "CLIENT SETNAME blocker", "BLPOP l 0.01", "CLIENT GETNAME"),
		tc("block/select-carried", "SELECT 2", "RPUSH l in2", "SELECT 0", "RPUSH l in0", "SELECT 2", "BLPOP l 0", "SELECT 0", "BLPOP l 0"),
		tc("block/wait", "WAIT 0 0", "SET k v", "WAIT 0 10"),
		tc("block/pipelined-while-blocked", sendOnly(0, "BLPOP l 0"), waitBlocked(1), sendOnly(0, "PING"), sendOnly(0, "GET l"), on(1, cmds("RPUSH l a")...), readOn(0, 3)),
		tc("block/several-keys", "RPUSH b x", "BLPOP a b c 0", sendOnly(0, "BRPOP a b c 0"), waitBlocked(1), on(1, cmds("RPUSH c y")...), readOn(0, 1)),
	)

	// Binary safety.
	add(
		tc("binary/nul-crlf-ff", `SET "a\x00b" "\r\n\xff\x00"`, `GET "a\x00b"`, `GET "a"`, `STRLEN "a\x00b"`, `APPEND "a\x00b" "\x00"`, `GET "a\x00b"`),
		tc("binary/empty", `SET "" ""`, `GET ""`, `EXISTS ""`, `STRLEN ""`, `SET k ""`, `GET k`, `APPEND k ""`, `HSET h "" ""`, `HGETALL h`, `RPUSH l ""`, `LRANGE l 0 -1`),
		tc("binary/structures", `HSET h "f\r\n" "v\x00"`, `HGET h "f\r\n"`, `RPUSH l "\xff\xfe" "\r\n"`, `LRANGE l 0 -1`, `ZADD z 1 "\x00"`, `ZRANGE z 0 -1`, `SADD s "\x00" "\x01"`, `SISMEMBER s "\x00"`, `MSET "k 1" "x y" "k\t2" "z"`, `MGET "k 1" "k\t2"`),
		tc("binary/crlf-in-args", `ECHO "\r\n"`, `ECHO "*1\r\n$4\r\nPING\r\n"`, `SET "$-1" "+OK"`, `GET "$-1"`),
		tc("binary/5mib",
			corpusStep{raw: corpusCmd("SET", "big", corpusBig), n: 1},
			"STRLEN big", "GET big", "GETRANGE big 5242870 -1", "APPEND big x", "STRLEN big",
			corpusStep{raw: corpusCmd("SET", "big2", corpusBig) + corpusCmd("GET", "big2") + corpusCmd("PING"), n: 3}),
	)

	// Databases.
	add(
		tc("select/isolation", "SELECT 1", "SET k v", "SELECT 0", "GET k", "SELECT 1", "GET k", "DBSIZE", "SELECT 0", "DBSIZE"),
		tc("select/errors", "SELECT 16", "SELECT -1", "SELECT abc", "SELECT", "SELECT 1 2", "SELECT 99999999999", "SELECT 1.5", "PING"),
		tc("select/number-forms", "SELECT 01", "SELECT +1", `SELECT " 1"`, "SELECT -0", `SELECT ""`, "SELECT 2147483648", "SELECT -2147483649", "SELECT 00", "SET k v", "SELECT 0", "GET k"),
		tc("select/then-multi", "SELECT 3", "MULTI", "SET k v", "EXEC", "SELECT 0", "GET k", "SELECT 3", "GET k"),
		tc("select/then-watch", "SELECT 4", "SET k 1", "WATCH k", "MULTI", "INCR k", "EXEC", "GET k", "SELECT 0", "EXISTS k"),
		tc("select/flushdb", "SELECT 1", "SET k v", "SELECT 0", "SET k v", "FLUSHDB", "SELECT 1", "DBSIZE"),
	)

	// Connection commands.
	add(
		tc("conn/ping-echo", "PING", "PING hello", `PING ""`, "ECHO hi", `ECHO ""`, `ECHO "a b"`),
		tc("conn/client-name", "CLIENT GETNAME", "CLIENT SETNAME app1", "CLIENT GETNAME", `CLIENT SETNAME "bad name"`, `CLIENT SETNAME "a\nb"`, "CLIENT GETNAME", `CLIENT SETNAME ""`, "CLIENT GETNAME", "CLIENT SETNAME", "CLIENT GETNAME x"),
		tc("conn/client-id", checked("CLIENT ID", bothInt), "CLIENT ID x", "CLIENT", "CLIENT HELP"),
		tc("conn/client-list-info",
			checked("CLIENT LIST", bulkWith("id=", "addr=", "cmd=client")),
			checked("CLIENT INFO", bulkWith("id=", "addr=", "cmd=client")),
			"CLIENT NO-EVICT on", "CLIENT NO-EVICT off", "CLIENT NO-EVICT maybe", "CLIENT NO-EVICT", "CLIENT NO-TOUCH on",
			"CLIENT LIST TYPE foo", "CLIENT LIST TYPE normal x", "CLIENT LIST ID abc", "CLIENT LIST ID", "CLIENT LIST foo",
			"CLIENT LIST ID 999999", "CLIENT LIST TYPE master", "CLIENT LIST TYPE replica", "CLIENT LIST TYPE slave", "CLIENT INFO x"),
		tc("conn/client-kill-errors", "CLIENT KILL", "CLIENT KILL 1.2.3.4:5", "CLIENT KILL ID", "CLIENT KILL ID abc",
			"CLIENT KILL ID 0", "CLIENT KILL ID -1", "CLIENT KILL ID 999999", "CLIENT KILL ID 1 SKIPME maybe", "CLIENT KILL TYPE foo",
			"CLIENT KILL a b c", "CLIENT KILL ID 999999 SKIPME", "CLIENT KILL USER nobody", "CLIENT KILL USER default ADDR 1.2.3.4:5",
			"CLIENT KILL LADDR 1.2.3.4:5", "CLIENT KILL TYPE master", "CLIENT KILL TYPE pubsub", "CLIENT KILL ADDR 1.2.3.4:5 SKIPME no",
			`CLIENT KILL ""`, `CLIENT KILL ADDR "" SKIPME no`, `CLIENT KILL LADDR ""`, "PING"),
		tc("conn/client-unblock-errors", "CLIENT UNBLOCK", "CLIENT UNBLOCK abc", "CLIENT UNBLOCK 1 foo", "CLIENT UNBLOCK abc foo",
			"CLIENT UNBLOCK 999999", "CLIENT UNBLOCK 999999 TIMEOUT", "CLIENT UNBLOCK 999999 error", "CLIENT UNBLOCK 1 2 3"),
		tc("conn/client-tracking-off", "CLIENT GETREDIR", "CLIENT TRACKINGINFO", "CLIENT GETREDIR x", "CLIENT TRACKINGINFO x",
			"CLIENT TRACKING", "CLIENT CACHING yes"),
		tc("conn/client-reply", raw(corpusCmd("CLIENT", "REPLY", "OFF")+corpusCmd("SET", "a", "1")+corpusCmd("GET", "a")+
			corpusCmd("NOSUCH")+corpusCmd("CLIENT", "REPLY", "SKIP")+corpusCmd("GET", "a")+corpusCmd("CLIENT", "REPLY", "ON")+
			corpusCmd("GET", "a")+corpusCmd("CLIENT", "REPLY", "SKIP")+corpusCmd("CLIENT", "REPLY", "SKIP")+corpusCmd("INCR", "a")+
			corpusCmd("GET", "a")+corpusCmd("CLIENT", "REPLY", "SKIP")+corpusCmd("CLIENT", "REPLY", "ON")+corpusCmd("PING")+
			corpusCmd("CLIENT", "REPLY", "SKIP")+corpusCmd("MGET", "a", "b")+corpusCmd("CLIENT", "REPLY", "FOO")+
			corpusCmd("CLIENT", "REPLY")+corpusCmd("GET", "a"), 8)),
		tc("conn/client-reply-off-pipeline", raw(corpusCmd("CLIENT", "REPLY", "OFF")+strings.Repeat(corpusCmd("INCR", "n"), 300)+
			corpusCmd("CLIENT", "REPLY", "ON")+corpusCmd("GET", "n"), 2)),
		tc("conn/quit", raw(corpusCmd("QUIT"), corpusUntilClose)),
		tc("conn/quit-pipelined", raw("PING\r\n"+corpusCmd("QUIT")+"PING\r\n", corpusUntilClose)),
		tc("conn/quit-inline", raw("SET a 1\r\nQUIT\r\nSET a 2\r\n", corpusUntilClose), on(1, cmds("GET a")...)),
		tc("conn/auth-no-password", "AUTH x", "AUTH default x", "AUTH bob x", "AUTH a b c", "AUTH", "PING"),
		tc("conn/hello", normed("HELLO", maskHelloID), normed("HELLO 2", maskHelloID), normed("HELLO 2 SETNAME hn", maskHelloID), "CLIENT GETNAME", "HELLO 4", "HELLO abc", "HELLO 2 NOPE", "HELLO 2 AUTH default"),
		tc("conn/hello3", normed("HELLO 3", maskHelloID), "HGETALL missing", normed("HELLO", maskHelloID), normed("HELLO 2", maskHelloID), "CLIENT GETNAME"),
		tc("conn/reset", "SELECT 1", "SET k v", "CLIENT SETNAME n", "RESET", "GET k", "CLIENT GETNAME", "RESET x"),
		tc("conn/info-command",
			checked("INFO", bulkWith("# Server\r\n", "redis_version:")),
			checked("INFO server", bulkWith("# Server\r\n", "redis_version:")),
			checked("COMMAND", sameArrayLen),
			"COMMAND COUNT", "COMMAND INFO GET SET nope", "COMMAND GETKEYS SET k v", "COMMAND GETKEYS PING"),
		tc("conn/hello-setname-after-pin", "BLPOP l 0.01", normed("HELLO 2 SETNAME late", maskHelloID), "CLIENT GETNAME"),
		tc("conn/client-setname-after-pin", "BLPOP l 0.01", "CLIENT SETNAME late", "CLIENT GETNAME", "RESET", "CLIENT GETNAME"),
		tc("conn/client-setname-chars", "CLIENT SETNAME ~ok!", "CLIENT GETNAME", `CLIENT SETNAME "\x7f"`, `CLIENT SETNAME "\xc3\xa9"`, "CLIENT GETNAME"),
		tc("conn/mixed-case", "pInG", "set k v", "gEt k", "client setname lower", "Client GetName", "Select 1", "gEt k", "select 0", "mUlTi", "eXeC"),
		tc("conn/hello-versions", "HELLO 02", "HELLO +2", "HELLO -2", "HELLO 1", "HELLO 2.0", `HELLO ""`),
		tc("conn/quit-args", raw(corpusCmd("QUIT", "now"), corpusUntilClose)),
		tc("conn/config-get", "CONFIG GET maxmemory-policy", "CONFIG GET databases", "CONFIG GET nope*"),
	)

	// Inline commands.
	add(
		tc("inline/ping", raw("PING\r\n", 1)),
		tc("inline/quoted", raw(`SET a "b c"`+"\r\n", 1), raw("GET a\n", 1)),
		tc("inline/spaces", raw("   SET    x     y   \r\n", 1), raw("\tGET\tx\t\r\n", 1), raw("GET x   \n", 1)),
		tc("inline/empty-lines", raw("\r\n\n   \r\nPING\r\n", 1), raw("\r\n", 0), raw("ECHO x\r\n", 1)),
		tc("inline/escapes", raw(`SET k "a\x41\n\t\"q\""`+"\r\n", 1), "GET k", raw(`ECHO 'it\'s'`+"\r\n", 1), raw(`ECHO "\x4"`+"\r\n", 1), raw(`ECHO ""`+"\r\n", 1)),
		tc("inline/unknown", raw("FOO bar baz\r\n", 1), raw("$x\r\n", 1), raw("+OK\r\n", 1), raw(":1\r\n", 1)),
		// Redis looks for the newline with strchr, so a NUL hides it: the
		// connection waits for a line that never ends.
		tc("inline/nul-stalls", silent("ECHO a\x00b\r\nPING\r\n")),
		tc("inline/cr-inside", raw("PING\rPING\r\n", 1), raw("ECHO a\rb\r\n", 1)),
		tc("inline/long-line", raw("ECHO "+strings.Repeat("a", 60000)+"\r\n", 1)),
		tc("inline/select", raw("SELECT 1\r\nSET k v\r\nSELECT 0\r\nGET k\r\nSELECT 1\r\nGET k\r\n", 6)),
		tc("inline/lf-only-pipeline", raw("SET a 1\nINCR a\nGET a\n", 3)),
	)

	// Split writes: a request cut anywhere gets no reply until it is whole.
	add(
		tc("split/multibulk", silent("*2\r\n$4\r\nECHO\r\n$5\r\nhel"), raw("lo\r\n", 1)),
		tc("split/header", silent("*"), silent("2\r"), silent("\n$3\r\nGET"), silent("\r\n$1\r"), raw("\nk\r\n", 1)),
		tc("split/inline", silent("PI"), silent("NG"), raw("\r\n", 1)),
		tc("split/pipeline-tail", raw("PING\r\n*1\r\n$4\r\nPI", 1), silent(""), raw("NG\r\n", 1)),
		tc("split/empty-multibulk", raw("*0\r\n*-1\r\nPING\r\n", 1)),
	)
	// A bulk shorter than its CRLF-less data: Redis takes the declared
	// length and skips two bytes without checking they are CRLF.
	add(tc("split/bulk-without-crlf", raw("*2\r\n$3\r\nGET\r\n$1\r\nab\r\n", 1), raw("PING\r\n", 1)))

	// Protocol errors: everything up to the close is compared, and another
	// client keeps working.
	protoErr := func(name, b string) corpusCase {
		return tc("protoerr/"+name, on(1, cmds("SET other 1")...), raw(b, corpusUntilClose), on(1, cmds("GET other")...))
	}
	add(
		protoErr("bad-multibulk-count", "*abc\r\n"),
		protoErr("bad-bulk-length", "*1\r\n$x\r\n"),
		protoErr("no-dollar", "*1\r\nx\r\n"),
		protoErr("unbalanced-quotes", "SET a \"b\r\n"),
		protoErr("unbalanced-single-quote", "SET a 'b\r\n"),
		protoErr("quote-not-followed-by-space", "SET a \"b\"c\r\n"),
		protoErr("huge-multibulk-count", "*3000000000\r\n"),
		protoErr("negative-bulk", "*1\r\n$-1\r\n"),
		protoErr("huge-bulk", "*1\r\n$600000000\r\n"),
		protoErr("after-valid", "PING\r\n"+corpusCmd("SET", "x", "1")+"*abc\r\nPING\r\n"),
		protoErr("too-big-inline", strings.Repeat("a", 70000)),
		protoErr("too-big-count-line", "*"+strings.Repeat("1", 70000)),
		protoErr("plus-multibulk-count", "*+1\r\n$4\r\nPING\r\n"),
		protoErr("plus-bulk-length", "*1\r\n$+4\r\nPING\r\n"),
		protoErr("leading-zero-count", "*01\r\n$4\r\nPING\r\n"),
		protoErr("minus-zero-bulk", "*1\r\n$-0\r\n"),
		protoErr("too-big-bulk-count-line", "*1\r\n$"+strings.Repeat("1", 70000)),
		protoErr("space-in-count", "* 1\r\n$4\r\nPING\r\n"),
		tc("protoerr/after-subscribe-keeps-replies", raw("*2\r\n$9\r\nSUBSCRIBE\r\n$1\r\na\r\nPING\r\nPING\r\n*x\r\n", corpusUntilClose)),
		tc("protoerr/negative-count-ignored", raw("*-5\r\n*0\r\nPING\r\n", 1)),
		tc("protoerr/empty-command-name", raw("*1\r\n$0\r\n\r\n", 1), raw("PING\r\n", 1)),
		tc("protoerr/no-dollar-waits", on(1, cmds("SET other 1")...), silent("*1\r\nx"), raw("\r\n", corpusUntilClose), on(1, cmds("GET other")...)),
		tc("protoerr/dollar-inline-is-command", raw("$x\r\n", 1), raw("PING\r\n", 1)),
	)
	return cs
}
