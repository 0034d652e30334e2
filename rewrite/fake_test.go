package rewrite

import (
	"bytes"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// exchange is one request a test expects the engine to send, as render
// writes it, and the reply Redis gives it (RESP; "<gen>" stands for the
// layout generation the engine last sent).
type exchange struct {
	req, reply string
}

// fakeUpstream is a Redis whose every answer a test scripts: it expects
// the requests of its exchanges, in order, answers each with its reply,
// and ends the test at the first request not as expected.
type fakeUpstream struct {
	t    *testing.T
	want []exchange
	next int
	gen  string // the last layout generation seen in a request
	// The node's scripts, which SCRIPT EXISTS and SCRIPT LOAD ask of
	// outside the exchanges: every one, unless flushed; then those
	// loaded since. asked counts the SCRIPT requests.
	flushed bool
	loaded  map[string]bool
	asked   int
	// onScript, when set, runs as a SCRIPT request arrives, before it is
	// answered: what the engine does meanwhile.
	onScript func()
}

// script answers SCRIPT EXISTS of one SHA1 and SCRIPT LOAD as a node
// holding the fake's scripts.
func (f *fakeUpstream) script(args [][]byte) []byte {
	f.asked++
	if f.onScript != nil {
		f.onScript()
	}
	switch sub := strings.ToUpper(string(args[1])); {
	case sub == "LOAD":
		if f.loaded == nil {
			f.loaded = map[string]bool{}
		}
		f.loaded[sha(string(args[2]))] = true
		return []byte(bulk(sha(string(args[2]))))
	case sub == "EXISTS" && (!f.flushed || f.loaded[string(args[2])]):
		return []byte(arr(num(1)))
	}
	return []byte(arr(num(0)))
}

func (f *fakeUpstream) Do(reqs []Request) [][]byte {
	f.t.Helper()
	out := make([][]byte, len(reqs))
	for i, r := range reqs {
		if string(r.Args[0]) == "SCRIPT" {
			out[i] = f.script(r.Args)
			continue
		}
		got := f.render(r)
		if r.Blocks != (string(r.Args[0]) == "WAIT") {
			f.t.Fatalf("request %d %q: Blocks %v, want it on WAIT only", f.next+1, got, r.Blocks)
		}
		if r.Follows && (i == 0 || !bytes.Equal(reqs[i-1].Key, r.Key)) {
			f.t.Fatalf("request %d %q follows no request for %q", f.next+1, got, r.Key)
		}
		if !r.Follows && !slices.ContainsFunc(r.Args, func(a []byte) bool { return bytes.Equal(a, r.Key) }) {
			f.t.Fatalf("request %d %q is routed by %q, none of its arguments", f.next+1, got, r.Key)
		}
		if f.next == len(f.want) {
			f.t.Fatalf("request %d: %q, want none", f.next+1, got)
		}
		x := f.want[f.next]
		f.next++
		if got != x.req {
			f.t.Fatalf("request %d: %q, want %q", f.next, got, x.req)
		}
		out[i] = []byte(strings.ReplaceAll(x.reply, "<gen>", f.gen))
	}
	return out
}

// Placement is one master serving every slot, as a standalone server.
func (f *fakeUpstream) Placement() (int, func(uint16) int) {
	return 1, func(uint16) int { return 0 }
}

func (f *fakeUpstream) Node(uint16) string { return "fake:6379" }

// done fails the test when some expected request was not sent.
func (f *fakeUpstream) done() {
	f.t.Helper()
	if f.next != len(f.want) {
		f.t.Errorf("%d requests sent, want %d; the next expected: %q", f.next, len(f.want), f.want[f.next].req)
	}
}

var (
	bucketName = regexp.MustCompile(`\{\d+\}([^#]+)#(\d+)\.([0-9a-f]+)`)
	markerGen  = regexp.MustCompile(`hotkeyproxy-layout:1:([0-9a-f]+):`)
	scriptName = map[string]string{}
)

func init() {
	for name, s := range map[string]*bucketScript{
		"deduct": scriptDeduct, "take": scriptTake, "add": scriptAdd, "convert": scriptConvert,
		"swap": scriptSwap, "drain": scriptDrain, "apply": scriptApply, "undo": scriptUndo,
		"moves": scriptMoves, "mark": scriptMark, "flip": scriptFlip, "lose": scriptLose,
	} {
		scriptName[string(s.sha)] = name
		scriptName[string(s.body)] = name
		if j := s.journaled; j != nil {
			scriptName[string(j.sha)] = name + "/j"
			scriptName[string(j.body)] = name + "/j"
		}
	}
	scriptName[string(scriptShare.sha)] = "share"
	scriptName[string(scriptShare.body)] = "share"
}

// render writes a request as a test states it: arguments joined by
// spaces, a bucket script's SHA1 or body by its name, bucket i of key k as
// "k#i" (its records as "k#i:intents"…), a layout as
// "layout:<tags>[:journal][:<fill>|:merge]", a journaled script as
// "<name>/j", MarkerPrefix as "<prefix>",
// appliedKeep in ms as "<keep>".
// The generation it drops is kept for replies.
func (f *fakeUpstream) render(r Request) string {
	parts := make([]string, len(r.Args))
	for i, a := range r.Args {
		s := string(a)
		if name, ok := scriptName[s]; ok {
			parts[i] = name
			continue
		}
		if s == MarkerPrefix {
			parts[i] = "<prefix>"
			continue
		}
		if s == string(keepMs) {
			parts[i] = "<keep>"
			continue
		}
		if m := bucketName.FindStringSubmatch(s); m != nil {
			f.gen = m[3]
		}
		if m := markerGen.FindStringSubmatch(s); m != nil {
			f.gen = m[1]
		}
		s = bucketName.ReplaceAllString(s, "$1#$2")
		parts[i] = markerGen.ReplaceAllString(s, "layout:")
	}
	return strings.Join(parts, " ")
}

// fakeClock is a clock that moves only when the engine sleeps or a test
// says.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time        { return c.now }
func (c *fakeClock) Sleep(d time.Duration) { c.now = c.now.Add(d) }

// RESP replies, as Redis writes them.
func bulk(s string) string    { return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n" }
func num(n int64) string      { return ":" + strconv.FormatInt(n, 10) + "\r\n" }
func pair2(a, b int64) string { return "*2\r\n" + num(a) + num(b) }
func errR(msg string) string  { return "-" + msg + "\r\n" }

const (
	nilR = "$-1\r\n"
	okR  = "+OK\r\n"
	// downR is what the proxy's upstream answers for a node it cannot reach.
	downR = "-ERR upstream unavailable: dial tcp 127.0.0.1:7001: connect: connection refused\r\n"
)

// The deduct scripts the test config declares: one unit, or ARGV[1].
const (
	deductOne = "return redis.call('decr', KEYS[1])"
	deductN   = "return redis.call('decrby', KEYS[1], ARGV[1])"
)

// testEngine is an engine over a fakeUpstream expecting want, at a fake
// clock, whose random start bucket is start. Key "k" is hot with 4
// buckets (route as given), soldout_ttl 100ms; the deduct scripts answer
// -1 when sold out.
func testEngine(t *testing.T, route string, start int, want []exchange) (*Engine, *fakeUpstream, *fakeClock) {
	t.Helper()
	return testEngineOf(t, testEngineConfig(config.KeyRule{Match: "k", Buckets: 4, Route: route}), start, want)
}

// testEngineConfig is the config of testEngine, with rule for key "k".
func testEngineConfig(rule config.KeyRule) *config.Config {
	cfg := config.Default()
	cfg.Hotkeys.Keys = []config.KeyRule{rule}
	cfg.Hotkeys.SoldoutTTL = config.Duration(100 * time.Millisecond)
	cfg.Scripts = []config.Script{
		{Name: "deduct-one", Body: deductOne, Amount: config.Amount{Const: 1}, Soldout: -1},
		{Name: "deduct-n", Body: deductN, Amount: config.Amount{ArgvIndex: 1}, Soldout: -1},
	}
	return cfg
}

// testEngineOf is testEngine with cfg.
func testEngineOf(t *testing.T, cfg *config.Config, start int, want []exchange) (*Engine, *fakeUpstream, *fakeClock) {
	t.Helper()
	f := &fakeUpstream{t: t, want: want}
	e := New(f, cfg, slog.New(slog.DiscardHandler))
	c := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	e.clock = c
	moves := 0
	e.moveID = func() string { moves++; return "m" + strconv.Itoa(moves) }
	e.intN = func(n int) int {
		if n != 4 {
			t.Fatalf("start bucket drawn among %d, want 4", n)
		}
		return start
	}
	t.Cleanup(f.done)
	return e, f, c
}

// marker is the layout the tests' key holds: 4 buckets, generation "a".
const marker = "hotkeyproxy-layout:1:a:0 1 2 3"

// loaded are the requests by which the engine reads the key's layout and
// its buckets' values.
func loaded(values ...int64) []exchange {
	x := []exchange{{"GET k", bulk(marker)}}
	for i, v := range values {
		x = append(x, exchange{"GET k#" + strconv.Itoa(i), bulk(strconv.FormatInt(v, 10))})
	}
	return x
}

// reads are the requests of a fresh read of every bucket, Redis holding
// values.
func reads(values ...int64) []exchange {
	return loaded(values...)[1:]
}

// join is the exchanges of its arguments, in order.
func join(xs ...[]exchange) []exchange { return slices.Concat(xs...) }

// cmd is a command's arguments, split at spaces.
func cmd(s string) [][]byte { return bytes.Fields([]byte(s)) }

// sha is the EVALSHA name of a declared deduct script.
func sha(body string) string { return config.Script{Body: body}.SHA1() }

// nowMs is the time the fake's nodes give the scripts (TIME), in ms.
const nowMs = 1_700_000_000_000

// arr is a RESP array of the frames given.
func arr(frames ...string) string {
	return "*" + strconv.Itoa(len(frames)) + "\r\n" + strings.Join(frames, "")
}

// bulks is a RESP array of bulk strings.
func bulks(ss ...string) string {
	frames := make([]string, len(ss))
	for i, s := range ss {
		frames[i] = bulk(s)
	}
	return arr(frames...)
}

// movesOf is the moves script's reply for a bucket: the node's time,
// whether the bucket exists, its intents (id, record, id, record…) and
// its applied marks older than appliedKeep.
func movesOf(exists bool, intents []string, old ...string) string {
	e := int64(0)
	if exists {
		e = 1
	}
	return arr(num(nowMs), num(e), bulks(intents...), bulks(old...))
}

// listMoves is the request of the moves script on bucket i of key k.
func listMoves(k string, i int) string {
	b := k + "#" + strconv.Itoa(i)
	return "EVALSHA moves 3 " + b + ":intents " + b + ":applied " + b + " <keep>"
}

// sweep are the requests by which the engine lists the moves of the 4
// buckets of k, each answered: none, the bucket there.
func sweep() []exchange {
	var x []exchange
	for i := range 4 {
		x = append(x, exchange{listMoves("k", i), movesOf(true, nil)})
	}
	return x
}

// moveSteps are the requests of one move of a units from bucket from to
// bucket 0 of k, as intent id, and their replies: taken (taken, from
// left), applied (to holds to0 then), the intent gone.
func moveSteps(from int, want int64, id string, taken, left, to0 int64) []exchange {
	b := "k#" + strconv.Itoa(from)
	x := []exchange{{"EVALSHA take 2 " + b + " " + b + ":intents " + itoa(want) + " " + id + " 0 <keep>", pair2(taken, left)}}
	if taken == 0 {
		return x
	}
	return append(x,
		exchange{"EVALSHA apply 2 k#0 k#0:applied " + id + " " + itoa(taken) + " <keep>", pair2(1, to0)},
		exchange{"HDEL " + b + ":intents " + id, num(1)})
}
