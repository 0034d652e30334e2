package e2e

// The byte-exact corpus of corpus_test.go, run through the proxy over a
// Redis Cluster and compared with a standalone redis-server: in cluster
// mode the proxy must look like one standalone Redis (README,
// "In front of a Redis Cluster"). Where Redis Cluster itself answers
// differently by design, clusterCorpusDiffs says so step by step; such a
// case also gets a variant with hash tags that must match the reference
// byte for byte. Then come the cluster's own cases, and checks that run
// against the nodes directly (SCAN, flushes, scripts, pub/sub, blocking).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
)

// Replies of Redis Cluster 7.0 (cluster.c, db.c, sort.c) and of the proxy
// where it refuses a command in cluster mode.
const (
	crossSlotReply = "-CROSSSLOT Keys in request don't hash to the same slot\r\n"
	selectReply    = "-ERR SELECT is not allowed in cluster mode\r\n"
	execAbortReply = "-EXECABORT Transaction discarded because of previous errors.\r\n"
	moveReply      = "-ERR MOVE is not allowed in cluster mode\r\n"
	swapdbReply    = "-ERR SWAPDB is not allowed in cluster mode\r\n"
	sortByReply    = "-ERR BY option of SORT denied in Cluster mode.\r\n"
	sortGetReply   = "-ERR GET option of SORT denied in Cluster mode.\r\n"
	copyDBReply    = "-ERR Copying to another database is not allowed in cluster mode\r\n"
	waitReply      = "-ERR WAIT is not supported by hotkeyproxy in cluster mode\r\n"
)

// Why a case differs on a cluster. Each names the design decision.
const (
	whyCrossSlot = "Redis Cluster refuses a command whose keys are in several slots with CROSSSLOT; " +
		"the proxy does the same and splits only MGET/MSET/DEL/UNLINK/EXISTS/TOUCH"
	whyCrossSlotTx = "inside MULTI a key in another slot than the transaction's gets CROSSSLOT and EXEC " +
		"then EXECABORT, as in Redis Cluster; the reference queues an unknown command instead, " +
		"so that its EXEC aborts too"
	whySelect = "a cluster has only db 0: SELECT n≠0 gets Redis Cluster's error and the client stays " +
		"in db 0; the reference skips the SELECT"
	whySelectInTx = "SELECT queued in MULTI fails inside EXEC with Redis Cluster's error and the " +
		"transaction's other commands run in db 0; the reference queues SELECT 0 instead"
	whyScan = "a SCAN cursor through the proxy names the master it is at, so a first " +
		"page ends with the first master (slots 0-5460) and a cursor to the next, never 0"
	whyOneDB         = "Redis Cluster refuses MOVE, SWAPDB and COPY … DB n: a cluster has one db"
	whySubscribeInTx = "SUBSCRIBE queued in MULTI would turn the transaction's node connection into a " +
		"subscriber the proxy cannot route for; refused in cluster mode, so EXEC aborts"
	whySort = "Redis Cluster refuses SORT BY/GET patterns, whose keys may be in any slot"
	whyWait = "WAIT counts the replicas of the node a connection writes to; the proxy refuses it " +
		"in cluster mode with an -ERR naming it (README: not supported, by design)"
)

// clusterDiff is how a corpus case goes on a cluster, by design. Either
// some steps get the cluster's reply, exactly, while the reference runs a
// stand-in (so that later steps compare against a standalone Redis that
// did what the cluster did); or, when a step cannot run at all (a blocking
// command refused at once), the whole case is replaced by the named cases.
type clusterDiff struct {
	why        string
	steps      []clusterStepDiff
	replacedBy []string
}

// clusterStepDiff is one step whose reply differs on a cluster.
type clusterStepDiff struct {
	step  int      // index in the case's steps
	sent  string   // what the step sends, to catch a table gone stale
	reply string   // the proxy's reply, exactly
	ref   []string // what the reference runs in its place, pipelined; nil: nothing
}

// refAbortTx stands in for a command refused inside MULTI: an unknown
// command, which Redis refuses while queueing, so that EXEC aborts.
var refAbortTx = []string{"FOO"}

// diffStep is a step whose reply is reply, with nothing run on the
// reference.
func diffStep(step int, sent, reply string) clusterStepDiff {
	return clusterStepDiff{step: step, sent: sent, reply: reply}
}

// clusterCorpusDiffs is, by case name, every difference a cluster makes.
func clusterCorpusDiffs(l *clusterLayout) map[string]clusterDiff {
	cross := func(step int, sent string) clusterStepDiff { return diffStep(step, sent, crossSlotReply) }
	sel := func(step int, sent string) clusterStepDiff { return diffStep(step, sent, selectReply) }
	return map[string]clusterDiff{
		"string/mset-mget": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(2, "MSETNX a 9 d 4"), cross(3, "MSETNX d 4 e 5")}},
		"string/lcs": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(1, "LCS k1 k2"), cross(2, "LCS k1 k2 LEN"), cross(3, "LCS k1 k2 IDX MINMATCHLEN 4 WITHMATCHLEN")}},
		// BITOP NOT with two sources: the slot check comes before the
		// command's own, on a cluster node too.
		"bitmap/bitop": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(2, "BITOP AND d a b"), cross(4, "BITOP OR d a b"), cross(6, "BITOP XOR d a b"),
			cross(8, "BITOP NOT d a"), cross(10, "BITOP NOT d a b")}},
		"list/lmpop": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(1, "LMPOP 2 l1 l2 LEFT"), cross(2, "LMPOP 2 l1 l2 RIGHT COUNT 5"), cross(3, "LMPOP 2 l1 l2 LEFT")}},
		"list/lmove-rpoplpush": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(1, "LMOVE s d LEFT RIGHT"), cross(2, "RPOPLPUSH s d"), cross(7, "LMOVE missing d LEFT LEFT")}},
		"set/algebra": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(2, "SINTER a b"), cross(3, "SUNION a b"), cross(4, "SDIFF a b"), cross(5, "SINTERCARD 2 a b"),
			cross(6, "SINTERCARD 2 a b LIMIT 1"), cross(7, "SINTERSTORE d a b"), cross(9, "SUNIONSTORE d a b"),
			cross(10, "SDIFFSTORE d b a")}},
		"set/move-pop-single": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(1, "SMOVE a b 7"), cross(2, "SMOVE a b 7")}},
		"zset/store-ops": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(2, "ZUNIONSTORE u 2 a b"), cross(4, "ZINTERSTORE i 2 a b WEIGHTS 2 3 AGGREGATE MAX"),
			cross(6, "ZINTER 2 a b WITHSCORES"), cross(7, "ZUNION 2 a b"), cross(8, "ZDIFF 2 a b WITHSCORES"),
			cross(9, "ZRANGESTORE r a 0 0")}},
		"stream/xread": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(3, "XREAD COUNT 1 STREAMS s t 0 0")}},
		"hll/basic": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(4, "PFCOUNT h h2"), cross(5, "PFMERGE h3 h h2")}},
		"keys/rename": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(1, "RENAME a b"), cross(3, "RENAME missing c"), cross(5, "RENAMENX b c"), cross(6, "RENAMENX b d")}},
		"keys/copy": {why: whyCrossSlot + "; " + whySelect, steps: []clusterStepDiff{
			cross(1, "COPY a b"), cross(4, "COPY a b"), cross(5, "COPY a b REPLACE"), cross(7, "COPY a c DB 1"),
			sel(8, "SELECT 1"), cross(11, "COPY missing x")}},
		"keys/move-swapdb": {why: whyOneDB + "; " + whySelect, steps: []clusterStepDiff{
			diffStep(1, "MOVE a 1", moveReply), sel(3, "SELECT 1"), diffStep(6, "MOVE a 1", moveReply),
			diffStep(7, "SWAPDB 0 1", swapdbReply), diffStep(9, "SWAPDB 0 99", swapdbReply)}},
		"keys/keys-scan": {why: whyScan, steps: []clusterStepDiff{
			diffStep(3, "SCAN 0 MATCH other COUNT 1000", "*2\r\n$4\r\n5461\r\n*0\r\n"),
			diffStep(4, "SCAN 0 MATCH user:* COUNT 1000", "*2\r\n$4\r\n5461\r\n*1\r\n$6\r\nuser:3\r\n"),
			diffStep(5, "SCAN 0 TYPE list COUNT 1000", "*2\r\n$4\r\n5461\r\n*0\r\n")}},
		"keys/sort": {why: whySort + "; " + whyCrossSlot, steps: []clusterStepDiff{
			diffStep(4, "SORT l BY w_* GET o_* GET #", sortByReply), diffStep(5, "SORT l BY nosort GET o_*", sortGetReply),
			cross(7, "SORT l BY w_* STORE dst"), diffStep(10, "SORT l GET h_*->f", sortGetReply)}},
		"script/keys-argv": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(0, `EVAL "return {KEYS[1],KEYS[2],ARGV[1],ARGV[2]}" 2 k1 k2 a1 a2`)}},
		"multi/runtime-error-inside": {why: whyCrossSlotTx, steps: []clusterStepDiff{
			{step: 3, sent: "SET t 1", reply: crossSlotReply, ref: refAbortTx}}},
		"multi/subscribe-inside": {why: whySubscribeInTx, steps: []clusterStepDiff{
			{step: 1, sent: "SUBSCRIBE ch", reply: "-ERR hotkeyproxy: SUBSCRIBE inside MULTI is not supported in cluster mode\r\n", ref: refAbortTx},
			{step: 2, sent: "EXEC", reply: "-EXECABORT Transaction discarded because of previous errors.\r\n", ref: []string{"EXEC"}}}},
		"multi/watch-unwatch": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(0, "WATCH a b")}},
		"multi/select-inside": {why: whySelectInTx, steps: []clusterStepDiff{
			{step: 1, sent: "SELECT 1", reply: "+QUEUED\r\n", ref: []string{"SELECT 0"}},
			{step: 3, sent: "EXEC", reply: "*2\r\n" + selectReply + "+OK\r\n", ref: []string{"EXEC"}}}},
		"multi/select-bad-inside": {why: whySelectInTx + " (a cluster node checks cluster mode before the range)", steps: []clusterStepDiff{
			{step: 4, sent: "EXEC", reply: "*3\r\n" + selectReply + "-ERR value is not an integer or out of range\r\n+OK\r\n", ref: []string{"EXEC"}}}},
		"pipeline/select-in-pipeline": {why: whySelect, steps: []clusterStepDiff{
			diffStep(0, "SELECT 1 | SET k one | SELECT 0 | SET k zero | GET k | SELECT 1 | GET k | SELECT 0",
				selectReply+"+OK\r\n+OK\r\n+OK\r\n$4\r\nzero\r\n"+selectReply+"$4\r\nzero\r\n+OK\r\n")}},
		"block/blpop-timeout": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(1, "BRPOP l1 l2 0.05")}},
		"block/blpop-data-present": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(3, "BLPOP l2 l 0.01")}},
		"block/brpop-woken": {why: whyCrossSlot + ": the client is never blocked",
			replacedBy: []string{"tagged/block/brpop-woken", "cluster/crossslot-blocking"}},
		"block/blmove-woken": {why: whyCrossSlot + ": the client is never blocked",
			replacedBy: []string{"tagged/block/blmove-woken", "cluster/crossslot-blocking"}},
		"block/blmpop-woken": {why: whyCrossSlot + ": the client is never blocked",
			replacedBy: []string{"tagged/block/blmpop-woken", "cluster/crossslot-blocking"}},
		"block/several-keys": {why: whyCrossSlot + ": the client is never blocked",
			replacedBy: []string{"tagged/block/several-keys", "cluster/crossslot-blocking"}},
		"block/select-carried": {why: whySelect, steps: []clusterStepDiff{
			sel(0, "SELECT 2"), sel(4, "SELECT 2")}},
		"block/wait": {why: whyWait, steps: []clusterStepDiff{
			diffStep(0, "WAIT 0 0", waitReply), diffStep(2, "WAIT 0 10", waitReply)}},
		"select/isolation": {why: whySelect, steps: []clusterStepDiff{
			sel(0, "SELECT 1"), sel(4, "SELECT 1")}},
		"select/errors": {why: whySelect + " (a cluster node checks cluster mode before the range)", steps: []clusterStepDiff{
			sel(0, "SELECT 16"), sel(1, "SELECT -1")}},
		"select/then-multi": {why: whySelect, steps: []clusterStepDiff{
			sel(0, "SELECT 3"), sel(6, "SELECT 3")}},
		"select/then-watch": {why: whySelect, steps: []clusterStepDiff{
			sel(0, "SELECT 4")}},
		"select/flushdb": {why: whySelect, steps: []clusterStepDiff{
			sel(0, "SELECT 1"), sel(5, "SELECT 1")}},
		"conn/reset": {why: whySelect, steps: []clusterStepDiff{
			sel(0, "SELECT 1")}},
		"conn/mixed-case": {why: whySelect, steps: []clusterStepDiff{
			sel(5, "Select 1")}},
		"inline/select": {why: whySelect, steps: []clusterStepDiff{
			diffStep(0, "SELECT 1\r\nSET k v\r\nSELECT 0\r\nGET k\r\nSELECT 1\r\nGET k\r\n",
				selectReply+"+OK\r\n+OK\r\n$1\r\nv\r\n"+selectReply+"$1\r\nv\r\n")}},

		// The cluster's own cases below.
		"tagged/keys/copy": {why: whyOneDB + "; " + whySelect, steps: []clusterStepDiff{
			diffStep(7, "COPY {k}a {k}c DB 1", copyDBReply), sel(8, "SELECT 1")}},
		"cluster/crossslot-blocking": {why: whyCrossSlot + " (the reference would block)", steps: []clusterStepDiff{
			cross(0, "BRPOP a b 5"), cross(1, "BLMOVE src dst LEFT RIGHT 0"), cross(2, "BLMPOP 0 2 l1 l2 RIGHT COUNT 2"),
			cross(3, "BLPOP a b c 0"), cross(4, "BRPOP a b c 0"), cross(5, "BZPOPMIN z1 z2 0"),
			cross(6, "XREAD BLOCK 0 STREAMS s t $ $")}},
		"cluster/multi-two-slots": {why: whyCrossSlotTx, steps: []clusterStepDiff{
			{step: 2, sent: "SET {b}y 2", reply: crossSlotReply, ref: refAbortTx}}},
		"cluster/multi-two-slots-pipelined": {why: whyCrossSlotTx, steps: []clusterStepDiff{
			{step: 0, sent: "MULTI | SET {a}x 1 | SET {b}y 2 | GET {a}x | EXEC",
				reply: "+OK\r\n+QUEUED\r\n" + crossSlotReply + "+QUEUED\r\n" + execAbortReply,
				ref:   []string{"MULTI", "SET {a}x 1", "FOO", "GET {a}x", "EXEC"}}}},
		"cluster/multi-keyless-then-two-masters": {why: whyCrossSlotTx, steps: []clusterStepDiff{
			{step: 4, sent: "SET " + l.keyOn[1][3] + " 2", reply: crossSlotReply, ref: refAbortTx}}},
		"cluster/watch-then-other-slot-in-multi": {why: whyCrossSlotTx, steps: []clusterStepDiff{
			{step: 3, sent: "SET {x}b 1", reply: crossSlotReply, ref: refAbortTx}}},
		"cluster/watch-two-slots": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(0, "WATCH {w}a {x}b")}},
		"cluster/ssubscribe-two-slots": {why: whyCrossSlot + " (shard channels hash like keys)", steps: []clusterStepDiff{
			cross(0, "SSUBSCRIBE a b")}},
		"cluster/eval-two-slots": {why: whyCrossSlot, steps: []clusterStepDiff{
			cross(0, `EVAL "return 1" 2 {a}1 {b}2`), cross(1, `EVAL_RO "return 1" 2 {a}1 {b}2`),
			cross(3, "EVALSHA e0e1f9fabfc9d4800c877a703b823ac0578ff8db 2 {a}1 {b}2"),
			cross(4, "FCALL f 2 {a}1 {b}2")}},
	}
}

// clusterLayout is where the test cluster keeps its slots: masters[i]
// serves the slots lo[i]..hi[i].
type clusterLayout struct {
	masters []string
	lo, hi  []int
	nodes   []string // every node, replicas included
	keyOn   [][]string
}

// clusterLayoutOf reads the layout from the cluster's own CLUSTER SLOTS
// and picks, with CLUSTER KEYSLOT, a few keys served by each master.
func clusterLayoutOf(t *testing.T, e *clusterEnv) *clusterLayout {
	t.Helper()
	l := &clusterLayout{}
	for _, n := range e.Cluster.Nodes() {
		l.nodes = append(l.nodes, n.Addr())
	}
	ctx := context.Background()
	direct := redis.NewClient(&redis.Options{Addr: l.nodes[0], Protocol: 2})
	defer direct.Close()
	slots, err := direct.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(slots, func(a, b redis.ClusterSlot) int { return a.Start - b.Start })
	for _, s := range slots {
		if len(l.masters) > 0 && l.masters[len(l.masters)-1] == s.Nodes[0].Addr {
			t.Fatalf("master %s serves two slot ranges; the test expects one each", s.Nodes[0].Addr)
		}
		l.masters = append(l.masters, s.Nodes[0].Addr)
		l.lo, l.hi = append(l.lo, s.Start), append(l.hi, s.End)
	}
	if len(l.masters) != 3 || l.lo[0] != 0 || l.lo[1] != 5461 {
		t.Fatalf("cluster layout %v %v %v: the table expects 3 masters, the second from slot 5461", l.masters, l.lo, l.hi)
	}
	// Four keys "m:<n>" served by each master.
	l.keyOn = make([][]string, len(l.masters))
	for n := 0; slices.ContainsFunc(l.keyOn, func(k []string) bool { return len(k) < 4 }); n++ {
		key := "m:" + strconv.Itoa(n)
		slot, err := direct.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		i := l.masterOf(int(slot))
		if i < 0 {
			t.Fatalf("CLUSTER KEYSLOT %s = %d, a slot no master serves", key, slot)
		}
		if len(l.keyOn[i]) < 4 {
			l.keyOn[i] = append(l.keyOn[i], key)
		}
	}
	return l
}

// masterOf is the index of the master serving slot, or -1.
func (l *clusterLayout) masterOf(slot int) int {
	for i := range l.masters {
		if l.lo[i] <= slot && slot <= l.hi[i] {
			return i
		}
	}
	return -1
}

// leakWatch fails the test when a reply of the proxy names a backend node:
// the proxy is one standalone Redis to its clients.
type leakWatch struct{ addrs []string }

func (w *leakWatch) check(t *testing.T, what, reply string) {
	t.Helper()
	for _, a := range w.addrs {
		if i := strings.Index(reply, a); i >= 0 {
			from, to := max(0, i-60), min(len(reply), i+len(a)+20)
			t.Errorf("%s: the proxy's reply names backend node %s: …%q…", what, a, reply[from:to])
		}
	}
}

// watchedConn is a raw client of the proxy whose every reply is watched
// for backend addresses.
type watchedConn struct {
	*rawConn
	w *leakWatch
	t *testing.T
}

func (w *leakWatch) dial(t *testing.T, addr string) *watchedConn {
	t.Helper()
	return &watchedConn{rawConn: dialRaw(t, addr), w: w, t: t}
}

func (c *watchedConn) do(args ...string) string {
	c.t.Helper()
	r := c.rawConn.do(args...)
	c.w.check(c.t, strings.Join(args, " "), r)
	return r
}

func (c *watchedConn) readReplies(n int) string {
	c.t.Helper()
	r := c.rawConn.readReplies(n)
	c.w.check(c.t, "reading", r)
	return r
}

// stepText is what a step sends, as clusterStepDiff.sent spells it.
func stepText(s corpusStep) string {
	if s.raw != "" {
		return s.raw
	}
	return strings.Join(s.cmds, " | ")
}

// checkDiffTable fails the test on a table entry that names no case, a
// step out of range or one that sends something else, or a replacement
// that does not exist.
func checkDiffTable(t *testing.T, cases []corpusCase, diffs map[string]clusterDiff) {
	t.Helper()
	byName := map[string]corpusCase{}
	for _, c := range cases {
		byName[c.name] = c
	}
	for name, d := range diffs {
		c, ok := byName[name]
		switch {
		case !ok:
			t.Errorf("clusterCorpusDiffs[%q]: no such case", name)
			continue
		case d.why == "":
			t.Errorf("clusterCorpusDiffs[%q]: no reason given", name)
		case (len(d.steps) == 0) == (len(d.replacedBy) == 0):
			t.Errorf("clusterCorpusDiffs[%q]: give either steps or replacedBy", name)
		}
		for _, r := range d.replacedBy {
			if _, ok := byName[r]; !ok {
				t.Errorf("clusterCorpusDiffs[%q]: replacement %q is not a case", name, r)
			}
		}
		for _, s := range d.steps {
			if s.step >= len(c.steps) || stepText(c.steps[s.step]) != s.sent {
				t.Errorf("clusterCorpusDiffs[%q]: step %d does not send %q", name, s.step, s.sent)
			}
		}
	}
}

// refSteps are the steps the reference runs: the case's, with stand-ins.
func (d clusterDiff) refSteps(steps []corpusStep) []corpusStep {
	out := slices.Clone(steps)
	for _, s := range d.steps {
		out[s.step] = corpusStep{conn: steps[s.step].conn, cmds: s.ref, n: len(s.ref)}
	}
	return out
}

func (d clusterDiff) step(i int) (clusterStepDiff, bool) {
	for _, s := range d.steps {
		if s.step == i {
			return s, true
		}
	}
	return clusterStepDiff{}, false
}

func TestClusterCorpus(t *testing.T) {
	e := startClusterEnv(t, nil)
	ref := redistest.Start(t, localredis.Options{})
	l := clusterLayoutOf(t, e)
	leaks := &leakWatch{addrs: l.nodes}
	cases := slices.Concat(corpusCases(), clusterCorpusCases(l))

	// What only the nodes can show first, on a cluster no case has
	// touched yet.
	clusterLive(t, e, l, leaks, ref.Addr())
	clusterRunCases(t, e, l, leaks, ref.Addr(), cases, clusterCorpusDiffs(l), false)
}

// TestClusterMultiKeyArity sends the multi-key commands the proxy splits
// with keys in several slots and a wrong number of arguments. It has a
// cluster of its own, after TestClusterCorpus, since the proxy has been
// seen to crash on such an MSET, which would end the test binary and
// hide every result before it.
func TestClusterMultiKeyArity(t *testing.T) {
	e := startClusterEnv(t, nil)
	ref := redistest.Start(t, localredis.Options{})
	l := clusterLayoutOf(t, e)
	cases := []corpusCase{
		tc("cluster/multikey-arity",
			"MSET a 1 b", "MSET a 1 b 2 c", "MSET a 1 b 2 c 3 d", "MSETNX a 1 b", "MGET a b c", "MSET {t}a 1 {t}b", "MSET a", "MSET",
			"DEL", "UNLINK", "EXISTS", "TOUCH", "MGET", "PING"),
		tc("cluster/multikey-arity-pipelined",
			pipe("SET a 1", "MSET a 2 b 3 c", "GET a", "MSET a 2 b 3 c 4", "MGET a b c", "MSET b")),
	}
	diffs := map[string]clusterDiff{
		// MSETNX is not split, so its keys are checked first, as on a
		// Redis Cluster node: the slots, then the pairs.
		"cluster/multikey-arity": {why: whyCrossSlot, steps: []clusterStepDiff{
			diffStep(3, "MSETNX a 1 b", crossSlotReply)}},
	}
	clusterRunCases(t, e, l, &leakWatch{addrs: l.nodes}, ref.Addr(), cases, diffs, false)
}

// clusterRunCases runs each case through the proxy over the cluster and
// on the reference Redis at refAddr, byte for byte, but for the
// differences diffs lists, and checks that every case ran; with resp3,
// on connections that said HELLO 3.
func clusterRunCases(t *testing.T, e *clusterEnv, l *clusterLayout, leaks *leakWatch, refAddr string, cases []corpusCase, diffs map[string]clusterDiff, resp3 bool) {
	t.Helper()
	direct := corpusTarget{addr: refAddr, servers: []string{refAddr}, resp3: resp3}
	proxied := corpusTarget{addr: e.ProxyAddr(), servers: l.masters, resp3: resp3}
	corpusCheckNames(t, cases)
	checkDiffTable(t, cases, diffs)

	// Each case starts from empty servers: emptied through the proxy, so
	// that it forgets the scripts it saw, and on each master.
	resets := slices.Concat([]string{proxied.addr}, direct.servers, proxied.servers)
	ran, replaced, excusedSteps, excusedCases := 0, 0, 0, 0
	for _, c := range cases {
		d := diffs[c.name]
		if d.replacedBy != nil {
			replaced++
			continue
		}
		if len(d.steps) > 0 {
			excusedCases++
			excusedSteps += len(d.steps)
		}
		t.Run(c.name, func(t *testing.T) {
			ran++
			if c.bad != "" {
				t.Fatal(c.bad)
			}
			for _, s := range resets {
				corpusReset(t, s)
			}
			want := direct.run(t, d.refSteps(c.steps))
			got := proxied.run(t, c.steps)
			for i, s := range c.steps {
				p := strings.Join(got[i], "")
				leaks.check(t, fmt.Sprintf("step %d sent %s", i, corpusQuote(stepText(s))), p)
				if sd, ok := d.step(i); ok {
					if p != sd.reply {
						t.Errorf("step %d (conn %d) sent %s: want the cluster's reply (%s)\n cluster: %s\n proxy:   %s",
							i, s.conn, corpusQuote(sd.sent), d.why, corpusQuote(sd.reply), corpusQuote(p))
					}
					continue
				}
				corpusCompare(t, i, s, want[i], got[i])
			}
			corpusCheckServes(t, proxied.addr)
		})
	}
	t.Logf("%d cases ran (%d of them with %d steps that differ by design), %d replaced by cluster variants",
		ran, excusedCases, excusedSteps, replaced)
	corpusCheckRan(t, ran+replaced, len(cases), min(100, len(cases)-1))
}

// clusterCorpusCases are the cluster's own cases: hash-tagged variants of
// corpus cases that Redis Cluster refuses as written, and what a cluster
// changes (keys in many slots, masters, transactions moving).
func clusterCorpusCases(l *clusterLayout) []corpusCase {
	var cs []corpusCase
	add := func(c ...corpusCase) { cs = append(cs, c...) }

	// Hash-tagged variants: one slot, so they must match byte for byte.
	add(
		tc("tagged/string/mset-mget", "MSET {k}a 1 {k}b 2 {k}c 3", "MGET {k}a {k}b {k}missing {k}c", "MSETNX {k}a 9 {k}d 4", "MSETNX {k}d 4 {k}e 5", "MGET {k}d {k}e", "MSET {k}a"),
		tc("tagged/string/lcs", "MSET {k}1 ohmytext {k}2 mynewtext", "LCS {k}1 {k}2", "LCS {k}1 {k}2 LEN", "LCS {k}1 {k}2 IDX MINMATCHLEN 4 WITHMATCHLEN"),
		tc("tagged/bitmap/bitop", "SET {b}a foof", "SET {b}b abcd", "BITOP AND {b}d {b}a {b}b", "GET {b}d", "BITOP OR {b}d {b}a {b}b", "GET {b}d", "BITOP XOR {b}d {b}a {b}b", "GET {b}d", "BITOP NOT {b}d {b}a", "GET {b}d", "BITOP NOT {b}d {b}a {b}b"),
		tc("tagged/list/lmpop", "RPUSH {l}2 x y z", "LMPOP 2 {l}1 {l}2 LEFT", "LMPOP 2 {l}1 {l}2 RIGHT COUNT 5", "LMPOP 2 {l}1 {l}2 LEFT", "LMPOP 0 {l}1 LEFT", "LMPOP 1 {l}1 UP"),
		tc("tagged/list/lmove-rpoplpush", "RPUSH {l}s a b c", "LMOVE {l}s {l}d LEFT RIGHT", "RPOPLPUSH {l}s {l}d", "LRANGE {l}s 0 -1", "LRANGE {l}d 0 -1", "LMOVE {l}s {l}s RIGHT LEFT", "LRANGE {l}s 0 -1", "LMOVE {l}missing {l}d LEFT LEFT"),
		tc("tagged/set/algebra", "SADD {s}a 1 2 3 4", "SADD {s}b 3 4 5", "SINTER {s}a {s}b", "SUNION {s}a {s}b", "SDIFF {s}a {s}b", "SINTERCARD 2 {s}a {s}b", "SINTERCARD 2 {s}a {s}b LIMIT 1", "SINTERSTORE {s}d {s}a {s}b", "SMEMBERS {s}d", "SUNIONSTORE {s}d {s}a {s}b", "SDIFFSTORE {s}d {s}b {s}a", "SMEMBERS {s}d"),
		tc("tagged/set/move-pop-single", "SADD {s}a 7", "SMOVE {s}a {s}b 7", "SMOVE {s}a {s}b 7", "SMEMBERS {s}b", "SRANDMEMBER {s}b", "SPOP {s}b", "EXISTS {s}b"),
		tc("tagged/zset/store-ops", "ZADD {z}a 1 x 2 y", "ZADD {z}b 10 y 20 z", "ZUNIONSTORE {z}u 2 {z}a {z}b", "ZRANGE {z}u 0 -1 WITHSCORES", "ZINTERSTORE {z}i 2 {z}a {z}b WEIGHTS 2 3 AGGREGATE MAX", "ZRANGE {z}i 0 -1 WITHSCORES", "ZINTER 2 {z}a {z}b WITHSCORES", "ZUNION 2 {z}a {z}b", "ZDIFF 2 {z}a {z}b WITHSCORES", "ZRANGESTORE {z}r {z}a 0 0", "ZRANGE {z}r 0 -1"),
		tc("tagged/stream/xread", "XADD {x}s 1-0 a 1", "XADD {x}s 2-0 b 2", "XADD {x}t 1-0 c 3", "XREAD COUNT 1 STREAMS {x}s {x}t 0 0", "XREAD STREAMS {x}s {x}t 1-0 0"),
		tc("tagged/hll/basic", "PFADD {h}h a b c", "PFADD {h}h2 c d e", "PFCOUNT {h}h {h}h2", "PFMERGE {h}h3 {h}h {h}h2", "PFCOUNT {h}h3"),
		tc("tagged/keys/rename", "SET {k}a 1", "RENAME {k}a {k}b", "GET {k}b", "RENAME {k}missing {k}c", "SET {k}c 3", "RENAMENX {k}b {k}c", "RENAMENX {k}b {k}d", "MGET {k}a {k}b {k}c {k}d", "RENAME {k}d {k}d"),
		tc("tagged/keys/copy", "SET {k}a 1", "COPY {k}a {k}b", "GET {k}b", "SET {k}a 2", "COPY {k}a {k}b", "COPY {k}a {k}b REPLACE", "GET {k}b", "COPY {k}a {k}c DB 1", "SELECT 1", "GET {k}c", "SELECT 0", "COPY {k}missing {k}x", "COPY {k}a {k}a"),
		tc("tagged/keys/sort-store", "RPUSH {s}l 3 1 2", "SORT {s}l STORE {s}dst", "LRANGE {s}dst 0 -1", "SORT {s}l DESC ALPHA STORE {s}dst", "LRANGE {s}dst 0 -1"),
		tc("tagged/script/keys-argv", `EVAL "return {KEYS[1],KEYS[2],ARGV[1],ARGV[2]}" 2 {k}1 {k}2 a1 a2`, `EVAL "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('GET', KEYS[2])" 2 {k}1 {k}1 v`),
		tc("tagged/multi/runtime-error-inside", "SET {t}s x", "MULTI", "INCR {t}s", "SET {t}t 1", "LPUSH {t}s y", "EXEC", "GET {t}t"),
		tc("tagged/multi/watch-unwatch", "WATCH {w}a {w}b", "UNWATCH", "SET {w}a 1", "MULTI", "SET {w}b 2", "EXEC"),
		tc("tagged/block/blpop-timeout", "BLPOP {b}l 0.1", "BRPOP {b}l1 {b}l2 0.05", "LLEN {b}l"),
		tc("tagged/block/brpop-woken", sendOnly(0, "BRPOP {b}a {b}b 5"), waitBlocked(1), on(1, cmds("RPUSH {b}b 1 2")...), readOn(0, 1), "LRANGE {b}b 0 -1"),
		tc("tagged/block/blmove-woken", sendOnly(0, "BLMOVE {b}src {b}dst LEFT RIGHT 0"), waitBlocked(1), on(1, cmds("RPUSH {b}src a b")...), readOn(0, 1), "LRANGE {b}dst 0 -1", "LRANGE {b}src 0 -1"),
		tc("tagged/block/blmpop-woken", sendOnly(0, "BLMPOP 0 2 {b}l1 {b}l2 RIGHT COUNT 2"), waitBlocked(1), on(1, cmds("RPUSH {b}l2 a b c")...), readOn(0, 1), "BLMPOP 0.01 1 {b}l9 LEFT"),
		tc("tagged/block/several-keys", "RPUSH {b}b x", "BLPOP {b}a {b}b {b}c 0", sendOnly(0, "BRPOP {b}a {b}b {b}c 0"), waitBlocked(1), on(1, cmds("RPUSH {b}c y")...), readOn(0, 1)),
	)

	// What Redis Cluster refuses, with the reference as a standalone Redis
	// that did not run the refused command.
	add(
		tc("cluster/crossslot-blocking", "BRPOP a b 5", "BLMOVE src dst LEFT RIGHT 0", "BLMPOP 0 2 l1 l2 RIGHT COUNT 2", "BLPOP a b c 0", "BRPOP a b c 0", "BZPOPMIN z1 z2 0", "XREAD BLOCK 0 STREAMS s t $ $", "PING"),
		tc("cluster/multi-two-slots", "MULTI", "SET {a}x 1", "SET {b}y 2", "EXEC", "GET {a}x", "GET {b}y"),
		tc("cluster/multi-two-slots-pipelined", pipe("MULTI", "SET {a}x 1", "SET {b}y 2", "GET {a}x", "EXEC"), "GET {a}x"),
		tc("cluster/multi-keyless-then-two-masters", "MULTI", "PING", "SET "+l.keyOn[0][3]+" 1", "INCR "+l.keyOn[0][3], "SET "+l.keyOn[1][3]+" 2", "EXEC", "GET "+l.keyOn[0][3], "GET "+l.keyOn[1][3]),
		tc("cluster/watch-then-other-slot-in-multi", "WATCH {w}a", "MULTI", "INCR {w}a", "SET {x}b 1", "EXEC", "GET {w}a", "GET {x}b"),
		tc("cluster/watch-two-slots", "WATCH {w}a {x}b", "MULTI", "SET {w}a 1", "EXEC"),
		tc("cluster/ssubscribe-two-slots", "SSUBSCRIBE a b", "PING", "SET a 1", "GET a"),
		tc("cluster/eval-two-slots", `EVAL "return 1" 2 {a}1 {b}2`, `EVAL_RO "return 1" 2 {a}1 {b}2`, `SCRIPT LOAD "return 1"`, "EVALSHA e0e1f9fabfc9d4800c877a703b823ac0578ff8db 2 {a}1 {b}2", "FCALL f 2 {a}1 {b}2", `EVAL "return 1" 2 {a}1 {a}2`),
	)

	// Multi-key commands over many slots: split per slot and merged, they
	// must answer as one standalone Redis does.
	var many, pairs []string
	for i := range 40 {
		many = append(many, fmt.Sprintf("mk:%d", i))
		pairs = append(pairs, fmt.Sprintf("mk:%d", i), fmt.Sprintf("v%d", i))
	}
	sp := func(s []string) string { return strings.Join(s, " ") }
	add(tc("cluster/multikey-many-slots",
		"MSET "+sp(pairs),
		"MGET "+sp(many),
		"MGET mk:3 missing mk:3 mk:0 mk:39 nope mk:0 mk:17",
		"EXISTS mk:1 mk:1 mk:2 missing mk:3 mk:1",
		"TOUCH mk:1 mk:2 missing mk:1 mk:30",
		"RPUSH mk:list x", "HSET mk:hash f v", "SADD mk:set m", "ZADD mk:z 1 m",
		"MGET mk:1 mk:list mk:hash missing mk:set mk:z mk:2",
		"EXISTS mk:list mk:hash mk:1 mk:set mk:z",
		"DEL mk:1 mk:1 mk:list missing mk:2",
		"UNLINK mk:3 mk:3 mk:hash mk:4 mk:set",
		"MGET mk:1 mk:2 mk:3 mk:4 mk:5",
		"MSET mk:5 a mk:6 b mk:5 c mk:7 d mk:6 e", "MGET mk:5 mk:6 mk:7",
		"EXISTS "+sp(many), "DBSIZE",
		"DEL "+sp(many)+" mk:z", "DBSIZE",
		"MSET mk:1", "MGET", "DEL", "EXISTS", "TOUCH", "UNLINK", "MSET",
		`MSET "" e "\x00" z "{" a "{}" b "}{" c "{a}" d "a{b}c" f "{}{a}" g`,
		`MGET "" "\x00" "{" "{}" "}{" "{a}" "a{b}c" "{}{a}" missing`,
		`DEL "" "\x00" "{" "{}" "}{" "{a}" "a{b}c" "{}{a}" missing`,
	))
	var big, bigPairs, bigGet []string
	for i := range 1000 {
		k := fmt.Sprintf("big:%d", i)
		big = append(big, k)
		bigPairs = append(bigPairs, k, strconv.Itoa(i*7))
		bigGet = append(bigGet, k)
		if i%10 == 0 {
			bigGet = append(bigGet, "big:missing:"+strconv.Itoa(i), big[i/2])
		}
	}
	add(tc("cluster/multikey-1000",
		"MSET "+sp(bigPairs), "DBSIZE",
		"MGET "+sp(bigGet),
		"EXISTS "+sp(bigGet),
		"TOUCH "+sp(big),
		"DEL "+sp(big[:500]),
		"MGET "+sp(big),
		"UNLINK "+sp(big),
		"DBSIZE",
		pipe("MSET "+sp(bigPairs), "MGET "+sp(big), "DEL "+sp(bigGet), "EXISTS "+sp(big)),
	))

	// 10,000 pipelined commands over every master, split and keyless ones
	// among them, come back in order.
	mixed := make([]string, 0, 10000)
	for i := 0; len(mixed) < 10000; i++ {
		k := fmt.Sprintf("px:%d", i)
		switch i % 10 {
		case 0:
			mixed = append(mixed, "SET "+k+" "+strconv.Itoa(i))
		case 1:
			mixed = append(mixed, fmt.Sprintf("GET px:%d", i-1))
		case 2:
			mixed = append(mixed, fmt.Sprintf("INCR ctr:%d", i%17))
		case 3:
			mixed = append(mixed, fmt.Sprintf("MGET px:%d %s px:%d nope:%d", i-3, k, i-13, i))
		case 4:
			mixed = append(mixed, fmt.Sprintf("MSET a:%d x b:%d y %s z", i, i, k))
		case 5:
			mixed = append(mixed, fmt.Sprintf("DEL a:%d b:%d px:%d", i-1, i-11, i-5))
		case 6:
			mixed = append(mixed, fmt.Sprintf("EXISTS a:%d b:%d %s px:%d", i-2, i-2, k, i-6))
		case 7:
			mixed = append(mixed, fmt.Sprintf("LPUSH l:%d %d", i%13, i), "PING", "ECHO "+k)
		case 8:
			mixed = append(mixed, fmt.Sprintf("LPUSH px:%d x", i-8)) // WRONGTYPE
		default:
			if i%100 == 9 {
				mixed = append(mixed, "DBSIZE", "EXISTS "+k)
			} else {
				mixed = append(mixed, fmt.Sprintf("GETDEL ctr:%d", i%5))
			}
		}
	}
	add(tc("cluster/pipeline-10000-mixed", pipe(mixed[:10000]...), "DBSIZE"))

	// A standalone Redis answers cluster commands with "cluster support
	// disabled", its usual arity and subcommand errors, in or out of a
	// transaction: a cluster-aware client then treats the proxy as one
	// server, and never learns a node's address.
	add(
		tc("cluster/cluster-commands",
			"CLUSTER SLOTS", "CLUSTER SHARDS", "CLUSTER NODES", "CLUSTER INFO", "CLUSTER KEYSLOT foo",
			"CLUSTER MYID", "CLUSTER MYSHARDID", "CLUSTER COUNTKEYSINSLOT 1", "CLUSTER GETKEYSINSLOT 1 10", "CLUSTER HELP",
			"CLUSTER LINKS", "CLUSTER REPLICAS x", "CLUSTER SLAVES x", "CLUSTER COUNT-FAILURE-REPORTS x",
			"CLUSTER SETSLOT 0 STABLE", "CLUSTER SAVECONFIG", "CLUSTER FORGET x",
			"CLUSTER FOO", "CLUSTER SLOTS x", "CLUSTER KEYSLOT", "CLUSTER", "cluster slots", "Cluster Nodes",
			"READONLY", "READWRITE", "ASKING", "READONLY x", "READWRITE x", "ASKING x", "readonly",
			"GET k", "PING"),
		tc("cluster/cluster-commands-in-multi", "MULTI", "CLUSTER SLOTS", "CLUSTER NODES", "READONLY", "ASKING", "CLUSTER MYID", "SET k v", "EXEC", "GET k"),
		tc("cluster/cluster-commands-watching", "WATCH k", "CLUSTER SLOTS", "CLUSTER SHARDS", "READONLY", "UNWATCH"),
		tc("cluster/cluster-commands-pipelined", pipe("SET a 1", "CLUSTER SLOTS", "GET a", "READONLY", "CLUSTER KEYSLOT a", "ASKING", "READWRITE", "GET b")),
		tc("cluster/cluster-commands-subscribed", raw(corpusCmd("SUBSCRIBE", "ch"), 1), raw(corpusCmd("CLUSTER", "SLOTS")+corpusCmd("READONLY"), 2), raw(corpusCmd("UNSUBSCRIBE"), 1)),
		tc("cluster/ping-echo", "PING", "PING x", `PING ""`, "PING a b", "ECHO", "ECHO a b", `ECHO "\x00\r\n"`, "ping", "EcHo z",
			raw("PING\r\nECHO hi\r\nPING x\r\n", 3), pipe("PING", "SET pe 1", "ECHO x", "GET pe", "PING y", "ECHO")),
		tc("cluster/dbsize-keys-randomkey", "DBSIZE", "KEYS *", "RANDOMKEY", "SET "+l.keyOn[1][0]+" v", "RANDOMKEY", "KEYS *", "DBSIZE",
			"SET "+l.keyOn[2][0]+" w", normed("KEYS *", sortArray), "DBSIZE", "FLUSHDB", "DBSIZE", "RANDOMKEY", "KEYS"),
		tc("cluster/eval-numkeys", `EVAL "return {KEYS[1], ARGV[1]}" 1 {e}k other`, `EVAL "return {KEYS[1], KEYS[2]}" 2 {e}a {e}b`, `EVAL "return ARGV[1]" 0 a b`,
			`EVAL "return 1" 3 a`, `EVAL "return 1" -1 a`, `EVAL "return 1" x a`, `EVAL "return KEYS[1]" 1 "{}{a}"`),
	)

	// A transaction whose first commands have no key starts on one master
	// and moves to its first key's: one case per master, so that at
	// least two of them move.
	for i, keys := range l.keyOn {
		k := keys[0]
		add(
			tc(fmt.Sprintf("cluster/multi-keyless-then-key/master-%d", i),
				"MULTI", "PING", "ECHO x", "SET "+k+" 1", "INCR "+k, "GET "+k, "EXISTS "+k+" "+k, "EXEC", "GET "+k),
			tc(fmt.Sprintf("cluster/multi-keyless-then-key-pipelined/master-%d", i),
				pipe("MULTI", "PING", "SET "+k+" 1", "INCR "+k, "EXEC", "GET "+k)),
			tc(fmt.Sprintf("cluster/watch-multi/master-%d", i),
				"SET "+k+" 1", "WATCH "+k, "MULTI", "PING", "INCR "+k, "EXEC", "GET "+k,
				"WATCH "+k, on(1, cmds("SET "+k+" 10")...), "MULTI", "INCR "+k, "EXEC", "GET "+k),
		)
	}
	add(
		tc("cluster/watch-tagged-other-client", "SET {w}a 1", "WATCH {w}a {w}b", on(1, cmds("SET {w}b 2")...), "MULTI", "INCR {w}a", "EXEC", "GET {w}a",
			"WATCH {w}a {w}b", "MULTI", "INCR {w}a", "GET {w}b", "EXEC"),
		tc("cluster/watch-then-other-slot-before-multi", "SET {w}a 1", "WATCH {w}a", "GET {x}b", "SET {x}b 1", "MULTI", "INCR {w}a", "EXEC", "GET {x}b"),
		tc("cluster/multi-discard-then-other-master", "MULTI", "SET "+l.keyOn[0][0]+" 1", "DISCARD", "MULTI", "SET "+l.keyOn[1][0]+" 2", "EXEC", "MGET "+l.keyOn[0][0]+" "+l.keyOn[1][0]),
		tc("cluster/ssubscribe-spublish",
			raw(corpusCmd("SSUBSCRIBE", "{sh}a", "{sh}b"), 2),
			on(1, cmds("SPUBLISH {sh}a hello", `SPUBLISH {sh}b "\x00bin"`, "SPUBLISH {sh}c nobody", "PUBSUB SHARDNUMSUB {sh}a {sh}c")...),
			on(1, normed("PUBSUB SHARDCHANNELS", sortArray)),
			readOn(0, 2),
			raw(corpusCmd("PING"), 1),
			raw(corpusCmd("SUNSUBSCRIBE", "{sh}a"), 1),
			raw(corpusCmd("SUNSUBSCRIBE"), 1),
			"GET k", "SET k v"),
		// Sessions are spread over the masters in turn: conns 1-3 of a
		// case cover every master, whichever the case starts on.
		tc("cluster/publish-from-every-master",
			raw(corpusCmd("SUBSCRIBE", "ch"), 1),
			on(1, cmds("PUBLISH ch one", "PUBSUB NUMSUB ch", "PUBSUB CHANNELS")...),
			on(2, cmds("PUBLISH ch two", "PUBSUB NUMSUB ch", "PUBSUB CHANNELS")...),
			on(3, cmds("PUBLISH ch three", "PUBSUB NUMSUB ch", "PUBSUB NUMPAT")...),
			readOn(0, 3)),
		tc("cluster/subscribed-keys-on-every-master",
			raw(corpusCmd("SUBSCRIBE", "ch"), 1),
			raw(corpusCmd("GET", l.keyOn[0][0])+corpusCmd("GET", l.keyOn[1][0])+corpusCmd("GET", l.keyOn[2][0]), 3),
			raw(corpusCmd("UNSUBSCRIBE"), 1),
			"SET "+l.keyOn[0][0]+" a", "SET "+l.keyOn[1][0]+" b", "SET "+l.keyOn[2][0]+" c",
			"MGET "+l.keyOn[0][0]+" "+l.keyOn[1][0]+" "+l.keyOn[2][0]),
		tc("cluster/unsubscribe-unsubscribed-keys-on-every-master",
			"UNSUBSCRIBE", "PUNSUBSCRIBE",
			"SET "+l.keyOn[0][0]+" a", "SET "+l.keyOn[1][0]+" b", "SET "+l.keyOn[2][0]+" c",
			"MGET "+l.keyOn[0][0]+" "+l.keyOn[1][0]+" "+l.keyOn[2][0]),
		tc("cluster/blocking-on-each-master",
			sendOnly(0, "BLPOP "+l.keyOn[0][1]+" 0"), waitBlocked(1), on(1, cmds("RPUSH "+l.keyOn[0][1]+" a")...), readOn(0, 1),
			sendOnly(0, "BLPOP "+l.keyOn[1][1]+" 0"), waitBlocked(1), on(1, cmds("RPUSH "+l.keyOn[1][1]+" b")...), readOn(0, 1),
			sendOnly(0, "BLPOP "+l.keyOn[2][1]+" 0"), waitBlocked(1), on(1, cmds("RPUSH "+l.keyOn[2][1]+" c")...), readOn(0, 1),
			"BLPOP "+l.keyOn[0][2]+" 0.01", "SET "+l.keyOn[1][2]+" v", "GET "+l.keyOn[1][2]),
	)
	return cs
}

// clusterLive checks what only the nodes themselves can show: SCAN, KEYS
// and friends over keys in every slot range, flushes and scripts reaching
// every master, pub/sub across masters, blocking pops served by a push on
// the key's master. It reuses the corpus's cluster.
func clusterLive(t *testing.T, e *clusterEnv, l *clusterLayout, leaks *leakWatch, refAddr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	masters := make([]*redis.Client, len(l.masters))
	for i, a := range l.masters {
		masters[i] = redis.NewClient(&redis.Options{Addr: a, Protocol: 2, MaxRetries: -1})
		defer masters[i].Close()
	}
	reset := func(t *testing.T) {
		t.Helper()
		corpusReset(t, e.ProxyAddr())
		for _, m := range l.masters {
			corpusReset(t, m)
		}
	}
	dbsizes := func(t *testing.T) []int64 {
		t.Helper()
		out := make([]int64, len(masters))
		for i, m := range masters {
			n, err := m.DBSize(ctx).Result()
			if err != nil {
				t.Fatalf("DBSIZE on master %s: %v", l.masters[i], err)
			}
			out[i] = n
		}
		return out
	}

	t.Run("live/scan-keys-dbsize-randomkey", func(t *testing.T) {
		reset(t)
		c := leaks.dial(t, e.ProxyAddr())
		// 5000 keys of five types, written as one pipeline.
		types := []string{"string", "list", "hash", "set", "zset"}
		written := map[string]string{}
		var req []byte
		for i := range 5000 {
			typ := types[i%len(types)]
			k := fmt.Sprintf("scan:%s:%d", typ, i)
			written[k] = typ
			switch typ {
			case "string":
				req = append(req, corpusCmd("SET", k, "v")...)
			case "list":
				req = append(req, corpusCmd("RPUSH", k, "v")...)
			case "hash":
				req = append(req, corpusCmd("HSET", k, "f", "v")...)
			case "set":
				req = append(req, corpusCmd("SADD", k, "m")...)
			case "zset":
				req = append(req, corpusCmd("ZADD", k, "1", "m")...)
			}
		}
		c.send(req)
		for i := range 5000 {
			if r := c.readReplies(1); r != "+OK\r\n" && r != ":1\r\n" {
				t.Fatalf("write %d: %q", i, r)
			}
		}
		sizes := dbsizes(t)
		if slices.Contains(sizes, 0) || sizes[0]+sizes[1]+sizes[2] != 5000 {
			t.Fatalf("DBSIZE of each master %v: want 5000 keys spread over all of them", sizes)
		}
		if r := c.do("DBSIZE"); r != ":5000\r\n" {
			t.Errorf("DBSIZE through the proxy: %q, want :5000 (the sum of %v)", r, sizes)
		}

		want := func(match func(k, typ string) bool) map[string]bool {
			m := map[string]bool{}
			for k, typ := range written {
				if match(k, typ) {
					m[k] = true
				}
			}
			return m
		}
		all := want(func(string, string) bool { return true })
		scan := func(t *testing.T, what string, count func() int, extra []string, wantKeys map[string]bool) {
			t.Helper()
			seen := map[string]int{}
			cursor, calls := "0", 0
			for {
				args := append([]string{"SCAN", cursor, "COUNT", strconv.Itoa(count())}, extra...)
				r := c.do(args...)
				_, el, ok := corpusElems(r)
				if !ok || len(el) != 2 {
					t.Fatalf("%s: %v: reply %s", what, args, corpusQuote(r))
				}
				next, ok := bulkString(el[0])
				_, keys, ok2 := corpusElems(el[1])
				if !ok || !ok2 {
					t.Fatalf("%s: %v: reply %s", what, args, corpusQuote(r))
				}
				for _, kr := range keys {
					k, _ := bulkString(kr)
					seen[k]++
				}
				calls++
				if cursor = next; cursor == "0" {
					break
				}
				if calls > 20000 {
					t.Fatalf("%s: no end after %d calls", what, calls)
				}
			}
			var dup, extraKeys, missing []string
			for k, n := range seen {
				switch {
				case !wantKeys[k]:
					extraKeys = append(extraKeys, k)
				case n > 1:
					dup = append(dup, k)
				}
			}
			for k := range wantKeys {
				if seen[k] == 0 {
					missing = append(missing, k)
				}
			}
			if len(dup)+len(extraKeys)+len(missing) > 0 {
				t.Errorf("%s (%d calls): %d keys seen twice or more %.5q, %d not wanted %.5q, %d missing %.5q",
					what, calls, len(dup), dup, len(extraKeys), extraKeys, len(missing), missing)
			}
		}
		for _, n := range []int{1, 7, 100, 1000} {
			scan(t, fmt.Sprintf("SCAN COUNT %d", n), func() int { return n }, nil, all)
		}
		scan(t, "SCAN with a random COUNT 1..1000 per call", func() int { return 1 + rand.IntN(1000) }, nil, all)
		scan(t, "SCAN MATCH scan:*:1*", func() int { return 100 }, []string{"MATCH", "scan:*:1*"},
			want(func(k, _ string) bool { return globMatch("scan:*:1*", k) }))
		for _, typ := range types {
			scan(t, "SCAN TYPE "+typ, func() int { return 50 }, []string{"TYPE", typ},
				want(func(_, tp string) bool { return tp == typ }))
		}
		scan(t, "SCAN MATCH scan:hash:2* TYPE hash", func() int { return 300 }, []string{"MATCH", "scan:hash:2*", "TYPE", "hash"},
			want(func(k, tp string) bool { return tp == "hash" && globMatch("scan:hash:2*", k) }))
		scan(t, "SCAN MATCH scan:hash:* TYPE list", func() int { return 1000 }, []string{"TYPE", "list", "MATCH", "scan:hash:*"}, map[string]bool{})

		// KEYS merges every master's keys, each once.
		for _, pat := range []string{"*", "scan:set:*", "scan:*:4?"} {
			r := c.do("KEYS", pat)
			_, el, ok := corpusElems(r)
			if !ok {
				t.Fatalf("KEYS %s: %s", pat, corpusQuote(r))
			}
			got := map[string]int{}
			for _, kr := range el {
				k, _ := bulkString(kr)
				got[k]++
			}
			wantKeys := want(func(k, _ string) bool { return globMatch(pat, k) })
			if len(el) != len(wantKeys) || len(got) != len(wantKeys) {
				t.Errorf("KEYS %s: %d keys (%d distinct), want %d", pat, len(el), len(got), len(wantKeys))
			}
			for k := range wantKeys {
				if got[k] != 1 {
					t.Errorf("KEYS %s: %s seen %d times", pat, k, got[k])
					break
				}
			}
		}

		// RANDOMKEY gives existing keys, from every master in time.
		from := map[int]bool{}
		for range 300 {
			r := c.do("RANDOMKEY")
			k, ok := bulkString(r)
			if !ok || written[k] == "" {
				t.Fatalf("RANDOMKEY: %s, not a key written", corpusQuote(r))
			}
			slot, err := masters[0].ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			from[l.masterOf(int(slot))] = true
		}
		if len(from) != len(l.masters) {
			t.Errorf("300 RANDOMKEY calls drew keys from masters %v only, of %d", from, len(l.masters))
		}
	})

	t.Run("live/flush-reaches-every-master", func(t *testing.T) {
		reset(t)
		c := leaks.dial(t, e.ProxyAddr())
		fill := func() {
			t.Helper()
			for _, keys := range l.keyOn {
				for _, k := range keys {
					if r := c.do("SET", k, "v"); r != "+OK\r\n" {
						t.Fatalf("SET %s: %q", k, r)
					}
				}
			}
			if s := dbsizes(t); slices.Contains(s, 0) {
				t.Fatalf("DBSIZE of each master after writing keys to each: %v", s)
			}
		}
		for _, cmd := range [][]string{{"FLUSHALL"}, {"FLUSHDB"}, {"FLUSHALL", "ASYNC"}, {"FLUSHDB", "SYNC"}, {"flushall", "sync"}} {
			fill()
			if r := c.do(cmd...); r != "+OK\r\n" {
				t.Errorf("%v: %q", cmd, r)
			}
			if s := dbsizes(t); slices.ContainsFunc(s, func(n int64) bool { return n != 0 }) {
				t.Errorf("DBSIZE of each master after %v through the proxy: %v, want all 0", cmd, s)
			}
		}
		for _, cmd := range [][]string{{"FLUSHALL", "NOW"}, {"FLUSHDB", "ASYNC", "x"}} {
			want := dialRaw(t, refAddr).do(cmd...)
			if r := c.do(cmd...); r != want {
				t.Errorf("%v: proxy %q, reference %q", cmd, r, want)
			}
		}
	})

	t.Run("live/scripts-every-master", func(t *testing.T) {
		reset(t)
		c := leaks.dial(t, e.ProxyAddr())
		body := "return {KEYS[1], redis.call('INCR', KEYS[1])}"
		r := c.do("SCRIPT", "LOAD", body)
		sha, ok := bulkString(r)
		if !ok || len(sha) != 40 {
			t.Fatalf("SCRIPT LOAD: %q", r)
		}
		for i, m := range masters {
			if got, err := m.ScriptExists(ctx, sha).Result(); err != nil || !got[0] {
				t.Errorf("SCRIPT EXISTS on master %s after SCRIPT LOAD through the proxy: %v, %v; want it loaded on every master",
					l.masters[i], got, err)
			}
		}
		for i, keys := range l.keyOn {
			k := keys[0]
			want := fmt.Sprintf("*2\r\n$%d\r\n%s\r\n:1\r\n", len(k), k)
			if r := c.do("EVALSHA", sha, "1", k); r != want {
				t.Errorf("EVALSHA for %s on master %d: %q, want %q", k, i, r, want)
			}
		}
		if r := c.do("SCRIPT", "EXISTS", sha, strings.Repeat("0", 40), strings.ToUpper(sha)); r != "*3\r\n:1\r\n:0\r\n:1\r\n" {
			t.Errorf("SCRIPT EXISTS of a loaded script, an unknown one and the loaded one in capitals: %q", r)
		}

		// A script on one master only: for the client it does not exist.
		only := "return 'only on one master'"
		osha, err := masters[1].ScriptLoad(ctx, only).Result()
		if err != nil {
			t.Fatal(err)
		}
		if r := c.do("SCRIPT", "EXISTS", osha, sha); r != "*2\r\n:0\r\n:1\r\n" {
			t.Errorf("SCRIPT EXISTS of a script loaded directly on master 1 only, and of one loaded everywhere: %q, want [0, 1] (the AND over masters)", r)
		}
		if r := c.do("EVALSHA", osha, "1", l.keyOn[1][0]); r != "$18\r\nonly on one master\r\n" {
			t.Errorf("EVALSHA for a key on the master that has the script: %q", r)
		}
		if r := c.do("EVALSHA", osha, "1", l.keyOn[2][0]); !strings.HasPrefix(r, "-NOSCRIPT ") {
			t.Errorf("EVALSHA for a key on a master without the script, whose body the proxy never saw: %q, want NOSCRIPT", r)
		}

		if r := c.do("SCRIPT", "FLUSH"); r != "+OK\r\n" {
			t.Fatalf("SCRIPT FLUSH: %q", r)
		}
		for i, m := range masters {
			if got, err := m.ScriptExists(ctx, sha, osha).Result(); err != nil || got[0] || got[1] {
				t.Errorf("SCRIPT EXISTS on master %s after SCRIPT FLUSH through the proxy: %v, %v; want [false false]", l.masters[i], got, err)
			}
		}
		for i, keys := range l.keyOn {
			if r := c.do("EVALSHA", sha, "1", keys[0]); r != "-NOSCRIPT No matching script. Please use EVAL.\r\n" {
				t.Errorf("EVALSHA for a key on master %d after SCRIPT FLUSH: %q, want NOSCRIPT as from a standalone Redis", i, r)
			}
		}
	})

	t.Run("live/pubsub-across-masters", func(t *testing.T) {
		reset(t)
		sub := leaks.dial(t, e.ProxyAddr())
		pub := leaks.dial(t, e.ProxyAddr())
		if r := sub.do("SUBSCRIBE", "ch"); r != "*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n" {
			t.Fatalf("SUBSCRIBE: %q", r)
		}
		msg := func(payload string) string {
			return fmt.Sprintf("*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$%d\r\n%s\r\n", len(payload), payload)
		}
		if r := pub.do("PUBLISH", "ch", "via-proxy"); r != ":1\r\n" {
			t.Errorf("PUBLISH through the proxy to one subscriber of the proxy: %q, want :1 as from a standalone Redis", r)
		}
		if r := sub.readReplies(1); r != msg("via-proxy") {
			t.Errorf("message published through the proxy: %q", r)
		}
		for i, m := range masters {
			payload := fmt.Sprintf("direct-on-master-%d", i)
			if err := m.Publish(ctx, "ch", payload).Err(); err != nil {
				t.Fatal(err)
			}
			if r := sub.readReplies(1); r != msg(payload) {
				t.Errorf("message published directly on master %s: %q", l.masters[i], r)
			}
		}

		// A shard channel lives on its slot's master.
		ssub := leaks.dial(t, e.ProxyAddr())
		ch := l.keyOn[2][3]
		smsg := func(payload string) string {
			return fmt.Sprintf("*3\r\n$8\r\nsmessage\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(ch), ch, len(payload), payload)
		}
		if r := ssub.do("SSUBSCRIBE", ch); r != fmt.Sprintf("*3\r\n$10\r\nssubscribe\r\n$%d\r\n%s\r\n:1\r\n", len(ch), ch) {
			t.Fatalf("SSUBSCRIBE: %q", r)
		}
		if r := pub.do("SPUBLISH", ch, "via-proxy"); r != ":1\r\n" {
			t.Errorf("SPUBLISH through the proxy: %q, want :1", r)
		}
		if r := ssub.readReplies(1); r != smsg("via-proxy") {
			t.Errorf("shard message published through the proxy: %q", r)
		}
		if err := masters[2].SPublish(ctx, ch, "direct").Err(); err != nil {
			t.Fatal(err)
		}
		if r := ssub.readReplies(1); r != smsg("direct") {
			t.Errorf("shard message published directly on the channel's master: %q", r)
		}
	})

	t.Run("live/blpop-served-by-push-on-master", func(t *testing.T) {
		reset(t)
		c := leaks.dial(t, e.ProxyAddr())
		for i, keys := range l.keyOn {
			k := keys[0]
			c.send([]byte(corpusCmd("BLPOP", k, "5")))
			corpusWaitBlocked(t, []string{l.masters[i]}, 1)
			if err := masters[i].LPush(ctx, k, "pushed").Err(); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("*2\r\n$%d\r\n%s\r\n$6\r\npushed\r\n", len(k), k)
			if r := c.readReplies(1); r != want {
				t.Errorf("BLPOP %s (on master %d) after LPUSH directly on it: %q, want %q", k, i, r, want)
			}
		}
	})
}

// bulkString is the value of a bulk string reply.
func bulkString(r string) (string, bool) {
	i := strings.Index(r, "\r\n")
	if !strings.HasPrefix(r, "$") || i < 0 {
		return "", false
	}
	n, err := strconv.Atoi(r[1:i])
	if err != nil || n < 0 || len(r) != i+2+n+2 {
		return "", false
	}
	return r[i+2 : i+2+n], true
}

// globMatch matches the patterns the live checks use: * and ?.
func globMatch(pat, s string) bool {
	if pat == "" {
		return s == ""
	}
	switch pat[0] {
	case '*':
		for i := 0; i <= len(s); i++ {
			if globMatch(pat[1:], s[i:]) {
				return true
			}
		}
		return false
	case '?':
		return s != "" && globMatch(pat[1:], s[1:])
	}
	return s != "" && s[0] == pat[0] && globMatch(pat[1:], s[1:])
}
