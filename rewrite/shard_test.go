package rewrite

import (
	"strings"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// TestUnshard merges a learned key back: the layout marked merging, each
// other bucket drained into bucket 0 by a move (what was given back to one
// meanwhile included), the moves in flight finished, then the key takes
// bucket 0's value, nothing left; the reply comes once every proxy must
// have stopped using the layout (the clock's wait).
func TestUnshard(t *testing.T) {
	e, f, c := testEngine(t, config.RouteRandom, 0, []exchange{
		{"GET j", bulk(marker)},
		{"GET j#0", bulk("1")}, {"GET j#1", bulk("2")}, {"GET j#2", bulk("0")}, {"GET j#3", bulk("0")},
		{"EVALSHA mark 2 j j#0 layout:0 1 2 3 layout:0 1 2 3:merge", pair2(1, 0)},
		{"EVALSHA drain 2 j#1 j#1:intents m1 0 <keep>", pair2(2, 1)},
		{"EVALSHA drain 2 j#2 j#2:intents m2 0 <keep>", pair2(1, 1)}, // given back meanwhile
		{"EVALSHA drain 2 j#3 j#3:intents m3 0 <keep>", pair2(0, 1)},
		{"EVALSHA apply 2 j#0 j#0:applied m1 2 <keep>", pair2(1, 3)},
		{"EVALSHA apply 2 j#0 j#0:applied m2 1 <keep>", pair2(1, 4)},
		{"HDEL j#1:intents m1", num(1)},
		{"HDEL j#2:intents m2", num(1)},
		// Drained buckets are missing: no lost bucket while merging.
		{listMoves("j", 0), movesOf(true, nil)},
		{listMoves("j", 1), movesOf(false, nil)},
		{listMoves("j", 2), movesOf(false, nil)},
		{listMoves("j", 3), movesOf(false, nil)},
		{"EVALSHA flip 4 j j#0 j#0:applied j#0:lost layout:0 1 2 3:merge", pair2(1, 0)},
		{"PUBLISH hotkeyproxy:layouts -j", num(1)},
	})
	e.Learn([]byte("j"))
	start := c.now
	var steps []string
	e.SetMoveHook(func(s string) { steps = append(steps, s) })
	if r := string(e.Unshard([]byte("j"))); r != okR {
		t.Fatalf("Unshard: %q, want +OK", r)
	}
	if waited := c.now.Sub(start); waited != recheck+100*time.Millisecond {
		t.Errorf("waited %v before replying, want %v", waited, recheck+100*time.Millisecond)
	}
	if got, want := strings.Join(steps, " "), "mark drain apply finish flip"; got != want {
		t.Errorf("steps told the hook: %q, want %q", got, want)
	}
	if e.Hot([]byte("j")) {
		t.Error("j still hot after Unshard")
	}
	f.done()
}

// TestMergeFinished: a proxy that meets a layout left merging (its proxy
// died after the drains) finishes the merge, in the same steps, and
// answers from the plain key.
func TestMergeFinished(t *testing.T) {
	e, f, _ := testEngine(t, config.RouteRandom, 0, []exchange{
		{"GET j", bulk(marker + ":merge")},
		{"EVALSHA mark 2 j j#0 layout:0 1 2 3 layout:0 1 2 3:merge", pair2(1, 0)},
		{"EVALSHA drain 2 j#1 j#1:intents m1 0 <keep>", pair2(0, 0)},
		{"EVALSHA drain 2 j#2 j#2:intents m2 0 <keep>", pair2(0, 0)},
		{"EVALSHA drain 2 j#3 j#3:intents m3 0 <keep>", pair2(0, 0)},
		// The dead proxy's drain of bucket 2 is half done: applied, or
		// not; applying it again is applying it once.
		{listMoves("j", 0), movesOf(true, nil)},
		{listMoves("j", 1), movesOf(false, nil)},
		{listMoves("j", 2), movesOf(false, []string{"d7", "0 4 " + itoa(nowMs)})},
		{listMoves("j", 3), movesOf(false, nil)},
		{"EVALSHA apply 2 j#0 j#0:applied d7 4 <keep>", pair2(2, 9)},
		{"HDEL j#2:intents d7", num(1)},
		{"EVALSHA flip 4 j j#0 j#0:applied j#0:lost layout:0 1 2 3:merge", pair2(1, 0)},
		{"PUBLISH hotkeyproxy:layouts -j", num(1)},
		{"GET j", bulk("9")},
	})
	e.Learn([]byte("j"))
	if r := e.Do(cmd("DECR j"), 1, 0); r != nil {
		t.Fatalf("DECR on the merged key: %q, want nil (relayed)", r)
	}
	f.done()
}

func TestShardRefusals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		do    func(e *Engine) []byte
		want  []exchange
		reply string
	}{
		{"Unshard of a key a rule names", func(e *Engine) []byte { return e.Unshard([]byte("k")) }, nil,
			errR("ERR hotkeyproxy: 'k' is marked hot by hotkeys.keys in proxy.yaml; remove it there first")},
		{"Unshard of a plain key", func(e *Engine) []byte { return e.Unshard([]byte("j")) },
			[]exchange{{"GET j", bulk("5")}}, errR("ERR hotkeyproxy: 'j' is not held as buckets")},
		{"Unshard with the key's node down", func(e *Engine) []byte { return e.Unshard([]byte("j")) },
			[]exchange{{"GET j", downR}}, downR},
		{"Shard of a value that is no integer", func(e *Engine) []byte { return e.Shard([]byte("j"), 2) },
			[]exchange{{"GET j", bulk("x")}, {"EVALSHA convert 2 j j#0 layout:" + placeTags("j", 2) + " <prefix> 1 2", pair2(-1, 0)}},
			errR("ERR hotkeyproxy: 'j' does not hold an integer below 2^53 in absolute value; only counters can be held as buckets")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, f, _ := testEngine(t, config.RouteRandom, 0, tc.want)
			if r := string(tc.do(e)); r != tc.reply {
				t.Errorf("reply %q, want %q", r, tc.reply)
			}
			f.done()
		})
	}
}
