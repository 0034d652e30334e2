package rewrite

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
)

// TestLoad drives how the engine finds a hot key in Redis: a plain value
// converted into a layout, a pending layout completed (by this proxy or
// another), a key that goes or changes meanwhile, and failures on the way.
func TestLoad(t *testing.T) {
	// A new layout's generation is random: the fake shows it as <gen>.
	tags := placeTags("k", 4)
	made := "hotkeyproxy-layout:1:<gen>:" + tags
	pending := "hotkeyproxy-layout:1:a:0 1 2 3:10" // 10 to spread: 3 3 2 2
	getAll := join([]exchange{{"GET k", bulk(marker)}}, reads(3, 3, 2, 2))
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a plain integer converted, then spread", []step{{
			cmd: "DECR k", want: join([]exchange{
				{"GET k", bulk("10")},
				{"EVALSHA convert 2 k k#0 layout:" + tags + " <prefix> 1 4", pair2(1, 0)},
				{"PUBLISH hotkeyproxy:layouts +k", num(1)},
				{"GET k", bulk(made + ":10")},
				{"PTTL k", num(-1)},
				{"SET k#1 3 NX", okR}, {"SET k#2 2 NX", okR}, {"SET k#3 2 NX", okR},
				{"EVALSHA swap 1 k layout:" + tags + ":10 layout:" + tags, pair2(1, 0)},
			}, reads(3, 3, 2, 2), []exchange{{"EVALSHA deduct 1 k#0 1", num(2)}}), reply: num(9),
		}}},
		{"a missing key made by a write", []step{{
			cmd: "INCRBY k 10", want: join([]exchange{
				{"GET k", nilR},
				{"EVALSHA convert 2 k k#0 layout:" + tags + " <prefix> 1 4", pair2(1, 0)},
				{"PUBLISH hotkeyproxy:layouts +k", num(1)},
				{"GET k", bulk(made)},
			}, reads(0, 0, 0, 0), []exchange{{"EVALSHA add 1 k#0 10", num(10)}}), reply: num(10),
		}}},
		{"a missing key read: nil, nothing made", []step{{
			cmd: "GET k", want: []exchange{{"GET k", nilR}, {"GET k", nilR}}, reply: nilR,
		}}},
		{"converted by another proxy meanwhile", []step{{
			cmd: "GET k", want: join([]exchange{
				{"GET k", bulk("10")},
				{"EVALSHA convert 2 k k#0 layout:" + tags + " <prefix> 0 4", pair2(2, 0)},
			}, loaded(3, 3, 2, 2), getAll), reply: bulk("10"),
		}}},
		{"not an integer: Redis's error to DECR", []step{{
			cmd: "DECR k", want: []exchange{
				{"GET k", bulk("abc")},
				{"EVALSHA convert 2 k k#0 layout:" + tags + " <prefix> 1 4", pair2(-1, 0)},
			}, reply: errR(rediserr.NotInteger),
		}}},
		{"Redis fails the conversion", []step{{
			cmd: "DECR k", want: []exchange{
				{"GET k", bulk("10")},
				{"EVALSHA convert 2 k k#0 layout:" + tags + " <prefix> 1 4", downR},
			}, reply: downR,
		}}},
		{"a pending layout completed, with the key's TTL", []step{{
			cmd: "GET k", want: join([]exchange{
				{"GET k", bulk(pending)},
				{"PTTL k", num(5000)},
				{"SET k#1 3 NX PX 5000", okR}, {"SET k#2 2 NX PX 5000", okR}, {"SET k#3 2 NX PX 5000", okR},
				{"EVALSHA swap 1 k " + strings.Replace(pending, "hotkeyproxy-layout:1:a:", "layout:", 1) + " layout:0 1 2 3", pair2(1, 0)},
			}, reads(3, 3, 2, 2), getAll), reply: bulk("10"),
		}}},
		{"completed by another proxy first: its buckets stand", []step{{
			cmd: "GET k", want: join([]exchange{
				{"GET k", bulk(pending)},
				{"PTTL k", num(-1)},
				{"SET k#1 3 NX", nilR}, {"SET k#2 2 NX", nilR}, {"SET k#3 2 NX", okR},
				{"EVALSHA swap 1 k layout:0 1 2 3:10 layout:0 1 2 3", pair2(0, 0)},
				{"GET k", bulk(marker)},
			}, reads(3, 3, 2, 2), getAll), reply: bulk("10"),
		}}},
		{"the key deleted while completing: the buckets made go", []step{{
			cmd: "GET k", want: []exchange{
				{"GET k", bulk(pending)},
				{"PTTL k", num(-1)},
				{"SET k#1 3 NX", nilR}, {"SET k#2 2 NX", okR}, {"SET k#3 2 NX", okR},
				{"EVALSHA swap 1 k layout:0 1 2 3:10 layout:0 1 2 3", pair2(0, 0)},
				{"GET k", nilR},
				{"DEL k#2", num(1)}, {"DEL k#3", num(1)},
				{"GET k", nilR},
				{"GET k", nilR},
			}, reply: nilR,
		}}},
		{"a bucket's node fails the completion", []step{{
			cmd: "GET k", want: []exchange{
				{"GET k", bulk(pending)},
				{"PTTL k", num(-1)},
				{"SET k#1 3 NX", okR}, {"SET k#2 2 NX", downR}, {"SET k#3 2 NX", okR},
			}, reply: downR,
		}}},
		{"the key gone as fast as it is made", []step{{
			cmd: "GET k", want: []exchange{
				{"GET k", bulk(pending)}, {"PTTL k", num(-2)},
				{"GET k", bulk(pending)}, {"PTTL k", num(-2)},
				{"GET k", bulk(pending)}, {"PTTL k", num(-2)},
			}, reply: errR("ERR hotkeyproxy: 'k' keeps changing; try again"),
		}}},
		{"made again with another layout between two GETs", []step{
			{cmd: "GET k", want: join(loaded(3, 3, 2, 2), getAll), reply: bulk("10")},
			{cmd: "GET k", want: join(
				[]exchange{{"GET k", bulk("hotkeyproxy-layout:1:b:0 1 2 3")}}, reads(3, 3, 2, 2),
				[]exchange{{"GET k", nilR}, {"GET k", nilR}}), reply: nilR},
		}},
		{"the layout trusted within the recheck interval, read again after", []step{
			{cmd: "GET k", want: join(loaded(3, 3, 2, 2), getAll), reply: bulk("10")},
			{wait: recheck - 1, cmd: "GET k", want: getAll, reply: bulk("10")},
			{wait: 1, cmd: "DEL k", want: join(loaded(3, 3, 2, 2), []exchange{{"DEL k", num(1)}}, dropped("DEL")), reply: num(1)},
		}},
		{"a malformed layout is no integer", []step{{
			cmd: "DECR k", want: []exchange{{"GET k", bulk("hotkeyproxy-layout:1:zz")}}, reply: errR(rediserr.NotInteger),
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, f, c := testEngine(t, config.RouteRandom, 0, nil)
			run(t, e, f, c, tc.steps)
		})
	}
}

// TestLearnedKeyPlainAgain: a learned key found holding a plain value is
// the caller's to relay (Do returns nil), and no longer hot.
func TestLearnedKeyPlainAgain(t *testing.T) {
	e, f, _ := testEngine(t, config.RouteRandom, 0, []exchange{{"GET j", bulk("5")}})
	e.Learn([]byte("j"))
	if r := e.Do(cmd("DECR j"), 1, 0); r != nil {
		t.Fatalf("DECR on a plain learned key: %q, want nil", r)
	}
	if e.Hot([]byte("j")) {
		t.Error("still hot after it was found plain")
	}
	f.done()
}

// TestRefusals: commands a hot key does not support get an error naming
// it, with no request sent.
func TestRefusals(t *testing.T) {
	for _, tc := range []struct{ cmd, reply string }{
		{"HSET k f v", "ERR hotkeyproxy: 'k' is a hot key held as buckets; HSET is not supported on it"},
		{"INCRBYFLOAT k 1.5", "ERR hotkeyproxy: 'k' is a hot key held as buckets; INCRBYFLOAT is not supported on it: its buckets hold integers"},
		{"SET k abc", "ERR hotkeyproxy: 'k' is a hot key held as buckets; its value must be an integer"},
		{"SET k", "ERR wrong number of arguments for 'set' command"},
		{"EVALSHA 0123 1 k", "ERR hotkeyproxy: 'k' is a hot key held as buckets; only the deduct scripts declared in proxy.yaml can run on it"},
		{"EVALSHA " + sha(deductOne) + " 2 k j", "ERR hotkeyproxy: 'k' is a hot key held as buckets; a deduct script must name it as its only key"},
		{"EVALSHA " + sha(deductN) + " 1 k", "ERR hotkeyproxy: 'k' is a hot key held as buckets; script deduct-n needs ARGV[1], the amount"},
		{"EVALSHA " + sha(deductN) + " 1 k 0", "ERR hotkeyproxy: 'k' is a hot key held as buckets; script deduct-n needs a positive integer amount in ARGV[1]"},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			e, f, c := testEngine(t, config.RouteRandom, 0, nil)
			run(t, e, f, c, []step{{cmd: tc.cmd, reply: errR(tc.reply)}})
		})
	}
}

// placeTags are the tags Place gives key's n buckets on one master.
func placeTags(key string, n int) string {
	return strings.Join(Place(key, n, 1, func(uint16) int { return 0 }).Tags, " ")
}

// TestReadStaleness drives hotkeys.read_staleness: within it GET answers
// from the last read of every bucket plus this proxy's own changes since,
// with no request; at the bound, after a failed read and after DEL or
// EXPIRE it reads again; 0 reads every time.
func TestReadStaleness(t *testing.T) {
	getAll := func(values ...int64) []exchange { return join([]exchange{{"GET k", bulk(marker)}}, reads(values...)) }
	first := step{cmd: "GET k", want: join(loaded(3, 3, 2, 2), getAll(3, 3, 2, 2)), reply: bulk("10")}
	for _, tc := range []struct {
		name      string
		staleness time.Duration
		steps     []step
		local     uint64 // GETs answered from memory
	}{
		{"0: every GET reads", 0, []step{first,
			{cmd: "GET k", want: getAll(3, 3, 2, 2), reply: bulk("10")},
		}, 0},
		{"within the bound: memory, with this proxy's deduct", 100 * time.Millisecond, []step{first,
			{wait: 50 * time.Millisecond, cmd: "GET k", reply: bulk("10")},
			{cmd: one, want: []exchange{{"EVALSHA deduct 1 k#0 1", num(2)}}, reply: num(9)},
			{cmd: "GET k", reply: bulk("9")},
			// Another proxy sold one from bucket 3 meanwhile: seen at the bound.
			{wait: 50 * time.Millisecond, cmd: "GET k", want: getAll(2, 3, 2, 1), reply: bulk("8")},
			{cmd: "GET k", reply: bulk("8")},
		}, 3},
		{"a bucket that failed to answer is not remembered", time.Second, []step{
			{cmd: "GET k", want: join(loaded(3, 3, 2, 2), []exchange{
				{"GET k", bulk(marker)}, {"GET k#0", bulk("3")}, {"GET k#1", downR}, {"GET k#2", bulk("2")}, {"GET k#3", bulk("2")},
			}), reply: downR},
			{cmd: "GET k", want: getAll(3, 3, 2, 2), reply: bulk("10")},
			{cmd: "GET k", reply: bulk("10")},
		}, 1},
		{"DEL ends it", time.Second, []step{first,
			{cmd: "DEL k", want: join([]exchange{{"DEL k", num(1)}}, dropped("DEL")), reply: num(1)},
			{cmd: "GET k", want: []exchange{{"GET k", nilR}, {"GET k", nilR}}, reply: nilR},
		}, 0},
		{"EXPIRE ends it", time.Second, []step{first,
			{cmd: "EXPIRE k -1", want: join([]exchange{{"EXPIRE k -1", num(1)}, {"EXPIRE k#0 -1", num(0)}, {"EXPIRE k#1 -1", num(0)}, {"EXPIRE k#2 -1", num(0)}, {"EXPIRE k#3 -1", num(0)}},
				onRecords("EXPIRE", " -1")), reply: num(1)},
			{cmd: "GET k", want: []exchange{{"GET k", nilR}, {"GET k#0", nilR}, {"GET k#1", nilR}, {"GET k#2", nilR}, {"GET k#3", nilR}}, reply: nilR},
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, f, c := testEngine(t, config.RouteRandom, 0, nil)
			st := *e.settings.Load()
			st.staleness = tc.staleness
			e.settings.Store(&st)
			run(t, e, f, c, tc.steps)
			if s := e.Stats()[0]; s.ReadsLocal != tc.local {
				t.Errorf("reads_local %d, want %d", s.ReadsLocal, tc.local)
			}
		})
	}
}

// dropped are the requests by which the engine deletes the 4 buckets of k
// with their records, by cmd (DEL or UNLINK).
func dropped(cmd string) []exchange {
	var x []exchange
	for i := range 4 {
		b := "k#" + strconv.Itoa(i)
		req := cmd + " " + b + " " + b + ":intents " + b + ":applied"
		if i == 0 {
			req += " k#0:lost"
		}
		x = append(x, exchange{req, num(1)})
	}
	return x
}

// onRecords are the requests "cmd <record><args>" for each record of the
// 4 buckets of k, answered 0 (there was none).
func onRecords(cmd, args string) []exchange {
	var x []exchange
	for i := range 4 {
		b := "k#" + strconv.Itoa(i)
		x = append(x, exchange{cmd + " " + b + ":intents" + args, num(0)}, exchange{cmd + " " + b + ":applied" + args, num(0)})
		if i == 0 {
			x = append(x, exchange{cmd + " k#0:lost" + args, num(0)})
		}
	}
	return x
}
