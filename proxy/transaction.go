package proxy

import (
	"bytes"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
	"github.com/tidwall/redcon"
)

// A transaction runs on the client's own connection, where Redis queues
// its commands. In cluster mode its keys must share one slot, as Redis
// Cluster requires: until its first key it runs on the client's home
// master and is kept for a replay, then it moves to the key's node.

// txState is a client's transaction and, in cluster mode, its WATCH.
type txState struct {
	// open: own has a transaction open (MULTI answered +OK, no EXEC or
	// DISCARD since), so Redis queues what the proxy would answer itself.
	open   bool
	dirty  bool // a command was refused: EXEC must fail
	queued int  // commands Redis queued (CLIENT LIST's multi)
	// hotKeys are the hot keys its queued steps change (standalone):
	// the engine forgets what it saw of them once EXEC or DISCARD ends it.
	hotKeys []string
	deleted []string // those a queued DEL or UNLINK deletes

	// Cluster mode.
	watching bool
	slot     int    // the slot its keys must be in; -1 while unknown
	name     []byte // the name a CLIENT SETNAME queued in it sets
	hello    bool   // a HELLO queued in it: its reply says "standalone"
	// The connection that held a WATCH was given up (a blocking command
	// or a subscription on another node): EXEC fails as if a watched key
	// had changed.
	watchLost bool
	// While slot is unknown, the transaction so far (MULTI and keyless
	// commands), to start it again on another node.
	replay  []byte
	replayN int
}

// multi opens a transaction on the client's own connection (standalone).
func (s *session) multi(cmd *resp.Command) {
	mark := s.exchange(cmd)
	// A nested MULTI is refused and leaves the transaction open.
	s.tx.open = s.tx.open || string(s.out[mark:]) == "+OK\r\n"
}

// endOwnTx sends EXEC or DISCARD of a transaction on the client's own
// connection (standalone). A command the proxy refused inside it (a hot
// key) fails EXEC, as a refused command does in Redis.
func (s *session) endOwnTx(cmd *resp.Command, name string) {
	if name == "exec" && s.tx.dirty {
		mark := s.exchange(&resp.Command{Args: [][]byte{[]byte("DISCARD")}})
		s.out = redcon.AppendError(s.out[:mark], rediserr.ExecAbort)
	} else {
		s.forward(cmd)
	}
	s.flush()
	for _, k := range s.tx.hotKeys {
		s.srv.hot.Changed([]byte(k))
	}
	s.endTx()
}

// clusterMulti opens a transaction on the client's home master, or on the
// node of the keys it watches.
func (s *session) clusterMulti(cmd *resp.Command) {
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
	if !s.tx.watching {
		// Which node the transaction belongs on is known at its
		// first key; until then it runs here and is kept for a
		// replay. After WATCH it is the watched keys' node.
		s.tx.slot = -1
		s.tx.replay, s.tx.replayN = append(s.tx.replay[:0], rawOf(cmd)...), 1
	}
	s.cs.hold, s.tx.dirty = true, false
	mark := s.exchange(cmd)
	s.tx.open = string(s.out[mark:]) == "+OK\r\n"
	s.cs.hold = s.tx.open
}

// clusterOwn starts what needs the client's own connection: MULTI, WATCH,
// a blocking command. Per-connection modes that would have to follow the
// client to every node are refused.
func (s *session) clusterOwn(cmd *resp.Command, c *command) {
	switch c.cluster {
	case clusterMulti:
		s.clusterMulti(cmd)
	case onKeyNode:
		name := c.name
		t, slot, ok := s.clusterSlot(cmd, c)
		if !ok {
			return
		}
		if slot < 0 { // no keys: Redis answers the arity error
			s.queue(t, s.home(t), -1, mergeOne, cmd)
			return
		}
		if name == "watch" && s.tx.watching && slot != s.tx.slot {
			s.replyError(rediserr.CrossSlot)
			return
		}
		s.flush()
		if name != "watch" && s.tx.watching && t.Node(slot) != s.cs.ownNode {
			s.blockAside(cmd, t.Node(slot))
			return
		}
		if !s.ownOn(t.Node(slot)) {
			return
		}
		s.cs.hold = true
		if name == "watch" {
			if mark := s.ownExchange(cmd, false, false, s.ownOn); string(s.out[mark:]) == "+OK\r\n" {
				s.tx.watching, s.tx.slot = true, slot
			}
		} else {
			s.ownExchange(cmd, true, true, s.ownOn)
		}
		s.cs.hold = false
	case killAll: // it must reach the busy node at once
		s.flush()
		s.killEverywhere(cmd)
	case refusedInCluster:
		s.replyError(notInCluster(cmd.Args))
	}
}

// notInCluster refuses a command that needs per-connection state which
// would have to follow the client to every node.
func notInCluster(args [][]byte) string {
	return "ERR " + refusedName(args) + " is not supported by hotkeyproxy in cluster mode"
}

// clusterTx handles a command while the client is held on its own
// connection; false lets the ordinary path send it there.
func (s *session) clusterTx(cmd *resp.Command, c *command) bool {
	cs := &s.cs
	if !s.tx.open {
		return false // a blocking command holds it: nothing else comes
	}
	name := c.name
	t, slot, ok := s.clusterSlot(cmd, c)
	if !ok {
		s.tx.dirty = true
		return true
	}
	if slot < 0 && len(s.keyIdx) > 0 { // several slots: nothing splits here
		s.replyError(rediserr.CrossSlot)
		s.tx.dirty = true
		return true
	}
	switch {
	case name == "watch":
		// Redis's refusal; the transaction goes on (a node would answer
		// MOVED first for a key of another slot).
		s.replyError(rediserr.WatchInMulti)
		return true
	case c.route == routeStream, c.spans:
		s.replyError("ERR hotkeyproxy: " + refusedName(cmd.Args) + " inside MULTI is not supported in cluster mode")
		s.tx.dirty = true
		return true
	}
	if c.cluster == answerNoCluster {
		// Queued as a standalone Redis queues them, and failing at EXEC
		// with its words; never run on the node, whose answer would
		// name nodes.
		_, keys, _ := s.srv.up.Cluster.Current()
		if keys.Check(cmd.Args) != nil {
			s.replyError(s.clusterRefusal(cmd.Args, name))
			s.tx.dirty = true
			return true
		}
		script := "return redis.error_reply('" + rediserr.ClusterOff + "')"
		cmd = &resp.Command{Args: [][]byte{[]byte("EVAL"), []byte(script), []byte("0")}}
	}
	switch {
	case slot >= 0 && s.tx.slot < 0:
		if t.Node(slot) != cs.ownNode && !s.moveTx(t.Node(slot)) {
			return true
		}
		s.tx.slot = slot
		s.txFirstKey(cmd)
		return true
	case slot >= 0 && slot != s.tx.slot:
		s.replyError(rediserr.CrossSlot)
		s.tx.dirty = true
		return true
	case slot < 0 && s.tx.slot < 0:
		s.tx.replay = append(s.tx.replay, rawOf(cmd)...)
		s.tx.replayN++
	}
	switch {
	case c.cluster == answerNoCluster:
		s.forward(cmd) // the stand-in, as the replay log has it
	case name == "exec", name == "discard":
		switch {
		case name == "exec" && s.tx.dirty:
			mark := s.exchange(&resp.Command{Args: [][]byte{[]byte("DISCARD")}})
			s.out = redcon.AppendError(s.out[:mark], rediserr.ExecAbort)
		case name == "exec" && s.tx.watchLost:
			mark := s.exchange(&resp.Command{Args: [][]byte{[]byte("DISCARD")}})
			s.out = s.proto.AppendNullArray(s.out[:mark])
		default:
			mark := s.exchange(cmd)
			if name == "exec" && s.tx.name != nil && len(s.out) > mark && s.out[mark] == '*' {
				s.name = s.tx.name // CLIENT SETNAME queued in it ran
			}
			if name == "exec" && s.tx.hello {
				s.out = append(s.out[:mark], standaloneHello(s.out[mark:])...)
				if p, ok := helloReplyProto(s.out[mark:]); ok {
					s.switchShared(p) // the last HELLO queued switched the connection
				}
			}
		}
		s.endTx()
	case name == "hello":
		s.tx.hello = true
		return false
	case name == "client":
		if len(cmd.Args) == 3 && strings.EqualFold(string(cmd.Args[1]), "setname") && validName(cmd.Args[2]) {
			s.tx.name = append([]byte{}, cmd.Args[2]...)
		}
		return false
	default:
		return false
	}
	return true
}

// endTx lets the client's commands be routed by slot again.
func (s *session) endTx() {
	s.tx = txState{slot: -1, replay: s.tx.replay[:0]}
	s.cs.hold = false
}

// moveTx moves an open transaction that has seen no key yet to n: it is
// discarded where it ran and started again on n, its replies already given.
func (s *session) moveTx(n *upstream.Node) bool {
	mark := s.exchange(&resp.Command{Args: [][]byte{[]byte("DISCARD")}})
	s.out = s.out[:mark]
	if !s.ownOn(n) {
		s.quit = true // the transaction is lost: close, as Redis would
		return false
	}
	s.tx.queued = 0 // the replay queues them again
	s.b.Req, s.b.N = append(s.b.Req, s.tx.replay...), s.tx.replayN
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
	s.ownExchange(cmd, false, false, s.moveTx)
}
