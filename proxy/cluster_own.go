package proxy

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/resp"
)

// In cluster mode a client's own connection goes to one node, so it is
// used only while something holds the client there: a transaction, whose
// keys must then share one slot, as Redis Cluster requires; a blocking
// command; a subscription. Everything else is routed by slot, also
// between WATCH and MULTI: the watched keys live on the own connection's
// node, and a write to them from a shared connection still touches them.

// pinned reports whether requests go to the client's own connection.
func (s *session) pinned() bool {
	return s.own != nil && (s.srv.cluster == nil || s.cs.hold || s.streaming)
}

// ownOn makes own a connection to n, replacing one to another node.
func (s *session) ownOn(n *node) bool {
	if s.own != nil && s.cs.ownNode == n {
		return true
	}
	if s.own != nil {
		s.own.nc.Close()
		s.setOwn(nil)
	}
	if !s.pin(n.pool) {
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
		t, _, err := s.srv.cluster.current()
		if err != nil {
			s.replyError(errorText(err))
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
		if !s.ownOn(t.slots[slot]) {
			return
		}
		s.cs.hold = true
		if name == "watch" {
			mark := len(s.out)
			s.forward(cmd)
			s.flush()
			if string(s.out[mark:]) == "+OK\r\n" {
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
		cs.txDirty = cs.txDirty || s.inMulti
		return true
	}
	if slot < 0 && len(cs.keyIdx) > 0 { // several slots: nothing splits here
		s.replyError(msgCrossSlot)
		cs.txDirty = cs.txDirty || s.inMulti
		return true
	}
	switch {
	case slot >= 0 && cs.txSlot < 0:
		if t.slots[slot] != cs.ownNode && !s.moveTx(t.slots[slot]) {
			return true
		}
		cs.txSlot = slot
	case slot >= 0 && slot != cs.txSlot:
		s.replyError(msgCrossSlot)
		cs.txDirty = cs.txDirty || s.inMulti
		return true
	case slot < 0 && cs.txSlot < 0 && s.inMulti:
		cs.txReplay = append(cs.txReplay, rawOf(cmd)...)
		cs.txReplayN++
	}
	switch name {
	case "exec", "discard":
		if !s.inMulti {
			return false // Redis answers "without MULTI"; WATCH stays
		}
		if name == "exec" && cs.txDirty {
			s.forward(&resp.Command{Args: [][]byte{[]byte("DISCARD")}})
			mark := len(s.out)
			s.flush()
			s.out = resp.AppendError(s.out[:mark], msgExecAbort)
		} else {
			s.forward(cmd)
			s.flush()
		}
		s.endTx()
	default:
		return false
	}
	return true
}

// endTx lets the client's commands be routed by slot again.
func (s *session) endTx() {
	s.inMulti = false
	s.cs.hold, s.cs.watching, s.cs.txSlot, s.cs.txDirty = false, false, -1, false
}

// moveTx moves an open transaction that has seen no key yet to n: it is
// discarded where it ran and started again on n, its replies already given.
func (s *session) moveTx(n *node) bool {
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
	s.b.req, s.b.n = append(s.b.req, cs.txReplay...), cs.txReplayN
	s.flush()
	ok := bytes.HasPrefix(s.out[mark:], []byte("+OK\r\n"))
	s.out = s.out[:mark]
	if !ok {
		s.replyError("ERR hotkeyproxy: cannot move the transaction to the node of its key")
		s.quit = true
	}
	return ok
}

// blockOn sends a blocking command on own, following the redirections of
// a slot that moved since the map was loaded.
func (s *session) blockOn(cmd *resp.Command) {
	for try := 0; ; try++ {
		mark := len(s.out)
		s.forward(cmd)
		s.flushBlocking()
		addr, asking := parseRedirect(s.out[mark:])
		if addr == "" || s.quit {
			return
		}
		s.out = s.out[:mark]
		if try == maxHops {
			s.out = resp.AppendError(s.out, msgSlotMoving)
			return
		}
		if !asking {
			s.srv.cluster.refresh()
		}
		if !s.ownOn(s.srv.cluster.node(addr)) {
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
// channel for SSUBSCRIBE, else the home master (cluster pub/sub reaches
// every node).
func (s *session) clusterStream(cmd *resp.Command) {
	t, slot, ok := s.clusterSlot(cmd, strings.ToLower(string(cmd.Args[0])))
	if !ok {
		return
	}
	n := s.home(t)
	if slot >= 0 {
		n = t.slots[slot]
	}
	s.flush()
	if !s.ownOn(n) {
		return
	}
	s.startStream()
	s.forward(cmd)
}

// killEverywhere sends SCRIPT KILL or FUNCTION KILL to every master on
// new connections, since the shared ones wait behind the busy script. The
// reply is +OK when it killed one somewhere, else the first master's.
func (s *session) killEverywhere(cmd *resp.Command) {
	t, _, err := s.srv.cluster.current()
	if err != nil {
		s.replyError(errorText(err))
		return
	}
	req := rawOf(cmd)
	var first []byte
	for _, n := range t.masters {
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

func killOn(n *node, req []byte) []byte {
	nc, br, err := n.pool.dial(0)
	if err != nil {
		return resp.AppendError(nil, errorText(err))
	}
	defer nc.Close()
	if _, err = nc.Write(req); err == nil {
		var reply []byte
		if reply, err = resp.ReadReply(br, nil); err == nil {
			return reply
		}
	}
	return resp.AppendError(nil, errorText(err))
}

// rawOf is cmd as RESP, as it came when it came so.
func rawOf(cmd *resp.Command) []byte {
	if cmd.Raw != nil {
		return cmd.Raw
	}
	return resp.AppendCommand(nil, cmd.Args...)
}

// infoSection is the proxy's own INFO section, added when the client asks
// for all sections or for "proxy".
func (srv *Server) infoSection(args [][]byte, t *topology) string {
	want := len(args) == 0
	for _, a := range args {
		switch strings.ToLower(string(a)) {
		case "all", "everything", "default", "proxy":
			want = true
		}
	}
	if !want {
		return ""
	}
	return "\r\n# Proxy\r\nproxy_upstream_mode:cluster\r\nproxy_cluster_masters:" +
		strconv.Itoa(len(t.masters)) + "\r\nproxy_connected_clients:" + strconv.Itoa(srv.Clients()) + "\r\n"
}
