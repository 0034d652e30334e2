package proxy

import (
	"bytes"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
)

// In cluster mode a client's own connection goes to one node, so it is
// used only while something holds the client there: a transaction, whose
// keys must then share one slot, as Redis Cluster requires; a blocking
// command; a subscription. Everything else is routed by slot, also
// between WATCH and MULTI: the watched keys live on the own connection's
// node, and a write to them from a shared connection still touches them.

// pinned reports whether requests go to the client's own connection.
func (s *session) pinned() bool {
	return s.own != nil && (s.srv.up.Cluster == nil || s.cs.hold || s.streaming)
}

// ownOn makes own a connection to n, replacing one to another node.
func (s *session) ownOn(n *upstream.Node) bool {
	if s.own != nil && s.cs.ownNode == n {
		return true
	}
	if s.own != nil {
		s.own.nc.Close()
		s.setOwn(nil)
		if s.cs.watching {
			// The watch went with the connection: the transaction it
			// guards must fail, as if a watched key had changed.
			s.cs.watching, s.cs.watchLost = false, true
		}
	}
	if !s.pin(n.Pool) {
		return false
	}
	s.cs.ownNode = n
	return true
}

// clusterOwn starts what needs the client's own connection: MULTI, WATCH,
// a blocking command. Per-connection modes that would have to follow the
// client to every node are refused.
func (s *session) clusterOwn(cmd *resp.Command, name string) {
	switch name {
	case "multi":
		t, _, err := s.srv.up.Cluster.Current()
		if err != nil {
			s.replyError(upstream.ErrorText(err))
			return
		}
		s.flush()
		n := s.cs.ownNode
		if s.own == nil {
			n = s.home(t)
		}
		if !s.ownOn(n) {
			return
		}
		if !s.cs.watching {
			// Which node the transaction belongs on is known at its
			// first key; until then it runs here and is kept for a
			// replay. After WATCH it is the watched keys' node.
			s.cs.txSlot = -1
			s.cs.txReplay, s.cs.txReplayN = append(s.cs.txReplay[:0], rawOf(cmd)...), 1
		}
		s.cs.hold, s.cs.txDirty = true, false
		mark := len(s.out)
		s.forward(cmd)
		s.flush()
		s.inMulti = string(s.out[mark:]) == "+OK\r\n"
		s.cs.hold = s.inMulti
	case "watch", "blpop", "brpop", "brpoplpush", "blmove", "blmpop", "bzpopmin",
		"bzpopmax", "bzmpop", "xread", "xreadgroup":
		t, slot, ok := s.clusterSlot(cmd, name)
		if !ok {
			return
		}
		if slot < 0 { // no keys: Redis answers the arity error
			s.queue(t, s.home(t), -1, mergeOne, cmd)
			return
		}
		if name == "watch" && s.cs.watching && slot != s.cs.txSlot {
			s.replyError(msgCrossSlot)
			return
		}
		s.flush()
		if name != "watch" && s.cs.watching && t.Slots[slot] != s.cs.ownNode {
			s.blockAside(cmd, t.Slots[slot])
			return
		}
		if !s.ownOn(t.Slots[slot]) {
			return
		}
		s.cs.hold = true
		if name == "watch" {
			if s.ownFollow(cmd) == "+OK\r\n" {
				s.cs.watching, s.cs.txSlot = true, slot
			}
		} else {
			s.blockOn(cmd)
		}
		s.cs.hold = false
	case "script", "function": // KILL: it must reach the busy node at once
		s.flush()
		s.killEverywhere(cmd)
	default:
		s.replyError("ERR " + refusedName(cmd.Args) + " is not supported by hotkeyproxy in cluster mode")
	}
}

// clusterTx handles a command while the client is held on its own
// connection; false lets the ordinary path send it there.
func (s *session) clusterTx(cmd *resp.Command, name string) bool {
	cs := &s.cs
	if !s.inMulti {
		return false // a blocking command holds it: nothing else comes
	}
	t, slot, ok := s.clusterSlot(cmd, name)
	if !ok {
		cs.txDirty = true
		return true
	}
	if slot < 0 && len(cs.keyIdx) > 0 { // several slots: nothing splits here
		s.replyError(msgCrossSlot)
		cs.txDirty = true
		return true
	}
	switch {
	case name == "watch":
		// Redis's refusal; the transaction goes on (a node would answer
		// MOVED first for a key of another slot).
		s.replyError("ERR WATCH inside MULTI is not allowed")
		return true
	case routes[name] == routeStream, spansCluster(name, cmd.Args):
		s.replyError("ERR hotkeyproxy: " + refusedName(cmd.Args) + " inside MULTI is not supported in cluster mode")
		cs.txDirty = true
		return true
	}
	switch name {
	case "cluster", "readonly", "readwrite", "asking":
		// Queued as a standalone Redis queues them, and failing at EXEC
		// with its words; never run on the node, whose answer would
		// name nodes.
		_, keys, _ := s.srv.up.Cluster.Current()
		if keys.Check(cmd.Args) != nil {
			s.replyError(s.clusterRefusal(cmd.Args, name))
			cs.txDirty = true
			return true
		}
		script := "return redis.error_reply('" + msgClusterOff + "')"
		cmd = &resp.Command{Args: [][]byte{[]byte("EVAL"), []byte(script), []byte("0")}}
	}
	switch {
	case slot >= 0 && cs.txSlot < 0:
		if t.Slots[slot] != cs.ownNode && !s.moveTx(t.Slots[slot]) {
			return true
		}
		cs.txSlot = slot
		s.txFirstKey(cmd)
		return true
	case slot >= 0 && slot != cs.txSlot:
		s.replyError(msgCrossSlot)
		cs.txDirty = true
		return true
	case slot < 0 && cs.txSlot < 0:
		cs.txReplay = append(cs.txReplay, rawOf(cmd)...)
		cs.txReplayN++
	}
	switch name {
	case "exec", "discard":
		s.flush()
		mark := len(s.out)
		switch {
		case name == "exec" && cs.txDirty:
			s.forward(&resp.Command{Args: [][]byte{[]byte("DISCARD")}})
			s.flush()
			s.out = resp.AppendError(s.out[:mark], msgExecAbort)
		case name == "exec" && cs.watchLost:
			s.forward(&resp.Command{Args: [][]byte{[]byte("DISCARD")}})
			s.flush()
			s.out = append(s.out[:mark], "*-1\r\n"...)
		default:
			s.forward(cmd)
			s.flush()
			if name == "exec" && cs.txName != nil && len(s.out) > mark && s.out[mark] == '*' {
				s.name = cs.txName // CLIENT SETNAME queued in it ran
			}
			if name == "exec" && cs.txHello {
				s.out = append(s.out[:mark], standaloneHello(s.out[mark:])...)
			}
		}
		s.endTx()
	case "cluster", "readonly", "readwrite", "asking":
		s.forward(cmd) // the stand-in, as the replay log has it
	case "hello":
		cs.txHello = true
		return false
	case "client":
		if len(cmd.Args) == 3 && strings.EqualFold(string(cmd.Args[1]), "setname") && validName(cmd.Args[2]) {
			cs.txName = append([]byte{}, cmd.Args[2]...)
		}
		return false
	default:
		return false
	}
	return true
}

// endTx lets the client's commands be routed by slot again.
func (s *session) endTx() {
	s.inMulti = false
	s.cs.hold, s.cs.watching, s.cs.watchLost, s.cs.txSlot = false, false, false, -1
	s.cs.txDirty, s.cs.txName, s.cs.txHello = false, nil, false
}

// moveTx moves an open transaction that has seen no key yet to n: it is
// discarded where it ran and started again on n, its replies already given.
func (s *session) moveTx(n *upstream.Node) bool {
	cs := &s.cs
	s.flush()
	s.forward(&resp.Command{Args: [][]byte{[]byte("DISCARD")}})
	mark := len(s.out)
	s.flush()
	s.out = s.out[:mark]
	if !s.ownOn(n) {
		s.quit = true // the transaction is lost: close, as Redis would
		return false
	}
	s.b.Req, s.b.N = append(s.b.Req, cs.txReplay...), cs.txReplayN
	s.flush()
	ok := bytes.HasPrefix(s.out[mark:], []byte("+OK\r\n"))
	s.out = s.out[:mark]
	if !ok {
		s.replyError("ERR hotkeyproxy: cannot move the transaction to the node of its key")
		s.quit = true
	}
	return ok
}

// txFirstKey sends the first keyed command of a transaction and checks
// the node took it: with a stale slot map it answers MOVED, and the
// transaction moves to the node named, its replies already given.
func (s *session) txFirstKey(cmd *resp.Command) {
	for try := 0; ; try++ {
		s.flush()
		mark := len(s.out)
		s.forward(cmd)
		s.flush()
		addr, asking := upstream.ParseRedirect(s.out[mark:])
		if addr == "" || asking || try == upstream.MaxHops || s.quit {
			return
		}
		s.out = s.out[:mark]
		s.srv.up.Cluster.Refresh()
		if !s.moveTx(s.srv.up.Cluster.Node(addr)) {
			return
		}
	}
}

// ownFollow sends cmd on own and returns its reply, following MOVED to
// the node named when the slot map is stale (WATCH).
func (s *session) ownFollow(cmd *resp.Command) string {
	for try := 0; ; try++ {
		mark := len(s.out)
		s.forward(cmd)
		s.flush()
		addr, asking := upstream.ParseRedirect(s.out[mark:])
		if addr == "" || asking || try == upstream.MaxHops || s.quit {
			return string(s.out[mark:])
		}
		s.out = s.out[:mark]
		s.srv.up.Cluster.Refresh()
		if !s.ownOn(s.srv.up.Cluster.Node(addr)) {
			return ""
		}
	}
}

// blockAside runs a blocking command on another node than the one whose
// connection holds the client's WATCH, on a connection of its own for the
// time, so that the watch stays.
func (s *session) blockAside(cmd *resp.Command, n *upstream.Node) {
	watch, watchNode := s.own, s.cs.ownNode
	s.setOwn(nil)
	if s.ownOn(n) {
		s.cs.hold = true
		s.blockOn(cmd)
		s.cs.hold = false
		s.own.nc.Close()
	}
	s.setOwn(watch)
	s.cs.ownNode = watchNode
}

// blockOn sends a blocking command on own, following the redirections of
// a slot that moved since the map was loaded.
func (s *session) blockOn(cmd *resp.Command) {
	for try := 0; ; try++ {
		mark := len(s.out)
		s.forward(cmd)
		s.flushBlocking()
		addr, asking := upstream.ParseRedirect(s.out[mark:])
		if addr == "" || s.quit {
			return
		}
		s.out = s.out[:mark]
		if try == upstream.MaxHops {
			s.out = resp.AppendError(s.out, upstream.MsgSlotMoving)
			return
		}
		if !asking {
			s.srv.up.Cluster.Refresh()
		}
		if !s.ownOn(s.srv.up.Cluster.Node(addr)) {
			return
		}
		if asking {
			s.forward(&resp.Command{Args: [][]byte{[]byte("ASKING")}})
			s.flush()
			s.out = s.out[:mark]
		}
	}
}

// clusterStream starts pub/sub or MONITOR on a node: the node of the shard
// channel for SSUBSCRIBE, else the first master, which also gets every
// PUBLISH and PUBSUB, so that their counts of subscribers are right
// (cluster pub/sub delivers messages on every node, counts per node).
// UNSUBSCRIBE and the like without a subscription are answered here, as
// Redis does, so they cost no connection.
func (s *session) clusterStream(cmd *resp.Command, name string) {
	if strings.HasSuffix(name, "unsubscribe") {
		s.reply(unsubscribeReplies(cmd.Args, name))
		return
	}
	t, slot, ok := s.clusterSlot(cmd, name)
	if !ok {
		return
	}
	n := t.Masters[0]
	if slot >= 0 {
		n = t.Slots[slot]
	}
	s.flush()
	if !s.ownOn(n) {
		return
	}
	if name == "ssubscribe" {
		// The first reply says whether the map was right: a stale one
		// gets MOVED, followed here before the stream starts.
		s.cs.hold = true
		reply := s.ownFollow(cmd)
		s.cs.hold = false
		if !strings.HasPrefix(reply, "*3\r\n") {
			return
		}
		s.startStream()
		s.cs.subs = map[string]struct{}{}
		for _, ch := range cmd.Args[1:] {
			s.cs.subs["s"+string(ch)] = struct{}{}
		}
		return
	}
	s.startStream()
	s.clusterStreaming(cmd, name)
}

// unsubscribeReplies is Redis's reply to an unsubscribe command from a
// client with no subscriptions: one per channel named, or one with a nil
// channel.
func unsubscribeReplies(args [][]byte, name string) []byte {
	one := func(b []byte, ch []byte) []byte {
		b = resp.AppendArrayHeader(b, 3)
		b = resp.AppendBulk(b, []byte(name))
		if ch == nil {
			b = resp.AppendNil(b)
		} else {
			b = resp.AppendBulk(b, ch)
		}
		return append(b, ":0\r\n"...)
	}
	if len(args) == 1 {
		return one(nil, nil)
	}
	var b []byte
	for _, ch := range args[1:] {
		b = one(b, ch)
	}
	return b
}

// msgSubscribed is Redis 7.0's refusal of a command while subscribed.
const msgSubscribed = "': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"

// clusterStreaming sends a command of a streaming client to its node. The
// proxy keeps count of the subscriptions, as Redis does (sets of channels,
// patterns, shard channels), so that it knows when the last one is gone:
// the client then leaves the stream and its commands are routed by slot
// again. While subscribed, a command with keys is refused here, in order
// with the stream: its node would answer MOVED first.
func (s *session) clusterStreaming(cmd *resp.Command, name string) {
	cs := &s.cs
	switch name {
	case "subscribe", "psubscribe", "ssubscribe", "unsubscribe", "punsubscribe", "sunsubscribe":
		unsub := strings.HasSuffix(name, "unsubscribe")
		kind := "c" // subscribe, unsubscribe
		if name[0] == 'p' || name[0] == 's' && name != "subscribe" {
			kind = name[:1]
		}
		if kind == "s" && !s.shardChannelsHere(cmd.Args[1:]) {
			s.streamReplyError(msgCrossSlot)
			return
		}
		if cs.subs == nil {
			cs.subs = make(map[string]struct{})
		}
		switch {
		case unsub && len(cmd.Args) == 1:
			for ch := range cs.subs {
				if strings.HasPrefix(ch, kind) {
					delete(cs.subs, ch)
				}
			}
		case unsub:
			for _, ch := range cmd.Args[1:] {
				delete(cs.subs, kind+string(ch))
			}
		default:
			for _, ch := range cmd.Args[1:] {
				cs.subs[kind+string(ch)] = struct{}{}
			}
		}
		s.forward(cmd)
		if len(cs.subs) == 0 && !cs.monitor {
			s.tryEndStream()
		}
		return
	case "monitor":
		cs.monitor = true
	}
	if _, keys, err := s.srv.up.Cluster.Current(); err == nil && len(cs.subs) > 0 {
		if cs.keyIdx, _ = keys.Keys(cmd.Args, cs.keyIdx[:0]); len(cs.keyIdx) > 0 {
			s.streamReplyError("ERR Can't execute '" + name + msgSubscribed)
			return
		}
	}
	s.forward(cmd)
}

// shardChannelsHere reports whether shard channels are served by the node
// the client streams from: one connection cannot follow channels on
// several masters. A channel in the slot of one already followed is here,
// whatever a slot map not yet reloaded says.
func (s *session) shardChannelsHere(channels [][]byte) bool {
	t, _, err := s.srv.up.Cluster.Current()
	if err != nil {
		return true // the node will say
	}
	for _, ch := range channels {
		slot := hashslot.Of(ch)
		if t.Slots[slot] != s.cs.ownNode && !s.followsSlot(slot) {
			return false
		}
	}
	return true
}

// followsSlot reports whether the client follows a shard channel in slot.
func (s *session) followsSlot(slot uint16) bool {
	for ch := range s.cs.subs {
		if ch[0] == 's' && hashslot.Of([]byte(ch[1:])) == slot {
			return true
		}
	}
	return false
}

// streamReplyError answers a streaming client with an error of the
// proxy's, after every reply to what it sent before.
func (s *session) streamReplyError(msg string) {
	nonce := []byte("hotkeyproxy-stream-sync")
	frame := resp.AppendBulk(resp.AppendBulk(resp.AppendArrayHeader(nil, 2), []byte("pong")), nonce)
	if !s.streamSync(&resp.Command{Args: [][]byte{[]byte("PING"), nonce}}, &streamMark{frame: frame}) {
		s.quit = true
		return
	}
	s.replyError(msg)
	s.write()
}

// tryEndStream ends the stream once the proxy counts no subscription
// left: an ECHO comes back when Redis agrees; while Redis still counts
// one, it refuses the ECHO and the stream goes on.
func (s *session) tryEndStream() {
	nonce := []byte("hotkeyproxy-stream-end")
	m := &streamMark{
		frame: resp.AppendBulk(nil, nonce),
		stop:  true,
		alt:   resp.AppendError(nil, "ERR Can't execute 'echo"+msgSubscribed),
	}
	if !s.streamSync(&resp.Command{Args: [][]byte{[]byte("ECHO"), nonce}}, m) {
		s.quit = true
		return
	}
	if !m.altHit {
		s.endStream()
	}
}

// killEverywhere sends SCRIPT KILL or FUNCTION KILL to every master on
// new connections, since the shared ones wait behind the busy script. The
// reply is +OK when it killed one somewhere, else the first master's.
func (s *session) killEverywhere(cmd *resp.Command) {
	t, _, err := s.srv.up.Cluster.Current()
	if err != nil {
		s.replyError(upstream.ErrorText(err))
		return
	}
	req := rawOf(cmd)
	var first []byte
	for _, n := range t.Masters {
		reply := killOn(n, req)
		if string(reply) == "+OK\r\n" {
			s.reply(reply)
			return
		}
		if first == nil {
			first = reply
		}
	}
	s.reply(first)
}

func killOn(n *upstream.Node, req []byte) []byte {
	nc, br, err := n.Pool.Dial(0)
	if err != nil {
		return resp.AppendError(nil, upstream.ErrorText(err))
	}
	defer nc.Close()
	if _, err = nc.Write(req); err == nil {
		var reply []byte
		if reply, err = resp.ReadReply(br, nil); err == nil {
			return reply
		}
	}
	return resp.AppendError(nil, upstream.ErrorText(err))
}

// rawOf is cmd as RESP, as it came when it came so.
func rawOf(cmd *resp.Command) []byte {
	if cmd.Raw != nil {
		return cmd.Raw
	}
	return resp.AppendCommand(nil, cmd.Args...)
}
