package upstream

import (
	"bytes"
	"runtime"
	"slices"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// How hard a request is retried when the cluster redirects it (MOVED,
// ASK: a few hops) or asks to wait (TRYAGAIN, CLUSTERDOWN: a few waits
// with backoff, about 600 ms in all), then the client gets the error.
const (
	// MaxHops bounds the redirections followed for one request. An ASK
	// often leads to a TRYAGAIN (a multi-key command while its keys are
	// split between the two nodes) and the wait back to the source, so
	// hops must outlast waits.
	MaxHops        = 16
	maxWaits       = 5
	retryBaseDelay = 20 * time.Millisecond
)

// MsgSlotMoving is the error reply, without '-' and CRLF, to a request
// redirected MaxHops times: the slot kept moving under it.
const MsgSlotMoving = "TRYAGAIN hotkeyproxy: the slot is moving; try again"

// keptBatches bounds the node batches a RoundTrip keeps from run to run
// beyond those one run needs: one per master of a common cluster.
const keptBatches = 8

// clusterPart is one request sent to one node: a client's command has one
// part, or one per slot when split, or one per master when broadcast.
type clusterPart struct {
	nb         *nodeBatch // where it was last sent
	start, end int        // the request, in nb.Req
	idx        int        // its reply's index in nb
	slot       int        // the slot it is routed by; -1 for keyless
	hops       int        // MOVED and ASK followed
	waits      int        // TRYAGAIN and CLUSTERDOWN waited out
	loaded     bool       // its script was loaded after a NOSCRIPT
	follower   bool       // sent right after the part before it, wherever that goes
	script     []byte     // EVALSHA's SHA1, to load the script on NOSCRIPT
	reply      []byte     // nil until answered
}

// nodeBatch is a round's requests to one node.
type nodeBatch struct {
	node *Node
	conn *Conn // the node's shared connection it went on last
	Batch
}

// RoundTrip sends requests to the nodes of a cluster, each to its own, in
// rounds: all nodes at once, then again for what the cluster redirected,
// until every request has its final reply. Queue requests, Run, read each
// Reply, Reset, and queue again: its buffers are reused from run to run,
// so a RoundTrip belongs to one goroutine.
type RoundTrip struct {
	c        *Cluster
	id       uint64 // spreads users over a node's shared connections
	login    *Login // whose pools it uses; nil: the nodes' own
	key      Key    // the shared connections it uses: db 0, in a protocol
	parts    []clusterPart
	batches  []*nodeBatch // the first round's, reused from run to run
	used     int          // batches[:used] are in use
	reqBytes int
	ran      []int   // collectRound's: the parts with a slot answered in this round, in order
	held     []*Conn // sendRound's: the connections whose write side it took
}

// NewRoundTrip returns a RoundTrip on c's nodes for the user id, which
// picks the shared connection of each node it uses.
func NewRoundTrip(c *Cluster, id uint64) RoundTrip { return RoundTrip{c: c, id: id} }

// SetLogin makes the requests from now on go on l's pools, authenticated
// as its ACL user, rather than the nodes' own.
func (r *RoundTrip) SetLogin(l *Login) {
	r.login = l
	for _, nb := range r.batches {
		nb.conn = nil
	}
}

// SetRESP3 makes the next runs use connections that speak RESP3, or
// RESP2 when off, so that replies come in the protocol of the client.
func (r *RoundTrip) SetRESP3(on bool) {
	if r.key.RESP3 != on {
		r.key.RESP3 = on
		for _, nb := range r.batches {
			nb.conn = nil // of the other protocol
		}
	}
}

// SetBlocking makes the next runs use the nodes' Blocking connections
// (Key.Blocking), picked by id, when on; else the shared ones of id.
func (r *RoundTrip) SetBlocking(on bool, id uint64) {
	if r.key.Blocking != on || r.id != id {
		r.key.Blocking, r.id = on, id
		for _, nb := range r.batches {
			nb.conn = nil
		}
	}
}

// Queue adds a request for node n to the first round: raw, its RESP
// frame, or args when raw is nil. slot is the slot it is routed by, for
// TRYAGAIN and CLUSTERDOWN, or -1 for none. Its reply is Reply(Len()-1).
func (r *RoundTrip) Queue(n *Node, slot int, raw []byte, args [][]byte) {
	nb := r.firstRoundBatch(n)
	start := len(nb.Req)
	if raw != nil {
		nb.Req = append(nb.Req, raw...)
	} else {
		nb.Req = resp.AppendCommand(nb.Req, args...)
	}
	r.reqBytes += len(nb.Req) - start
	r.parts = append(r.parts, clusterPart{nb: nb, start: start, end: len(nb.Req), idx: nb.N, slot: slot})
	nb.N++
}

// QueueFollower adds a request that follows the one queued last: sent
// right after it on the same connection, and again right after it when
// that one is redirected or retried (WAIT, which counts what its
// connection wrote, must go where the write went). Its reply is
// Reply(Len()-1); it is never redirected itself.
func (r *RoundTrip) QueueFollower(args [][]byte) {
	last := r.parts[len(r.parts)-1]
	r.Queue(last.nb.node, -1, nil, args)
	r.parts[len(r.parts)-1].follower = true
}

// MarkScript says the request queued last is an EVALSHA of the script
// with SHA1 sha: on NOSCRIPT the script is loaded there, once, when the
// cluster's ScriptCache knows it, and the request sent again.
func (r *RoundTrip) MarkScript(sha []byte) { r.parts[len(r.parts)-1].script = sha }

// Len is the number of requests queued.
func (r *RoundTrip) Len() int { return len(r.parts) }

// Size is the length in bytes of the requests queued.
func (r *RoundTrip) Size() int { return r.reqBytes }

// Reply is the final reply to the i-th request queued, valid after Run
// until Reset: Redis's, or an error reply for a request that could not be
// sent or kept being redirected.
func (r *RoundTrip) Reply(i int) []byte { return r.parts[i].reply }

// firstRoundBatch finds or adds the batch for n among the first round's,
// which are reused from run to run: the one that went to n before when
// there is one, which has n's connection, so that runs to one node after
// another (a hot key's deducts, over its buckets' masters) do not each
// look a connection up; up to keptBatches are kept.
func (r *RoundTrip) firstRoundBatch(n *Node) *nodeBatch {
	for _, nb := range r.batches[:r.used] {
		if nb.node == n {
			return nb
		}
	}
	next := slices.IndexFunc(r.batches[r.used:], func(nb *nodeBatch) bool { return nb.node == n })
	switch {
	case next < 0 && (r.used == len(r.batches) || len(r.batches) < keptBatches):
		r.batches = append(r.batches, &nodeBatch{Batch: Batch{DoneCh: make(chan struct{}, 1)}})
		next = len(r.batches) - 1 - r.used
	case next < 0:
		next = 0
	}
	r.batches[r.used], r.batches[r.used+next] = r.batches[r.used+next], r.batches[r.used]
	nb := r.batches[r.used]
	r.used++
	if nb.node != n {
		nb.node, nb.conn = n, nil
	}
	nb.Req, nb.N = nb.Req[:0], 0
	return nb
}

// Run sends the queued requests and follows the redirections, until every
// request has its final reply.
func (r *RoundTrip) Run() {
	round := r.batches[:r.used]
	for round != nil {
		r.sendRound(round)
		round = r.collectRound()
	}
}

// Reset forgets the requests of the last run.
func (r *RoundTrip) Reset() {
	clear(r.parts)
	r.parts, r.used, r.reqBytes = r.parts[:0], 0, 0
}

// sendRound sends every batch of a round at once and waits for them all.
func (r *RoundTrip) sendRound(round []*nodeBatch) {
	for _, nb := range round {
		nb.Out, nb.Ends, nb.Done, nb.OKLen, nb.Err = nb.Out[:0], nb.Ends[:0], 0, 0, nil
		if nb.Ends == nil {
			nb.Ends = make([]int, 0, nb.N)
		}
		p := nb.node.Pool
		if r.login != nil {
			p = r.login.Pool(p)
		}
		if mayDial(nb.conn) {
			r.held = writeAll(r.held)
		}
		if c := p.queue(&nb.conn, r.key, r.id, &nb.Batch); c != nil {
			r.held = append(r.held, c)
		}
	}
	if len(r.held) > 0 {
		runtime.Gosched() // once for every node, as Conn.Send for one
		r.held = writeAll(r.held)
	}
	for _, nb := range round {
		<-nb.DoneCh
		if nb.Err != nil {
			r.c.Refresh()
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
func (r *RoundTrip) collectRound() []*nodeBatch {
	type retry struct {
		part   int
		target *Node
		first  []byte
		again  bool
	}
	var retries []retry
	r.ran = r.ran[:0]
	for i := range r.parts {
		p := &r.parts[i]
		if p.reply != nil {
			continue
		}
		nb := p.nb
		if p.idx < nb.Done {
			start := 0
			if p.idx > 0 {
				start = nb.Ends[p.idx-1]
			}
			p.reply = nb.Out[start:nb.Ends[p.idx]]
		} else {
			p.reply = redcon.AppendError(nil, ErrorText(nb.Err))
		}
		target, first, again := r.redirect(p)
		switch {
		case p.follower:
			// Final unless the part it follows is sent again (below).
		case target == nil:
			if p.slot >= 0 {
				r.ran = append(r.ran, i)
			}
		case again && p.waits >= maxWaits, !again && p.hops >= MaxHops:
			if !again {
				p.reply = redcon.AppendError(nil, MsgSlotMoving)
			}
		default:
			retries = append(retries, retry{i, target, first, again})
		}
	}
	var next []*nodeBatch
	var wait time.Duration
	for _, rt := range retries {
		p := &r.parts[rt.part]
		if rt.again && r.ranAfter(rt.part) {
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
			rb = &nodeBatch{node: rt.target, Batch: Batch{DoneCh: make(chan struct{}, 1)}}
			next = append(next, rb)
		}
		if rt.first != nil {
			rb.Req = append(rb.Req, rt.first...)
			rb.N++
		}
		start := len(rb.Req)
		rb.Req = append(rb.Req, p.nb.Req[p.start:p.end]...)
		p.nb, p.start, p.end, p.idx, p.reply = rb, start, len(rb.Req), rb.N, nil
		rb.N++
		if f := rt.part + 1; f < len(r.parts) && r.parts[f].follower {
			fp := &r.parts[f]
			start := len(rb.Req)
			rb.Req = append(rb.Req, fp.nb.Req[fp.start:fp.end]...)
			fp.nb, fp.start, fp.end, fp.idx, fp.reply = rb, start, len(rb.Req), rb.N, nil
			rb.N++
		}
	}
	time.Sleep(wait)
	return next
}

// ranAfter reports whether a part after part, of its slot, got its reply
// in the round collectRound just read.
func (r *RoundTrip) ranAfter(part int) bool {
	slot := r.parts[part].slot
	for k := len(r.ran) - 1; k >= 0 && r.ran[k] > part; k-- {
		if r.parts[r.ran[k]].slot == slot {
			return true
		}
	}
	return false
}

// askingReq is sent before a command an ASK redirection names a node for.
var askingReq = resp.AppendCommand(nil, []byte("ASKING"))

// redirect reads a part's reply for what makes it worth sending again:
// the cluster's redirections, the errors that ask to wait (TRYAGAIN,
// CLUSTERDOWN; again is set), and NOSCRIPT for a script the proxy can
// load. It returns the node to send the part to next and a request to send
// before it (ASKING, SCRIPT LOAD), whose reply is dropped; a nil target
// means the reply is final.
func (r *RoundTrip) redirect(p *clusterPart) (target *Node, first []byte, again bool) {
	c := r.c
	if slot, addr, asking := ParseRedirect(p.reply); addr != "" {
		if asking {
			return c.Asked(addr), askingReq, false
		}
		return c.Moved(slot, addr), nil, false
	}
	switch {
	case bytes.HasPrefix(p.reply, []byte("-NOSCRIPT")) && p.script != nil && !p.loaded:
		if load := c.scripts.loadRequest(p.script); load != nil {
			p.loaded = true
			return p.nb.node, load, false
		}
	case bytes.HasPrefix(p.reply, []byte("-TRYAGAIN")), bytes.HasPrefix(p.reply, []byte("-CLUSTERDOWN")):
		c.Refresh()
		t, _, err := c.Current()
		if err != nil || p.slot < 0 || t.Node(p.slot) == nil {
			return p.nb.node, nil, true
		}
		return t.Node(p.slot), nil, true
	}
	return nil, nil, false
}

// ParseRedirect reads a reply "-MOVED <slot> <addr>\r\n" or "-ASK <slot>
// <addr>\r\n", per the Redis Cluster spec, for the slot, the address
// (host:port) it names and whether it is an ASK; addr is empty for any
// other reply, slot -1 when it is not a number.
func ParseRedirect(reply []byte) (slot int, addr string, asking bool) {
	if len(reply) < 4 || reply[0] != '-' {
		return -1, "", false
	}
	f := bytes.Fields(reply[1 : len(reply)-2])
	if len(f) != 3 || (string(f[0]) != "MOVED" && string(f[0]) != "ASK") {
		return -1, "", false
	}
	slot = -1
	if n, ok := resp.ParseInt(f[1]); ok {
		slot = int(n)
	}
	return slot, string(f[2]), f[0][0] == 'A'
}
