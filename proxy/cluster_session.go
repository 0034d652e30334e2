package proxy

import (
	"strconv"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/internal/keyspec"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
)

// clusterCmd is one client command in cluster mode: its parts and how
// their replies merge.
type clusterCmd struct {
	merge    mergeKind
	first, n int     // its parts: session.parts[first:first+n]
	order    []int   // mergeArray: the part of each key, in order
	scan     scanPos // mergeScan
	info     string  // mergeInfo: the proxy's section
	known    []bool  // mergeAnd: the scripts the proxy can load anywhere
	per      int     // mergeArray: elements of each key's
}

// clusterState is what a session keeps for the cluster upstream.
type clusterState struct {
	upstream.RoundTrip
	cmds    []clusterCmd
	keyIdx  []int
	replies [][]byte

	ownNode *upstream.Node // the node of session.own
	// hold keeps requests on own: a transaction (MULTI) or a
	// blocking command is under way there.
	hold     bool
	watching bool
	txSlot   int    // the slot a transaction's keys must be in; -1 while unknown
	txDirty  bool   // a command was refused: EXEC must fail
	txName   []byte // the name a CLIENT SETNAME queued in it sets
	txHello  bool   // a HELLO queued in it: its reply says "standalone"
	// The connection that held a WATCH was given up (a blocking command
	// or a subscription on another node): EXEC fails as if a watched key
	// had changed.
	watchLost bool
	// While txSlot is unknown, the transaction so far (MULTI and keyless
	// commands), to start it again on another node.
	txReplay  []byte
	txReplayN int

	// What a streaming client is subscribed to ("c" channels, "p"
	// patterns, "s" shard channels, then the name), and MONITOR.
	subs    map[string]struct{}
	monitor bool
}

// home is the master a keyless command goes to; clients are spread over
// the masters.
func (s *session) home(t *upstream.Topology) *upstream.Node {
	return t.Masters[s.id%uint64(len(t.Masters))]
}

// clusterHandle handles a command in cluster mode; false means the
// ordinary path (the client's own connection) takes it.
func (s *session) clusterHandle(cmd *resp.Command, r route, name string) bool {
	if s.streaming {
		return false
	}
	if s.pinned() {
		return s.clusterTx(cmd, name)
	}
	switch r {
	case routeShared:
		if name == "unwatch" && s.cs.watching {
			s.flush()
			s.cs.hold = true
			s.forward(cmd)
			s.flush()
			s.endTx()
			return true
		}
		s.clusterForward(cmd, name)
	case routeOwn:
		s.clusterOwn(cmd, name)
	case routeStream:
		s.clusterStream(cmd, name)
	case routeLocal:
		if name != "select" {
			return false
		}
		s.clusterSelect(cmd.Args)
	case routeRefuse:
		return false
	}
	return true
}

// clusterForward queues cmd on the nodes that serve its keys, or answers
// it when the proxy can.
func (s *session) clusterForward(cmd *resp.Command, name string) {
	t, slot, ok := s.clusterSlot(cmd, name)
	if !ok {
		return
	}
	switch {
	case slot >= 0:
		s.queue(t, t.Slots[slot], slot, mergeOne, cmd)
		s.learnScript(cmd, name)
	case len(s.cs.keyIdx) > 0:
		s.clusterSplit(t, cmd, name)
	default:
		s.clusterKeyless(t, cmd, name)
	}
}

// clusterSlot finds the slot of cmd's keys: -1 with keyIdx empty when it
// has none, -1 with keyIdx set when they are in several slots and name can
// be split. Otherwise it answers the client and ok is false.
func (s *session) clusterSlot(cmd *resp.Command, name string) (t *upstream.Topology, slot int, ok bool) {
	t, keys, err := s.srv.up.Cluster.Current()
	if err != nil {
		s.replyError(upstream.ErrorText(err))
		return nil, -1, false
	}
	cs := &s.cs
	cs.keyIdx, _ = keys.Keys(cmd.Args, cs.keyIdx[:0])
	if len(cs.keyIdx) == 0 {
		return t, -1, true
	}
	first := int(hashslot.Of(cmd.Args[cs.keyIdx[0]]))
	for _, i := range cs.keyIdx[1:] {
		if int(hashslot.Of(cmd.Args[i])) != first {
			if splits[name] {
				return t, -1, true
			}
			s.replyError(msgCrossSlot)
			return nil, -1, false
		}
	}
	if t.Slots[first] == nil {
		s.srv.up.Cluster.Refresh()
		s.replyError(msgSlotNotServed)
		return nil, -1, false
	}
	return t, first, true
}

// splits are the multi-key commands a standalone Redis answers for keys in
// any slots: sent per slot and merged. Others get CROSSSLOT, as from Redis
// Cluster, since splitting them would lose their atomicity.
var splits = map[string]bool{
	"mget": true, "mset": true, "del": true, "unlink": true, "exists": true, "touch": true,
}

// clusterSplit sends a multi-key command as one command per slot.
func (s *session) clusterSplit(t *upstream.Topology, cmd *resp.Command, name string) {
	kind, pairs, per := mergeSum, false, 1
	switch name {
	case "mget":
		kind = mergeArray
	case "pubsub": // SHARDNUMSUB: a channel and its count for each channel
		kind, per = mergeArray, 2
	case "mset":
		kind, pairs = mergeAll, true
	}
	if pairs && len(cmd.Args)%2 == 0 {
		// A node would check the slots first and answer CROSSSLOT.
		s.replyError(wrongArity(name))
		return
	}
	prefix := cmd.Args[:s.cs.keyIdx[0]]
	var slots []int
	var groups [][][]byte
	group := make(map[int]int)
	order := make([]int, 0, len(s.cs.keyIdx))
	for _, i := range s.cs.keyIdx {
		slot := int(hashslot.Of(cmd.Args[i]))
		if t.Slots[slot] == nil {
			s.srv.up.Cluster.Refresh()
			s.replyError(msgSlotNotServed)
			return
		}
		g, ok := group[slot]
		if !ok {
			g = len(slots)
			group[slot] = g
			slots = append(slots, slot)
			groups = append(groups, append([][]byte(nil), prefix...))
		}
		groups[g] = append(groups[g], cmd.Args[i])
		if pairs {
			groups[g] = append(groups[g], cmd.Args[i+1])
		}
		order = append(order, g)
	}
	c := s.addCmd(kind)
	c.order, c.per = order, per
	for g, slot := range slots {
		s.cs.Queue(t.Slots[slot], slot, nil, groups[g])
	}
	s.endCmd()
}

// spansCluster reports the keyless commands that act on every master, so
// they cannot run inside a transaction, which is on one.
func spansCluster(name string, args [][]byte) bool {
	sub := ""
	if len(args) > 1 {
		sub = strings.ToLower(string(args[1]))
	}
	switch name {
	case "dbsize", "keys", "randomkey", "flushall", "flushdb", "scan":
		return true
	case "script":
		return sub == "load" || sub == "flush" || sub == "exists"
	case "function":
		return sub == "load" || sub == "delete" || sub == "flush" || sub == "restore"
	}
	return false
}

// clusterKeyless routes a command without keys: answered here, sent to
// every master and merged, or sent to the client's home master.
func (s *session) clusterKeyless(t *upstream.Topology, cmd *resp.Command, name string) {
	args := cmd.Args
	sub := ""
	if len(args) > 1 {
		sub = strings.ToLower(string(args[1]))
	}
	switch {
	case name == "ping":
		switch len(args) {
		case 1:
			s.reply([]byte("+PONG\r\n"))
		case 2:
			s.reply(resp.AppendBulk(nil, args[1]))
		default:
			s.replyError(wrongArity(name))
		}
	case name == "echo":
		if len(args) != 2 {
			s.replyError(wrongArity(name))
			return
		}
		s.reply(resp.AppendBulk(nil, args[1]))
	case name == "cluster", name == "readonly", name == "readwrite", name == "asking":
		s.replyError(s.clusterRefusal(args, name))
	case name == "role" && len(args) == 1:
		// A node's answer names its replicas; one standalone master
		// without any is what clients see.
		s.reply([]byte("*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n"))
	case name == "dbsize":
		s.broadcast(t, mergeSum, cmd)
	case name == "keys":
		s.broadcast(t, mergeConcat, cmd)
	case name == "randomkey":
		s.broadcast(t, mergeRandom, cmd)
	case name == "script" && sub == "load":
		s.learnScript(cmd, name)
		s.broadcast(t, mergeAll, cmd)
	case name == "script" && sub == "flush":
		s.srv.up.Cluster.Scripts().Purge()
		s.broadcast(t, mergeAll, cmd)
	case name == "flushall", name == "flushdb",
		name == "function" && (sub == "load" || sub == "delete" || sub == "flush" || sub == "restore"):
		s.broadcast(t, mergeAll, cmd)
	case name == "script" && sub == "exists":
		// A script the proxy can load where it is missing exists, as far
		// as EVALSHA through the proxy goes.
		c := s.addCmd(mergeAnd)
		for _, sha := range args[2:] {
			c.known = append(c.known, s.srv.up.Cluster.Scripts().Knows(sha))
		}
		for _, n := range t.Masters {
			s.cs.Queue(n, -1, cmd.Raw, cmd.Args)
		}
		s.endCmd()
	case name == "scan" && len(args) > 1:
		pos, ok := parseScanCursor(t, args[1])
		if !ok {
			s.queue(t, s.home(t), -1, mergeOne, cmd) // Redis words the error
			return
		}
		c := s.addCmd(mergeScan)
		c.scan = pos
		a := append([][]byte{args[0], strconv.AppendUint(nil, pos.cursor, 10)}, args[2:]...)
		s.cs.Queue(t.Masters[pos.i], -1, nil, a)
		s.endCmd()
	case name == "pubsub" && sub == "shardchannels":
		s.broadcast(t, mergeConcat, cmd)
	case name == "pubsub" && sub == "shardnumsub" && len(args) > 2:
		s.cs.keyIdx = s.cs.keyIdx[:0]
		for i := 2; i < len(args); i++ {
			s.cs.keyIdx = append(s.cs.keyIdx, i)
		}
		s.clusterSplit(t, cmd, name)
	case name == "publish", name == "pubsub":
		s.queue(t, t.Masters[0], -1, mergeOne, cmd) // where SUBSCRIBE goes
	case name == "info":
		c := s.addCmd(mergeInfo)
		c.info = s.srv.infoSection(args[1:], t)
		s.cs.Queue(s.home(t), -1, cmd.Raw, args)
		s.endCmd()
	default:
		s.queue(t, s.home(t), -1, mergeOne, cmd)
		s.learnScript(cmd, name)
	}
}

// learnScript remembers the bodies of scripts that pass through, so that
// an EVALSHA meeting NOSCRIPT on a node that never saw its script (a new
// master after a failover) can be answered by loading it there; for an
// EVALSHA just queued it marks the part.
func (s *session) learnScript(cmd *resp.Command, name string) {
	switch {
	case (name == "eval" || name == "eval_ro") && len(cmd.Args) > 2:
		s.srv.up.Cluster.Scripts().Learn(cmd.Args[1])
	case name == "script" && len(cmd.Args) == 3:
		s.srv.up.Cluster.Scripts().Learn(cmd.Args[2])
	case (name == "evalsha" || name == "evalsha_ro") && len(cmd.Args) > 2:
		s.cs.MarkScript(cmd.Args[1])
	}
}

// clusterRefusal is what a standalone Redis 7.0 answers the cluster
// commands a cluster-aware client probes with, so that it uses the proxy
// as one server and never sees a node's address.
func (s *session) clusterRefusal(args [][]byte, name string) string {
	_, keys, _ := s.srv.up.Cluster.Current()
	switch keys.Check(args) {
	case keyspec.ErrUnknownSubcommand:
		return "ERR unknown subcommand '" + string(args[1]) + "'. Try " + strings.ToUpper(name) + " HELP."
	case keyspec.ErrArity:
		if len(args) > 1 && name == "cluster" {
			name += "|" + strings.ToLower(string(args[1]))
		}
		return wrongArity(name)
	}
	return msgClusterOff
}

// broadcast sends cmd to every master.
func (s *session) broadcast(t *upstream.Topology, kind mergeKind, cmd *resp.Command) {
	s.addCmd(kind)
	for _, n := range t.Masters {
		s.cs.Queue(n, -1, cmd.Raw, cmd.Args)
	}
	s.endCmd()
}

// clusterSelect answers SELECT as Redis Cluster does: only db 0 exists.
func (s *session) clusterSelect(args [][]byte) {
	if len(args) != 2 {
		s.replyError(wrongArity("select"))
		return
	}
	n, ok := resp.ParseInt(args[1])
	switch {
	case !ok:
		s.replyError(msgNotInteger)
	case n < -1<<31 || n > 1<<31-1:
		s.replyError(msgIntRange)
	case n != 0:
		s.replyError(msgSelectCluster)
	default:
		s.reply([]byte("+OK\r\n"))
	}
}

// queue adds a command of one part.
func (s *session) queue(t *upstream.Topology, n *upstream.Node, slot int, kind mergeKind, cmd *resp.Command) {
	s.addCmd(kind)
	s.cs.Queue(n, slot, cmd.Raw, cmd.Args)
	s.endCmd()
}

func (s *session) addCmd(kind mergeKind) *clusterCmd {
	cs := &s.cs
	cs.cmds = append(cs.cmds, clusterCmd{merge: kind, first: cs.Len()})
	return &cs.cmds[len(cs.cmds)-1]
}

// endCmd closes the command addCmd opened and sends the pipeline when it
// has grown big.
func (s *session) endCmd() {
	cs := &s.cs
	c := &cs.cmds[len(cs.cmds)-1]
	c.n = cs.Len() - c.first
	if cs.Len() >= maxBatchCommands || cs.Size() >= maxBatchBytes {
		s.flush()
		if len(s.out) >= maxPendingOut && !s.write() {
			s.quit = true
		}
	}
}

// clusterRoundTrip sends the queued commands, follows redirections, and
// appends the merged replies to out in the client's order.
func (s *session) clusterRoundTrip() {
	cs := &s.cs
	cs.Run()
	for i := range cs.cmds {
		c := &cs.cmds[i]
		cs.replies = cs.replies[:0]
		for j := c.first; j < c.first+c.n; j++ {
			cs.replies = append(cs.replies, cs.Reply(j))
		}
		s.out = c.mergeReplies(s.out, cs.replies)
	}
	clear(cs.cmds)
	clear(cs.replies)
	cs.cmds = cs.cmds[:0]
	cs.Reset()
}
