package proxy

import (
	"strings"
	"testing"
)

// TestClientLine: CLIENT LIST's line, field by field as Redis 7.0's
// catClientInfoString prints it, for clients in several states.
func TestClientLine(t *testing.T) {
	idle := " qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=1024 rbp=0 obl=0 oll=0 omem=0 tot-mem=1800 events=r "
	tests := []struct {
		name  string
		shown clientShown
		unix  bool
		want  string
	}{
		{"new", clientShown{multi: -1, proto: 2, cmd: "NULL", lastIO: 100}, false,
			"id=7 addr=1.2.3.4:5 laddr=6.7.8.9:10 fd=12 name= age=5 idle=5 flags=N db=0 sub=0 psub=0 ssub=0 multi=-1" + idle + "cmd=NULL user=default redir=-1 resp=2"},
		{"named-subscriber", clientShown{name: "app", db: 3, multi: -1, sub: 2, psub: 1, proto: 2, cmd: "psubscribe", lastIO: 104, user: "bob"}, false,
			"id=7 addr=1.2.3.4:5 laddr=6.7.8.9:10 fd=12 name=app age=5 idle=1 flags=P db=3 sub=2 psub=1 ssub=0 multi=-1" + idle + "cmd=psubscribe user=bob redir=-1 resp=2"},
		{"transaction", clientShown{multi: 2, proto: 2, cmd: "get", lastIO: 105}, false,
			"id=7 addr=1.2.3.4:5 laddr=6.7.8.9:10 fd=12 name= age=5 idle=0 flags=x db=0 sub=0 psub=0 ssub=0 multi=2" + idle + "cmd=get user=default redir=-1 resp=2"},
		{"every-flag", clientShown{multi: 0, monitor: true, ssub: 1, blocked: true, tracking: true, bcast: true, redir: 9, noEvict: true, proto: 3, cmd: "client|list", lastIO: 105}, true,
			"id=7 addr=1.2.3.4:5 laddr=6.7.8.9:10 fd=12 name= age=5 idle=0 flags=OPxbtBUe db=0 sub=0 psub=0 ssub=1 multi=0" + idle + "cmd=client|list user=default redir=9 resp=3"},
		{"tracking-off-keeps-no-redir", clientShown{multi: -1, redir: 9, bcast: true, proto: 2, cmd: "ping", lastIO: 105}, false,
			"id=7 addr=1.2.3.4:5 laddr=6.7.8.9:10 fd=12 name= age=5 idle=0 flags=N db=0 sub=0 psub=0 ssub=0 multi=-1" + idle + "cmd=ping user=default redir=-1 resp=2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ci := &clientInfo{addr: "1.2.3.4:5", laddr: "6.7.8.9:10", fd: 12, created: 100, unix: tc.unix, clientShown: tc.shown}
			if got := string(appendClientLine(nil, 7, ci, 105)); got != tc.want {
				t.Errorf("line\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestCountSubs: the subscription counts follow Redis's (un)subscribe
// replies, in RESP2 and as RESP3 pushes; other frames change nothing.
func TestCountSubs(t *testing.T) {
	s := &session{info: &clientInfo{}}
	frames := []struct {
		frame           string
		sub, psub, ssub int
	}{
		{"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n", 1, 0, 0},
		{"*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n", 2, 0, 0},
		{"*3\r\n$10\r\npsubscribe\r\n$2\r\np*\r\n:3\r\n", 2, 1, 0},
		{"*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$9\r\nsubscribe\r\n", 2, 1, 0},
		{">3\r\n$10\r\nssubscribe\r\n$1\r\ns\r\n:1\r\n", 2, 1, 1},
		{"*3\r\n$11\r\nunsubscribe\r\n$1\r\na\r\n:2\r\n", 1, 1, 1},
		{"*3\r\n$12\r\npunsubscribe\r\n$2\r\np*\r\n:1\r\n", 1, 0, 1},
		{"*3\r\n$12\r\nsunsubscribe\r\n$1\r\ns\r\n:0\r\n", 1, 0, 0},
		{"*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n", 0, 0, 0},
		{"+OK\r\n", 0, 0, 0},
	}
	for _, f := range frames {
		s.countSubs([]byte(f.frame))
		if c := s.info.clientShown; c.sub != f.sub || c.psub != f.psub || c.ssub != f.ssub {
			t.Errorf("after %q: sub=%d psub=%d ssub=%d, want %d %d %d", f.frame, c.sub, c.psub, c.ssub, f.sub, f.psub, f.ssub)
		}
	}
}

// TestShownName: the cmd field names a command as Redis 7.0 does: its
// subcommand with it, the container alone, NULL for what Redis does not
// know.
func TestShownName(t *testing.T) {
	for cmd, want := range map[string]string{
		"GET k":              "get",
		"CLIENT LIST":        "client|list",
		"client Setname x":   "client|setname",
		"CONFIG SET a b":     "config|set",
		"object encoding k":  "object|encoding",
		"CLIENT":             "client",
		"CLIENT NOPE":        "NULL",
		"NOSUCHCOMMAND":      "NULL",
		"XREAD BLOCK 0 S k$": "xread",
	} {
		args := [][]byte{}
		for f := range strings.FieldsSeq(cmd) {
			args = append(args, []byte(f))
		}
		var buf [24]byte
		c, _ := lookup(args, &buf)
		if got := c.shownName(args); got != want {
			t.Errorf("%q: cmd=%s, want %s", cmd, got, want)
		}
	}
}
