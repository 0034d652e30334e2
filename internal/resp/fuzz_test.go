package resp_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// commandSeeds are valid and malformed requests for FuzzCommandReader.
var commandSeeds = []string{
	"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n",
	"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\nGET k\r\n",
	"PING\r\n",
	"GET key\n",
	`SET "a b" 'c\'d' "\x41\n\t" foo"bar baz"` + "\r\n",
	"\r\n\n \t\r\nPING\r\n",
	"*0\r\n*-1\r\n*-5\r\nPING\r\n",
	"*2\r\n$4\r\nECHO\r\n$8\r\na\r\n\x00b\n*\r\r\n",
	"*3\r\n$3\r\nSET\r\n$0\r\n\r\n$0\r\n\r\n",
	"*2\r\n$4\r\nECHO\r\n$3\r\nfooXY*1\r\n$4\r\nPING\r\n",
	"*1\rX$4\rYPING\r\n",
	"*1\r\n$4\r\nPI",
	"PING\x00\r\nPING\r\n",
	"*1\x00\r\n$4\r\nPING\r\n",
	"*abc\r\n",
	"*\r\n",
	"*-0\r\n",
	"*+1\r\n",
	"*3000000000\r\n",
	"*2147483647\r\n",
	"*99999999999999999999\r\n",
	"*1\r\n$-1\r\n",
	"*1\r\n$abc\r\n",
	"*1\r\n$600000000\r\n",
	"*1\r\n$500000000\r\nabc",
	"*1\r\nx\r\n",
	"*1\r\n\r\n",
	"*1\r\n\nfoo\r\n",
	"\"foo\r\n",
	"'a'b\r\n",
	"ECHO \"a\"\"b\"\r\n",
	"*11\r\n",
	"*1\r\n$16385\r\n",
	"PING\r\n*1\r\n$4\r\nPING\r\n*abc\r\nPING\r\n",
}

// FuzzCommandReader parses the same bytes in one read and one byte per read
// and wants the same commands and the same error; the Raw of a multibulk
// command and the re-encoding of an inline one must parse to the same args.
func FuzzCommandReader(f *testing.F) {
	for _, s := range commandSeeds {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, auth bool) {
		whole := resp.NewCommandReader(bytes.NewReader(data), defaultMaxQuery, defaultMaxBulk)
		whole.SetAuthRequired(auth)
		got, err := readAllRaw(t, whole)
		var pe *resp.ProtocolError
		if err != io.EOF && !errors.As(err, &pe) {
			t.Fatalf("error %v (%T) is neither io.EOF nor a protocol error", err, err)
		}
		for _, c := range got {
			if len(c.Args) == 0 {
				t.Fatalf("command with no args")
			}
			if c.Raw != nil {
				checkRaw(t, c.Raw, argStrings(c.Args))
				continue
			}
			enc := resp.AppendCommand(nil, c.Args...)
			if again, err := parseAll(t, enc, false, 0); err != io.EOF || !equalCmds(again, [][]string{argStrings(c.Args)}) {
				t.Fatalf("inline %q re-encoded as %q parses to %q, %v", c.Args, enc, again, err)
			}
		}

		// Past InlineMax the "too big" errors depend on how much one read
		// brought, as in Redis.
		if len(data) > resp.InlineMax {
			return
		}
		bytewise := resp.NewCommandReader(&chunkReader{chunks: splitEvery(data, 1)}, defaultMaxQuery, defaultMaxBulk)
		bytewise.SetAuthRequired(auth)
		got2, err2 := readAllRaw(t, bytewise)
		if !errorsMatch(err, err2) {
			t.Fatalf("error in one read %v, byte by byte %v", err, err2)
		}
		if !slices.EqualFunc(got, got2, equalCommand) {
			t.Fatalf("one read gives %q, byte by byte %q", got, got2)
		}
	})
}

func errorsMatch(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Error() == b.Error()
}

func equalCommand(a, b resp.Command) bool {
	return bytes.Equal(a.Raw, b.Raw) && (a.Raw == nil) == (b.Raw == nil) && slices.EqualFunc(a.Args, b.Args, bytes.Equal)
}

// readAllRaw is readAll keeping whole commands, copied.
func readAllRaw(tb testing.TB, r *resp.CommandReader) ([]resp.Command, error) {
	tb.Helper()
	var out []resp.Command
	for {
		cmds, err := r.ReadCommands()
		for _, c := range cmds {
			cp := resp.Command{Args: make([][]byte, len(c.Args))}
			for i, a := range c.Args {
				cp.Args[i] = bytes.Clone(a)
			}
			if c.Raw != nil {
				cp.Raw = bytes.Clone(c.Raw)
			}
			out = append(out, cp)
		}
		if err != nil {
			return out, err
		}
		if len(cmds) == 0 {
			tb.Fatalf("ReadCommands returned no command and no error")
		}
	}
}

// FuzzReadReply wants ReadReply never to panic, to return on success a
// prefix of its input, and to frame the same way whatever the bufio size.
func FuzzReadReply(f *testing.F) {
	for _, s := range []string{
		"+OK\r\n",
		"-ERR unknown command\r\n",
		":-1\r\n",
		"$5\r\nhello\r\n",
		"$-1\r\n",
		"$0\r\n\r\n",
		"*-1\r\n",
		"*0\r\n",
		"*2\r\n*2\r\n+a\r\n*0\r\n*3\r\n-ERR x\r\n$-1\r\n$1\r\nz\r\n",
		"*3\r\n$3\r\nfoo\r\n:1\r\n+OK\r\n+NEXT\r\n",
		"$3\r\nfooXY",
		"$5\r\nhel",
		"+OK\n",
		"\r\n",
		"?\r\n",
		"$-2\r\n",
		"*-2\r\n",
		"$01\r\nx\r\n",
		"*1\r\n*1\r\n*1\r\n$x\r\n",
		"_\r\n",
		",1.5\r\n",
		"#t\r\n",
		"(12345678901234567890\r\n",
		"=7\r\ntxt:abc\r\n",
		"!5\r\nERR x\r\n",
		"%2\r\n+a\r\n:1\r\n+b\r\n~1\r\n_\r\n",
		">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n",
		"|1\r\n+a\r\n+b\r\n*1\r\n:1\r\n",
		"%-1\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := resp.ReadReply(bufio.NewReaderSize(bytes.NewReader(data), 16), nil)
		if err == nil && !bytes.HasPrefix(data, got) {
			t.Fatalf("ReadReply = %q, not a prefix of the input", got)
		}
		got2, err2 := resp.ReadReply(bufio.NewReader(bytes.NewReader(data)), nil)
		if (err == nil) != (err2 == nil) || errors.Is(err, resp.ErrBadReply) != errors.Is(err2, resp.ErrBadReply) {
			t.Fatalf("bufio 16: %v, bufio 4096: %v", err, err2)
		}
		if err == nil && !bytes.Equal(got, got2) {
			t.Fatalf("bufio 16 reads %q, bufio 4096 %q", got, got2)
		}
		if err == nil && resp.FrameLen(got) != len(got) {
			t.Fatalf("FrameLen(%q) = %d, ReadReply framed %d", got, resp.FrameLen(got), len(got))
		}
	})
}
