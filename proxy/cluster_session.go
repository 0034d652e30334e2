package proxy

import (
	"bytes"
	"strconv"
	"strings"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/internal/keyspec"
	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// How hard a command is retried when the cluster redirects it (MOVED,
// ASK: a few hops) or asks to wait (TRYAGAIN, CLUSTERDOWN: a few waits
// with backoff, about 600 ms in all), then the client gets the error.
const (
	// An ASK often leads to a TRYAGAIN (a multi-key command while its
	// keys are split between the two nodes) and the wait back to the
	// source, so hops must outlast waits.
	maxHops        = 16
	maxWaits       = 5
	retryBaseDelay = 20 * time.Millisecond
)

// clusterPart is one request of a client's command sent to one node: a
// command has one part, or one per slot when split, or one per master
// when broadcast.
type clusterPart struct {
	nb         *nodeBatch // where it was last sent
	start, end int        // the request, in nb.req
	idx        int        // its reply's index in nb
	slot       int        // the slot it is routed by; -1 for keyless
	hops       int        // MOVED and ASK followed
	waits      int        // TRYAGAIN and CLUSTERDOWN waited out
	loaded     bool       // its script was loaded after a NOSCRIPT
	script     []byte     // EVALSHA's SHA1, to load the script on NOSCRIPT
	reply      []byte     // nil until answered
}

// nodeBatch is a round's requests to one node.
type nodeBatch struct {
	node *node
	batch
}

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

// roundTripper sends requests to the nodes of a cluster, each to its own,
// in rounds: all nodes at once, then again for what the cluster
// redirected, until every request has its final reply.
type roundTripper struct {
	c        *clusterUpstream
	id       uint64 // spreads users over a node's shared connections
	parts    []clusterPart
	batches  []*nodeBatch // the first round's, reused from run to run
	used     int          // batches[:used] are in use
	reqBytes int
}

// clusterState is what a session keeps for the cluster upstream.
type clusterState struct {
	roundTripper
	cmds    []clusterCmd
	keyIdx  []int
	replies [][]byte

	ownNode *node // the node of session.own
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
func (s *session) home(t *topology) *node {
	return t.masters[s.id%uint64(len(t.masters))]
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
		s.queue(t, t.slots[slot], slot, mergeOne, cmd)
		s.learnScript(cmd, c)
	case len(s.cs.keyIdx) > 0:
		s.clusterSplit(t, cmd, c, 1)
	default:
		s.clusterKeyless(t, cmd, c)
	}
}

// clusterSlot finds the slot of cmd's keys: -1 with keyIdx empty when it
// has none, -1 with keyIdx set when they are in several slots and c
// splits. Otherwise it answers the client and ok is false.
func (s *session) clusterSlot(cmd *resp.Command, c *command) (t *topology, slot int, ok bool) {
	t, keys, err := s.srv.cluster.current()
	if err != nil {
		s.replyError(errorText(err))
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
			if c.splits {
				return t, -1, true
			}
			s.replyError(rediserr.CrossSlot)
			return nil, -1, false
		}
	}
	if t.slots[first] == nil {
		s.srv.cluster.refresh()
		s.replyError(rediserr.SlotNotServed)
		return nil, -1, false
	}
	return t, first, true
}

// clusterSplit sends a multi-key command as one command per slot; each of
// its keys has per elements in the merged reply.
func (s *session) clusterSplit(t *topology, cmd *resp.Command, c *command, per int) {
	pairs := c.pairs
	if pairs && len(cmd.Args)%2 == 0 {
		// A node would check the slots first and answer CROSSSLOT.
		s.replyError(rediserr.WrongArity(c.name))
		return
	}
	prefix := cmd.Args[:s.cs.keyIdx[0]]
	var slots []int
	var groups [][][]byte
	group := make(map[int]int)
	order := make([]int, 0, len(s.cs.keyIdx))
	for _, i := range s.cs.keyIdx {
		slot := int(hashslot.Of(cmd.Args[i]))
		if t.slots[slot] == nil {
			s.srv.cluster.refresh()
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
		s.cs.queuePart(t.slots[slot], slot, nil, groups[g])
	}
	s.endCmd()
}

// clusterKeyless routes a command without keys: answered here, sent to
// every master and merged, or sent to the client's home master.
func (s *session) clusterKeyless(t *topology, cmd *resp.Command, c *command) {
	args := cmd.Args
	switch {
	case c.cluster == answerPing:
		switch len(args) {
		case 1:
			s.reply([]byte("+PONG\r\n"))
		case 2:
			s.reply(resp.AppendBulk(nil, args[1]))
		default:
			s.replyError(rediserr.WrongArity(c.name))
		}
	case c.cluster == answerEcho:
		if len(args) != 2 {
			s.replyError(rediserr.WrongArity(c.name))
			return
		}
		s.reply(resp.AppendBulk(nil, args[1]))
	case c.cluster == answerNoCluster:
		s.replyError(s.clusterRefusal(args, c.name))
	case c.cluster == answerRole && len(args) == 1:
		// A node's answer names its replicas; one standalone master
		// without any is what clients see.
		s.reply([]byte("*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n"))
	case c.cluster == everyMaster:
		if c.flushesScripts {
			s.srv.cluster.scripts.bodies.Purge()
		}
		s.learnScript(cmd, c)
		s.broadcast(t, c.merge, cmd)
	case c.cluster == scriptExists:
		// A script the proxy can load where it is missing exists, as far
		// as EVALSHA through the proxy goes.
		cc := s.addCmd(mergeAnd)
		for _, sha := range args[2:] {
			cc.known = append(cc.known, s.srv.cluster.scripts.knows(sha))
		}
		for _, n := range t.masters {
			s.cs.queuePart(n, -1, cmd.Raw, cmd.Args)
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
		s.cs.queuePart(t.masters[pos.i], -1, nil, a)
		s.endCmd()
	case c.cluster == shardNumSub && len(args) > 2:
		s.cs.keyIdx = s.cs.keyIdx[:0]
		for i := 2; i < len(args); i++ {
			s.cs.keyIdx = append(s.cs.keyIdx, i)
		}
		s.clusterSplit(t, cmd, c, 2) // a channel and its count for each
	case c.cluster == firstMaster, c.cluster == shardNumSub:
		s.queue(t, t.masters[0], -1, mergeOne, cmd) // where SUBSCRIBE goes
	case c.cluster == infoMerge:
		cc := s.addCmd(mergeInfo)
		cc.info = s.srv.infoSection(args[1:], t)
		s.cs.queuePart(s.home(t), -1, cmd.Raw, args)
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
		s.srv.cluster.scripts.learn(cmd.Args[1])
	case c.script == bodyAt2 && len(cmd.Args) == 3:
		s.srv.cluster.scripts.learn(cmd.Args[2])
	case c.script == sha1At1 && len(cmd.Args) > 2:
		s.cs.parts[len(s.cs.parts)-1].script = cmd.Args[1]
	}
}

// clusterRefusal is what a standalone Redis 7.0 answers the cluster
// commands a cluster-aware client probes with, so that it uses the proxy
// as one server and never sees a node's address.
func (s *session) clusterRefusal(args [][]byte, name string) string {
	_, keys, _ := s.srv.cluster.current()
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
func (s *session) broadcast(t *topology, kind mergeKind, cmd *resp.Command) {
	s.addCmd(kind)
	for _, n := range t.masters {
		s.cs.queuePart(n, -1, cmd.Raw, cmd.Args)
	}
	s.endCmd()
}

// queue adds a command of one part.
func (s *session) queue(t *topology, n *node, slot int, kind mergeKind, cmd *resp.Command) {
	s.addCmd(kind)
	s.cs.queuePart(n, slot, cmd.Raw, cmd.Args)
	s.endCmd()
}

func (s *session) addCmd(kind mergeKind) *clusterCmd {
	cs := &s.cs
	cs.cmds = append(cs.cmds, clusterCmd{merge: kind, first: len(cs.parts)})
	return &cs.cmds[len(cs.cmds)-1]
}

// endCmd closes the command addCmd opened and sends the pipeline when it
// has grown big.
func (s *session) endCmd() {
	cs := &s.cs
	c := &cs.cmds[len(cs.cmds)-1]
	c.n = len(cs.parts) - c.first
	if len(cs.parts) >= maxBatchCommands || cs.reqBytes >= maxBatchBytes {
		s.flush()
		if len(s.out) >= maxPendingOut && !s.write() {
			s.quit = true
		}
	}
}

// queuePart adds a request for node n to the first round: raw as it came,
// or args when raw is nil. slot is what it is routed by, -1 for none.
func (r *roundTripper) queuePart(n *node, slot int, raw []byte, args [][]byte) {
	nb := r.firstRoundBatch(n)
	start := len(nb.req)
	if raw != nil {
		nb.req = append(nb.req, raw...)
	} else {
		nb.req = resp.AppendCommand(nb.req, args...)
	}
	r.reqBytes += len(nb.req) - start
	r.parts = append(r.parts, clusterPart{nb: nb, start: start, end: len(nb.req), idx: nb.n, slot: slot})
	nb.n++
}

// firstRoundBatch finds or adds the batch for n among the first round's,
// which are reused from run to run.
func (r *roundTripper) firstRoundBatch(n *node) *nodeBatch {
	cs := r
	for _, nb := range cs.batches[:cs.used] {
		if nb.node == n {
			return nb
		}
	}
	if cs.used == len(cs.batches) {
		cs.batches = append(cs.batches, &nodeBatch{batch: batch{doneCh: make(chan struct{}, 1)}})
	}
	nb := cs.batches[cs.used]
	cs.used++
	nb.node = n
	nb.req, nb.n = nb.req[:0], 0
	return nb
}

// run sends the queued requests and follows the redirections, until every
// part has its final reply.
func (r *roundTripper) run() {
	round := r.batches[:r.used]
	for round != nil {
		r.sendRound(round)
		round = r.collectRound()
	}
}

// reset forgets the parts of the last run.
func (r *roundTripper) reset() {
	clear(r.parts)
	r.parts, r.used, r.reqBytes = r.parts[:0], 0, 0
}

// clusterRoundTrip sends the queued commands, follows redirections, and
// appends the merged replies to out in the client's order.
func (s *session) clusterRoundTrip() {
	cs := &s.cs
	cs.run()
	for i := range cs.cmds {
		c := &cs.cmds[i]
		cs.replies = cs.replies[:0]
		for _, p := range cs.parts[c.first : c.first+c.n] {
			cs.replies = append(cs.replies, p.reply)
		}
		s.out = c.mergeReplies(s.out, cs.replies)
	}
	clear(cs.cmds)
	clear(cs.replies)
	cs.cmds = cs.cmds[:0]
	cs.reset()
}

// sendRound sends every batch of a round at once and waits for them all.
func (r *roundTripper) sendRound(round []*nodeBatch) {
	for _, nb := range round {
		nb.out, nb.ends, nb.done, nb.okLen, nb.err = nb.out[:0], nb.ends[:0], 0, 0, nil
		if nb.ends == nil {
			nb.ends = make([]int, 0, nb.n)
		}
		conn, err := nb.node.pool.get(0, r.id)
		if err != nil {
			nb.err = err
			nb.doneCh <- struct{}{}
			continue
		}
		conn.send(&nb.batch)
	}
	for _, nb := range round {
		<-nb.doneCh
		if nb.err != nil {
			r.c.refresh()
		}
	}
}

// collectRound hands each part sent in the round its reply, and returns a
// new round for the parts worth sending again (see redirect), or nil when
// all are done. A TRYAGAIN is not waited out when a later command of the
// pipeline for the same slot has run meanwhile: the retry would run after
// it, out of the client's order (MSET a b, GET a: the GET ran where a still
// was), so the client gets Redis's TRYAGAIN. MOVED and ASK need no such
// care: the node answers every later command for the slot, or for the same
// missing keys, with the same redirection, so they are retried in order.
func (r *roundTripper) collectRound() []*nodeBatch {
	cs := r
	type retry struct {
		part   int
		target *node
		first  []byte
		again  bool
	}
	var retries []retry
	var ran map[int]int // slot → the last part of it that got its reply
	for i := range cs.parts {
		p := &cs.parts[i]
		if p.reply != nil {
			continue
		}
		nb := p.nb
		if p.idx < nb.done {
			start := 0
			if p.idx > 0 {
				start = nb.ends[p.idx-1]
			}
			p.reply = nb.out[start:nb.ends[p.idx]]
		} else {
			p.reply = resp.AppendError(nil, errorText(nb.err))
		}
		target, first, again := r.redirect(p)
		switch {
		case target == nil:
			if p.slot >= 0 {
				if ran == nil {
					ran = make(map[int]int)
				}
				ran[p.slot] = i
			}
		case again && p.waits >= maxWaits, !again && p.hops >= maxHops:
			if !again {
				p.reply = resp.AppendError(nil, msgSlotMoving)
			}
		default:
			retries = append(retries, retry{i, target, first, again})
		}
	}
	var next []*nodeBatch
	var wait time.Duration
	for _, rt := range retries {
		p := &cs.parts[rt.part]
		if last, ok := ran[p.slot]; ok && rt.again && last > rt.part {
			continue // Redis's TRYAGAIN stands
		}
		if rt.again {
			p.waits++
			wait = max(wait, retryBaseDelay<<(p.waits-1))
		} else {
			p.hops++
		}
		var rb *nodeBatch
		for _, b := range next {
			if b.node == rt.target {
				rb = b
			}
		}
		if rb == nil {
			rb = &nodeBatch{node: rt.target, batch: batch{doneCh: make(chan struct{}, 1)}}
			next = append(next, rb)
		}
		if rt.first != nil {
			rb.req = append(rb.req, rt.first...)
			rb.n++
		}
		start := len(rb.req)
		rb.req = append(rb.req, p.nb.req[p.start:p.end]...)
		p.nb, p.start, p.end, p.idx, p.reply = rb, start, len(rb.req), rb.n, nil
		rb.n++
	}
	time.Sleep(wait)
	return next
}

// askingReq is sent before a command an ASK redirection names a node for.
var askingReq = resp.AppendCommand(nil, []byte("ASKING"))

// redirect reads a part's reply for what makes it worth sending again:
// the cluster's redirections, the errors that ask to wait (TRYAGAIN,
// CLUSTERDOWN; again is set), and NOSCRIPT for a script the proxy can
// load. It returns the node to send the part to next and a request to send
// before it (ASKING, SCRIPT LOAD), whose reply is dropped; a nil target
// means the reply is final.
func (r *roundTripper) redirect(p *clusterPart) (target *node, first []byte, again bool) {
	c := r.c
	if addr, asking := parseRedirect(p.reply); addr != "" {
		if asking {
			c.m.ask.Inc()
			return c.node(addr), askingReq, false
		}
		c.m.moved.Inc()
		c.refresh()
		return c.node(addr), nil, false
	}
	switch {
	case bytes.HasPrefix(p.reply, []byte("-NOSCRIPT")) && p.script != nil && !p.loaded:
		if load := c.scripts.loadRequest(p.script); load != nil {
			p.loaded = true
			return p.nb.node, load, false
		}
	case bytes.HasPrefix(p.reply, []byte("-TRYAGAIN")), bytes.HasPrefix(p.reply, []byte("-CLUSTERDOWN")):
		c.refresh()
		t, _, err := c.current()
		if err != nil || p.slot < 0 || t.slots[p.slot] == nil {
			return p.nb.node, nil, true
		}
		return t.slots[p.slot], nil, true
	}
	return nil, nil, false
}

// parseRedirect reads "-MOVED <slot> <addr>" and "-ASK <slot> <addr>",
// per the Redis Cluster spec; addr is empty for any other reply.
func parseRedirect(reply []byte) (addr string, asking bool) {
	if len(reply) < 4 || reply[0] != '-' {
		return "", false
	}
	f := bytes.Fields(reply[1 : len(reply)-2])
	if len(f) != 3 || (string(f[0]) != "MOVED" && string(f[0]) != "ASK") {
		return "", false
	}
	return string(f[2]), f[0][0] == 'A'
}
