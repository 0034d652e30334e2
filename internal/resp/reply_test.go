package resp_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// bufSizes are the bufio sizes replies are read with: the smallest bufio
// allows and the default.
var bufSizes = []int{16, 4096}

func TestReadReply(t *testing.T) {
	big := strings.Repeat("0123456789\r\n", 100000)
	tests := []struct {
		name string
		in   string
	}{
		{"status", "+OK\r\n"},
		{"empty status", "+\r\n"},
		{"error", "-ERR unknown command 'foo', with args beginning with: \r\n"},
		{"error with code", "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"},
		{"integer", ":1000\r\n"},
		{"negative integer", ":-1\r\n"},
		{"bulk", "$5\r\nhello\r\n"},
		{"binary bulk", "$6\r\n\r\n\x00$\r\n\r\n"},
		{"nil bulk", "$-1\r\n"},
		{"empty bulk", "$0\r\n\r\n"},
		{"empty array", "*0\r\n"},
		{"nil array", "*-1\r\n"},
		{"array", "*3\r\n$3\r\nfoo\r\n:1\r\n+OK\r\n"},
		{"array with nils", "*3\r\n$-1\r\n*-1\r\n$0\r\n\r\n"},
		{"nested arrays", "*2\r\n*2\r\n+a\r\n*0\r\n*3\r\n-ERR x\r\n*1\r\n*1\r\n:5\r\n$1\r\nz\r\n"},
		{"error inside array", "*2\r\n-ERR a\r\n-ERR b\r\n"},
		{"huge bulk", fmt.Sprintf("$%d\r\n%s\r\n", len(big), big)},
		{"long error line", "-ERR " + strings.Repeat("x", 10000) + "\r\n"},
		{"long status in array", "*2\r\n+" + strings.Repeat("s", 5000) + "\r\n:1\r\n"},
		{"deep nesting", strings.Repeat("*1\r\n", 1000) + ":1\r\n"},
		// RESP3, as Redis 7.0 sends it after HELLO 3.
		{"null", "_\r\n"},
		{"double", ",3.14\r\n"},
		{"double inf", ",-inf\r\n"},
		{"double nan", ",nan\r\n"},
		{"boolean true", "#t\r\n"},
		{"boolean false", "#f\r\n"},
		{"big number", "(3492890328409238509324850943850943825024385\r\n"},
		{"verbatim", "=15\r\ntxt:Some string\r\n"},
		{"verbatim with CRLF inside", "=10\r\ntxt:a\r\nb\r\n\r\n"},
		{"blob error", "!21\r\nSYNTAX invalid syntax\r\n"},
		{"empty map", "%0\r\n"},
		{"map", "%2\r\n+first\r\n:1\r\n$6\r\nsecond\r\n,2.5\r\n"},
		{"map of aggregates", "%1\r\n*2\r\n:1\r\n:2\r\n~1\r\n#t\r\n"},
		{"empty set", "~0\r\n"},
		{"set", "~3\r\n$1\r\na\r\n:1\r\n_\r\n"},
		{"push", ">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n"},
		{"push in nothing else", ">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n"},
		{"attribute before a reply", "|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.19\r\n*2\r\n:2039123\r\n:9543892\r\n"},
		{"attribute before a scalar", "|0\r\n:1\r\n"},
		{"attribute inside an array", "*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n"},
		{"map holding a null and a set", "%2\r\n+a\r\n_\r\n+b\r\n~1\r\n(12\r\n"},
	}
	for _, tc := range tests {
		for _, size := range bufSizes {
			t.Run(fmt.Sprintf("%s/bufio %d", tc.name, size), func(t *testing.T) {
				// A second reply after it must stay unread, and the reply
				// is appended after what dst holds.
				src := &chunkReader{chunks: splitEvery([]byte(tc.in+"+NEXT\r\n"), 1000)}
				br := bufio.NewReaderSize(src, size)
				dst := []byte("prefix")
				got, err := resp.ReadReply(br, dst)
				if err != nil {
					t.Fatalf("ReadReply: %v", err)
				}
				if string(got) != "prefix"+tc.in {
					t.Fatalf("ReadReply = %.100q, want %.100q", got, "prefix"+tc.in)
				}
				next, err := resp.ReadReply(br, got[:0])
				if err != nil || string(next) != "+NEXT\r\n" {
					t.Fatalf("next ReadReply = %q, %v; want +NEXT", next, err)
				}
				if _, err := resp.ReadReply(br, nil); err != io.EOF {
					t.Fatalf("ReadReply at the end = %v, want io.EOF", err)
				}
			})
		}
	}
}

func TestReadReplyMalformed(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{"empty line", "\r\n"},
		{"LF only", "+OK\n"},
		{"bare LF", "\n"},
		{"CR not before LF", "+OK\rX\n"},
		{"LF inside status", "+O\nK\r\n"},
		{"no type byte", "OK\r\n"},
		{"unknown type byte", "?\r\n"},
		{"null with text", "_x\r\n"},
		{"empty double", ",\r\n"},
		{"empty big number", "(\r\n"},
		{"boolean not t or f", "#x\r\n"},
		{"boolean too long", "#tt\r\n"},
		{"nil map", "%-1\r\n"},
		{"nil set", "~-1\r\n"},
		{"nil push", ">-1\r\n"},
		{"nil verbatim", "=-1\r\n"},
		{"nil blob error", "!-1\r\n"},
		{"attribute length -2", "|-2\r\n"},
		{"verbatim without CRLF after", "=5\r\ntxt:aXY"},
		{"bulk without CRLF after", "$1\r\naXY"},
		{"bad value in map", "%1\r\n+k\r\n?v\r\n"},
		{"bad reply after attribute", "|1\r\n+k\r\n+v\r\n?x\r\n"},
		{"bulk length not a number", "$abc\r\n"},
		{"bulk length empty", "$\r\n"},
		{"bulk length -2", "$-2\r\n"},
		{"bulk length leading zero", "$01\r\nx\r\n"},
		{"bulk length plus", "$+1\r\nx\r\n"},
		{"bulk length overflow", "$99999999999999999999\r\n"},
		{"array length not a number", "*abc\r\n"},
		{"array length empty", "*\r\n"},
		{"array length -2", "*-2\r\n"},
		{"array length -0", "*-0\r\n"},
		{"bad element in array", "*2\r\n:1\r\n?x\r\n"},
		{"bad element deep in array", "*1\r\n*1\r\n*1\r\n$x\r\n"},
	}
	for _, tc := range tests {
		for _, size := range bufSizes {
			t.Run(fmt.Sprintf("%s/bufio %d", tc.name, size), func(t *testing.T) {
				_, err := resp.ReadReply(bufio.NewReaderSize(strings.NewReader(tc.in), size), nil)
				if !errors.Is(err, resp.ErrBadReply) {
					t.Errorf("ReadReply(%q) error = %v, want %v", tc.in, err, resp.ErrBadReply)
				}
			})
		}
	}
}

func TestReadReplyTruncated(t *testing.T) {
	for _, in := range []string{
		"",
		"+OK",
		"+OK\r",
		":1",
		"$5\r\n",
		"$5\r\nhel",
		"$5\r\nhello",
		"$5\r\nhello\r",
		"*2\r\n",
		"*2\r\n:1\r\n",
		"*2\r\n*1\r\n:1\r\n",
		"%1\r\n+k\r\n",
		"~2\r\n:1\r\n",
		">3\r\n$7\r\nmessage\r\n",
		"|1\r\n+a\r\n+b\r\n",
		"=10\r\ntxt:ab",
		"#",
		"_\r",
	} {
		t.Run(fmt.Sprintf("%q", in), func(t *testing.T) {
			_, err := resp.ReadReply(bufio.NewReader(strings.NewReader(in)), nil)
			if err == nil {
				t.Errorf("ReadReply(%q) returned no error", in)
			}
		})
	}
}

// TestReadReplyHugeLengths: lengths no server sends must fail, neither
// overflow into a reply that looks complete nor panic.
func TestReadReplyHugeLengths(t *testing.T) {
	for _, in := range []string{
		"$9223372036854775807\r\n",
		"$9223372036854775806\r\n",
		"*2\r\n*9223372036854775807\r\n",
		"*9223372036854775807\r\n*9223372036854775807\r\n",
		"$999999999999999\r\n", // more than the Go heap can address
	} {
		t.Run(fmt.Sprintf("%q", in), func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("ReadReply(%q) panics: %v", in, p)
				}
			}()
			got, err := resp.ReadReply(bufio.NewReader(strings.NewReader(in)), nil)
			if err == nil {
				t.Errorf("ReadReply(%q) = %q, no error", in, got)
			}
		})
	}
}

// TestReadReplyBulkHeaderAllocs sends only the header of a big bulk: the
// reader must not allocate for the announced length before the data comes.
func TestReadReplyBulkHeaderAllocs(t *testing.T) {
	in := "$300000000\r\n"
	var err error
	alloc := allocated(func() {
		_, err = resp.ReadReply(bufio.NewReader(strings.NewReader(in)), nil)
	})
	if err == nil {
		t.Fatalf("ReadReply(%q) returned no error", in)
	}
	if alloc > 64<<20 {
		t.Errorf("ReadReply(%q) allocated %d bytes before any data came", in, alloc)
	}
}

// TestAppendHelpers: the reply builders the proxy uses for what it answers
// itself (redcon's) give the bytes Redis gives, byte for byte: integers of
// one digit and more, negative and extreme ones, empty and binary bulk
// strings, nil, arrays, and errors whose CR and LF become spaces, as
// Redis's addReplyError makes them.
func TestAppendHelpers(t *testing.T) {
	tests := []struct {
		name string
		got  []byte
		want string
	}{
		{"status", redcon.AppendString(nil, "OK"), "+OK\r\n"},
		{"empty status", redcon.AppendString(nil, ""), "+\r\n"},
		{"error", redcon.AppendError(nil, "ERR bad"), "-ERR bad\r\n"},
		{"int", redcon.AppendInt(nil, 42), ":42\r\n"},
		{"min int", redcon.AppendInt(nil, math.MinInt64), ":-9223372036854775808\r\n"},
		{"bulk", redcon.AppendBulk(nil, []byte("a\r\nb")), "$4\r\na\r\nb\r\n"},
		{"empty bulk", redcon.AppendBulk(nil, nil), "$0\r\n\r\n"},
		{"nil", redcon.AppendNull(nil), "$-1\r\n"},
		{"array header", redcon.AppendArray(nil, 3), "*3\r\n"},
		{"command", resp.AppendCommand(nil, []byte("SET"), []byte("k"), []byte("")), "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"},
		{"appends", redcon.AppendInt([]byte("x"), 1), "x:1\r\n"},
		{"error with CR LF", redcon.AppendError(nil, "ERR a\r\nb"), "-ERR a  b\r\n"},
		{"status with LF", redcon.AppendString(nil, "a\nb"), "+a b\r\n"},
		{"zero", redcon.AppendInt(nil, 0), ":0\r\n"},
		{"nine", redcon.AppendInt(nil, 9), ":9\r\n"},
		{"ten", redcon.AppendInt(nil, 10), ":10\r\n"},
		{"minus one", redcon.AppendInt(nil, -1), ":-1\r\n"},
		{"max int", redcon.AppendInt(nil, math.MaxInt64), ":9223372036854775807\r\n"},
		{"binary bulk", redcon.AppendBulk(nil, []byte{0, 255, '$'}), "$3\r\n\x00\xff$\r\n"},
		{"empty array", redcon.AppendArray(nil, 0), "*0\r\n"},
		{"long array", redcon.AppendArray(nil, 1024), "*1024\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if string(tc.got) != tc.want {
				t.Errorf("got %q, want %q", tc.got, tc.want)
			}
		})
	}
}

// TestAppendRoundTrip reads back, reply by reply, what the Append helpers
// wrote.
func TestAppendRoundTrip(t *testing.T) {
	var replies [][]byte
	add := func(b []byte) { replies = append(replies, b) }
	add(redcon.AppendString(nil, "OK"))
	add(redcon.AppendString(nil, ""))
	add(redcon.AppendError(nil, "ERR something bad"))
	for _, n := range []int64{0, 1, -1, math.MaxInt64, math.MinInt64} {
		add(redcon.AppendInt(nil, n))
	}
	add(redcon.AppendBulk(nil, nil))
	add(redcon.AppendBulk(nil, []byte("\r\n\x00\r\n")))
	add(redcon.AppendBulk(nil, bytes.Repeat([]byte("b"), 100000)))
	add(redcon.AppendNull(nil))
	add(redcon.AppendArray(nil, 0))
	add(redcon.AppendArray(nil, -1))
	arr := redcon.AppendArray(nil, 4)
	arr = redcon.AppendInt(arr, 1)
	arr = redcon.AppendNull(arr)
	arr = redcon.AppendArray(arr, 2)
	arr = redcon.AppendString(arr, "x")
	arr = redcon.AppendError(arr, "ERR y")
	arr = redcon.AppendBulk(arr, []byte("z"))
	add(arr)
	add(resp.AppendCommand(nil, []byte("SET"), []byte("k"), []byte("v\r\n")))
	add(resp.AppendCommand(nil))

	var stream []byte
	for _, r := range replies {
		stream = append(stream, r...)
	}
	for _, size := range bufSizes {
		br := bufio.NewReaderSize(bytes.NewReader(stream), size)
		for i, want := range replies {
			got, err := resp.ReadReply(br, nil)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("bufio %d, reply %d: ReadReply = %.100q, %v; want %.100q", size, i, got, err, want)
			}
		}
		if _, err := resp.ReadReply(br, nil); err != io.EOF {
			t.Fatalf("bufio %d: after the last reply: %v, want io.EOF", size, err)
		}
	}
}

// TestAppendCommandRoundTrip parses what AppendCommand wrote.
func TestAppendCommandRoundTrip(t *testing.T) {
	cmd := [][]byte{[]byte("SET"), []byte(""), []byte("\r\n\x00*$"), bytes.Repeat([]byte("v"), 70000)}
	in := resp.AppendCommand(nil, cmd...)
	got, err := parseAll(t, in, false, 0)
	if err != io.EOF || len(got) != 1 || !equalCmds(got, [][]string{argStrings(cmd)}) {
		t.Fatalf("parsed %.100q, %v; want %.100q", got, err, argStrings(cmd))
	}
}

func BenchmarkReadReply(b *testing.B) {
	var reply []byte
	reply = redcon.AppendArray(reply, 3)
	reply = redcon.AppendBulk(reply, bytes.Repeat([]byte("v"), 100))
	reply = redcon.AppendInt(reply, 42)
	reply = redcon.AppendNull(reply)
	br := bufio.NewReader(&loopReader{reply})
	b.SetBytes(int64(len(reply)))
	b.ReportAllocs()
	var dst []byte
	for b.Loop() {
		var err error
		if dst, err = resp.ReadReply(br, dst[:0]); err != nil || len(dst) != len(reply) {
			b.Fatalf("ReadReply = %q, %v", dst, err)
		}
	}
}

// TestFrameLen walks replies, and never reads past a truncated or
// malformed one.
func TestFrameLen(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want int
	}{
		{"status", "+OK\r\n:1\r\n", 5},
		{"error", "-ERR x y\r\n+OK\r\n", 10},
		{"int", ":-12\r\n", 6},
		{"bulk", "$3\r\nfoo\r\n+OK\r\n", 9},
		{"bulk with CRLF inside", "$4\r\n\r\n\r\n+OK\r\n", 10},
		{"nil", "$-1\r\n+OK\r\n", 5},
		{"nil array", "*-1\r\n+OK\r\n", 5},
		{"empty array", "*0\r\n+OK\r\n", 4},
		{"nested array", "*2\r\n*1\r\n$1\r\na\r\n:2\r\n+OK\r\n", 19},
		{"map", "%1\r\n+k\r\n:1\r\n+OK\r\n", 12},
		{"attribute and its reply", "|1\r\n+a\r\n:1\r\n:2\r\n+OK\r\n", 16},
		{"set", "~2\r\n:1\r\n_\r\n+OK\r\n", 11},
		{"push", ">2\r\n+a\r\n#t\r\n+OK\r\n", 12},
		{"verbatim", "=5\r\ntxt:a\r\n+OK\r\n", 11},
		{"double", ",1.5\r\n+OK\r\n", 6},
		{"truncated bulk", "$10\r\nabc", 8},
		{"truncated array", "*3\r\n:1\r\n", 8},
		{"huge bulk length", "$9223372036854775807\r\nab\r\n", 26},
		{"huge array length", "*9223372036854775807\r\n:1\r\n", 26},
		{"no CRLF", "+OK", 3},
		{"empty line", "\r\n+OK\r\n", 2},
		{"empty", "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := resp.FrameLen([]byte(tc.in)); got != tc.want {
				t.Errorf("FrameLen(%q) = %d, want %d", tc.in, got, tc.want)
			}
		})
	}
}
