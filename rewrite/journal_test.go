package rewrite

import (
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// journalRule makes testEngine's key k journaled, journals kept to 1000
// entries, deduct-n's order id in ARGV[2].
func journalRule(e *Engine) { e.Reload(journalConfig()) }

// journalConfig is the config of journalRule.
func journalConfig() *config.Config {
	cfg := config.Default()
	cfg.Hotkeys.Keys = []config.KeyRule{{Match: "k", Buckets: 4, Route: config.RouteRandom, Journal: true}}
	cfg.Hotkeys.JournalMaxlen = 1000
	cfg.Scripts = []config.Script{{Name: "deduct-n", Body: deductN, Amount: config.Amount{ArgvIndex: 1}, Soldout: -1, OrderID: 2}}
	return cfg
}

// TestJournaledRequests: a key journaled by its rule is converted with
// the layout marked journaled and every bucket's share journaled; every
// bucket change after it runs the journaled script, which takes the
// bucket's journal and the journal's arguments (MAXLEN, key, bucket, the
// order id when the deduct script names one).
func TestJournaledRequests(t *testing.T) {
	tags := placeTags("k", 4)
	made := "hotkeyproxy-layout:1:<gen>:" + tags + ":journal"
	e, f, c := testEngine(t, config.RouteRandom, 2, nil)
	journalRule(e)
	run(t, e, f, c, []step{
		{cmd: "EVALSHA " + sha(deductN) + " 1 k 2 order-1", want: join([]exchange{
			{"GET k", bulk("10")},
			{"EVALSHA convert/j 3 k k#0 k#0:journal layout:" + tags + ":journal <prefix> 0 4 1000 k 0 ", pair2(1, 0)},
			{"PUBLISH hotkeyproxy:layouts +k", num(1)},
			{"GET k", bulk(made + ":10")},
			{"PTTL k", num(-1)},
			{"EVALSHA share 2 k#1 k#1:journal 3 NX 1000 k 1 ", okR},
			{"EVALSHA share 2 k#2 k#2:journal 2 NX 1000 k 2 ", okR},
			{"EVALSHA share 2 k#3 k#3:journal 2 NX 1000 k 3 ", okR},
			{"EVALSHA swap 1 k layout:" + tags + ":journal:10 layout:" + tags + ":journal", pair2(1, 0)},
		}, reads(3, 3, 2, 2), []exchange{
			{"EVALSHA deduct/j 2 k#2 k#2:journal 2 1000 k 2 order-1", num(0)},
		}), reply: num(8)},
		{cmd: "DECRBY k 3", want: []exchange{
			{"EVALSHA deduct/j 2 k#0 k#0:journal 3 1000 k 0 ", num(0)},
		}, reply: num(5)},
		{cmd: "INCRBY k 4", want: []exchange{
			{"EVALSHA add/j 2 k#0 k#0:journal 4 1000 k 0 ", num(4)},
		}, reply: num(9)},
	})
}

// TestJournalMarker: the marker of a journaled layout parses back, and a
// plain one is not journaled.
func TestJournalMarker(t *testing.T) {
	for _, m := range []string{"hotkeyproxy-layout:1:a:0 1:journal", "hotkeyproxy-layout:1:a:0 1:journal:7", "hotkeyproxy-layout:1:a:0 1:journal:merge"} {
		l, err := ParseMarker("k", []byte(m))
		if err != nil || !l.Journal || string(l.Marker()) != m {
			t.Errorf("ParseMarker(%q): %+v, %v", m, l, err)
		}
	}
	if l, err := ParseMarker("k", []byte("hotkeyproxy-layout:1:a:0 1")); err != nil || l.Journal {
		t.Errorf("a plain layout: %+v, %v", l, err)
	}
	if _, err := ParseMarker("k", []byte("hotkeyproxy-layout:1:a:0 1:merge:journal")); err == nil {
		t.Error("a marker with its journal flag out of place parsed")
	}
}

// TestJournaledWaitReplicas: with wait_replicas, each journaled change
// (the conversion, its spread by the share script, the swap that ends it,
// a deduct, SET's shares and its marker) is followed by its WAIT on the
// connection that wrote it; a SET whose share is short of the replicas
// stands and says so.
func TestJournaledWaitReplicas(t *testing.T) {
	const wait = "WAIT 1 100"
	tags := placeTags("k", 4)
	made := "hotkeyproxy-layout:1:<gen>:" + tags + ":journal"
	e, f, c := testEngine(t, config.RouteRandom, 2, nil)
	cfg := journalConfig()
	cfg.Hotkeys.Keys[0].WaitReplicas = 1
	cfg.Hotkeys.Keys[0].WaitTimeout = config.Duration(100 * time.Millisecond)
	e.Reload(cfg)
	run(t, e, f, c, []step{
		{cmd: "EVALSHA " + sha(deductN) + " 1 k 2 order-1", want: join([]exchange{
			{"GET k", bulk("10")},
			{"EVALSHA convert/j 3 k k#0 k#0:journal layout:" + tags + ":journal <prefix> 0 4 1000 k 0 ", pair2(1, 0)}, {wait, num(1)},
			{"PUBLISH hotkeyproxy:layouts +k", num(1)},
			{"GET k", bulk(made + ":10")},
			{"PTTL k", num(-1)},
			{"EVALSHA share 2 k#1 k#1:journal 3 NX 1000 k 1 ", okR}, {wait, num(1)},
			{"EVALSHA share 2 k#2 k#2:journal 2 NX 1000 k 2 ", okR}, {wait, num(1)},
			{"EVALSHA share 2 k#3 k#3:journal 2 NX 1000 k 3 ", okR}, {wait, num(1)},
			{"EVALSHA swap 1 k layout:" + tags + ":journal:10 layout:" + tags + ":journal", pair2(1, 0)}, {wait, num(1)},
		}, reads(3, 3, 2, 2), []exchange{
			{"EVALSHA deduct/j 2 k#2 k#2:journal 2 1000 k 2 order-1", num(0)}, {wait, num(1)},
		}), reply: num(8)},
	})
	// The new layout's bucket names are known once SET made it.
	f.want = append(f.want, join([]exchange{
		{"EVALSHA share 2 k#0 k#0:journal 2 1000 k 0 ", okR}, {wait, num(1)},
		{"EVALSHA share 2 k#1 k#1:journal 2 1000 k 1 ", okR}, {wait, num(0)},
		{"EVALSHA share 2 k#2 k#2:journal 2 1000 k 2 ", okR}, {wait, num(1)},
		{"EVALSHA share 2 k#3 k#3:journal 2 1000 k 3 ", okR}, {wait, num(1)},
		{"SET k layout:" + tags + ":journal", okR}, {wait, num(1)},
	}, reads(2, 2, 2, 2), []exchange{
		{"PUBLISH hotkeyproxy:layouts +k", num(1)},
	}, dropped("DEL"), []exchange{
		{"PEXPIRE k#0:journal 86400000", num(1)},
		{"PEXPIRE k#1:journal 86400000", num(1)},
		{"PEXPIRE k#2:journal 86400000", num(1)},
		{"PEXPIRE k#3:journal 86400000", num(1)},
	})...)
	got := string(e.Do(cmd("SET k 8"), 1, 0))
	if f.next != len(f.want) {
		t.Fatalf("SET k 8: %d of %d requests sent", f.next, len(f.want))
	}
	if want := unackedAt(e.key([]byte("k")).layout.Load().Bucket(1), "0"); got != want {
		t.Errorf("SET k 8: %q, want %q", got, want)
	}
	if got := e.Stats()[0].WaitsShort; got != 1 {
		t.Errorf("WaitsShort = %d, want 1", got)
	}
}
