package proxy

import (
	"strconv"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/internal/keyspec"
	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
	"github.com/tidwall/redcon"
)

// clusterCmd is one client command in cluster mode: its parts and how
// their replies merge.
type clusterCmd struct {
	merge    mergeKind
	first, n int        // its parts: session.parts[first:first+n]
	order    []int      // mergeArray: the part of each key, in order
	scan     scanPos    // mergeScan
	info     string     // mergeInfo: the proxy's section
	proto    resp.Proto // mergeInfo: the client's
	known    []bool     // mergeAnd: the scripts the proxy can load anywhere
	per      int        // mergeArray: elements of each key's
}

// clusterState is what a session keeps for the cluster upstream.
type clusterState struct {
	upstream.RoundTrip
	cmds    []clusterCmd
	replies [][]byte

	ownNode *upstream.Node // the node of session.own
	// hold keeps requests on own: a transaction (MULTI) or a
	// blocking command is under way there.
	hold bool

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
func (s *session) clusterHandle(cmd *resp.Command, c *command) bool {
	if s.streaming {
		return false
	}
	if s.pinned() {
		return s.clusterTx(cmd, c)
	}
	switch c.route {
	case routeShared:
		if c.cluster == unwatch && s.tx.watching {
			s.flush()
			s.cs.hold = true
			s.forward(cmd)
			s.flush()
			s.endTx()
			return true
		}
		s.clusterForward(cmd, c)
	case routeOwn:
		s.clusterOwn(cmd, c)
	case routeStream:
		s.clusterStream(cmd, c)
	case routeLocal:
		if c.cluster != answerSelect {
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
func (s *session) clusterForward(cmd *resp.Command, c *command) {
	t, slot, ok := s.clusterSlot(cmd, c)
	if !ok {
		return
	}
	switch {
	case slot >= 0:
		s.queue(t, t.Node(slot), slot, mergeOne, cmd)
		s.learnScript(cmd, c)
	case len(s.keyIdx) > 0:
		s.clusterSplit(t, cmd, c, s.keyIdx, 1)
	default:
		s.clusterKeyless(t, cmd, c)
	}
}

// clusterSlot finds the slot of cmd's keys: -1 with keyIdx empty when it
// has none, -1 with keyIdx set when they are in several slots and c
// splits. Otherwise it answers the client and ok is false.
func (s *session) clusterSlot(cmd *resp.Command, c *command) (t *upstream.Topology, slot int, ok bool) {
	t, keys, err := s.srv.up.Cluster.Current()
	if err != nil {
		s.replyError(upstream.ErrorText(err))
		return nil, -1, false
	}
	idx := s.keyPositions(keys, cmd)
	if len(idx) == 0 {
		return t, -1, true
	}
	first := int(hashslot.Of(cmd.Args[idx[0]]))
	for _, i := range idx[1:] {
		if int(hashslot.Of(cmd.Args[i])) != first {
			if c.splits {
				return t, -1, true
			}
			s.replyError(rediserr.CrossSlot)
			return nil, -1, false
		}
	}
	if t.Node(first) == nil {
		s.srv.up.Cluster.Refresh()
		s.replyError(rediserr.SlotNotServed)
		return nil, -1, false
	}
	return t, first, true
}

// clusterSplit sends a multi-key command as one command per slot; each of
// its keys, at idx in its arguments, has per elements in the merged reply.
func (s *session) clusterSplit(t *upstream.Topology, cmd *resp.Command, c *command, idx []int, per int) {
	pairs := c.pairs
	if pairs && len(cmd.Args)%2 == 0 {
		// A node would check the slots first and answer CROSSSLOT.
		s.replyError(rediserr.WrongArity(c.name))
		return
	}
	prefix := cmd.Args[:idx[0]]
	var slots []int
	var groups [][][]byte
	group := make(map[int]int)
	order := make([]int, 0, len(idx))
	for _, i := range idx {
		slot := int(hashslot.Of(cmd.Args[i]))
		if t.Node(slot) == nil {
			s.srv.up.Cluster.Refresh()
			s.replyError(rediserr.SlotNotServed)
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
	cc := s.addCmd(c.merge)
	cc.order, cc.per = order, per
	for g, slot := range slots {
		s.cs.Queue(t.Node(slot), slot, nil, groups[g])
	}
	s.endCmd()
}

// clusterKeyless routes a command without keys: answered here, sent to
// every master and merged, or sent to the client's home master.
func (s *session) clusterKeyless(t *upstream.Topology, cmd *resp.Command, c *command) {
	args := cmd.Args
	switch {
	case c.cluster == answerPing:
		switch len(args) {
		case 1:
			s.reply([]byte("+PONG\r\n"))
		case 2:
			s.reply(redcon.AppendBulk(nil, args[1]))
		default:
			s.replyError(rediserr.WrongArity(c.name))
		}
	case c.cluster == answerEcho:
		if len(args) != 2 {
			s.replyError(rediserr.WrongArity(c.name))
			return
		}
		s.reply(redcon.AppendBulk(nil, args[1]))
	case c.cluster == answerNoCluster:
		s.replyError(s.clusterRefusal(args, c.name))
	case c.cluster == answerRole && len(args) == 1:
		// A node's answer names its replicas; one standalone master
		// without any is what clients see.
		s.reply([]byte("*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n"))
	case c.cluster == everyMaster:
		if c.flushesScripts {
			s.srv.up.Cluster.Scripts().Purge()
		}
		s.learnScript(cmd, c)
		s.broadcast(t, c.merge, cmd)
	case c.cluster == scriptExists:
		// A script the proxy can load where it is missing exists, as far
		// as EVALSHA through the proxy goes.
		cc := s.addCmd(mergeAnd)
		for _, sha := range args[2:] {
			cc.known = append(cc.known, s.srv.up.Cluster.Scripts().Knows(sha))
		}
		for _, n := range t.Masters {
			s.cs.Queue(n, -1, cmd.Raw, cmd.Args)
		}
		s.endCmd()
	case c.cluster == scanMasters && len(args) > 1:
		pos, ok := parseScanCursor(t, args[1])
		if !ok {
			s.queue(t, s.home(t), -1, mergeOne, cmd) // Redis words the error
			return
		}
		cc := s.addCmd(mergeScan)
		cc.scan = pos
		a := append([][]byte{args[0], strconv.AppendUint(nil, pos.cursor, 10)}, args[2:]...)
		s.cs.Queue(t.Masters[pos.i], -1, nil, a)
		s.endCmd()
	case c.cluster == shardNumSub && len(args) > 2:
		channels := make([]int, 0, len(args)-2)
		for i := 2; i < len(args); i++ {
			channels = append(channels, i)
		}
		s.clusterSplit(t, cmd, c, channels, 2) // a channel and its count for each
	case c.cluster == firstMaster, c.cluster == shardNumSub:
		s.queue(t, t.Masters[0], -1, mergeOne, cmd) // where SUBSCRIBE goes
	case c.cluster == infoMerge:
		cc := s.addCmd(mergeInfo)
		cc.info, cc.proto = s.srv.infoSection(args[1:], t), s.proto
		s.cs.Queue(s.home(t), -1, cmd.Raw, args)
		s.endCmd()
	default:
		s.queue(t, s.home(t), -1, mergeOne, cmd)
		s.learnScript(cmd, c)
	}
}

// learnScript remembers the bodies of scripts that pass through, so that
// an EVALSHA meeting NOSCRIPT on a node that never saw its script (a new
// master after a failover) can be answered by loading it there; for an
// EVALSHA just queued it marks the part.
func (s *session) learnScript(cmd *resp.Command, c *command) {
	switch {
	case c.script == bodyAt1 && len(cmd.Args) > 2:
		s.srv.up.Cluster.Scripts().Learn(cmd.Args[1])
	case c.script == bodyAt2 && len(cmd.Args) == 3:
		s.srv.up.Cluster.Scripts().Learn(cmd.Args[2])
	case c.script == sha1At1 && len(cmd.Args) > 2:
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
		return rediserr.UnknownSubcommand(string(args[1]), strings.ToUpper(name))
	case keyspec.ErrArity:
		if len(args) > 1 && name == "cluster" {
			name += "|" + strings.ToLower(string(args[1]))
		}
		return rediserr.WrongArity(name)
	}
	return rediserr.ClusterOff
}

// broadcast sends cmd to every master.
func (s *session) broadcast(t *upstream.Topology, kind mergeKind, cmd *resp.Command) {
	s.addCmd(kind)
	for _, n := range t.Masters {
		s.cs.Queue(n, -1, cmd.Raw, cmd.Args)
	}
	s.endCmd()
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
		s.flushFull()
	}
}

// queuePart adds a request for node n to the first round: raw as it came,
// or args when raw is nil. slot is what it is routed by, -1 for none.

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
