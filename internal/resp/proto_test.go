package resp_test

import (
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

func TestProtoAppend(t *testing.T) {
	tests := []struct {
		name         string
		got          func(resp.Proto) []byte
		resp2, resp3 string
	}{
		{"map", func(p resp.Proto) []byte { return p.AppendMap(nil, 2) }, "*4\r\n", "%2\r\n"},
		{"empty map", func(p resp.Proto) []byte { return p.AppendMap(nil, 0) }, "*0\r\n", "%0\r\n"},
		{"push", func(p resp.Proto) []byte { return p.AppendPush(nil, 3) }, "*3\r\n", ">3\r\n"},
		{"null", func(p resp.Proto) []byte { return p.AppendNull(nil) }, "$-1\r\n", "_\r\n"},
		{"null array", func(p resp.Proto) []byte { return p.AppendNullArray(nil) }, "*-1\r\n", "_\r\n"},
		{"verbatim", func(p resp.Proto) []byte { return p.AppendVerbatim(nil, []byte("a\r\nb")) }, "$4\r\na\r\nb\r\n", "=8\r\ntxt:a\r\nb\r\n"},
		{"empty verbatim", func(p resp.Proto) []byte { return p.AppendVerbatim(nil, nil) }, "$0\r\n\r\n", "=4\r\ntxt:\r\n"},
		{"appends", func(p resp.Proto) []byte { return p.AppendNull([]byte("+OK\r\n")) }, "+OK\r\n$-1\r\n", "+OK\r\n_\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(tc.got(resp.RESP2)); got != tc.resp2 {
				t.Errorf("RESP2: %q, want %q", got, tc.resp2)
			}
			if got := string(tc.got(resp.RESP3)); got != tc.resp3 {
				t.Errorf("RESP3: %q, want %q", got, tc.resp3)
			}
		})
	}
}

func TestProtoAdapt(t *testing.T) {
	tests := []struct{ in, want string }{
		{"$-1\r\n", "_\r\n"},
		{"*-1\r\n", "_\r\n"},
		{"$2\r\n93\r\n", "$2\r\n93\r\n"},
		{":-1\r\n", ":-1\r\n"},
		{"-ERR x -1\r\n", "-ERR x -1\r\n"},
		{"*3\r\n$2\r\n93\r\n$-1\r\n*1\r\n*-1\r\n", "*3\r\n$2\r\n93\r\n_\r\n*1\r\n_\r\n"},
		// A bulk whose payload looks like a nil stays as it is.
		{"*2\r\n$5\r\n$-1\r\n\r\n$-1\r\n", "*2\r\n$5\r\n$-1\r\n\r\n_\r\n"},
		{"$7\r\n*-1\r\n:1\r\n", "$7\r\n*-1\r\n:1\r\n"},
	}
	for _, tc := range tests {
		if got := string(resp.RESP3.Adapt([]byte(tc.in))); got != tc.want {
			t.Errorf("RESP3.Adapt(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := string(resp.RESP2.Adapt([]byte(tc.in))); got != tc.in {
			t.Errorf("RESP2.Adapt(%q) = %q, want it unchanged", tc.in, got)
		}
	}
}

func TestReplyViewsRESP3(t *testing.T) {
	elems, ok := resp.MapElems([]byte("%2\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n~1\r\n_\r\n"), nil)
	if !ok || len(elems) != 4 || string(elems[3]) != "~1\r\n_\r\n" {
		t.Errorf("MapElems = %q, %v", elems, ok)
	}
	if _, ok := resp.MapElems([]byte("*2\r\n:1\r\n:2\r\n"), nil); ok {
		t.Error("MapElems of an array: ok")
	}
	for in, want := range map[string]string{"=9\r\ntxt:a\r\nb\r\n": "a\r\nb", "$3\r\nabc\r\n": "abc", "=4\r\ntxt:\r\n": ""} {
		if got, ok := resp.TextValue([]byte(in)); !ok || string(got) != want {
			t.Errorf("TextValue(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{"$-1\r\n", "_\r\n", "-ERR x\r\n", "=2\r\nab\r\n"} {
		if got, ok := resp.TextValue([]byte(in)); ok {
			t.Errorf("TextValue(%q) = %q, ok", in, got)
		}
	}
	for in, want := range map[string]string{
		">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n": "message",
		">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n":  "invalidate",
		">3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n":    "subscribe",
	} {
		if got, ok := resp.PushKind([]byte(in)); !ok || string(got) != want {
			t.Errorf("PushKind(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{"*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n", ">0\r\n", "+OK\r\n"} {
		if _, ok := resp.PushKind([]byte(in)); ok {
			t.Errorf("PushKind(%q): ok", in)
		}
	}
}
