package resp_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/tidwall/redcon"
)

type splitArgsCase struct {
	line string
	want []string // nil with ok false: unbalanced quotes
	ok   bool
}

// splitArgsCases mirror Redis's sdssplitargs (sds.c).
var splitArgsCases = []splitArgsCase{
	{"", []string{}, true},
	{"   ", []string{}, true},
	{"a", []string{"a"}, true},
	{"a b  c", []string{"a", "b", "c"}, true},
	{"  a  ", []string{"a"}, true},
	// isspace skips \t\n\v\f\r between args; inside an unquoted arg only
	// space, \n, \r and \t end it.
	{"\t\v\f\r\n a", []string{"a"}, true},
	{"a\vb", []string{"a\vb"}, true},
	{"a\fb", []string{"a\fb"}, true},
	{"a \v b", []string{"a", "b"}, true},
	{"a\tb\rc\nd", []string{"a", "b", "c", "d"}, true},
	{`\x41 \n`, []string{`\x41`, `\n`}, true}, // no escapes outside quotes
	{`"a b"`, []string{"a b"}, true},
	{`""`, []string{""}, true},
	{`"" ''`, []string{"", ""}, true},
	{`"\n\r\t\b\a\\\"\q\'"`, []string{"\n\r\t\b\a\\\"q'"}, true},
	{`"\x41\x6a\xFF\x00"`, []string{"Aj\xff\x00"}, true},
	{`"\x4g" "\x" "\xG0"`, []string{"x4g", "x", "xG0"}, true},
	{`"\x41\x4"`, []string{"Ax4"}, true},
	{`foo"bar baz"`, []string{"foobar baz"}, true},
	{`a'b c'`, []string{"ab c"}, true},
	{`"foo" bar`, []string{"foo", "bar"}, true},
	{"\"foo\"\tbar", []string{"foo", "bar"}, true},
	{"\"foo\"\vbar", []string{"foo", "bar"}, true}, // a closing quote needs isspace after it
	{"'foo'\fbar", []string{"foo", "bar"}, true},
	{`'a b'`, []string{"a b"}, true},
	{`'it\'s'`, []string{"it's"}, true},
	{`'a\nb\x41'`, []string{`a\nb\x41`}, true},
	{`'a"b'`, []string{`a"b`}, true},
	{`"a'b"`, []string{`a'b`}, true},
	{`'\\'x'`, []string{`\'x`}, true}, // \ is kept, then \' is a quote
	{`'a\\'`, nil, false},             // the same: still open at the end
	{`'a\'`, nil, false},
	{`"foo`, nil, false},
	{`'foo`, nil, false},
	{`"foo\"`, nil, false},
	{`"foo\`, nil, false},
	{`a "b`, nil, false},
	{`"foo"bar`, nil, false},
	{`foo"bar"baz`, nil, false},
	{`'a'b`, nil, false},
	{`a'b c'd`, nil, false},
	{`"a""b"`, nil, false},
	{`"a"'b'`, nil, false},
	{`''x`, nil, false},
}

func TestSplitArgs(t *testing.T) {
	for _, tc := range splitArgsCases {
		t.Run(fmt.Sprintf("%q", tc.line), func(t *testing.T) {
			got, ok := resp.SplitArgs([]byte(tc.line))
			if ok != tc.ok || !slices.Equal(argStrings(got), tc.want) {
				t.Errorf("SplitArgs(%q) = %q, %v; want %q, %v", tc.line, got, ok, tc.want, tc.ok)
			}
			for i, a := range got {
				if a == nil {
					t.Errorf("arg %d is nil, want an empty slice", i)
				}
			}
		})
	}
}

// TestSplitArgsMatchesRedis sends "RPUSH l <line>" inline to a real
// redis-server and reads the list back: Redis's split must be SplitArgs's.
func TestSplitArgsMatchesRedis(t *testing.T) {
	srv := redistest.Start(t, localredis.Options{})
	ran := 0
	for i, tc := range splitArgsCases {
		// An inline line ends at \n and at NUL, loses a trailing \r, and
		// RPUSH needs an element.
		if strings.ContainsAny(tc.line, "\n\x00") || strings.HasSuffix(tc.line, "\r") || (tc.ok && len(tc.want) == 0) {
			continue
		}
		ran++
		t.Run(fmt.Sprintf("%q", tc.line), func(t *testing.T) {
			key := fmt.Sprintf("splitargs:%d", i)
			in := "RPUSH " + key + " " + tc.line + "\r\n" + multibulk("LRANGE", key, "0", "-1") + multibulk("QUIT")
			got := redisRoundTrip(t, srv.Addr(), in)

			var want []byte
			split, ok := resp.SplitArgs([]byte(tc.line))
			if ok {
				want = redcon.AppendInt(want, int64(len(split)))
				want = redcon.AppendArray(want, len(split))
				for _, a := range split {
					want = redcon.AppendBulk(want, a)
				}
				want = redcon.AppendString(want, "OK")
			} else {
				want = redcon.AppendError(want, "ERR "+resp.ErrUnbalancedQuotes.Error())
			}
			if got != string(want) {
				t.Errorf("Redis replied %q, SplitArgs gives %q", got, want)
			}
		})
	}
	if ran < 30 {
		t.Fatalf("only %d lines sent to Redis", ran)
	}
}

const splitArgsChildEnv = "RESP_TEST_SPLITARGS_NUL_CHILD"

// TestSplitArgsNUL: sdssplitargs reads a C string, so a NUL byte ends the
// line. The cases run in a child process with a watchdog, because a
// SplitArgs that loops on NUL would never return.
func TestSplitArgsNUL(t *testing.T) {
	if os.Getenv(splitArgsChildEnv) != "" {
		splitArgsNULChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSplitArgsNUL$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), splitArgsChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("--- PASS: TestSplitArgsNUL")) {
		t.Fatalf("child did not run the cases:\n%s", out)
	}
}

func splitArgsNULChild(t *testing.T) {
	tests := []splitArgsCase{
		{"\x00", []string{}, true},
		{"a\x00b", []string{"a"}, true},
		{"a \x00 b", []string{"a"}, true},
		{"\"x\"\x00y", []string{"x"}, true},
		{"'x'\x00 y", []string{"x"}, true},
		{"\"a\x00\"", nil, false},
		{"'a\x00'", nil, false},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.line), func(t *testing.T) {
			watchdog := time.AfterFunc(time.Second, func() {
				fmt.Printf("FAIL: SplitArgs(%q) has not returned after 1s\n", tc.line)
				os.Exit(3)
			})
			got, ok := resp.SplitArgs([]byte(tc.line))
			watchdog.Stop()
			if ok != tc.ok || !slices.Equal(argStrings(got), tc.want) {
				t.Errorf("SplitArgs(%q) = %q, %v; want %q, %v", tc.line, got, ok, tc.want, tc.ok)
			}
		})
	}
}
