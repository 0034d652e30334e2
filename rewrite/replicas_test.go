package rewrite

import (
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// unackedR is the error reply to a change of bucket b of the tests' key
// that acked of the 1 replica waited for acknowledged.
func unackedR(t *testing.T, b int, acked string) string {
	t.Helper()
	l, err := ParseMarker("k", []byte(marker))
	if err != nil {
		t.Fatal(err)
	}
	return unackedAt(l.Bucket(b), acked)
}

// unackedAt is the error reply to a change of the bucket key bucket of
// the tests' key that acked of the 1 replica waited for acknowledged.
func unackedAt(bucket []byte, acked string) string {
	return errR("ERR hotkeyproxy: 'k' was changed in " + string(bucket) + " on fake:6379, but only " + acked +
		" of 1 replicas acknowledged it within 100ms; the change was applied and may be lost on failover")
}

func TestWaitReplicas(t *testing.T) {
	const wait = "WAIT 1 100"
	for _, tc := range []struct {
		name    string
		steps   func(t *testing.T) []step
		unacked uint64
	}{
		{"a deduct its replica has is answered", func(*testing.T) []step {
			return []step{{cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{
				{"EVALSHA deduct 1 k#2 1", num(4)}, {wait, num(1)},
			}), reply: num(19)}}
		}, 0},
		{"a deduct short of replicas: applied, the error says so, no other bucket tried", func(t *testing.T) []step {
			return []step{
				{cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{
					{"EVALSHA deduct 1 k#2 1", num(4)}, {wait, num(0)},
				}), reply: unackedR(t, 2, "0")},
				// The take stands: the next deduct knows bucket 2 holds 4.
				{cmd: one, want: []exchange{{"EVALSHA deduct 1 k#2 1", num(3)}, {wait, num(1)}}, reply: num(18)},
			}
		}, 1},
		{"a WAIT that failed acknowledged none", func(t *testing.T) []step {
			return []step{{cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{
				{"EVALSHA deduct 1 k#2 1", num(4)}, {wait, downR},
			}), reply: unackedR(t, 2, "0")}}
		}, 1},
		{"a bucket that did not cover changed nothing: the ring goes on", func(*testing.T) []step {
			return []step{{cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{
				{"EVALSHA deduct 1 k#2 1", pair2(0, 0)}, {wait, num(0)},
				{"EVALSHA deduct 1 k#3 1", num(4)}, {wait, num(1)},
			}), reply: num(14)}}
		}, 1},
		{"a give back short of replicas", func(t *testing.T) []step {
			return []step{{cmd: "INCRBY k 3", want: join(loaded(5, 5, 5, 5), []exchange{
				{"EVALSHA add 1 k#0 3", num(8)}, {wait, num(0)},
			}), reply: unackedR(t, 0, "0")}}
		}, 1},
		{"a bucket found missing: its lost record is not waited for", func(*testing.T) []step {
			return []step{{cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{
				{"EVALSHA deduct 1 k#2 1", pair2(-2, 0)}, {wait, num(0)},
				{"EVALSHA lose 2 k k#0:lost layout:0 1 2 3 2 5 1000", pair2(1, 5)},
			}), reply: errR("ERR hotkeyproxy: 'k' lost bucket 2 ({2}k#2.a): its key is missing while the layout names it; it held 5 units when last seen; the other buckets still sell")}}
		}, 1},
		{"a gather's apply short of replicas: its intent stays for whoever looks next", func(t *testing.T) []step {
			return []step{{cmd: five, want: join(loaded(2, 2, 2, 2), reads(2, 2, 2, 2), []exchange{
				{"EVALSHA take 2 k#1 k#1:intents 3 m1 0 <keep>", pair2(2, 0)}, {wait, num(1)},
				{"EVALSHA apply 2 k#0 k#0:applied m1 2 <keep>", pair2(1, 4)}, {wait, num(0)},
			}), reply: unackedR(t, 0, "0")}}
		}, 1},
		{"a node without the script: WAIT follows the EVAL that ran", func(*testing.T) []step {
			return []step{{cmd: "DECR k", want: join(loaded(5, 5, 5, 5), []exchange{
				{"EVALSHA deduct 1 k#2 1", errR("NOSCRIPT No matching script. Please use EVAL.")}, {wait, num(1)},
				{"EVAL deduct 1 k#2 1", num(4)}, {wait, num(1)},
			}), reply: num(19)}}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testEngineConfig(config.KeyRule{Match: "k", Buckets: 4, Route: config.RouteRandom,
				WaitReplicas: 1, WaitTimeout: config.Duration(100 * time.Millisecond)})
			e, f, c := testEngineOf(t, cfg, 2, nil)
			run(t, e, f, c, tc.steps(t))
			if got := e.Stats()[0].WaitsShort; got != tc.unacked {
				t.Errorf("WaitsShort = %d, want %d", got, tc.unacked)
			}
		})
	}
}

// TestWaitReplicasUnruled: a key hot without a rule (learned, promoted)
// waits as hotkeys.detect says, and a reload changes it.
func TestWaitReplicasUnruled(t *testing.T) {
	cfg := testEngineConfig(config.KeyRule{Match: "other", Buckets: 4, Route: config.RouteRandom})
	cfg.Hotkeys.Detect.WaitReplicas = 1
	e, f, c := testEngineOf(t, cfg, 2, nil)
	e.Learn([]byte("k"))
	run(t, e, f, c, []step{{cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{
		{"EVALSHA deduct 1 k#2 1", num(4)}, {"WAIT 1 100", num(1)},
	}), reply: num(19)}})
	cfg.Hotkeys.Detect.WaitReplicas = 0
	e.Reload(cfg)
	run(t, e, f, c, []step{{cmd: one, want: []exchange{{"EVALSHA deduct 1 k#2 1", num(3)}}, reply: num(18)}})
}
