package resp_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// Redis's defaults: client-query-buffer-limit 1gb, proto-max-bulk-len 512mb.
const (
	defaultMaxQuery = 1 << 30
	defaultMaxBulk  = 512 << 20
)

// chunkReader returns its chunks one per Read (a chunk longer than the
// caller's buffer over several reads), then io.EOF. It counts what it gave.
type chunkReader struct {
	chunks [][]byte
	n      int // bytes returned so far
	reads  int // calls to Read
}

func (c *chunkReader) Read(p []byte) (int, error) {
	c.reads++
	for len(c.chunks) > 0 && len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	c.chunks[0] = c.chunks[0][n:]
	c.n += n
	return n, nil
}

// splitEvery cuts b into pieces of n bytes.
func splitEvery(b []byte, n int) [][]byte {
	var out [][]byte
	for len(b) > n {
		out = append(out, b[:n])
		b = b[n:]
	}
	return append(out, b)
}

// endlessReader serves prefix, then fill bytes forever.
type endlessReader struct {
	prefix []byte
	fill   byte
	n      int
}

func (e *endlessReader) Read(p []byte) (int, error) {
	n := copy(p, e.prefix)
	e.prefix = e.prefix[n:]
	for i := n; i < len(p); i++ {
		p[i] = e.fill
	}
	e.n += len(p)
	return len(p), nil
}

// readAll calls ReadCommands until it fails. It returns the args of every
// command, copied, and the error that ended the stream. It checks that the
// Raw of every multibulk command re-parses to the same args.
func readAll(tb testing.TB, r *resp.CommandReader) ([][]string, error) {
	tb.Helper()
	var got [][]string
	for {
		cmds, err := r.ReadCommands()
		for _, c := range cmds {
			args := argStrings(c.Args)
			if c.Raw != nil {
				checkRaw(tb, c.Raw, args)
			}
			got = append(got, args)
		}
		if err != nil {
			return got, err
		}
		if len(cmds) == 0 {
			tb.Fatalf("ReadCommands returned no command and no error")
		}
	}
}

// checkRaw parses raw alone and wants exactly one command with args.
func checkRaw(tb testing.TB, raw []byte, args []string) {
	tb.Helper()
	r := resp.NewCommandReader(bytes.NewReader(raw), defaultMaxQuery, defaultMaxBulk)
	cmds, err := r.ReadCommands()
	if err != nil || len(cmds) != 1 || !bytes.Equal(cmds[0].Raw, raw) || !slices.Equal(argStrings(cmds[0].Args), args) {
		tb.Fatalf("Raw %q re-parses to %q (err %v), want one command %q", raw, cmdsArgs(cmds), err, args)
	}
	if cmds, err := r.ReadCommands(); err != io.EOF {
		tb.Fatalf("Raw %q has trailing bytes: %q, %v", raw, cmdsArgs(cmds), err)
	}
}

func argStrings(args [][]byte) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = string(a)
	}
	return out
}

func cmdsArgs(cmds []resp.Command) [][]string {
	var out [][]string
	for _, c := range cmds {
		out = append(out, argStrings(c.Args))
	}
	return out
}

func equalCmds(a, b [][]string) bool { return slices.EqualFunc(a, b, slices.Equal) }

// parseAll parses in, handed over in one piece, with Redis's default limits.
func parseAll(tb testing.TB, in []byte, auth bool, maxBulk int64) ([][]string, error) {
	tb.Helper()
	if maxBulk == 0 {
		maxBulk = defaultMaxBulk
	}
	r := resp.NewCommandReader(bytes.NewReader(in), defaultMaxQuery, maxBulk)
	r.SetAuthRequired(auth)
	return readAll(tb, r)
}

func cmdList(c ...[]string) [][]string { return c }
func argv(a ...string) []string        { return a }

func multibulk(a ...string) string {
	var bs [][]byte
	for _, s := range a {
		bs = append(bs, []byte(s))
	}
	return string(resp.AppendCommand(nil, bs...))
}

func TestCommandReaderValid(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 5<<20/16) // 5 MiB
	many := make([]string, 1000)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}

	tests := []struct {
		name    string
		in      string
		auth    bool
		maxBulk int64
		want    [][]string
	}{
		{name: "multibulk", in: "*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n", want: cmdList(argv("GET", "key"))},
		{name: "inline CRLF", in: "GET key\r\n", want: cmdList(argv("GET", "key"))},
		{name: "inline LF", in: "GET key\n", want: cmdList(argv("GET", "key"))},
		{name: "inline double quotes and escapes", in: `SET "a b" "c\"d\n\r\t\b\a\\\q"` + "\r\n",
			want: cmdList(argv("SET", "a b", "c\"d\n\r\t\b\a\\q"))},
		{name: "inline hex escapes", in: `ECHO "\x41\x7a\xFF\x00" "\x4" "\xZZ" "\x"` + "\r\n",
			want: cmdList(argv("ECHO", "Az\xff\x00", "x4", "xZZ", "x"))},
		{name: "inline single quotes", in: `SET 'a b' 'it\'s' 'x\ny'` + "\r\n",
			want: cmdList(argv("SET", "a b", "it's", `x\ny`))},
		{name: "inline tabs and blanks", in: "\t GET\t\tkey \t\r\n", want: cmdList(argv("GET", "key"))},
		{name: "inline VT and FF lead", in: "\v\f GET key\r\n", want: cmdList(argv("GET", "key"))},
		{name: "inline VT inside an arg", in: "ECHO a\vb\r\n", want: cmdList(argv("ECHO", "a\vb"))},
		{name: "inline CR separates", in: "ECHO a\rb\r\n", want: cmdList(argv("ECHO", "a", "b"))},
		{name: "inline quote glued to a word", in: `SET foo"bar baz" v` + "\r\n", want: cmdList(argv("SET", "foobar baz", "v"))},
		{name: "inline empty quoted args", in: `SET "" ''` + "\r\n", want: cmdList(argv("SET", "", ""))},
		{name: "inline many args", in: "DEL a b c d e f g h i j k l\r\n", want: cmdList(argv("DEL", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"))},
		{name: "inline star inside", in: "KEYS *\r\n", want: cmdList(argv("KEYS", "*"))},
		{name: "empty lines", in: "\r\n\n  \t\r\nPING\r\n\r\n\n", want: cmdList(argv("PING"))},
		{name: "only empty lines", in: "\r\n\r\n\n"},
		{name: "*0 skipped", in: "*0\r\nPING\r\n", want: cmdList(argv("PING"))},
		{name: "*-1 skipped", in: "*-1\r\nPING\r\n", want: cmdList(argv("PING"))},
		{name: "*-5 skipped", in: "*-5\r\n*1\r\n$4\r\nPING\r\n", want: cmdList(argv("PING"))},
		{name: "*-3000000000 skipped", in: "*-3000000000\r\nPING\r\n", want: cmdList(argv("PING"))},
		{name: "mixed pipeline", in: "*1\r\n$4\r\nPING\r\nGET a\r\n*0\r\n\r\n*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$1\r\nc\r\nECHO 'x y'\n",
			want: cmdList(argv("PING"), argv("GET", "a"), argv("SET", "b", "c"), argv("ECHO", "x y"))},
		{name: "binary bulk", in: "*2\r\n$4\r\nECHO\r\n$8\r\na\r\n\x00b\n*\r\r\n",
			want: cmdList(argv("ECHO", "a\r\n\x00b\n*\r"))},
		{name: "empty-string args", in: "*3\r\n$3\r\nSET\r\n$0\r\n\r\n$0\r\n\r\n", want: cmdList(argv("SET", "", ""))},
		{name: "bulk CRLF not checked", in: "*2\r\n$4\r\nECHO\r\n$3\r\nfooXY*1\r\n$4\r\nPING\r\n",
			want: cmdList(argv("ECHO", "foo"), argv("PING"))},
		{name: "count line LF not checked", in: "*1\rX$4\rYPING\r\n", want: cmdList(argv("PING"))},
		{name: "5 MiB bulk", in: multibulk("SET", "k", big) + "PING\r\n", want: cmdList(argv("SET", "k", big), argv("PING"))},
		{name: "1000 args", in: multibulk(many...), want: cmdList(many)},
		{name: "bulk at maxBulk", in: "*1\r\n$5\r\nhello\r\n", maxBulk: 5, want: cmdList(argv("hello"))},
		{name: "count INT_MAX waits", in: "*2147483647\r\n$1\r\na\r\n"},
		{name: "incomplete frame at EOF", in: "PING\r\n*2\r\n$3\r\nGET\r\n$3\r\nke", want: cmdList(argv("PING"))},
		{name: "inline of 64 KiB without newline waits", in: strings.Repeat("a", resp.InlineMax)},
		{name: "count line of 64 KiB waits", in: "*" + strings.Repeat("1", resp.InlineMax-1)},
		// strchr stops at NUL, so a line holding one never ends.
		{name: "NUL in inline line", in: "PING\x00\r\nPING\r\n"},
		{name: "NUL in count line", in: "*1\x00\r\n$4\r\nPING\r\n"},
		{name: "NUL in bulk count line", in: "PING\r\n*1\r\n$4\x00\r\nPING\r\n", want: cmdList(argv("PING"))},
		{name: "auth: 10 args", in: multibulk("a", "b", "c", "d", "e", "f", "g", "h", "i", "j"), auth: true,
			want: cmdList(argv("a", "b", "c", "d", "e", "f", "g", "h", "i", "j"))},
		{name: "auth: 16384-byte bulk", in: multibulk("AUTH", strings.Repeat("p", resp.UnauthBulkMax)), auth: true,
			want: cmdList(argv("AUTH", strings.Repeat("p", resp.UnauthBulkMax)))},
		{name: "auth: inline has no limits", in: "DEL a b c d e f g h i j k l " + strings.Repeat("p", 20000) + "\r\n", auth: true,
			want: cmdList(argv("DEL", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", strings.Repeat("p", 20000)))},
		{name: "auth: *-20 skipped", in: "*-20\r\nPING\r\n", auth: true, want: cmdList(argv("PING"))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseAll(t, []byte(tc.in), tc.auth, tc.maxBulk)
			if err != io.EOF {
				t.Errorf("error = %v, want io.EOF", err)
			}
			if !equalCmds(got, tc.want) {
				t.Errorf("commands = %.200q, want %.200q", got, tc.want)
			}
		})
	}
}

// malformedCase is a request Redis answers with a protocol error. Commands
// before the error are PINGs, so Redis answers each with +PONG.
type malformedCase struct {
	name    string
	in      string
	auth    bool
	maxBulk int64 // 0: Redis's default
	want    [][]string
	wantErr string
}

func malformedCases() []malformedCase {
	const (
		invalidMbulk = "Protocol error: invalid multibulk length"
		invalidBulk  = "Protocol error: invalid bulk length"
		unbalanced   = "Protocol error: unbalanced quotes in request"
	)
	return []malformedCase{
		{name: "*abc", in: "*abc\r\n", wantErr: invalidMbulk},
		{name: "* empty count", in: "*\r\n", wantErr: invalidMbulk},
		{name: "*-0", in: "*-0\r\n", wantErr: invalidMbulk},
		{name: "*+1", in: "*+1\r\n$4\r\nPING\r\n", wantErr: invalidMbulk},
		{name: "* 1", in: "* 1\r\n$4\r\nPING\r\n", wantErr: invalidMbulk},
		{name: "*01", in: "*01\r\n$4\r\nPING\r\n", wantErr: invalidMbulk},
		{name: "*1 trailing blank", in: "*1 \r\n$4\r\nPING\r\n", wantErr: invalidMbulk},
		{name: "*3000000000", in: "*3000000000\r\n", wantErr: invalidMbulk},
		{name: "*2147483648", in: "*2147483648\r\n", wantErr: invalidMbulk},
		{name: "* int64 overflow", in: "*99999999999999999999\r\n", wantErr: invalidMbulk},
		{name: "$-1 in request", in: "*1\r\n$-1\r\n", wantErr: invalidBulk},
		{name: "$-0", in: "*1\r\n$-0\r\n", wantErr: invalidBulk},
		{name: "$abc", in: "*1\r\n$abc\r\n", wantErr: invalidBulk},
		{name: "$ empty", in: "*1\r\n$\r\n", wantErr: invalidBulk},
		{name: "$+4", in: "*1\r\n$+4\r\nPING\r\n", wantErr: invalidBulk},
		{name: "$04", in: "*1\r\n$04\r\nPING\r\n", wantErr: invalidBulk},
		{name: "$600000000 over proto-max-bulk-len", in: "*1\r\n$600000000\r\n", wantErr: invalidBulk},
		{name: "$536870913 just over proto-max-bulk-len", in: "*1\r\n$536870913\r\n", wantErr: invalidBulk},
		{name: "$6 over maxBulk 5", in: "*1\r\n$6\r\n", maxBulk: 5, wantErr: invalidBulk},
		{name: "x instead of $", in: "*1\r\nx\r\n", wantErr: "Protocol error: expected '$', got 'x'"},
		{name: ": instead of $ in second arg", in: "*2\r\n$3\r\nGET\r\n:1\r\n", wantErr: "Protocol error: expected '$', got ':'"},
		{name: "byte 0x80 instead of $", in: "*1\r\n\x80\r\n", wantErr: "Protocol error: expected '$', got '\x80'"},
		// Redis's addReplyErrorFormat maps \r and \n in the text to spaces,
		// so the reply stays one line.
		{name: "CR instead of $", in: "*1\r\n\r\n", wantErr: "Protocol error: expected '$', got ' '"},
		{name: "LF instead of $", in: "*1\r\n\nfoo\r\n", wantErr: "Protocol error: expected '$', got ' '"},
		{name: `inline "foo`, in: "\"foo\r\n", wantErr: unbalanced},
		{name: "inline 'foo", in: "SET k 'foo\r\n", wantErr: unbalanced},
		{name: "inline 'a'b", in: "'a'b\r\n", wantErr: unbalanced},
		{name: `inline "a"b`, in: "ECHO \"a\"b\r\n", wantErr: unbalanced},
		{name: `inline "a""b"`, in: "ECHO \"a\"\"b\"\r\n", wantErr: unbalanced},
		{name: `inline "foo\"`, in: "ECHO \"foo\\\"\r\n", wantErr: unbalanced},
		{name: `inline 'a\\'`, in: "ECHO 'a\\\\'\r\n", wantErr: unbalanced},
		{name: "too big inline", in: strings.Repeat("a", resp.InlineMax+1), wantErr: "Protocol error: too big inline request"},
		{name: "too big inline after a command", in: "PING\r\n" + strings.Repeat("a", resp.InlineMax+1), want: cmdList(argv("PING")),
			wantErr: "Protocol error: too big inline request"},
		{name: "too big mbulk count string", in: "*" + strings.Repeat("1", resp.InlineMax), wantErr: "Protocol error: too big mbulk count string"},
		{name: "too big bulk count string", in: "*1\r\n$" + strings.Repeat("1", resp.InlineMax), wantErr: "Protocol error: too big bulk count string"},
		{name: "too big bulk count string without $", in: "*1\r\n" + strings.Repeat("x", resp.InlineMax+1),
			wantErr: "Protocol error: too big bulk count string"},
		{name: "unauthenticated multibulk length", in: "*11\r\n", auth: true, wantErr: "Protocol error: unauthenticated multibulk length"},
		{name: "unauthenticated bulk length", in: "*1\r\n$16385\r\n", auth: true, wantErr: "Protocol error: unauthenticated bulk length"},
		{name: "auth: invalid count beats unauthenticated", in: "*3000000000\r\n", auth: true, wantErr: invalidMbulk},
		{name: "auth: invalid bulk beats unauthenticated", in: "*1\r\n$600000000\r\n", auth: true, wantErr: invalidBulk},
		{name: "commands before the error", in: "PING\r\n*1\r\n$4\r\nPING\r\n*abc\r\nPING\r\n", want: cmdList(argv("PING"), argv("PING")),
			wantErr: invalidMbulk},
		{name: "commands before a bad bulk", in: "*1\r\n$4\r\nPING\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$x\r\n", want: cmdList(argv("PING"), argv("PING")),
			wantErr: invalidBulk},
		{name: "commands before unbalanced quotes", in: "PING\r\nECHO \"x\r\nPING\r\n", want: cmdList(argv("PING")), wantErr: unbalanced},
	}
}

func TestCommandReaderMalformed(t *testing.T) {
	for _, tc := range malformedCases() {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseAll(t, []byte(tc.in), tc.auth, tc.maxBulk)
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("error = %v, want %s", err, tc.wantErr)
			}
			var pe *resp.ProtocolError
			if !errors.As(err, &pe) {
				t.Errorf("error %v (%T) is not a *resp.ProtocolError", err, err)
			}
			if !equalCmds(got, tc.want) {
				t.Errorf("commands = %.200q, want %.200q", got, tc.want)
			}
		})
	}
}

// TestCommandReaderMalformedOneCall checks that the commands parsed before a
// protocol error come back from the same call as the error, so they can be
// answered first, and that the error is sticky.
func TestCommandReaderMalformedOneCall(t *testing.T) {
	in := "PING\r\n*1\r\n$4\r\nPING\r\n*abc\r\nPING\r\n"
	src := &chunkReader{chunks: [][]byte{[]byte(in)}}
	r := resp.NewCommandReader(src, defaultMaxQuery, defaultMaxBulk)
	cmds, err := r.ReadCommands()
	if !errors.Is(err, resp.ErrInvalidMultibulk) {
		t.Fatalf("error = %v, want %v", err, resp.ErrInvalidMultibulk)
	}
	if got := cmdsArgs(cmds); !equalCmds(got, [][]string{{"PING"}, {"PING"}}) {
		t.Fatalf("commands = %q, want two PINGs", got)
	}
	reads := src.reads
	for i := range 3 {
		cmds, err := r.ReadCommands()
		if err != resp.ErrInvalidMultibulk || len(cmds) != 0 {
			t.Fatalf("call %d after the error = %q, %v; want no command and the same error", i, cmdsArgs(cmds), err)
		}
	}
	if src.reads != reads {
		t.Errorf("reader read %d more times after the error", src.reads-reads)
	}
}

func TestCommandReaderErrorsAreSticky(t *testing.T) {
	ioErr := errors.New("boom")
	tests := []struct {
		name    string
		src     io.Reader
		maxQ    int
		wantErr error
	}{
		{"protocol error", strings.NewReader("*1\r\nx\r\nPING\r\n"), defaultMaxQuery, nil},
		{"EOF", strings.NewReader("PING\r\n"), defaultMaxQuery, io.EOF},
		{"I/O error", io.MultiReader(strings.NewReader("PING\r\n"), &errReader{ioErr}), defaultMaxQuery, ioErr},
		{"query buffer", strings.NewReader(strings.Repeat("x", 10000)), 100, resp.ErrQueryBufferExceeded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := resp.NewCommandReader(tc.src, tc.maxQ, defaultMaxBulk)
			_, first := readAll(t, r)
			if tc.wantErr != nil && first != tc.wantErr {
				t.Fatalf("error = %v, want %v", first, tc.wantErr)
			}
			for range 3 {
				if cmds, err := r.ReadCommands(); err != first || len(cmds) != 0 {
					t.Fatalf("later call = %q, %v; want %v again", cmdsArgs(cmds), err, first)
				}
			}
		})
	}
}

type errReader struct{ err error }

func (e *errReader) Read([]byte) (int, error) { return 0, e.err }

func TestCommandReaderRaw(t *testing.T) {
	frames := []string{
		"*1\r\n$4\r\nPING\r\n",
		"GET a\r\n",
		"*2\r\n$3\r\nGET\r\n$1\r\nkXY",
		"*1\rZ$4\r\nPING\r\n",
	}
	wantRaw := []string{frames[0], "", frames[2], frames[3]}
	r := resp.NewCommandReader(strings.NewReader(strings.Join(frames, "")), defaultMaxQuery, defaultMaxBulk)
	cmds, err := r.ReadCommands()
	if err != nil || len(cmds) != len(wantRaw) {
		t.Fatalf("ReadCommands = %q, %v; want %d commands", cmdsArgs(cmds), err, len(wantRaw))
	}
	for i, c := range cmds {
		if string(c.Raw) != wantRaw[i] || (wantRaw[i] == "") != (c.Raw == nil) {
			t.Errorf("command %d Raw = %q, want %q", i, c.Raw, wantRaw[i])
		}
	}
}

func TestCommandReaderFeed(t *testing.T) {
	src := &chunkReader{chunks: [][]byte{[]byte("$3\r\nbar\r\n")}}
	r := resp.NewCommandReader(src, defaultMaxQuery, defaultMaxBulk)
	r.Feed([]byte("PING\r\n*2\r\n$3\r\nGET"))
	r.Feed([]byte("\r\n"))
	if n := len("PING\r\n*2\r\n$3\r\nGET\r\n"); r.Buffered() != n {
		t.Fatalf("Buffered() = %d after Feed, want %d", r.Buffered(), n)
	}
	cmds, err := r.ReadCommands()
	if err != nil || !equalCmds(cmdsArgs(cmds), cmdList(argv("PING"))) || src.reads != 0 {
		t.Fatalf("first call = %q, %v after %d reads; want PING from the fed bytes, no read", cmdsArgs(cmds), err, src.reads)
	}
	got, err := readAll(t, r)
	if err != io.EOF || !equalCmds(got, cmdList(argv("GET", "bar"))) {
		t.Fatalf("got %q, %v; want GET bar, io.EOF", got, err)
	}
}

// TestCommandReaderMatchesRedis sends each malformed request to a real
// redis-server and wants, byte for byte, +PONG for each command parsed
// before the error, then "-ERR " + the reader's error text, then EOF.
func TestCommandReaderMatchesRedis(t *testing.T) {
	open := redistest.Start(t, localredis.Options{})
	locked := redistest.Start(t, localredis.Options{Password: "secret"})
	for _, tc := range malformedCases() {
		if tc.maxBulk != 0 {
			continue // Redis cannot set proto-max-bulk-len below 1mb
		}
		t.Run(tc.name, func(t *testing.T) {
			srv := open
			if tc.auth {
				srv = locked
			}
			got := redisRoundTrip(t, srv.Addr(), tc.in)
			_, err := parseAll(t, []byte(tc.in), tc.auth, 0)
			if err == nil {
				t.Fatalf("reader accepts %.100q; Redis replied %q", tc.in, got)
			}
			want := strings.Repeat("+PONG\r\n", len(tc.want)) + "-ERR " + err.Error() + "\r\n"
			if got != want {
				t.Errorf("%.100q: Redis replied %q, reader's reply would be %q", tc.in, got, want)
			}
		})
	}
}

// redisRoundTrip writes in on a new connection and returns all the server
// sends until it closes the connection.
func redisRoundTrip(tb testing.TB, addr, in string) string {
	tb.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		tb.Fatal(err)
	}
	if _, err := io.WriteString(c, in); err != nil {
		tb.Fatal(err)
	}
	out, err := io.ReadAll(c)
	if err != nil {
		tb.Fatalf("reading Redis's reply to %.100q: %v (got %q)", in, err, out)
	}
	return string(out)
}

// splitPipeline returns a pipeline of varied commands and the args each
// should parse to.
func splitPipeline(bigLen int) ([]byte, [][]string) {
	big := make([]byte, bigLen)
	for i := range big {
		big[i] = "\r\n\x00*$abc"[i%8]
	}
	var in []byte
	var want [][]string
	add := func(frame string, cmd ...string) {
		in = append(in, frame...)
		if cmd != nil {
			want = append(want, cmd)
		}
	}
	add("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n", "SET", "k", "hello")
	add("PING\r\n", "PING")
	add(`SET "a b" 'c\'d' "\x41\n"`+"\r\n", "SET", "a b", "c'd", "A\n")
	add("\r\n")
	add("*0\r\n")
	add("*-1\r\n")
	add("\t GET  k\n", "GET", "k")
	add("*2\r\n$4\r\nECHO\r\n$0\r\n\r\n", "ECHO", "")
	add("*2\r\n$4\r\nECHO\r\n$8\r\n\r\n\x00\r\n*\r\n\r\n", "ECHO", "\r\n\x00\r\n*\r\n")
	add(multibulk("SET", "big", string(big)), "SET", "big", string(big))
	add("*1\r\n$4\r\nPINGXY", "PING")
	add("*1\rX$4\r\nPING\r\n", "PING")
	add("ECHO \"\"\r\n", "ECHO", "")
	add("QUIT\r\n", "QUIT")
	return in, want
}

// TestCommandReaderSplitEverywhere feeds one pipeline cut at every byte
// boundary, one byte per read, and in random chunks, and wants the same
// commands every time.
func TestCommandReaderSplitEverywhere(t *testing.T) {
	in, want := splitPipeline(6000)
	rng := rand.New(rand.NewPCG(1, 2))

	type split struct {
		name   string
		chunks [][]byte
	}
	var splits []split
	splits = append(splits, split{"whole", [][]byte{in}})
	splits = append(splits, split{"byte by byte", splitEvery(in, 1)})
	for i := 1; i < len(in); i++ {
		splits = append(splits, split{fmt.Sprintf("cut at %d", i), [][]byte{in[:i], in[i:]}})
	}
	const nRandom = 300
	for i := range nRandom {
		var chunks [][]byte
		for rest := in; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(1<<rng.IntN(15)))
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		splits = append(splits, split{fmt.Sprintf("random %d", i), chunks})
	}

	ran := 0
	for _, s := range splits {
		r := resp.NewCommandReader(&chunkReader{chunks: s.chunks}, defaultMaxQuery, defaultMaxBulk)
		got, err := readAll(t, r)
		if err != io.EOF || !equalCmds(got, want) {
			t.Fatalf("%s: got %d commands %.300q, error %v; want %d commands, io.EOF", s.name, len(got), got, err, len(want))
		}
		ran++
	}
	if wantRan := 2 + len(in) - 1 + nRandom; ran != wantRan || len(splits) != wantRan {
		t.Fatalf("ran %d of %d splits, want %d", ran, len(splits), wantRan)
	}
}

// TestCommandReaderSplitBigBulk does the same with a bulk bigger than one
// read can take, cutting at every boundary around its header and its end.
func TestCommandReaderSplitBigBulk(t *testing.T) {
	in, want := splitPipeline(150 << 10)
	bigAt := bytes.Index(in, []byte("$3\r\nbig\r\n"))
	bigEnd := bigAt + 150<<10 + 30
	rng := rand.New(rand.NewPCG(3, 4))

	var cuts []int
	for i := 1; i < len(in); i++ {
		if i < bigAt+100 || i > bigEnd-100 {
			cuts = append(cuts, i)
		}
	}
	ran := 0
	for _, i := range cuts {
		r := resp.NewCommandReader(&chunkReader{chunks: [][]byte{in[:i], in[i:]}}, defaultMaxQuery, defaultMaxBulk)
		got, err := readAll(t, r)
		if err != io.EOF || !equalCmds(got, want) {
			t.Fatalf("cut at %d: got %d commands, error %v; want %d commands, io.EOF", i, len(got), err, len(want))
		}
		ran++
	}
	const nRandom = 50
	for i := range nRandom {
		var chunks [][]byte
		for rest := in; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(1<<(10+rng.IntN(8))))
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		r := resp.NewCommandReader(&chunkReader{chunks: chunks}, defaultMaxQuery, defaultMaxBulk)
		got, err := readAll(t, r)
		if err != io.EOF || !equalCmds(got, want) {
			t.Fatalf("random %d: got %d commands, error %v; want %d commands, io.EOF", i, len(got), err, len(want))
		}
		ran++
	}
	wantCuts := (bigAt + 100 - 1) + (len(in) - 1 - (bigEnd - 100))
	if wantRan := wantCuts + nRandom; ran != wantRan || len(cuts) != wantCuts {
		t.Fatalf("ran %d splits (%d cuts), want %d (%d cuts)", ran, len(cuts), wantRan, wantCuts)
	}
}

// allocated returns the bytes f allocates on the heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestCommandReaderQueryBufferLimit(t *testing.T) {
	const maxQuery = 1 << 20
	tests := []struct {
		name   string
		prefix string
		fill   byte
	}{
		{"endless bulk", "*2\r\n$3\r\nSET\r\n$500000000\r\n", 'v'},
		{"endless args", "*2000000000\r\n", 'x'}, // 'x' is parsed as a bad '$' only once a CR arrives
		{"endless count line", "*", '1'},
		{"endless inline", "", 'a'},
		{"endless bulk count line", "*1\r\n$", '1'},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := resp.NewCommandReader(&endlessReader{prefix: []byte(tc.prefix), fill: tc.fill}, maxQuery, defaultMaxBulk)
			var err error
			alloc := allocated(func() { _, err = r.ReadCommands() })
			if err != resp.ErrQueryBufferExceeded && !isTooBig(err) {
				t.Fatalf("error = %v, want %v", err, resp.ErrQueryBufferExceeded)
			}
			if alloc > 8*maxQuery {
				t.Errorf("allocated %d bytes with a query buffer limit of %d", alloc, maxQuery)
			}
			// The last read may bring up to twice what was buffered.
			if r.Buffered() > 4*maxQuery {
				t.Errorf("Buffered() = %d with a query buffer limit of %d", r.Buffered(), maxQuery)
			}
		})
	}

	t.Run("small limit before the inline limit", func(t *testing.T) {
		r := resp.NewCommandReader(&endlessReader{fill: 'a'}, 100, defaultMaxBulk)
		if _, err := r.ReadCommands(); err != resp.ErrQueryBufferExceeded {
			t.Fatalf("error = %v, want %v", err, resp.ErrQueryBufferExceeded)
		}
	})
	t.Run("complete commands within the limit pass", func(t *testing.T) {
		in := strings.Repeat("*1\r\n$4\r\nPING\r\n", 1000)
		r := resp.NewCommandReader(&chunkReader{chunks: splitEvery([]byte(in), 50)}, 100, defaultMaxBulk)
		got, err := readAll(t, r)
		if err != io.EOF || len(got) != 1000 {
			t.Fatalf("got %d commands, %v; want 1000, io.EOF", len(got), err)
		}
	})
}

func isTooBig(err error) bool {
	return err == resp.ErrTooBigInline || err == resp.ErrTooBigMultibulk || err == resp.ErrTooBigBulkCount
}

// TestCommandReaderBulkHeaderAllocs sends only the header of a huge bulk: the
// reader must not allocate for the announced length before the data comes.
func TestCommandReaderBulkHeaderAllocs(t *testing.T) {
	for _, n := range []int{100 << 10, 10 << 20, 500 << 20, defaultMaxBulk} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			in := fmt.Sprintf("*2\r\n$3\r\nSET\r\n$%d\r\n", n)
			r := resp.NewCommandReader(strings.NewReader(in), defaultMaxQuery, defaultMaxBulk)
			var err error
			alloc := allocated(func() { _, err = r.ReadCommands() })
			if err != io.EOF {
				t.Fatalf("error = %v, want io.EOF", err)
			}
			if alloc > 256<<10 {
				t.Errorf("header alone allocated %d bytes", alloc)
			}
		})
	}
	t.Run("AllocsPerRun", func(t *testing.T) {
		in := []byte("*2\r\n$3\r\nSET\r\n$500000000\r\n")
		allocs := testing.AllocsPerRun(20, func() {
			r := resp.NewCommandReader(bytes.NewReader(in), defaultMaxQuery, defaultMaxBulk)
			r.ReadCommands()
		})
		if allocs > 10 {
			t.Errorf("%v allocations per header", allocs)
		}
	})
}

// TestCommandReaderGrowth parses big requests arriving in network-sized
// reads. The work should stay proportional to the request: Redis parses
// these in linear time.
func TestCommandReaderGrowth(t *testing.T) {
	manyArgs := make([]string, 1<<17)
	for i := range manyArgs {
		manyArgs[i] = "a"
	}
	tests := []struct {
		name   string
		args   []string
		chunk  int
		factor int // bound on allocated bytes per request byte
	}{
		// A buffer that grows geometrically allocates a few times what it
		// finally holds.
		{"1 MiB bulk in 1460-byte reads", []string{"SET", "k", strings.Repeat("v", 1<<20)}, 1460, 6},
		{"1 MiB bulk in 16 KiB reads", []string{"SET", "k", strings.Repeat("v", 1<<20)}, 16 << 10, 6},
		{"20 args of 60 KB in 16 KiB reads", slices.Repeat([]string{strings.Repeat("v", 60000)}, 20), 16 << 10, 6},
		// Each 7-byte arg also costs a 24-byte slice header in Args and
		// two offsets while parsing.
		{"128Ki one-byte args in 16 KiB reads", manyArgs, 16 << 10, 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(multibulk(tc.args...))
			src := &chunkReader{chunks: splitEvery(in, tc.chunk)}
			r := resp.NewCommandReader(src, defaultMaxQuery, defaultMaxBulk)
			var cmds []resp.Command
			var err error
			alloc := allocated(func() { cmds, err = r.ReadCommands() })
			if err != nil || len(cmds) != 1 || len(cmds[0].Args) != len(tc.args) {
				t.Fatalf("got %d commands, %v", len(cmds), err)
			}
			if alloc > uint64(tc.factor*len(in))+1<<20 {
				t.Errorf("parsing %d bytes in %d reads allocated %d bytes (%.0fx the request)",
					len(in), src.reads, alloc, float64(alloc)/float64(len(in)))
			}
		})
	}
}

// loopReader returns p on every Read.
type loopReader struct{ p []byte }

func (l *loopReader) Read(b []byte) (int, error) { return copy(b, l.p), nil }

func BenchmarkCommandReader(b *testing.B) {
	var pipeline []byte
	for i := range 16 {
		pipeline = resp.AppendCommand(pipeline, []byte("GET"), fmt.Appendf(nil, "key:%d", i))
	}
	r := resp.NewCommandReader(&loopReader{pipeline}, defaultMaxQuery, defaultMaxBulk)
	b.SetBytes(int64(len(pipeline)))
	b.ReportAllocs()
	for b.Loop() {
		cmds, err := r.ReadCommands()
		if err != nil || len(cmds) != 16 {
			b.Fatalf("got %d commands, %v", len(cmds), err)
		}
	}
}

// TestParseInt mirrors Redis's string2ll.
func TestParseInt(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"1", 1, true},
		{"-1", -1, true},
		{"10", 10, true},
		{"1234567890", 1234567890, true},
		{"-1234567890", -1234567890, true},
		{"9223372036854775807", math.MaxInt64, true},
		{"-9223372036854775808", math.MinInt64, true},
		{"9223372036854775808", 0, false},
		{"-9223372036854775809", 0, false},
		{"18446744073709551615", 0, false},
		{"18446744073709551616", 0, false},
		{"18446744073709551619", 0, false},
		{"99999999999999999999", 0, false},
		{"-99999999999999999999", 0, false},
		{"123456789012345678901234567890", 0, false},
		{"", 0, false},
		{"-", 0, false},
		{"-0", 0, false},
		{"00", 0, false},
		{"01", 0, false},
		{"-01", 0, false},
		{"+1", 0, false},
		{"+0", 0, false},
		{" 1", 0, false},
		{"1 ", 0, false},
		{"1\r", 0, false},
		{"1\x00", 0, false},
		{"--1", 0, false},
		{"1-", 0, false},
		{"1a", 0, false},
		{"0x10", 0, false},
		{"1.0", 0, false},
		{"1e3", 0, false},
		{"١", 0, false}, // Arabic-Indic digit one
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			got, ok := resp.ParseInt([]byte(tc.in))
			if got != tc.want || ok != tc.ok {
				t.Errorf("ParseInt(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestParseIntCanonical checks ParseInt against strconv on every number's
// canonical form, the only form string2ll accepts.
func TestParseIntCanonical(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 10000 {
		v := int64(rng.Uint64()) >> rng.IntN(64)
		s := strconv.FormatInt(v, 10)
		if got, ok := resp.ParseInt([]byte(s)); !ok || got != v {
			t.Fatalf("case %d: ParseInt(%q) = %d, %v", i, s, got, ok)
		}
		if v > 0 {
			if _, ok := resp.ParseInt([]byte("0" + s)); ok {
				t.Fatalf("case %d: ParseInt accepts a leading zero in %q", i, "0"+s)
			}
		}
	}
}

// The commands of one read share an arena for their arguments: each must
// still own its Args, so that a caller appending to one (or keeping it
// while it handles the next) never sees or changes another's.
func TestCommandReaderArgsApart(t *testing.T) {
	var pipeline strings.Builder
	const n = 100 // past the arena's first sizes
	for i := range n {
		fmt.Fprintf(&pipeline, "*2\r\n$3\r\nGET\r\n$%d\r\nk%d\r\n", len(strconv.Itoa(i))+1, i)
	}
	r := resp.NewCommandReader(strings.NewReader(pipeline.String()), defaultMaxQuery, defaultMaxBulk)
	cmds, err := r.ReadCommands()
	if err != nil || len(cmds) != n {
		t.Fatalf("got %d commands, %v; want %d", len(cmds), err, n)
	}
	for i := range cmds {
		cmds[i].Args = append(cmds[i].Args, []byte("extra"))
	}
	for i, c := range cmds {
		if len(c.Args) != 3 || string(c.Args[0]) != "GET" || string(c.Args[1]) != "k"+strconv.Itoa(i) || string(c.Args[2]) != "extra" {
			t.Fatalf("command %d = %q after appends to each", i, c.Args)
		}
	}
}
