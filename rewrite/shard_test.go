package rewrite

import (
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// TestUnshard merges a learned key back: stock gathered into bucket 0,
// the key takes it, and after the drain delay (on the clock) what was
// given back to the other buckets meanwhile is added to the key.
func TestUnshard(t *testing.T) {
	e, f, c := testEngine(t, config.RouteRandom, 0, []exchange{
		{"GET j", bulk(marker)},
		{"GET j#0", bulk("1")}, {"GET j#1", bulk("2")}, {"GET j#2", bulk("0")}, {"GET j#3", bulk("0")},
		{"SET j#0:unshard 1 NX PX 30000", okR},
		{"EVALSHA take 1 j#1 " + big(1), pair2(2, 0)},
		{"EVALSHA add 1 j#0 2", pair2(1, 3)},
		{"EVALSHA take 1 j#2 " + big(3), pair2(0, 0)},
		{"EVALSHA take 1 j#3 " + big(3), pair2(0, 0)},
		{"EVALSHA merge 2 j j#0 layout:0 1 2 3", pair2(1, 0)},
		{"PUBLISH hotkeyproxy:layouts -j", num(1)},
		{"EVALSHA drain 1 j#1", pair2(0, 0)},
		{"EVALSHA drain 1 j#2", pair2(1, 0)},
		{"INCRBY j 1", num(4)},
		{"EVALSHA drain 1 j#3", pair2(0, 0)},
		{"DEL j#0:unshard", num(1)},
	})
	e.Learn([]byte("j"))
	start := c.now
	if r := string(e.Unshard([]byte("j"))); r != okR {
		t.Fatalf("Unshard: %q, want +OK", r)
	}
	if waited := c.now.Sub(start); waited != recheck+100*time.Millisecond {
		t.Errorf("waited %v before draining, want %v", waited, recheck+100*time.Millisecond)
	}
	if e.Hot([]byte("j")) {
		t.Error("j still hot after Unshard")
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
