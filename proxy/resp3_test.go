package proxy

import (
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

func TestHelloProto(t *testing.T) {
	tests := []struct {
		args string // after HELLO, space-separated
		cur  resp.Proto
		want resp.Proto
		msg  string
	}{
		{"", resp.RESP2, resp.RESP2, ""},
		{"", resp.RESP3, resp.RESP3, ""},
		{"3", resp.RESP2, resp.RESP3, ""},
		{"2", resp.RESP3, resp.RESP2, ""},
		{"3 SETNAME x", resp.RESP2, resp.RESP3, ""},
		{"4", resp.RESP2, resp.RESP2, rediserr.NoProto},
		{"1", resp.RESP3, resp.RESP3, rediserr.NoProto},
		{"-3", resp.RESP2, resp.RESP2, rediserr.NoProto},
		{"3.0", resp.RESP2, resp.RESP2, rediserr.BadProtover},
		{"x", resp.RESP2, resp.RESP2, rediserr.BadProtover},
	}
	for _, tc := range tests {
		args := [][]byte{[]byte("HELLO")}
		for _, a := range strings.Fields(tc.args) {
			args = append(args, []byte(a))
		}
		got, msg := helloProto(args, tc.cur)
		if got != tc.want || msg != tc.msg {
			t.Errorf("HELLO %s from RESP%d: %d, %q; want %d, %q", tc.args, tc.cur, got, msg, tc.want, tc.msg)
		}
	}
}

func TestHelloReplies(t *testing.T) {
	const resp3 = "%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$6\r\n7.0.15\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:12\r\n$4\r\nmode\r\n$7\r\ncluster\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n"
	patched := string(standaloneHello(patchHelloID([]byte(resp3), 987)))
	const want = "%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$6\r\n7.0.15\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:987\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n"
	if patched != want {
		t.Errorf("patched RESP3 HELLO reply = %q, want %q", patched, want)
	}
	if p, ok := helloReplyProto([]byte(resp3)); !ok || p != resp.RESP3 {
		t.Errorf("helloReplyProto(RESP3 reply) = %d, %v", p, ok)
	}
	// EXEC's reply with two HELLOs: the last one counts.
	exec := "*2\r\n*2\r\n$5\r\nproto\r\n:3\r\n*2\r\n$5\r\nproto\r\n:2\r\n"
	if p, ok := helloReplyProto([]byte(exec)); !ok || p != resp.RESP2 {
		t.Errorf("helloReplyProto(EXEC of two HELLOs) = %d, %v; want RESP2", p, ok)
	}
	if _, ok := helloReplyProto([]byte("*1\r\n+QUEUED\r\n")); ok {
		t.Error("helloReplyProto of a reply without HELLO's: ok")
	}
}

func TestOutOfBand(t *testing.T) {
	for in, want := range map[string]bool{
		">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n":             true,
		">4\r\n$8\r\npmessage\r\n$1\r\np\r\n$1\r\nc\r\n$1\r\nm\r\n": true,
		">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n":              true,
		">3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n":                false,
		">3\r\n$11\r\nUNSUBSCRIBE\r\n$1\r\nc\r\n:0\r\n":             false,
		">3\r\n$12\r\npunsubscribe\r\n$1\r\nc\r\n:0\r\n":            false,
		"*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n":             false,
		"+OK\r\n": false,
	} {
		if got := outOfBand([]byte(in)); got != want {
			t.Errorf("outOfBand(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestMaskSecretsRESP3(t *testing.T) {
	for in, want := range map[string]string{
		"%2\r\n$11\r\nrequirepass\r\n$3\r\nabc\r\n$9\r\nmaxmemory\r\n$1\r\n0\r\n": "%2\r\n$11\r\nrequirepass\r\n$6\r\n******\r\n$9\r\nmaxmemory\r\n$1\r\n0\r\n",
		"*2\r\n$10\r\nmasterauth\r\n$1\r\nx\r\n":                                  "*2\r\n$10\r\nmasterauth\r\n$6\r\n******\r\n",
		"%0\r\n":                                                                  "%0\r\n",
		"-ERR nope\r\n":                                                           "-ERR nope\r\n",
	} {
		if got := string(maskSecrets([]byte(in))); got != want {
			t.Errorf("maskSecrets(%q) = %q, want %q", in, got, want)
		}
	}
}
