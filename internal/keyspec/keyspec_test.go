package keyspec

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// conn is a raw client of a real redis-server.
type conn struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
}

// startServer starts a redis-server for tb and connects to it.
func startServer(tb testing.TB) *conn {
	tb.Helper()
	srv := redistest.Start(tb, localredis.Options{})
	nc, err := net.DialTimeout("tcp", srv.Addr(), 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { nc.Close() })
	return &conn{t: tb, nc: nc, br: bufio.NewReader(nc)}
}

// pipeline sends every command at once and returns the raw replies.
func (c *conn) pipeline(cmds [][][]byte) [][]byte {
	c.t.Helper()
	c.nc.SetDeadline(time.Now().Add(60 * time.Second))
	var req []byte
	for _, args := range cmds {
		req = resp.AppendCommand(req, args...)
	}
	// Write while reading, so a pipeline bigger than the socket buffers
	// cannot deadlock against the server's replies.
	werr := make(chan error, 1)
	go func() {
		_, err := c.nc.Write(req)
		werr <- err
	}()
	replies := make([][]byte, len(cmds))
	for i := range cmds {
		var err error
		if replies[i], err = resp.ReadReply(c.br, nil); err != nil {
			c.t.Fatalf("reply %d of %d: %v", i+1, len(cmds), err)
		}
	}
	if err := <-werr; err != nil {
		c.t.Fatal(err)
	}
	return replies
}

// table fetches COMMAND from the server and parses it.
func (c *conn) table() *Table {
	c.t.Helper()
	reply := c.pipeline([][][]byte{{[]byte("COMMAND")}})[0]
	tab, err := Parse(reply)
	if err != nil {
		c.t.Fatalf("Parse(COMMAND): %v", err)
	}
	return tab
}

// words splits a command line on spaces; `""` is an empty argument.
func words(line string) []string {
	ws := strings.Fields(line)
	for i, w := range ws {
		if w == `""` {
			ws[i] = ""
		}
	}
	return ws
}

func toBytes(ss []string) [][]byte {
	bs := make([][]byte, len(ss))
	for i, s := range ss {
		bs[i] = []byte(s)
	}
	return bs
}

// getkeysNoKeys are the errors of COMMAND GETKEYS that mean the command has
// no keys to route by: a command without keys, one Redis rejects, or one
// too short for GETKEYS itself.
var getkeysNoKeys = []string{
	"-ERR Invalid command specified",
	"-ERR The command has no key arguments",
	"-ERR Invalid number of arguments specified for command",
	"-ERR Invalid arguments specified for command",
	"-ERR wrong number of arguments for 'command|getkeys' command",
}

// decodeGetkeys turns a COMMAND GETKEYS reply into key names; an error
// reply that means "no keys" gives nil.
func decodeGetkeys(t *testing.T, reply []byte) []string {
	t.Helper()
	if reply[0] == '-' {
		line := string(bytes.TrimSuffix(reply, []byte("\r\n")))
		if !slices.Contains(getkeysNoKeys, line) {
			t.Fatalf("COMMAND GETKEYS: unexpected error %q", line)
		}
		return nil
	}
	r := &reader{b: reply}
	var keys []string
	for range r.array() {
		keys = append(keys, string(r.str()))
	}
	if r.err != nil || len(r.b) > 0 {
		t.Fatalf("COMMAND GETKEYS: bad reply %q: %v", reply, r.err)
	}
	return keys
}

// keyNames returns args[i] for each index, checking the indexes are in
// order and within args, but never the command name.
func keyNames(t *testing.T, args [][]byte, idx []int) []string {
	t.Helper()
	var names []string
	for j, i := range idx {
		if i < 1 || i >= len(args) || j > 0 && i <= idx[j-1] {
			t.Fatalf("Keys = %v: index %d out of order or range", idx, i)
		}
		names = append(names, string(args[i]))
	}
	return names
}

// commandName is the table name args run: "name" or "container|sub".
func commandName(tab *Table, args [][]byte) string {
	name := strings.ToLower(string(args[0]))
	if c := tab.commands[name]; c != nil && c.subcommands != nil && len(args) > 1 {
		name += "|" + strings.ToLower(string(args[1]))
	}
	return name
}

// handCases are command lines written for the grammars and the odd corners;
// Keys must agree with COMMAND GETKEYS on each.
var handCases = []string{
	// Scripts and functions: numkeys at 2.
	"EVAL s 0",
	"EVAL s 0 a b",
	"EVAL s 1 k",
	"EVAL s 1 k arg",
	"EVAL s 2 k1 k2 arg",
	"EVAL s 3 k1 k2",
	"EVAL s -1 k",
	"EVAL s abc k",
	"EVAL s 9223372036854775807 k",
	"EVAL s 99999999999999999999 k",
	"eval s 1 k",
	"EvAl s 2 a b",
	"EVALSHA 0123456789abcdef0123456789abcdef01234567 2 a b c",
	"EVALSHA sha 0 a",
	"EVAL_RO s 1 a",
	"EVALSHA_RO sha 1 a b",
	"FCALL f 2 a b x",
	"FCALL f 0",
	"FCALL_RO f 1 a",
	"fcall_ro f 3 a b c",
	// A destination and numkeys at 2.
	"ZUNIONSTORE d 2 a b",
	"ZUNIONSTORE d 1 a WEIGHTS 2 AGGREGATE MAX",
	"ZINTERSTORE d 3 a b c",
	"ZDIFFSTORE d 1 a",
	"ZUNIONSTORE d 0 a",
	"ZUNIONSTORE d 3 a b",
	"ZUNIONSTORE d -1 a b",
	"zinterstore d 2 d d",
	// numkeys at 1.
	"ZUNION 2 a b WITHSCORES",
	"ZINTER 1 a",
	"ZDIFF 3 a b c",
	"ZDIFF 4 a b c",
	"ZINTERCARD 2 a b LIMIT 0",
	"SINTERCARD 1 a",
	"SINTERCARD 0 a",
	"LMPOP 2 a b LEFT COUNT 2",
	"LMPOP 1 a RIGHT",
	"ZMPOP 1 a MIN",
	"ZMPOP 2 a b MAX COUNT 10",
	"ZUNION 3 a b",
	// A timeout, then numkeys at 2.
	"BLMPOP 0 2 a b RIGHT",
	"BLMPOP 0 3 a b",
	"BZMPOP 1.5 1 a MAX COUNT 3",
	"BZMPOP 0 2 a b MIN",
	// Streams: the first half after STREAMS.
	"XREAD STREAMS a 0",
	"XREAD COUNT 10 STREAMS a b 0 0",
	"XREAD BLOCK 100 COUNT 1 STREAMS a b c 1 2 3",
	"xread count 1 streams a 0",
	"XREAD STREAMS streams 0",
	"XREAD STREAMS streams streams 0 0",
	"XREAD STREAMS a",
	"XREAD COUNT 1 BLOCK 0",
	"XREADGROUP GROUP g c STREAMS a >",
	"XREADGROUP GROUP streams streams STREAMS s 0",
	"XREADGROUP GROUP g c COUNT 1 BLOCK 0 NOACK STREAMS a b > >",
	"XREADGROUP GROUP count block STREAMS a >",
	"xreadgroup group g c streams a b 0 0",
	"XREADGROUP GROUP g c NOACK STREAMS a",
	"XREAD ſtreams a 0",
	// SORT: the key and the last STORE.
	"SORT k",
	"SORT k ALPHA DESC",
	"SORT k BY w_* GET # GET o_* STORE d",
	"SORT k LIMIT 0 10 STORE d",
	"SORT k STORE d STORE e",
	"SORT k STORE get",
	"SORT k STORE store",
	"SORT k STORE by GET x",
	"sort k store d",
	"SORT k STORE",
	"SORT k GET store x",
	"SORT k BY store",
	"SORT k LIMIT store d",
	"SORT k ſtore d",
	"SORT_RO k BY x GET y",
	"SORT_RO k STORE d",
	// MIGRATE: the key, or KEYS after an empty key.
	"MIGRATE h 6379 k 0 1000",
	"MIGRATE h 6379 k 0 1000 COPY REPLACE",
	`MIGRATE h 6379 "" 0 1000 KEYS a b c`,
	`MIGRATE h 6379 "" 0 1000 COPY AUTH keys KEYS a`,
	`MIGRATE h 6379 "" 0 1000 AUTH2 keys keys KEYS a b`,
	`MIGRATE h 6379 "" 0 1000 REPLACE AUTH2 u p`,
	"MIGRATE h 6379 k 0 1000 KEYS a b",
	`MIGRATE h 6379 "" 0 1000`,
	`migrate h 1 "" 0 1 keys a`,
	// GEORADIUS: the key and the STORE or STOREDIST destination.
	"GEORADIUS k 0 0 1 km",
	"GEORADIUS k 0 0 1 km STORE d",
	"GEORADIUS k 0 0 1 km STOREDIST d",
	"GEORADIUS k 0 0 1 km WITHDIST COUNT 5 ASC STORE d",
	"GEORADIUS k 0 0 1 km STORE",
	"GEORADIUS k 0 0 1 store d",
	"GEORADIUSBYMEMBER k m 1 km STORE d",
	"georadiusbymember k m 1 km storedist d",
	"GEORADIUSBYMEMBER k m 1 km COUNT 1 ANY",
	"GEORADIUS_RO k 0 0 1 km",
	"GEORADIUSBYMEMBER_RO k m 1 km WITHCOORD",
	// Subcommands.
	"OBJECT ENCODING k",
	"object encoding k",
	"OBJECT FREQ k",
	"OBJECT IDLETIME k",
	"OBJECT REFCOUNT k",
	"OBJECT HELP",
	"OBJECT NOSUCH k",
	"OBJECT ENCODING",
	"OBJECT ENCODING k extra",
	"MEMORY USAGE k SAMPLES 0",
	"MEMORY USAGE k",
	"MEMORY STATS",
	"XINFO STREAM k FULL COUNT 1",
	"XINFO GROUPS k",
	"XINFO CONSUMERS k g",
	"XGROUP CREATE k g $ MKSTREAM",
	"XGROUP SETID k g 0",
	"XGROUP DESTROY k g",
	"XGROUP CREATECONSUMER k g c",
	"XGROUP DELCONSUMER k g c",
	"CLIENT LIST",
	"CONFIG GET maxmemory",
	"CLUSTER KEYSLOT k",
	// Legacy ranges.
	"GET k",
	"SET k v EX 10 GET",
	"MSET a 1 b 2",
	"MSET a 1 b 2 c 3",
	"MSET a 1 b",
	"MSETNX a 1",
	"DEL a b c",
	"UNLINK a",
	"EXISTS a a",
	"TOUCH a b",
	"WATCH a b",
	"PFCOUNT a b",
	"BLPOP a b 0",
	"BRPOP a 0",
	"BZPOPMIN a b 0",
	"BITOP AND d a b",
	"BITOP NOT d a",
	"LMOVE a b LEFT RIGHT",
	"BLMOVE a b LEFT RIGHT 0",
	"RPOPLPUSH a b",
	"COPY a b DB 1 REPLACE",
	"RENAME a b",
	"SMOVE a b m",
	"LCS a b IDX",
	"PFMERGE d a b",
	"SUNIONSTORE d a b",
	"SINTERSTORE d a",
	"GEOSEARCHSTORE d s FROMMEMBER m BYRADIUS 1 km",
	"ZRANGESTORE d s 0 -1",
	"PFDEBUG GETREG k",
	"RESTORE-ASKING k 0 x",
	"HSET h f v f2 v2",
	"XADD s * f v",
	"BITFIELD k GET u8 0",
	// Arity and unknown names.
	"GET",
	"GET a b",
	"MSET a",
	"PING",
	"ECHO x",
	"NOSUCH a b",
	"ſort k",
	"object|encoding k",
}

// deviations are the cases where Keys does not say what COMMAND GETKEYS
// says, on purpose (see the package doc). getkeys is what the server says,
// checked too, so a deviation that goes away with a new Redis shows up.
var deviations = []struct {
	line          string
	getkeys, want []string
}{
	// Sharded pub/sub channels route by slot.
	{"SSUBSCRIBE a b", nil, []string{"a", "b"}},
	{"SUNSUBSCRIBE a", nil, []string{"a"}},
	{"SPUBLISH ch msg", nil, []string{"ch"}},
	// GETKEYS falls back to atoi for numkeys; the commands fail.
	{"EVAL s 3abc a b c", []string{"a", "b", "c"}, nil},
	{"EVAL s +1 a", []string{"a"}, nil},
	{"EVAL s 01 a", []string{"a"}, nil},
	{"EVAL s 4294967297 a", []string{"a"}, nil},
	{"ZUNIONSTORE d 2x a b", []string{"a", "b", "d"}, nil},
	// GETKEYS searches STREAMS from a fixed index and splits an odd
	// count; the commands parse their options, and reject an odd count.
	{"XREADGROUP COUNT 1 GROUP g streams STREAMS a 0", []string{"STREAMS"}, []string{"a"}},
	{"XREAD STREAMS a b 0", []string{"a"}, nil},
	{"XREAD FOO STREAMS a 0", []string{"a"}, nil},
	// GETKEYS takes the first STORE and the first STOREDIST; the last
	// one is the destination.
	{"GEORADIUS k 0 0 1 km STORE d STOREDIST e", []string{"k", "d", "e"}, []string{"k", "e"}},
	{"GEORADIUS k 0 0 1 km STORE a STORE b", []string{"k", "a"}, []string{"k", "b"}},
	{"GEORADIUSBYMEMBER k m 1 km STOREDIST a STORE b", []string{"k", "b", "a"}, []string{"k", "b"}},
	// GETKEYS names the empty key; MIGRATE moves nothing.
	{`MIGRATE h 6379 "" 0 1000 KEYS`, []string{""}, nil},
	// The key specs of PFMERGE fail when there is no source key; the
	// legacy range, which Redis Cluster routes by, has the destination.
	{"PFMERGE d", nil, []string{"d"}},
	// Redis's getkeys reads the destination "store" as the keyword again.
	{"SORT k STORE store LIMIT 0 1", []string{"k", "LIMIT"}, []string{"k", "store"}},
}

// notGenerated are commands, with an argument count (0: any), whose
// generated cases would be deviations; the deviations cover them.
var notGenerated = []struct {
	name string
	argc int
}{
	{"ssubscribe", 0},
	{"sunsubscribe", 0},
	{"spublish", 0},
	{"pfmerge", 2},
}

func generated(name string, argc int) bool {
	for _, ng := range notGenerated {
		if ng.name == name && (ng.argc == 0 || ng.argc == argc) {
			return false
		}
	}
	return true
}

// generatedCases builds argument lists for every command and subcommand of
// the table: the minimum count of arguments, a few more for variadic ones,
// and one too few or too many. Arguments are distinct words that look like
// no option. The name's case alternates, to check Redis's case folding.
func generatedCases(tab *Table) [][]string {
	var out [][]string
	add := func(prefix []string, c *command) {
		counts := []int{c.arity, c.arity - 1, c.arity + 1}
		if c.arity < 0 {
			counts = []int{-c.arity, -c.arity + 1, -c.arity + 2, -c.arity + 3, -c.arity - 1}
		}
		for _, n := range counts {
			if n < len(prefix) {
				continue
			}
			args := slices.Clone(prefix)
			for i := len(prefix); i < n; i++ {
				args = append(args, fmt.Sprintf("a%d", i))
			}
			if generated(strings.ToLower(args[0]), n) {
				out = append(out, args)
			}
		}
	}
	for name, c := range tab.commands {
		if c.subcommands == nil {
			add([]string{mixedCase(name)}, c)
			continue
		}
		for sub, sc := range c.subcommands {
			add([]string{mixedCase(name), mixedCase(sub)}, sc)
		}
	}
	slices.SortFunc(out, slices.Compare)
	return out
}

func mixedCase(s string) string {
	b := []byte(s)
	for i := 0; i < len(b); i += 2 {
		if 'a' <= b[i] && b[i] <= 'z' {
			b[i] -= 'a' - 'A'
		}
	}
	return string(b)
}

// TestKeysAgainstServer compares Keys with COMMAND GETKEYS of redis-server
// for a generated corpus covering every command, the hand-written cases and
// the deviations, and checks every command with keys was seen with keys.
func TestKeysAgainstServer(t *testing.T) {
	c := startServer(t)
	tab := c.table()

	type kase struct {
		args    [][]byte
		getkeys []string // what GETKEYS must say, for a deviation
		want    []string // what Keys must say, for a deviation
		dev     bool
	}
	var cases []kase
	for _, args := range generatedCases(tab) {
		cases = append(cases, kase{args: toBytes(args)})
	}
	for _, line := range handCases {
		cases = append(cases, kase{args: toBytes(words(line))})
	}
	for _, d := range deviations {
		cases = append(cases, kase{args: toBytes(words(d.line)), getkeys: d.getkeys, want: d.want, dev: true})
	}
	if n := len(cases); n < 150 {
		t.Fatalf("only %d cases", n)
	}

	// Two replies per case: GETKEYS, and COMMAND INFO of the name, which
	// is nil when Keys must say ErrUnknownCommand.
	var cmds [][][]byte
	for _, kc := range cases {
		cmds = append(cmds, append(toBytes([]string{"COMMAND", "GETKEYS"}), kc.args...))
		cmds = append(cmds, [][]byte{[]byte("COMMAND"), []byte("INFO"), kc.args[0]})
	}
	replies := c.pipeline(cmds)

	seen := map[string]bool{}
	var dst []int
	for i, kc := range cases {
		name := strings.Join(strings.Fields(fmt.Sprintf("%q", kc.args)), " ")
		t.Run(name, func(t *testing.T) {
			getkeys := decodeGetkeys(t, replies[2*i])
			// COMMAND INFO also finds "container|sub", a name the command
			// table itself does not have.
			info := string(replies[2*i+1])
			unknown := info == "*1\r\n$-1\r\n" || info == "*1\r\n*-1\r\n" || bytes.IndexByte(kc.args[0], '|') >= 0
			var err error
			dst, err = tab.Keys(kc.args, dst[:0])
			var wantErr error
			if unknown {
				wantErr = ErrUnknownCommand
			}
			if err != wantErr {
				t.Fatalf("Keys error = %v, want %v", err, wantErr)
			}
			got := keyNames(t, kc.args, dst)
			want := getkeys
			if kc.dev {
				if !slices.Equal(getkeys, kc.getkeys) {
					t.Errorf("COMMAND GETKEYS = %q, the deviation expects %q", getkeys, kc.getkeys)
				}
				want = kc.want
			}
			if !slices.Equal(got, want) {
				t.Errorf("Keys = %q, want %q", got, want)
			}
			if len(got) > 0 {
				seen[commandName(tab, kc.args)] = true
			}
		})
	}

	for name, c := range tab.commands {
		subs := map[string]*command{name: c}
		if c.subcommands != nil {
			subs = map[string]*command{}
			for sub, sc := range c.subcommands {
				subs[name+"|"+sub] = sc
			}
		}
		for full, sc := range subs {
			if (sc.first > 0 || sc.keys != nil) && !seen[full] {
				t.Errorf("no case gave %s keys", full)
			}
		}
	}
}

// TestGrammarsMatchMovableKeys checks that the grammars are exactly the
// commands the server flags movablekeys, less SORT_RO (see grammars).
func TestGrammarsMatchMovableKeys(t *testing.T) {
	c := startServer(t)
	tab := c.table()
	var withGrammar []string
	for name, cmd := range tab.commands {
		if cmd.keys != nil {
			withGrammar = append(withGrammar, name)
		}
	}
	var want []string
	for name := range grammars {
		want = append(want, name)
	}
	slices.Sort(withGrammar)
	slices.Sort(want)
	if !slices.Equal(withGrammar, want) {
		t.Errorf("commands with a grammar: %q, want %q", withGrammar, want)
	}

	// COMMAND INFO shows the flags; movablekeys on anything without a
	// grammar other than SORT_RO is a command this package does not know.
	replies := c.pipeline([][][]byte{{[]byte("COMMAND")}})
	for _, name := range movableNames(t, replies[0]) {
		if grammars[name] == nil && name != "sort_ro" {
			t.Errorf("%s is flagged movablekeys but has no grammar", name)
		}
	}
}

// movableNames lists the commands and subcommands a COMMAND reply flags
// movablekeys, by walking the reply independently of Parse.
func movableNames(t *testing.T, reply []byte) []string {
	t.Helper()
	var names []string
	r := &reader{b: reply}
	var walk func()
	walk = func() {
		n := r.array()
		name := string(r.str())
		r.skip()
		for range r.array() {
			if string(r.str()) == "movablekeys" {
				names = append(names, name)
			}
		}
		for i := 3; i < n; i++ {
			if i == 9 {
				for range r.array() {
					walk()
				}
			} else {
				r.skip()
			}
		}
	}
	for range r.array() {
		walk()
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	return names
}

// entry is one COMMAND entry in Redis 7's shape; subs are its subcommand
// entries.
func entry(name string, arity int, flags []string, first, last, step int, subs ...[]byte) []byte {
	b := redcon.AppendArray(nil, 10)
	b = redcon.AppendBulk(b, []byte(name))
	b = redcon.AppendInt(b, int64(arity))
	b = redcon.AppendArray(b, len(flags))
	for _, f := range flags {
		b = redcon.AppendString(b, f)
	}
	b = redcon.AppendInt(b, int64(first))
	b = redcon.AppendInt(b, int64(last))
	b = redcon.AppendInt(b, int64(step))
	b = append(b, "*1\r\n+@read\r\n*0\r\n*1\r\n*2\r\n$5\r\nflags\r\n*1\r\n+RO\r\n"...)
	b = redcon.AppendArray(b, len(subs))
	for _, s := range subs {
		b = append(b, s...)
	}
	return b
}

func reply(entries ...[]byte) []byte {
	b := redcon.AppendArray(nil, len(entries))
	for _, e := range entries {
		b = append(b, e...)
	}
	return b
}

var longName = strings.Repeat("m", nameBuf+6) + ".cmd"

// smallReply is a COMMAND reply with one command of each kind.
var smallReply = reply(
	entry("get", 2, []string{"readonly", "fast"}, 1, 1, 1),
	entry("mset", -3, []string{"write"}, 1, -1, 2),
	entry("eval", -3, []string{"noscript", "movablekeys"}, 0, 0, 0),
	entry("object", -2, nil, 0, 0, 0,
		entry("object|encoding", 3, []string{"readonly"}, 2, 2, 1),
		entry("object|help", 2, nil, 0, 0, 0)),
	entry("mod.movable", -2, []string{"movablekeys"}, 1, 1, 1),
	entry(longName, -2, nil, 1, -1, 1),
	// Redis before 6.0: six elements.
	[]byte("*6\r\n$3\r\nold\r\n:-2\r\n*1\r\n+write\r\n:1\r\n:-1\r\n:1\r\n"),
)

func TestKeysSmallTable(t *testing.T) {
	tab, err := Parse(smallReply)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	tests := []struct {
		args []string
		want []int
		err  error
	}{
		{[]string{"GET", "k"}, []int{1}, nil},
		{[]string{"get", "k", "x"}, nil, nil},
		{[]string{"MSET", "a", "1", "b", "2"}, []int{1, 3}, nil},
		{[]string{"EVAL", "s", "2", "a", "b"}, []int{3, 4}, nil},
		{[]string{"OBJECT", "ENCODING", "k"}, []int{2}, nil},
		{[]string{"OBJECT", "HELP"}, nil, nil},
		{[]string{"OBJECT", "NOSUCH", "k"}, nil, nil},
		{[]string{"OBJECT"}, nil, nil},
		{[]string{"object|encoding", "k"}, nil, ErrUnknownCommand},
		{[]string{"Mod.Movable", "a", "b"}, []int{1}, nil},
		{[]string{strings.ToUpper(longName), "a", "b"}, []int{1, 2}, nil},
		{[]string{longName + "x", "a"}, nil, ErrUnknownCommand},
		{[]string{longName[1:] + "x", "a"}, nil, ErrUnknownCommand},
		{[]string{"OLD", "a", "b"}, []int{1, 2}, nil},
		{[]string{"NOPE"}, nil, ErrUnknownCommand},
		{[]string{"gеt", "k"}, nil, ErrUnknownCommand}, // Cyrillic е
		{nil, nil, ErrUnknownCommand},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.args), func(t *testing.T) {
			got, err := tab.Keys(toBytes(tc.args), nil)
			if err != tc.err || !slices.Equal(got, tc.want) {
				t.Errorf("Keys = %v, %v; want %v, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestParseMalformed(t *testing.T) {
	get := entry("get", 2, nil, 1, 1, 1)
	tests := []struct {
		name  string
		reply string
	}{
		{"empty", ""},
		{"status", "+OK\r\n"},
		{"error reply", "-NOPERM this user has no permissions to run the 'command' command\r\n"},
		{"nil array", "*-1\r\n"},
		{"bad array length", "*x\r\n"},
		{"huge array length", "*99999999999\r\n"},
		{"no CR", "*1\n"},
		{"truncated", "*1\r\n"},
		{"entry not an array", "*1\r\n:1\r\n"},
		{"entry of five", "*1\r\n*5\r\n$3\r\nget\r\n:2\r\n*0\r\n:1\r\n:1\r\n"},
		{"name an integer", "*1\r\n*6\r\n:1\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n"},
		{"empty name", string(reply(entry("", 2, nil, 1, 1, 1)))},
		{"nil name", "*1\r\n*6\r\n$-1\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n"},
		{"short bulk", "*1\r\n*6\r\n$5\r\nget\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n"},
		{"bulk without CRLF", "*1\r\n*6\r\n$3\r\ngetxx:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n"},
		{"arity a string", "*1\r\n*6\r\n$3\r\nget\r\n$1\r\n2\r\n*0\r\n:1\r\n:1\r\n:1\r\n"},
		{"arity overflow", "*1\r\n*6\r\n$3\r\nget\r\n:99999999999\r\n*0\r\n:1\r\n:1\r\n:1\r\n"},
		{"flags not an array", "*1\r\n*6\r\n$3\r\nget\r\n:2\r\n+readonly\r\n:1\r\n:1\r\n:1\r\n"},
		{"flag an integer", "*1\r\n*6\r\n$3\r\nget\r\n:2\r\n*1\r\n:1\r\n:1\r\n:1\r\n:1\r\n"},
		{"negative first", string(reply(entry("get", 2, nil, -1, 1, 1)))},
		{"zero step", string(reply(entry("get", 2, nil, 1, 1, 0)))},
		{"negative step", string(reply(entry("get", 2, nil, 1, 1, -1)))},
		{"duplicate", string(reply(get, get))},
		{"duplicate subcommand", string(reply(entry("object", -2, nil, 0, 0, 0, get, get)))},
		{"subcommand without prefix", string(reply(entry("object", -2, nil, 0, 0, 0, entry("encoding", 3, nil, 2, 2, 1))))},
		{"subcommand of another", string(reply(entry("object", -2, nil, 0, 0, 0, entry("xinfo|stream", 3, nil, 2, 2, 1))))},
		{"subcommands not an array", "*1\r\n*10\r\n$3\r\nget\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n:0\r\n"},
		{"bad type in skipped element", "*1\r\n*7\r\n$3\r\nget\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n?x\r\n"},
		{"bad array in skipped element", "*1\r\n*7\r\n$3\r\nget\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n*-2\r\n"},
		{"bad bulk in skipped element", "*1\r\n*7\r\n$3\r\nget\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n$9\r\nab\r\n"},
		{"trailing bytes", string(reply(get)) + "+OK\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tab, err := Parse([]byte(tc.reply))
			if err == nil || tab != nil {
				t.Fatalf("Parse(%q) = %v, %v; want an error", tc.reply, tab, err)
			}
			if !strings.HasPrefix(err.Error(), "keyspec: ") {
				t.Errorf("error %q does not start with the package name", err)
			}
		})
	}

	t.Run("every prefix", func(t *testing.T) {
		for n := range len(smallReply) {
			if tab, err := Parse(smallReply[:n]); err == nil {
				t.Fatalf("Parse of the first %d bytes = %v, want an error", n, tab)
			}
		}
	})
}

func TestKeysAllocs(t *testing.T) {
	tab := startServer(t).table()
	dst := make([]int, 0, 16)
	for _, line := range []string{
		"GET k",
		"get k",
		"MSET a 1 b 2 c 3",
		"EVAL s 2 a b x",
		"XREADGROUP GROUP g c STREAMS a b > >",
		"object ENCODING k",
		"SORT k BY x STORE d",
		"NOSUCH k",
	} {
		args := toBytes(words(line))
		if n := testing.AllocsPerRun(100, func() { tab.Keys(args, dst[:0]) }); n != 0 {
			t.Errorf("Keys(%s) allocates %v times, want 0", line, n)
		}
	}
}

// fuzzTable has every grammar on a command of arity -1, so that argument
// lists of any length reach them; the grammars must not trust the arity.
func fuzzTable(tb testing.TB) *Table {
	tb.Helper()
	entries := [][]byte{
		entry("get", 2, nil, 1, 1, 1),
		entry("mset", -3, nil, 1, -1, 2),
		entry("bitop", -4, nil, 2, -1, 1),
		entry("blpop", -3, nil, 1, -2, 1),
		entry("odd", -1, nil, 3, 1, 1),
		entry("object", -2, nil, 0, 0, 0, entry("object|encoding", 3, nil, 2, 2, 1)),
	}
	for name := range grammars {
		entries = append(entries, entry(name, -1, []string{"movablekeys"}, 0, 0, 0))
	}
	tab, err := Parse(reply(entries...))
	if err != nil {
		tb.Fatal(err)
	}
	return tab
}

// FuzzKeys checks that Keys never panics and returns ordered indexes of
// arguments other than the name. Input is a command line, arguments split
// on spaces.
func FuzzKeys(f *testing.F) {
	tab := fuzzTable(f)
	for _, line := range handCases {
		f.Add(line)
	}
	for _, d := range deviations {
		f.Add(d.line)
	}
	for name := range grammars {
		f.Add(name)
		f.Add(name + " 1")
		f.Add(name + " a b")
	}
	f.Fuzz(func(t *testing.T, line string) {
		args := toBytes(strings.Split(line, " "))
		got, err := tab.Keys(args, nil)
		if err != nil && err != ErrUnknownCommand {
			t.Fatalf("Keys error %v", err)
		}
		keyNames(t, args, got)
	})
}

// FuzzParse checks that Parse never panics, and that a table it accepts
// never makes Keys panic.
func FuzzParse(f *testing.F) {
	f.Add(smallReply)
	f.Add(reply(entry("get", 2, nil, 1, 1, 1)))
	f.Add([]byte("*1\r\n*6\r\n$3\r\nold\r\n:-2\r\n*1\r\n+write\r\n:1\r\n:-1\r\n:1\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, err := Parse(b)
		if err != nil {
			return
		}
		for _, line := range []string{"get k", "mset a b c d", "old a b c", "object encoding k", "eval s 1 k"} {
			args := toBytes(words(line))
			got, _ := tab.Keys(args, nil)
			keyNames(t, args, got)
		}
	})
}

func BenchmarkKeys(b *testing.B) {
	tab := startServer(b).table()
	for _, line := range []string{
		"GET stock:sku:1001",
		"MSET a 1 b 2 c 3 d 4 e 5 f 6 g 7 h 8",
		"EVAL script 2 stock:sku:1001 log 1",
	} {
		args := toBytes(words(line))
		b.Run(strings.Fields(line)[0], func(b *testing.B) {
			dst := make([]int, 0, 16)
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if dst, err = tab.Keys(args, dst[:0]); err != nil || len(dst) == 0 {
					b.Fatalf("Keys = %v, %v", dst, err)
				}
			}
		})
	}
}

// TestCheckAgainstServer runs harmless commands on a real server and
// compares the refusal it gives with Check's.
func TestCheckAgainstServer(t *testing.T) {
	c := startServer(t)
	tab := c.table()
	lines := []string{
		"CLUSTER", "CLUSTER FOO", "CLUSTER SLOTS x", "CLUSTER SLOTS", "CLUSTER KEYSLOT",
		"CLUSTER KEYSLOT a", "cluster help", "READONLY", "READONLY x", "READWRITE", "ASKING x",
		"OBJECT", "OBJECT FOO", "OBJECT ENCODING", "OBJECT ENCODING k", "GET", "GET k", "GET k x",
		"NOSUCH", "CONFIG GET", "CONFIG GET maxmemory", "XINFO STREAM", "MSET k", "MSET k v",
		"ECHO", "SCRIPT EXISTS",
	}
	var cmds [][][]byte
	for _, l := range lines {
		cmds = append(cmds, toBytes(words(l)))
	}
	replies := c.pipeline(cmds)
	for i, l := range lines {
		r := string(replies[i])
		var want error
		switch {
		case strings.HasPrefix(r, "-ERR unknown command"):
			want = ErrUnknownCommand
		case strings.HasPrefix(r, "-ERR unknown subcommand"):
			want = ErrUnknownSubcommand
		case strings.HasPrefix(r, "-ERR wrong number of arguments"):
			want = ErrArity
		}
		if got := tab.Check(cmds[i]); got != want {
			t.Errorf("%s: Check = %v; the server said %q", l, got, r)
		}
	}
}

func TestWritesAgainstServer(t *testing.T) {
	tab := startServer(t).table()
	for line, want := range map[string]bool{
		"SET k v": true, "GET k": false, "INCR k": true, "DECRBY k 2": true, "MGET a b": false,
		"EVALSHA abc 1 k": true, "EVAL_RO x 1 k": false, "FCALL f 1 k": true, "OBJECT ENCODING k": false,
		"XGROUP CREATE s g $": true, "xinfo STREAM s": false, "NOSUCH k": false, "CLIENT NOSUCH": false,
	} {
		if got := tab.Writes(toBytes(words(line))); got != want {
			t.Errorf("Writes(%s) = %v, want %v", line, got, want)
		}
	}
}
