package upstream

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/internal/keyspec"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
)

// testCluster is a Cluster whose slot map the test sets with serve, and
// that does not refresh it: what Refresh asks for stays in c.wake, for
// refreshAsked to see.
func testCluster(t *testing.T) *Cluster {
	t.Helper()
	cfg := config.Default().Upstream
	cfg.DialTimeout = config.Duration(2 * time.Second)
	c := &Cluster{
		cfg:     &cfg,
		log:     slog.New(slog.DiscardHandler),
		m:       Metrics{}.orNowhere(),
		wake:    make(chan struct{}, 1),
		nodes:   make(map[string]*Node),
		scripts: newScriptCache(),
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.Pool.close()
		}
	})
	return c
}

// serve publishes a slot map with every slot on the node at addr.
func (c *Cluster) serve(addr string) {
	var slots [hashslot.Count]*Node
	n := c.Node(addr)
	for s := range slots {
		slots[s] = n
	}
	c.topo.Store(NewTopology(&slots))
	c.keys.Store(&keyspec.Table{})
}

// refreshAsked reports whether a refresh was asked for since the last call.
func refreshAsked(c *Cluster) bool {
	select {
	case <-c.wake:
		return true
	default:
		return false
	}
}

// sent lists the commands be received, one line each.
func sent(be *redistest.Backend) string {
	var lines []string
	for _, cmd := range be.Received() {
		lines = append(lines, strings.Join(cmd, " "))
	}
	return strings.Join(lines, "\n")
}

// answers is a backend's Answer from a map of command lines to replies;
// a line's replies are given in turn, the last one repeated.
func answers(m map[string][]string) func([]string) redistest.Reply {
	var mu sync.Mutex
	calls := make(map[string]int)
	return func(args []string) redistest.Reply {
		line := strings.Join(args, " ")
		rs, ok := m[line]
		if !ok {
			return redistest.Reply{Raw: "-ERR test backend: unexpected " + line + "\r\n"}
		}
		mu.Lock()
		i := min(calls[line], len(rs)-1)
		calls[line]++
		mu.Unlock()
		return redistest.Reply{Raw: rs[i]}
	}
}

// roundTrip runs one round trip of commands, each given as its words, all
// routed by the slot of their second word, and returns the replies.
func roundTrip(c *Cluster, cmds ...string) []string {
	t, _, _ := c.Current()
	r := NewRoundTrip(c, 0)
	for _, cmd := range cmds {
		var args [][]byte
		for _, w := range strings.Fields(cmd) {
			args = append(args, []byte(w))
		}
		slot := int(hashslot.Of(args[1]))
		r.Queue(t.Node(slot), slot, nil, args)
	}
	r.Run()
	var replies []string
	for i := range cmds {
		replies = append(replies, string(r.Reply(i)))
	}
	return replies
}

var slotA = hashslot.Of([]byte("a"))

// TestRoundTripMoved: a MOVED is followed to the node it names, counted,
// and a refresh of the slot map asked for.
func TestRoundTripMoved(t *testing.T) {
	b := redistest.StartBackend(t, redistest.BackendOptions{Answer: answers(map[string][]string{"GET a": {"$1\r\nb\r\n"}})})
	a := redistest.StartBackend(t, redistest.BackendOptions{Answer: answers(map[string][]string{
		"GET a": {fmt.Sprintf("-MOVED %d %s\r\n", slotA, b.Addr())},
	})})
	c := testCluster(t)
	c.serve(a.Addr())
	if got := roundTrip(c, "GET a"); got[0] != "$1\r\nb\r\n" {
		t.Errorf("reply %q, want node b's", got[0])
	}
	if sent(a) != "GET a" || sent(b) != "GET a" {
		t.Errorf("a got %q, b got %q", sent(a), sent(b))
	}
	if !refreshAsked(c) {
		t.Error("no refresh asked after MOVED")
	}
	if got := testutil.ToFloat64(c.m.Moved); got != 1 {
		t.Errorf("moved counted %v, want 1", got)
	}
}

// TestMovedMovesTheSlot: the first MOVED for a slot changes its owner in
// the slot map before the next request is routed, as cluster clients do:
// a pipeline of 1,000 GETs sent right after it goes to the new owner, with
// no further redirection. Other slots stay where they were.
func TestMovedMovesTheSlot(t *testing.T) {
	b := redistest.StartBackend(t, redistest.BackendOptions{Answer: answers(map[string][]string{"GET a": {"$1\r\nb\r\n"}})})
	a := redistest.StartBackend(t, redistest.BackendOptions{Answer: answers(map[string][]string{
		"GET a": {fmt.Sprintf("-MOVED %d %s\r\n", slotA, b.Addr())},
	})})
	c := testCluster(t)
	c.serve(a.Addr())
	roundTrip(c, "GET a")
	cur, _, _ := c.Current()
	if cur.Node(int(slotA)).Addr != b.Addr() {
		t.Fatalf("slot %d on %s after MOVED, want %s", slotA, cur.Node(int(slotA)).Addr, b.Addr())
	}
	if other := (slotA + 1) % hashslot.Count; cur.Node(int(other)).Addr != a.Addr() {
		t.Errorf("slot %d moved too, to %s", other, cur.Node(int(other)).Addr)
	}
	if len(cur.Masters) != 2 || cur.MasterIndex(cur.Node(int(slotA))) < 0 {
		t.Errorf("masters %v, want both nodes", cur.Masters)
	}
	cmds := make([]string, 1000)
	for i := range cmds {
		cmds[i] = "GET a"
	}
	for i, r := range roundTrip(c, cmds...) {
		if r != "$1\r\nb\r\n" {
			t.Fatalf("reply %d %q, want node b's", i, r)
		}
	}
	if got := testutil.ToFloat64(c.m.Moved); got != 1 {
		t.Errorf("%v MOVEDs for the pipeline after the first, want none (1 in all)", got-1)
	}
	if n := len(a.Received()); n != 1 {
		t.Errorf("the old owner got %d requests, want the first only", n)
	}
}

// TestRoundTripAsk: an ASK sends ASKING, then the command, to the node it
// names, whose ASKING reply is dropped; the slot map stays.
func TestRoundTripAsk(t *testing.T) {
	b := redistest.StartBackend(t, redistest.BackendOptions{Answer: answers(map[string][]string{
		"ASKING": {"+OK\r\n"}, "GET a": {"$1\r\nb\r\n"},
	})})
	a := redistest.StartBackend(t, redistest.BackendOptions{Answer: answers(map[string][]string{
		"GET a": {fmt.Sprintf("-ASK %d %s\r\n", slotA, b.Addr())},
	})})
	c := testCluster(t)
	c.serve(a.Addr())
	if got := roundTrip(c, "GET a"); got[0] != "$1\r\nb\r\n" {
		t.Errorf("reply %q, want node b's", got[0])
	}
	if got := sent(b); got != "ASKING\nGET a" {
		t.Errorf("b got %q, want ASKING first", got)
	}
	if refreshAsked(c) {
		t.Error("refresh asked after ASK")
	}
	if got := testutil.ToFloat64(c.m.Ask); got != 1 {
		t.Errorf("ask counted %v, want 1", got)
	}
}

// TestRoundTripTryAgain: a TRYAGAIN is waited out and sent again, unless
// a later command of the same slot already ran: then it would run out of
// the client's order, and Redis's TRYAGAIN stands.
func TestRoundTripTryAgain(t *testing.T) {
	const tryAgain = "-TRYAGAIN Multiple keys request during rehashing of slot\r\n"
	a := redistest.StartBackend(t, redistest.BackendOptions{Answer: answers(map[string][]string{
		"MSET a 1 a 2": {tryAgain, "+OK\r\n"},
		"GET a":        {"$1\r\n0\r\n"},
		"SET x 1":      {tryAgain, "+OK\r\n"},
	})})
	c := testCluster(t)
	c.serve(a.Addr())
	got := roundTrip(c, "MSET a 1 a 2", "GET a")
	if got[0] != tryAgain || got[1] != "$1\r\n0\r\n" {
		t.Errorf("MSET, GET of its slot: %q, want Redis's TRYAGAIN to stand", got)
	}
	if got := sent(a); got != "MSET a 1 a 2\nGET a" {
		t.Errorf("a got %q, want the MSET once", got)
	}
	if !refreshAsked(c) {
		t.Error("no refresh asked after TRYAGAIN")
	}
	if got := roundTrip(c, "SET x 1", "GET a"); got[0] != "+OK\r\n" {
		t.Errorf("SET alone in its slot: %q, want it waited out", got[0])
	}
}

// TestRoundTripBounds: redirections are followed MaxHops times and waits
// waited maxWaits times, then the client gets an error.
func TestRoundTripBounds(t *testing.T) {
	var addrA, addrB atomic.Value
	moved := func(to *atomic.Value) func([]string) redistest.Reply {
		return func(args []string) redistest.Reply {
			if args[0] == "ASKING" {
				return redistest.Reply{Raw: "+OK\r\n"}
			}
			return redistest.Reply{Raw: fmt.Sprintf("-MOVED %d %s\r\n", slotA, to.Load())}
		}
	}
	a := redistest.StartBackend(t, redistest.BackendOptions{Answer: moved(&addrB)})
	b := redistest.StartBackend(t, redistest.BackendOptions{Answer: moved(&addrA)})
	addrA.Store(a.Addr())
	addrB.Store(b.Addr())
	c := testCluster(t)
	c.serve(a.Addr())
	if got := roundTrip(c, "GET a"); got[0] != "-"+MsgSlotMoving+"\r\n" {
		t.Errorf("ping-pong of MOVED: %q", got[0])
	}
	if n := a.Served() + b.Served(); n != MaxHops+1 {
		t.Errorf("sent %d times, want %d", n, MaxHops+1)
	}

	const down = "-CLUSTERDOWN The cluster is down\r\n"
	d := redistest.StartBackend(t, redistest.BackendOptions{Answer: answers(map[string][]string{"GET a": {down}})})
	c = testCluster(t)
	c.serve(d.Addr())
	start := time.Now()
	if got := roundTrip(c, "GET a"); got[0] != down {
		t.Errorf("CLUSTERDOWN throughout: %q, want Redis's", got[0])
	}
	if n := d.Served(); n != maxWaits+1 {
		t.Errorf("sent %d times, want %d", n, maxWaits+1)
	}
	if d, want := time.Since(start), retryBaseDelay*(1<<maxWaits-1); d < want {
		t.Errorf("gave up after %v, want the backoff of %v", d, want)
	}
}

// TestRoundTripNoscript: an EVALSHA of a script the cache knows is
// answered after loading it on the node that said NOSCRIPT, once; one the
// cache does not know gets Redis's NOSCRIPT.
func TestRoundTripNoscript(t *testing.T) {
	const body = "return 1"
	sum := sha1.Sum([]byte(body))
	sha := hex.EncodeToString(sum[:])
	const noscript = "-NOSCRIPT No matching script. Please use EVAL.\r\n"
	a := redistest.StartBackend(t, redistest.BackendOptions{Answer: answers(map[string][]string{
		"EVALSHA " + sha + " 1 a":                     {noscript, ":1\r\n"},
		"SCRIPT LOAD " + body:                         {"$40\r\n" + sha + "\r\n"},
		"EVALSHA " + strings.Repeat("0", 40) + " 1 a": {noscript},
	})})
	c := testCluster(t)
	c.serve(a.Addr())
	c.scripts.Learn([]byte(body))
	r := NewRoundTrip(c, 0)
	n := c.Node(a.Addr())
	for _, s := range []string{strings.ToUpper(sha), strings.Repeat("0", 40)} {
		r.Queue(n, int(slotA), nil, [][]byte{[]byte("EVALSHA"), []byte(strings.ToLower(s)), []byte("1"), []byte("a")})
		r.MarkScript([]byte(s))
	}
	r.Run()
	if got := string(r.Reply(0)); got != ":1\r\n" {
		t.Errorf("known script: %q, want it loaded and run", got)
	}
	if got := string(r.Reply(1)); got != noscript {
		t.Errorf("unknown script: %q, want Redis's NOSCRIPT", got)
	}
	want := "EVALSHA " + sha + " 1 a\nEVALSHA " + strings.Repeat("0", 40) + " 1 a\nSCRIPT LOAD " + body + "\nEVALSHA " + sha + " 1 a"
	if got := sent(a); got != want {
		t.Errorf("a got\n%s\nwant\n%s", got, want)
	}
	r.Reset()
	if r.Len() != 0 || r.Size() != 0 {
		t.Errorf("after Reset: %d requests, %d bytes", r.Len(), r.Size())
	}
}

// TestRoundTripUnreachable: a node that cannot be dialed answers with the
// transport error, and the slot map is asked to refresh.
func TestRoundTripUnreachable(t *testing.T) {
	c := testCluster(t)
	c.serve("127.0.0.1:1")
	if got := roundTrip(c, "GET a"); !strings.HasPrefix(got[0], "-ERR upstream unavailable: ") {
		t.Errorf("reply %q", got[0])
	}
	if !refreshAsked(c) {
		t.Error("no refresh asked after a failed dial")
	}
}

// TestRedirectCounts: the redirection counters count MOVED and ASK
// replies, and nothing that merely mentions them.
func TestRedirectCounts(t *testing.T) {
	c := testCluster(t)
	r := NewRoundTrip(c, 0)
	for _, reply := range []string{"-MOVED 12 127.0.0.1:7001\r\n", "-ASK 12 127.0.0.1:7002\r\n",
		"-ASK 13 127.0.0.1:7002\r\n", "-ERR MOVED\r\n", "+OK\r\n"} {
		r.redirect(&clusterPart{reply: []byte(reply)})
	}
	if got := testutil.ToFloat64(c.m.Moved); got != 1 {
		t.Errorf("moved = %v, want 1", got)
	}
	if got := testutil.ToFloat64(c.m.Ask); got != 2 {
		t.Errorf("ask = %v, want 2", got)
	}
}

// TestClusterReady: not ready without a slot map, nor after a failed load.
func TestClusterReady(t *testing.T) {
	c := testCluster(t)
	if err := c.Ready(); err == nil || !strings.Contains(err.Error(), "not loaded") {
		t.Errorf("Ready with no slot map: %v", err)
	}
	c.err = fmt.Errorf("cluster slot map: 127.0.0.1:7000: connection refused")
	if err := c.Ready(); err != c.err {
		t.Errorf("Ready after a failed load: %v", err)
	}
	c.err = nil
	c.serve("127.0.0.1:7000")
	if err := c.Ready(); err != nil {
		t.Errorf("Ready with a slot map: %v", err)
	}
}

// TestRoundTripFollower: a follower goes on the connection of the request
// before it, right after it, and again right after it wherever that one is
// redirected: the WAIT of a write redirected by MOVED or ASK is answered
// by the node that took the write.
func TestRoundTripFollower(t *testing.T) {
	for _, asking := range []bool{false, true} {
		b := redistest.StartBackend(t, redistest.BackendOptions{Answer: answers(map[string][]string{
			"ASKING": {"+OK\r\n"}, "INCR a": {":1\r\n"}, "WAIT 1 100": {":1\r\n"},
		})})
		redirect := fmt.Sprintf("-MOVED %d %s\r\n", slotA, b.Addr())
		if asking {
			redirect = fmt.Sprintf("-ASK %d %s\r\n", slotA, b.Addr())
		}
		a := redistest.StartBackend(t, redistest.BackendOptions{Answer: answers(map[string][]string{
			"INCR a": {redirect}, "WAIT 1 100": {":0\r\n"}, "GET x": {"$-1\r\n"},
		})})
		c := testCluster(t)
		c.serve(a.Addr())
		cur, _, _ := c.Current()
		r := NewRoundTrip(c, 0)
		r.Queue(cur.Node(int(slotA)), int(slotA), nil, [][]byte{[]byte("INCR"), []byte("a")})
		r.QueueFollower([][]byte{[]byte("WAIT"), []byte("1"), []byte("100")})
		r.Queue(cur.Node(int(slotA)), -1, nil, [][]byte{[]byte("GET"), []byte("x")})
		r.Run()
		if got := []string{string(r.Reply(0)), string(r.Reply(1)), string(r.Reply(2))}; got[0] != ":1\r\n" || got[1] != ":1\r\n" || got[2] != "$-1\r\n" {
			t.Errorf("asking %v: replies %q, want b's INCR and WAIT, a's GET", asking, got)
		}
		want := "INCR a\nWAIT 1 100"
		if asking {
			want = "ASKING\n" + want
		}
		if got := sent(b); got != want {
			t.Errorf("asking %v: b got %q, want %q", asking, got, want)
		}
		if got := sent(a); got != "INCR a\nWAIT 1 100\nGET x" {
			t.Errorf("asking %v: a got %q", asking, got)
		}
	}
}

// TestRoundTripWaitsForEveryNode: a run over several nodes returns once
// every node has answered or failed, the slowest too, and each request has
// its own node's reply; run after run on one RoundTrip, so that what ends
// one run never ends the next early.
func TestRoundTripWaitsForEveryNode(t *testing.T) {
	fast := redistest.StartBackend(t, redistest.BackendOptions{})
	slow := redistest.StartBackend(t, redistest.BackendOptions{Delay: 10 * time.Millisecond})
	addrs := []string{fast.Addr(), slow.Addr(), "127.0.0.1:1"}
	c := testCluster(t)
	var slots [hashslot.Count]*Node
	for s := range slots {
		slots[s] = c.Node(addrs[s*len(addrs)/hashslot.Count])
	}
	c.topo.Store(NewTopology(&slots))
	c.keys.Store(&keyspec.Table{})
	r := NewRoundTrip(c, 0)
	for run := range 20 {
		var want []string
		per := make(map[string]int) // requests per node this run
		for i := range 12 {
			key := fmt.Sprintf("key:%d:%d", run, i)
			slot := int(hashslot.Of([]byte(key)))
			r.Queue(slots[slot], slot, nil, [][]byte{[]byte("GET"), []byte(key)})
			per[slots[slot].Addr]++
			if slots[slot].Addr == addrs[2] {
				want = append(want, "-ERR upstream unavailable")
			} else {
				want = append(want, fmt.Sprintf("$%d\r\n%s\r\n", len(key), key))
			}
		}
		if len(per) != len(addrs) {
			t.Fatalf("run %d: keys on %d nodes, want every one of %d: %v", run, len(per), len(addrs), per)
		}
		r.Run()
		for i, w := range want {
			if got := string(r.Reply(i)); !strings.HasPrefix(got, w) {
				t.Fatalf("run %d: reply %d %q, want %q", run, i, got, w)
			}
		}
		r.Reset()
	}
}

// TestRoundTripWritesBeforeDialing: a round that must dial one node (here
// a dial whose HELLO is not answered) writes what it queued for the other
// nodes first: batches that join those writes meanwhile must not wait
// for the dial.
func TestRoundTripWritesBeforeDialing(t *testing.T) {
	fast := redistest.StartBackend(t, redistest.BackendOptions{})
	hung, release := holdOn(t, "HELLO")
	c := testCluster(t)
	c.cfg.DialTimeout = config.Duration(time.Minute)
	var slots [hashslot.Count]*Node
	for s := range slots {
		slots[s] = c.Node(fast.Addr())
	}
	onHung := "b"
	for hashslot.Of([]byte(onHung)) == slotA {
		onHung += "b"
	}
	slots[hashslot.Of([]byte(onHung))] = c.Node(hung.Addr())
	c.topo.Store(NewTopology(&slots))
	c.keys.Store(&keyspec.Table{})

	r := NewRoundTrip(c, 0)
	r.SetRESP3(true) // a dial says HELLO 3
	r.Queue(slots[slotA], int(slotA), nil, [][]byte{[]byte("GET"), []byte("a")})
	slotHung := int(hashslot.Of([]byte(onHung)))
	r.Queue(slots[slotHung], slotHung, nil, [][]byte{[]byte("GET"), []byte(onHung)})
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run()
	}()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(sent(fast), "GET a"); {
		if time.Now().After(deadline) {
			t.Fatalf("GET a not written while the other node's dial waits; the fast node got %q", sent(fast))
		}
		time.Sleep(time.Millisecond)
	}
	release()
	<-done
	for i, key := range []string{"a", onHung} {
		if got, want := string(r.Reply(i)), fmt.Sprintf("$%d\r\n%s\r\n", len(key), key); got != want {
			t.Errorf("reply %d %q, want %q", i, got, want)
		}
	}
}
