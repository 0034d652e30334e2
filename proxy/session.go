package proxy

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/keyspec"
	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
	"github.com/tidwall/redcon"
)

// msgConfigHidden: a CONFIG GET reply can only be masked when it is not
// inside EXEC's array or a stream: there it is refused, so the upstream
// password stays hidden.
const msgConfigHidden = "ERR CONFIG GET is not supported by hotkeyproxy inside MULTI or after SUBSCRIBE when it has an upstream password"

// Flush thresholds: a long pipeline is sent upstream, and its replies
// written to the client, in pieces of about this size. A batch is also cut
// at as many commands as the last one's replies suggest fill
// maxPendingOut, so that big replies (GET of a 1 MiB value) are not
// gathered 512 at a time before the client gets the first: a session's
// first batch holds at most firstBatchCommands, and the limit grows to
// batchGrowth times what a batch held while the replies stay small.
const (
	maxBatchCommands   = 512
	firstBatchCommands = 128
	batchGrowth        = 4
	maxBatchBytes      = 256 << 10
	maxPendingOut      = 256 << 10
)

// stallGrace is how long a client over limits.max_pending_output may read
// nothing before the session reads its commands on regardless: such a
// client may be writing a whole pipeline before it reads any reply, and
// Redis serves those (the query buffer limit then bounds its replies).
const stallGrace = time.Second

// keyIdxKept is the most key positions a session keeps for the next
// command; a command of more gets room of its own.
const keyIdxKept = 256

// session is one client connection. Its goroutine reads a pipeline of
// commands, relays them upstream as one batch, and writes the replies back
// in request order.
type session struct {
	srv    *Server
	nc     net.Conn
	rd     *resp.CommandReader
	id     uint64
	db     int
	name   []byte
	authed bool
	// user is the ACL user the client is logged in as: "default" unless
	// Redis checks passwords (upstream.client_auth: redis) and it logged
	// in as another. login holds that user's pools then, nil otherwise.
	user  string
	login *upstream.Login
	// pool is the pool of the client's shared connections in standalone
	// mode: the server's, or its user's with a login.
	pool *upstream.Pool
	// proto is the protocol the client negotiated with HELLO (RESP2 until
	// then), which its replies are in, Redis's and the proxy's own: the
	// shared connections it uses speak it too (see upstreamKey). As
	// CLIENT LIST's resp field.
	proto resp.Proto

	// What CLIENT LIST shows (clients.go): info is published from these
	// and the fields above, which only the session's goroutine touches.
	info       *clientInfo
	lastCmd    string      // the last command, as Redis names it
	lastIO     int64       // unix seconds of the last read of commands
	monitoring bool        // MONITOR was sent
	killed     atomic.Bool // by CLIENT KILL: no more in CLIENT LIST
	replies    replyMode
	muted      bool     // the command being handled replies to nobody
	cur        *command // the entry of the command being handled, which marks its batch
	track      tracking // CLIENT TRACKING as Redis took it

	out    []byte // replies not yet written to the client
	w      *clientWriter
	b      upstream.Batch // requests not yet sent upstream
	shared *upstream.Conn // the shared connection for db, cached (Pool.Send)
	own    *ownConn       // the client's own connection, once it needed one
	quit   bool           // close once out is written
	tx     txState

	// batchMax is how many commands the next batch may hold: fewer than
	// maxBatchCommands when the last one's replies were big.
	batchMax int

	// Backpressure: past pendingMax bytes of replies waiting for the
	// client (0: never), its next commands wait; unbounded is set once
	// the client read nothing for stallGrace, until it catches up.
	pendingMax int
	unbounded  bool

	mem    memAccount // what the session holds, for limits.max_client_memory
	memOwn int64      // the part account counted: the buffers the session holds itself

	// ownNC is own's connection for abort, which runs on another goroutine.
	ownMu   sync.Mutex
	ownNC   net.Conn
	ownPool *upstream.Pool // own's, for CLIENT UNBLOCK and TRACKING REDIRECT
	// ownAsked is closed once the session answered another's request for
	// an own connection to receive its invalidations (ownForPushes).
	ownAsked chan struct{}
	// pushTarget: the session got its own connection for that, and is
	// watched for pushes as a tracking client is (watchPushes).
	pushTarget bool

	// Stream mode (pub/sub, MONITOR): every command goes to own as it comes,
	// and relay copies whatever Redis sends to the client.
	streaming bool
	wmu       sync.Mutex // guards writes to nc while streaming
	relayDone chan struct{}
	draining  atomic.Bool // relay must leave the client open when Redis closes
	mark      atomic.Pointer[streamMark]

	cs clusterState // cluster mode's routing and transaction state

	m sessionMetrics // commands not yet counted in the metrics

	// Relayed commands whose replies may show a key held as buckets that
	// this proxy did not know was hot (contract 9): see markLayout.
	marks []layoutMark

	// keyIdx are the positions of the keys among the arguments of keysOf,
	// the command being handled, once keyPositions found them: the hot-key
	// check and the cluster router both need them.
	keyIdx []int
	keysOf *resp.Command

	nameBuf [24]byte
}

// newSession is the session of the client on nc, whose replies w writes
// (w.tls is nc over TLS).
func newSession(srv *Server, nc net.Conn, w *clientWriter, id uint64) *session {
	limits := &srv.config().Limits
	s := &session{
		srv:        srv,
		nc:         nc,
		id:         id,
		rd:         resp.NewCommandReader(nc, int(limits.QueryBuffer), int64(limits.MaxBulk)),
		authed:     srv.config().Password == "",
		cur:        otherCommand,
		user:       "default",
		pool:       srv.up.Pool,
		proto:      resp.RESP2,
		batchMax:   firstBatchCommands,
		pendingMax: int(limits.MaxPendingOutput),
		mem:        memAccount{srv: srv},
		info:       newClientInfo(nc),
	}
	s.lastIO = s.info.created
	s.rd.SetAuthRequired(!s.authed)
	s.rd.SetGrowHook(s.account)
	s.w = w
	w.mem = &s.mem
	s.tx.slot = -1
	s.cs.RoundTrip = upstream.NewRoundTrip(srv.up.Cluster, id)
	if s.redisChecks() {
		s.authed = false // until Redis says its default user needs no AUTH
		s.rd.SetAuthRequired(false)
		s.logIn(srv.up.Logins.Get("", ""))
	}
	if srv.up.Cluster == nil {
		s.pool.KeepSpare(s.upstreamKey()) // for the first blocking command in db 0
	}
	return s
}

// serve runs the session until the client leaves, the proxy stops, or the
// client breaks the protocol.
func (s *session) serve() {
	defer s.close()
	idle := s.srv.config().Limits.IdleTimeout.Duration()
	for {
		var deadline time.Time
		if idle > 0 && !s.streaming {
			deadline = time.Now().Add(idle)
			s.nc.SetReadDeadline(deadline)
		}
		s.giveOwn(deadline)
		if s.srv.closing.Load() {
			return
		}
		if s.rd.Buffered() == 0 && cap(s.out) > maxPendingOut {
			s.out = nil // about to wait for the client: keep no big buffer meanwhile
			s.account()
		}
		stop := s.watchPushes()
		cmds, err := s.rd.ReadCommands()
		if stop != nil {
			stop()
		}
		if err != nil && s.wokenForOwn(err) {
			s.rd.Resume()
			err = nil
		}
		s.lastIO = time.Now().Unix()
		for i := range cmds {
			if s.handle(&cmds[i]); s.quit {
				break
			}
		}
		if cap(s.keyIdx) > keyIdxKept {
			s.keyIdx, s.keysOf = nil, nil // one command of many keys should not pin them
		}
		s.flush()
		s.publish()
		if err != nil && !s.quit {
			var pe *resp.ProtocolError
			switch {
			case errors.As(err, &pe):
				s.srv.log.Debug("client protocol error", "client", s.nc.RemoteAddr().String(), "err", err)
				s.out = redcon.AppendError(s.out, "ERR "+pe.Error())
			case errors.Is(err, resp.ErrQueryBufferExceeded):
				s.srv.log.Warn("closing client that reached the query buffer limit",
					"client", s.nc.RemoteAddr().String(), "limit", s.srv.config().Limits.QueryBuffer.String())
				s.srv.m.evicted[evictQuery].Inc()
				s.out = redcon.AppendError(s.out, rediserr.QueryBuffer)
			default:
				return
			}
			s.quit = true
			s.drainStream()
		}
		if !s.write() || s.quit {
			return
		}
		s.backpressure()
	}
}

// backpressure holds the session, before it reads more commands, while
// more than pendingMax bytes of replies wait for the client, as long as
// the client keeps reading them.
func (s *session) backpressure() {
	if s.pendingMax == 0 || s.streaming {
		return
	}
	if s.w.pending() <= s.pendingMax {
		s.unbounded = false
		return
	}
	if !s.unbounded && s.w.waitBelow(s.pendingMax, stallGrace, s.srv.stop) {
		s.unbounded = true
	}
}

// handshake runs the TLS handshake of a client of ServeTLS, within the
// deadline accept set, and reports whether it succeeded; a failure closes
// the client.
func (s *session) handshake() bool {
	if err := s.w.tls.Handshake(); err != nil {
		s.srv.m.tlsHandshakeFailures.Inc()
		s.srv.log.Debug("client TLS handshake failed", "client", s.nc.RemoteAddr().String(), "err", err)
		s.close()
		return false
	}
	s.nc.SetDeadline(time.Time{})
	return true
}

// abort disconnects the client and its own upstream connection from
// another goroutine: a blocking command in flight fails at once, and Redis
// drops it rather than serve it to nobody.
func (s *session) abort() {
	s.nc.Close()
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	if s.ownNC != nil {
		s.ownNC.Close()
	}
}

func (s *session) close() {
	s.endOwnAsks()
	s.w.wait()   // replies queued for a slow reader, QUIT's +OK among them
	s.nc.Close() // then: a relay blocked in a read of Redis returns
	if s.own != nil {
		s.own.nc.Close()
	}
	if s.relayDone != nil {
		<-s.relayDone
	}
	s.mem.add(-s.memOwn) // the writer gives back its own when it ends
	s.memOwn = 0
	if s.login != nil {
		s.login.Release()
	}
}

// reply appends a locally made reply after every reply before it.
func (s *session) reply(b []byte) {
	s.flush()
	s.out = append(s.out, b...)
}

func (s *session) replyError(msg string) { s.reply(redcon.AppendError(nil, msg)) }

// write sends the pending replies to the client.
func (s *session) write() bool {
	s.m.replied(s.out)
	if len(s.out) == 0 {
		return true
	}
	if s.streaming {
		s.wmu.Lock()
		defer s.wmu.Unlock()
	}
	kept, err := s.w.write(s.out)
	if kept {
		s.out = nil // the background writer owns it now
	}
	if errors.Is(err, errOutputLimit) {
		s.srv.log.Warn("closing client that does not read its replies",
			"client", s.nc.RemoteAddr().String(), "limit", s.srv.config().Limits.QueryBuffer.String())
		s.srv.m.evicted[evictOutput].Inc()
	}
	if cap(s.out) > keepMax {
		s.out = nil // a big reply once should not pin memory for good
	} else {
		s.out = s.out[:0]
	}
	s.account()
	return err == nil
}

func (s *session) handle(cmd *resp.Command) {
	s.keysOf = nil // cmd may sit where the last batch's command was
	c, name := lookup(cmd.Args, &s.nameBuf)
	s.m.add(s.srv.m, c, s.streaming)
	if !c.noAuth && !s.mayRun() {
		s.replyError(rediserr.NoAuth)
		return
	}
	s.lastCmd = c.shownName(cmd.Args)
	if s.streaming {
		s.handleStreaming(cmd, name)
		return
	}
	if s.replies != replyOn && !s.muted {
		s.handleMuted(func() { s.run(cmd, c, name) })
		return
	}
	s.run(cmd, c, name)
}

// keyPositions returns the positions of cmd's keys among its arguments, as
// table gives them (keyspec.Table.Keys), found once per command; the
// result is valid until the next command is handled.
func (s *session) keyPositions(table *keyspec.Table, cmd *resp.Command) []int {
	if s.keysOf != cmd {
		s.keyIdx, _ = table.Keys(cmd.Args, s.keyIdx[:0])
		s.keysOf = cmd
	}
	return s.keyIdx
}

// run handles cmd, whose table entry is c and lower-case name name.
func (s *session) run(cmd *resp.Command, c *command, name []byte) {
	s.cur = c
	if c.noMulti && s.tx.open {
		// Redis would queue it; answered about Redis's connections at
		// EXEC, it would show ids no client of the proxy has.
		s.replyError("ERR " + refusedName(cmd.Args) + " is not allowed inside MULTI through hotkeyproxy")
		s.tx.dirty = true
		return
	}
	if c.flushesScripts {
		// Which nodes hold the deduct scripts, as the hot keys' EVALSHA
		// last saw: asked again.
		s.srv.hot.ForgetScripts()
	}
	if s.hotCommand(cmd, c, string(name)) {
		return
	}
	if s.srv.up.Cluster != nil && s.clusterHandle(cmd, c) {
		return
	}
	if c.pauses && !s.tx.open {
		s.clientPause(cmd)
		return
	}
	if c.aside && s.own == nil && s.srv.up.Cluster == nil {
		s.reply(askAside(s.userPool(s.srv.up.Pool), rawOf(cmd)))
		return
	}
	switch c.route {
	case routeLocal:
		if s.upstreamOwns(c) {
			if c.shown == "client|setname" && !s.tx.open {
				s.ownSetName(cmd)
				return
			}
			s.dispatch(cmd, c)
			if string(name) == "select" && s.srv.up.Cluster == nil {
				s.ownSelect(cmd)
			}
			return
		}
		s.local(cmd, string(name))
	case routeShared:
		if string(name) == "info" && !s.tx.open && !s.pinned() {
			s.standaloneInfo(cmd)
			return
		}
		if s.tx.open && (string(name) == "exec" || string(name) == "discard") {
			s.endOwnTx(cmd, string(name))
			return
		}
		s.forward(cmd)
	case routeOwn:
		if s.own == nil && !s.pin(s.srv.up.Pool) {
			return
		}
		if string(name) == "multi" {
			s.multi(cmd)
			return
		}
		s.forward(cmd)
		if string(name) != "watch" {
			s.flushBlocking(cmd)
		}
	case routeStream:
		if s.own == nil && !s.pin(s.srv.up.Pool) {
			return
		}
		s.monitoring = s.monitoring || string(name) == "monitor"
		s.startStream()
		if !s.streamSubscriptions(cmd, string(name)) {
			s.forward(cmd) // MONITOR
		}
	case routeRefuse:
		s.replyError("ERR " + refusedName(cmd.Args) + " is not supported by hotkeyproxy")
	}
}

// dispatch queues cmd for whatever upstream serves it: in cluster mode the
// node of its keys, unless the client is held on its own connection.
func (s *session) dispatch(cmd *resp.Command, c *command) {
	if s.srv.up.Cluster != nil && !s.pinned() && !s.streaming {
		s.clusterForward(cmd, c)
		return
	}
	s.forward(cmd)
}

// forward queues cmd for the client's own or shared connection.
func (s *session) forward(cmd *resp.Command) {
	if len(cmd.Raw) >= maxBatchBytes && !s.streaming && !s.pinned() {
		s.forwardBig(cmd.Raw)
		return
	}
	if cmd.Raw != nil {
		s.b.Req = append(s.b.Req, cmd.Raw...)
	} else {
		s.b.Req = resp.AppendCommand(s.b.Req, cmd.Args...)
	}
	s.b.Held = s.b.Held || s.cur.held
	s.b.Rerun = s.cur.rerun && (s.b.N == 0 || s.b.Rerun)
	s.b.N++
	if s.b.N >= s.batchMax || len(s.b.Req) >= maxBatchBytes {
		s.flushFull()
	}
}

// forwardBig sends a big request on its own, from the client's read
// buffer, where it stays valid until the next read: copied into the batch,
// it would be held twice.
func (s *session) forwardBig(raw []byte) {
	s.flush()
	req := s.b.Req
	s.b.Req, s.b.N, s.b.Held, s.b.Rerun = raw, 1, s.cur.held, s.cur.rerun
	s.flush()
	s.b.Req = req
	s.account() // the batch's buffer is its own again, not the read buffer
	s.flushFull()
}

// flushFull sends the batch, which has grown big, and writes the replies
// when they have too; then waits while the client has too many unread.
func (s *session) flushFull() {
	s.flush()
	if len(s.out) >= maxPendingOut && !s.muted {
		if !s.write() {
			s.quit = true
			return
		}
		s.backpressure()
	}
}

// flush sends the queued requests and appends their replies to out.
func (s *session) flush() { s.send(nil) }

// exchange sends cmd as the client's commands go, once every request
// before it is answered, and returns where its reply starts in out: the
// caller reads it there, replaces or drops it.
func (s *session) exchange(cmd *resp.Command) (mark int) {
	s.flush()
	mark = len(s.out)
	var buf [24]byte
	c, _ := lookup(cmd.Args, &buf)
	cur := s.cur
	s.cur = c
	s.dispatch(cmd, c)
	s.flush()
	s.cur = cur
	return mark
}

// flushBlocking is flush for a batch that ends in cmd, a command that may
// block: while Redis holds it, the client is watched, so that a client
// that goes away does not leave a BLPOP behind to pop an element nobody
// will receive, and its reply is waited for as long as its own timeout
// says (see ownRoundTrip).
func (s *session) flushBlocking(cmd *resp.Command) { s.send(cmd) }

// send is flush, or flushBlocking when block is not nil.
func (s *session) send(block *resp.Command) {
	from := len(s.out)
	s.sendBatch(block)
	if len(s.marks) > 0 {
		s.readLayouts(from)
	}
}

func (s *session) sendBatch(block *resp.Command) {
	if len(s.cs.cmds) > 0 {
		s.clusterRoundTrip()
	}
	b := &s.b
	if b.N == 0 {
		return
	}
	n := b.N
	defer func() {
		b.Req, b.N, b.Held, b.Rerun = b.Req[:0], 0, false, false
		if cap(b.Req) > 4*maxBatchBytes {
			b.Req = nil // an inline command of megabytes once should not pin them
		}
		s.account()
	}()
	switch {
	case s.streaming:
		s.publish() // what the client is now shows before Redis's reply can
		if _, err := s.own.nc.Write(b.Req); err != nil {
			s.quit = true
		}
	case s.pinned():
		s.ownRoundTrip(block)
	default:
		from := len(s.out)
		b.Out, b.OKLen, b.Done, b.Err = s.out, from, 0, nil
		if b.DoneCh == nil {
			b.DoneCh = make(chan struct{}, 1) // made on first use: an idle client holds none
		}
		s.pool.Send(&s.shared, s.upstreamKey(), s.id, b)
		<-b.DoneCh
		s.out, b.Out = b.Out, nil
		if b.Err != nil {
			s.out = s.out[:b.OKLen]
			s.failBatch(b.Done, n, b.Err)
			return
		}
		fit := maxPendingOut * n / max(len(s.out)-from, 1)
		s.batchMax = min(max(fit, 1), max(batchGrowth*n, s.batchMax), maxBatchCommands)
	}
}

// upstreamKey names the shared connections the client's requests go on:
// of its db, in its protocol.
func (s *session) upstreamKey() upstream.Key {
	return upstream.Key{DB: s.db, RESP3: s.proto == resp.RESP3}
}

// failBatch answers requests done..n of a failed batch with an error.
func (s *session) failBatch(done, n int, err error) {
	msg := upstream.ErrorText(err)
	for i := done; i < n; i++ {
		s.out = redcon.AppendError(s.out, msg)
	}
	if s.pinned() {
		// Its transaction, subscriptions or db are gone with the
		// connection; closing tells the client as Redis would.
		s.quit = true
	}
}

// upstreamOwns reports whether a command the proxy answers itself for
// clients on shared connections goes upstream instead, because Redis holds
// the state: the name and db of the client's own connection, or the
// transaction that queues it.
func (s *session) upstreamOwns(c *command) bool {
	switch c.upstreamWhen {
	case whenPinned:
		return s.pinned()
	case whenInMulti:
		return s.tx.open
	case whenNoUpstreamPwd:
		return s.srv.cfg.Upstream.Password == ""
	}
	return false
}
