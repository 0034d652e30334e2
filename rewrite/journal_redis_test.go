package rewrite

// The journal on a real redis-server: what each change of a journaled
// key's buckets appends, and what reconciliation makes of it.

import (
	"bufio"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// journalEngine is redisEngine with the keys "k…" journaled, journal
// entries kept to maxlen (0: all), and deduct-n's order id in ARGV[2].
func journalEngine(t *testing.T, maxlen int64) (*Engine, *redisUpstream) {
	t.Helper()
	rs := redistest.Start(t, localredis.Options{})
	e, u := redisEngine(t, rs.Addr())
	cfg := config.Default()
	cfg.Hotkeys.Keys = []config.KeyRule{{Match: "k*", Buckets: 4, Route: config.RouteRandom, Journal: true}}
	cfg.Hotkeys.JournalMaxlen = maxlen
	cfg.Scripts = []config.Script{{Name: "deduct-n", Body: deductN, Amount: config.Amount{ArgvIndex: 1}, Soldout: -1, OrderID: 2}}
	e.Reload(cfg)
	// As a client would before its first EVALSHA: the key's master must
	// hold the script, or a hot key's EVALSHA is NOSCRIPT as a plain one's.
	u.do("SCRIPT", "LOAD", deductN)
	return e, u
}

// entries are bucket i's journal entries as "op amount after[ order]".
func entries(t *testing.T, u *redisUpstream, l *Layout, i int) []string {
	t.Helper()
	r := u.Do([]Request{{Key: l.JournalKey(i), Args: [][]byte{[]byte("XRANGE"), l.JournalKey(i), []byte("-"), []byte("+")}}})[0]
	msgs, ok := resp.ArrayElems(r, nil)
	if !ok {
		t.Fatalf("XRANGE %s: %q", l.JournalKey(i), r)
	}
	var out []string
	for _, m := range msgs {
		parts, _ := resp.ArrayElems(m, nil)
		fields, _ := resp.ArrayElems(parts[1], nil)
		f := map[string]string{}
		for j := 0; j+1 < len(fields); j += 2 {
			k, _ := resp.BulkValue(fields[j])
			v, _ := resp.BulkValue(fields[j+1])
			f[string(k)] = string(v)
		}
		if f["key"] != l.Key || f["bucket"] != strconv.Itoa(i) {
			t.Errorf("entry of bucket %d: key %q bucket %q", i, f["key"], f["bucket"])
		}
		s := f["op"] + " " + f["amount"] + " " + f["after"]
		if o, ok := f["order"]; ok {
			s += " " + o
		}
		out = append(out, s)
	}
	return out
}

// difference is a difference field of PROXY RECONCILE's reply.
var difference = regexp.MustCompile(`\$10\r\ndifference\r\n\$\d+\r\n(-?\d+)\r\n`)

// TestJournalOnRedis: SET, a deduct with an order id, DECRBY, INCRBY and
// a gather each append what they did to their bucket's journal; the
// reconciliation is clean, then finds a change made behind the proxy with
// its bucket and amount, and a bucket deleted as lost with the units the
// journal says it held.
func TestJournalOnRedis(t *testing.T) {
	e, u := journalEngine(t, 0)
	e.intN = func(int) int { return 1 }
	for _, c := range []struct{ cmd, want string }{
		{"SET k 10", okR}, // 3 3 2 2
		{"EVALSHA " + sha(deductN) + " 1 k 2 order-7", num(8)},
		{"DECRBY k 1", num(7)},
		{"EVALSHA " + sha(deductN) + " 1 k 4", num(3)}, // no bucket holds 4: 1 gathered into bucket 0
		{"INCRBY k 3", num(6)},
	} {
		keyAt := 1
		if strings.HasPrefix(c.cmd, "EVALSHA") {
			keyAt = 3
		}
		if r := string(e.Do(cmd(c.cmd), keyAt, 0)); r != c.want {
			t.Fatalf("%s: %q, want %q", c.cmd, r, c.want)
		}
	}
	l := e.key([]byte("k")).layout.Load()
	if !l.Journal || !strings.Contains(string(l.Marker()), ":journal") {
		t.Fatalf("layout %s is not journaled", l.Marker())
	}
	want := [][]string{
		{"set 3 3", "move_in 1 4", "deduct 4 0", "give_back 3 3"},
		{"set 3 3", "deduct 2 1 order-7", "deduct 1 0"},
		{"set 2 2", "move_out 1 1"},
		{"set 2 2"},
	}
	for i := range l.N() {
		if got := entries(t, u, l, i); strings.Join(got, ",") != strings.Join(want[i], ",") {
			t.Errorf("journal of bucket %d: %q, want %q", i, got, want[i])
		}
	}
	if r := string(e.Journal([]byte("k"))); !strings.Contains(r, string(l.JournalKey(3))) {
		t.Errorf("PROXY JOURNAL: %q", r)
	}
	check := func(status, diffs string) string {
		t.Helper()
		r := string(e.Reconcile([]byte("k")))
		if f, err := resp.ReadReply(bufio.NewReader(strings.NewReader(r)), nil); err != nil || len(f) != len(r) {
			t.Fatalf("RECONCILE: not one RESP frame: %q", r)
		}
		if !strings.Contains(r, "$6\r\nstatus\r\n"+bulk(status)) {
			t.Fatalf("RECONCILE status, want %s: %q", status, r)
		}
		var got []string
		for _, m := range difference.FindAllStringSubmatch(r, -1)[1:] {
			got = append(got, m[1])
		}
		if strings.Join(got, " ") != diffs {
			t.Fatalf("RECONCILE per-bucket differences %q, want %q: %q", got, diffs, r)
		}
		return r
	}
	check("clean", "0 0 0 0")
	u.do("INCRBY", string(l.Bucket(2)), "5")
	if r := check("differs", "0 0 5 0"); !strings.Contains(r, "a difference of 5, made after the last entry") {
		t.Errorf("RECONCILE's note: %q", r)
	}
	u.do("DEL", string(l.Bucket(3)))
	if r := check("differs", "0 0 5 -2"); !strings.Contains(r, "the journal says it held 2 units") {
		t.Errorf("RECONCILE of a lost bucket: %q", r)
	}
}

// TestJournalTrimmed: a journal kept to MAXLEN ~ N is reconciled from its
// oldest entry kept, and says so; one without entries cannot be.
func TestJournalTrimmed(t *testing.T) {
	e, u := journalEngine(t, 1)
	e.intN = func(int) int { return 0 }
	e.Do(cmd("SET k 1000"), 1, 0)
	for range 300 {
		e.Do(cmd("EVALSHA "+sha(deductN)+" 1 k 1"), 3, 0)
	}
	l := e.key([]byte("k")).layout.Load()
	r := string(e.Reconcile([]byte("k")))
	if !strings.Contains(r, bulk("clean")) || !strings.Contains(r, "journal trimmed: reconciled from entry") {
		t.Fatalf("RECONCILE of a trimmed journal: %q", r)
	}
	u.do("DEL", string(l.JournalKey(0)))
	r = string(e.Reconcile([]byte("k")))
	if !strings.Contains(r, bulk("unknown")) || !strings.Contains(r, "cannot reconcile bucket 0") {
		t.Fatalf("RECONCILE without a journal: %q", r)
	}
}

// TestJournalBadEntry: an entry its predecessors do not explain (here one
// written behind the proxy, with an amount that is no number) makes the
// bucket differ, even when the buckets agree with the journal's sum.
func TestJournalBadEntry(t *testing.T) {
	e, u := journalEngine(t, 0)
	e.Do(cmd("SET k 8"), 1, 0)
	l := e.key([]byte("k")).layout.Load()
	u.do("XADD", string(l.JournalKey(0)), "*", "key", "k", "bucket", "0", "op", "deduct", "amount", "zz", "after", "1000")
	r := string(e.Reconcile([]byte("k")))
	if !strings.Contains(r, bulk("differs")) || !strings.Contains(r, "is not what the entries before it make") {
		t.Errorf("RECONCILE with a bad entry: %q", r)
	}
}
