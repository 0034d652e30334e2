package proxy

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
)

// Error replies with Redis 7.0's exact texts.
const (
	msgNoAuth      = "NOAUTH Authentication required."
	msgWrongPass   = "WRONGPASS invalid username-password pair or user is disabled."
	msgNoPassword  = "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?"
	msgSyntax      = "ERR syntax error"
	msgNotInteger  = "ERR value is not an integer or out of range"
	msgIntRange    = "ERR value is out of range, value must between -2147483648 and 2147483647"
	msgBadName     = "ERR Client names cannot contain spaces, newlines or special characters."
	msgNoProto     = "NOPROTO unsupported protocol version"
	msgBadProtover = "ERR Protocol version is not an integer or out of range"
	msgHelloNoAuth = "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time"
	msgMaxClients  = "ERR max number of clients reached"
	// The reply can only be masked when it is not inside EXEC's array or a
	// stream: there it is refused, so the upstream password stays hidden.
	msgConfigHidden = "ERR CONFIG GET is not supported by hotkeyproxy inside MULTI or after SUBSCRIBE when it has an upstream password"
)

// Flush thresholds: a long pipeline is sent upstream, and its replies
// written to the client, in pieces of about this size.
const (
	maxBatchCommands = 512
	maxBatchBytes    = 256 << 10
	maxPendingOut    = 256 << 10
)

// ownConn is an upstream connection that belongs to one client: for
// transactions, blocking commands and pub/sub. The session uses it
// synchronously, so it has no goroutines of its own.
type ownConn struct {
	nc net.Conn
	br *bufio.Reader
}

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

	out    []byte // replies not yet written to the client
	w      *clientWriter
	b      upstream.Batch // requests not yet sent upstream
	shared *upstream.Conn // the shared connection for db, cached
	own    *ownConn       // the client's own connection, once it needed one
	quit   bool           // close once out is written
	// inMulti: own has a transaction open (MULTI answered +OK, no EXEC or
	// DISCARD since), so Redis queues what the proxy would answer itself.
	inMulti bool

	// ownNC is own's connection for abort, which runs on another goroutine.
	ownMu sync.Mutex
	ownNC net.Conn

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
	marks    []layoutMark
	markArgs []byte // their arguments, back to back
	markEnds []int  // where each argument ends in markArgs

	nameBuf [24]byte
}

func newSession(srv *Server, nc net.Conn, id uint64) *session {
	s := &session{
		srv:    srv,
		nc:     nc,
		id:     id,
		rd:     resp.NewCommandReader(nc, int(srv.config().Limits.QueryBuffer), int64(srv.config().Limits.MaxBulk)),
		authed: srv.config().Password == "",
	}
	s.rd.SetAuthRequired(!s.authed)
	s.w = newClientWriter(nc, int(srv.config().Limits.QueryBuffer))
	s.b.DoneCh = make(chan struct{}, 1)
	s.cs.txSlot = -1
	s.cs.RoundTrip = upstream.NewRoundTrip(srv.up.Cluster, id)
	return s
}

// serve runs the session until the client leaves, the proxy stops, or the
// client breaks the protocol.
func (s *session) serve() {
	defer s.close()
	idle := s.srv.config().Limits.IdleTimeout.Duration()
	for {
		if idle > 0 && !s.streaming {
			s.nc.SetReadDeadline(time.Now().Add(idle))
		}
		if s.srv.closing.Load() {
			return
		}
		cmds, err := s.rd.ReadCommands()
		for i := range cmds {
			if s.handle(&cmds[i]); s.quit {
				break
			}
		}
		s.flush()
		if err != nil && !s.quit {
			var pe *resp.ProtocolError
			switch {
			case errors.As(err, &pe):
				s.srv.log.Debug("client protocol error", "client", s.nc.RemoteAddr().String(), "err", err)
				s.out = resp.AppendError(s.out, "ERR "+pe.Error())
			case errors.Is(err, resp.ErrQueryBufferExceeded):
				s.srv.log.Warn("closing client that reached the query buffer limit",
					"client", s.nc.RemoteAddr().String(), "limit", s.srv.config().Limits.QueryBuffer.String())
				s.out = resp.AppendError(s.out, "ERR max query buffer length reached, closing connection")
			default:
				return
			}
			s.quit = true
			s.drainStream()
		}
		if !s.write() || s.quit {
			return
		}
	}
}

func (s *session) setOwn(own *ownConn) {
	s.own = own
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	s.ownNC = nil
	if own != nil {
		s.ownNC = own.nc
	}
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
	s.w.wait()   // replies queued for a slow reader, QUIT's +OK among them
	s.nc.Close() // then: a relay blocked in a read of Redis returns
	if s.own != nil {
		s.own.nc.Close()
	}
	if s.relayDone != nil {
		<-s.relayDone
	}
}

// reply appends a locally made reply after every reply before it.
func (s *session) reply(b []byte) {
	s.flush()
	s.out = append(s.out, b...)
}

func (s *session) replyError(msg string) { s.reply(resp.AppendError(nil, msg)) }

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
	}
	if cap(s.out) > 4*maxPendingOut {
		s.out = nil // a big reply once should not pin memory for good
	} else {
		s.out = s.out[:0]
	}
	return err == nil
}

func (s *session) handle(cmd *resp.Command) {
	r, name := classify(cmd.Args, &s.nameBuf)
	s.m.add(s.srv.m, name, s.streaming)
	if !s.authed && !runsBeforeAuth(name) {
		s.replyError(msgNoAuth)
		return
	}
	if s.streaming {
		s.handleStreaming(cmd, name)
		return
	}
	if s.hotCommand(cmd, string(name)) {
		return
	}
	if s.srv.up.Cluster != nil && s.clusterHandle(cmd, r, string(name)) {
		return
	}
	switch r {
	case routeLocal:
		if s.upstreamOwns(string(name)) {
			s.dispatch(cmd, string(name))
			if string(name) == "select" && s.srv.up.Cluster == nil {
				s.ownSelect(cmd)
			}
			return
		}
		s.local(cmd, string(name))
	case routeShared:
		if string(name) == "info" && !s.inMulti && !s.pinned() {
			s.standaloneInfo(cmd)
			return
		}
		if s.inMulti && string(name) == "exec" && s.cs.txDirty {
			// A hot key was refused inside it: it fails as a
			// transaction with a refused command does in Redis.
			s.flush()
			mark := len(s.out)
			s.forward(&resp.Command{Args: [][]byte{[]byte("DISCARD")}})
			s.flush()
			s.out = resp.AppendError(s.out[:mark], msgExecAbort)
			s.endTx()
			return
		}
		s.forward(cmd)
		if s.inMulti && (string(name) == "exec" || string(name) == "discard") {
			s.endTx()
		}
	case routeOwn:
		if s.own == nil && !s.pin(s.srv.up.Pool) {
			return
		}
		if string(name) == "multi" {
			s.flush()
			mark := len(s.out)
			s.forward(cmd)
			s.flush()
			// A nested MULTI is refused and leaves the transaction open.
			s.inMulti = s.inMulti || string(s.out[mark:]) == "+OK\r\n"
			return
		}
		s.forward(cmd)
		if string(name) != "watch" {
			s.flushBlocking()
		}
	case routeStream:
		if s.own == nil && !s.pin(s.srv.up.Pool) {
			return
		}
		s.startStream()
		s.forward(cmd)
	case routeRefuse:
		s.replyError("ERR " + refusedName(cmd.Args) + " is not supported by hotkeyproxy")
	}
}

// runsBeforeAuth reports the commands Redis 7.0 flags no-auth.
func runsBeforeAuth(name []byte) bool {
	switch string(name) {
	case "auth", "hello", "quit", "reset":
		return true
	}
	return false
}

func refusedName(args [][]byte) string {
	name := strings.ToUpper(string(args[0]))
	if len(args) > 1 && (name == "CLIENT" || name == "SCRIPT") {
		name += " " + strings.ToUpper(string(args[1]))
	}
	return name
}

// dispatch queues cmd for whatever upstream serves it: in cluster mode the
// node of its keys, unless the client is held on its own connection.
func (s *session) dispatch(cmd *resp.Command, name string) {
	if s.srv.up.Cluster != nil && !s.pinned() && !s.streaming {
		s.clusterForward(cmd, name)
		return
	}
	s.forward(cmd)
}

// forward queues cmd for the client's own or shared connection.
func (s *session) forward(cmd *resp.Command) {
	if cmd.Raw != nil {
		s.b.Req = append(s.b.Req, cmd.Raw...)
	} else {
		s.b.Req = resp.AppendCommand(s.b.Req, cmd.Args...)
	}
	s.b.N++
	if s.b.N >= maxBatchCommands || len(s.b.Req) >= maxBatchBytes {
		s.flush()
		if len(s.out) >= maxPendingOut && !s.write() {
			s.quit = true
		}
	}
}

// flush sends the queued requests and appends their replies to out.
func (s *session) flush() { s.send(false) }

// flushBlocking is flush for a batch that ends in a blocking command: while
// Redis holds it, the client is watched, so that a client that goes away
// does not leave a BLPOP behind to pop an element nobody will receive.
func (s *session) flushBlocking() { s.send(true) }

func (s *session) send(blocking bool) {
	from := len(s.out)
	s.sendBatch(blocking)
	if len(s.marks) > 0 {
		s.readLayouts(from)
	}
}

func (s *session) sendBatch(blocking bool) {
	if len(s.cs.cmds) > 0 {
		s.clusterRoundTrip()
	}
	b := &s.b
	if b.N == 0 {
		return
	}
	n := b.N
	defer func() { b.Req, b.N = b.Req[:0], 0 }()
	switch {
	case s.streaming:
		if _, err := s.own.nc.Write(b.Req); err != nil {
			s.quit = true
		}
	case s.pinned():
		s.ownRoundTrip(blocking)
	default:
		conn, err := s.sharedConn()
		if err != nil {
			s.failBatch(0, n, err)
			return
		}
		b.Out, b.OKLen, b.Done, b.Err = s.out, len(s.out), 0, nil
		conn.Send(b)
		<-b.DoneCh
		s.out, b.Out = b.Out, nil
		if b.Err != nil {
			s.out = s.out[:b.OKLen]
			s.failBatch(b.Done, n, b.Err)
		}
	}
}

// failBatch answers requests done..n of a failed batch with an error.
func (s *session) failBatch(done, n int, err error) {
	msg := upstream.ErrorText(err)
	for i := done; i < n; i++ {
		s.out = resp.AppendError(s.out, msg)
	}
	if s.pinned() {
		// Its transaction, subscriptions or db are gone with the
		// connection; closing tells the client as Redis would.
		s.quit = true
	}
}

func (s *session) sharedConn() (*upstream.Conn, error) {
	if s.shared != nil && !s.shared.Failed() {
		return s.shared, nil
	}
	c, err := s.srv.up.Pool.Get(s.db, s.id)
	if err != nil {
		return nil, err
	}
	s.shared = c
	return c, nil
}

func (s *session) ownRoundTrip(blocking bool) {
	b := &s.b
	if _, err := s.own.nc.Write(b.Req); err != nil {
		s.failBatch(0, b.N, err)
		return
	}
	var stop func() (clientGone bool)
	if blocking {
		stop = s.watchClient()
	}
	okLen, done := len(s.out), 0
	var err error
	for ; done < b.N; done++ {
		if s.out, err = resp.ReadReply(s.own.br, s.out); err != nil {
			break
		}
		okLen = len(s.out)
	}
	if gone := stop != nil && stop(); gone && err != nil {
		// The client left while Redis held its command, and we dropped
		// it: close quietly, as Redis would. A reply that came first is
		// still delivered (a half-closed client reads it).
		s.out, s.quit = s.out[:okLen], true
		return
	}
	if err != nil {
		s.out = s.out[:okLen]
		s.failBatch(done, b.N, err)
	}
}

// watchClient reads from the client while a blocking command waits
// upstream. Input is kept for the parser; a closed client closes the
// upstream connection, which makes Redis drop the blocked command. The
// returned func stops watching and reports whether the client left.
func (s *session) watchClient() (stop func() (clientGone bool)) {
	done := make(chan struct{})
	var data []byte
	var gone bool
	own := s.own.nc
	limit := int(s.srv.config().Limits.QueryBuffer)
	if !s.srv.closing.Load() {
		// Redis's timeout spares blocked clients; a deadline would also
		// end the watch early and leave the command behind if the client
		// then left. (Shutdown's deadline is kept: its stop aborts us.)
		s.nc.SetReadDeadline(time.Time{})
	}
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for len(data) < limit {
			n, err := s.nc.Read(buf)
			data = append(data, buf[:n]...)
			if err != nil {
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					gone = true
					own.Close()
				}
				return
			}
		}
	}()
	return func() bool {
		s.nc.SetReadDeadline(time.Unix(1, 0))
		<-done
		s.nc.SetReadDeadline(time.Time{})
		if len(data) > 0 {
			s.rd.Feed(data)
		}
		return gone
	}
}

// pin gives the client an upstream connection of its own to p's node, in
// its db and with its name, after every request sent so far is answered.
func (s *session) pin(p *upstream.Pool) bool {
	s.flush()
	nc, br, err := p.Dial(s.db)
	if err == nil && len(s.name) > 0 {
		nc.SetDeadline(time.Now().Add(p.DialTimeout()))
		req := resp.AppendCommand(nil, []byte("CLIENT"), []byte("SETNAME"), s.name)
		if _, err = nc.Write(req); err == nil {
			_, err = resp.ReadReply(br, nil)
		}
		nc.SetDeadline(time.Time{})
		if err != nil {
			nc.Close()
		}
	}
	if err != nil {
		s.out = resp.AppendError(s.out, upstream.ErrorText(err))
		return false
	}
	s.setOwn(&ownConn{nc: nc, br: br})
	return true
}

// startStream switches to stream mode: replies written so far go out first,
// then relay owns the way from Redis to the client.
func (s *session) startStream() {
	s.flush()
	if !s.write() {
		s.quit = true
	}
	s.streaming = true
	s.nc.SetReadDeadline(time.Time{}) // Redis's timeout spares subscribers too
	s.relayDone = make(chan struct{})
	go s.relay(s.own)
}

// streamMark is a reply relay looks out for: the reply to a request the
// session sent to learn when everything before it has reached the client.
type streamMark struct {
	frame []byte        // the reply
	pass  bool          // pass it on (RESET's +RESET) or drop it (the proxy's own)
	stop  bool          // the stream ends with it
	seen  chan struct{} // closed when relay got there
	// alt is another reply that ends the wait, but not the stream: Redis
	// refusing the request because the client is still subscribed.
	alt    []byte
	altHit bool // set by relay before seen is closed
}

// streamSync sends req, whose reply is m's frame, and waits until relay has
// passed on every reply before it; false when the stream broke first.
func (s *session) streamSync(req *resp.Command, m *streamMark) bool {
	m.seen = make(chan struct{})
	s.mark.Store(m)
	s.forward(req)
	s.flush()
	select {
	case <-m.seen:
	case <-s.relayDone:
		select {
		case <-m.seen: // it stopped there, as m asked
		default:
			return false
		}
	}
	if m.stop && !m.altHit {
		<-s.relayDone
	}
	return true
}

func (s *session) relay(own *ownConn) {
	defer close(s.relayDone)
	var buf []byte
	for {
		start := len(buf)
		var err error
		buf, err = resp.ReadReply(own.br, buf)
		if m := s.mark.Load(); err == nil && m != nil {
			frame := buf[start:]
			m.altHit = m.alt != nil && bytes.Equal(frame, m.alt)
			if m.altHit || bytes.Equal(frame, m.frame) {
				if !m.pass || m.altHit {
					buf = buf[:start]
				}
				buf, err = s.relayWrite(buf)
				s.mark.Store(nil)
				close(m.seen)
				if m.stop && !m.altHit || err != nil {
					return
				}
				continue
			}
		}
		if err == nil && own.br.Buffered() > 0 && len(buf) < maxPendingOut {
			continue // more frames are here already: write them together
		}
		if len(buf) > 0 {
			var werr error
			if buf, werr = s.relayWrite(buf); werr != nil {
				err = werr
			}
		}
		if err != nil {
			// Redis closed (QUIT) or failed: the client's subscriptions
			// are gone, so is the client's connection.
			if !s.draining.Load() {
				s.w.wait() // what Redis said last (QUIT's +OK) goes out first
				s.nc.Close()
			}
			return
		}
	}
}

// relayWrite passes frames from Redis on to the client, after whatever the
// session wrote before, and returns a buffer to reuse.
func (s *session) relayWrite(buf []byte) ([]byte, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	kept, err := s.w.write(buf)
	if kept {
		return nil, err
	}
	return buf[:0], err
}

// drainStream lets Redis answer, and relay pass on, everything sent before
// the session ends with an error of its own, which must come last: it
// half-closes the upstream connection, so Redis replies, then closes.
func (s *session) drainStream() {
	if !s.streaming {
		return
	}
	s.draining.Store(true)
	if tc, ok := s.own.nc.(*net.TCPConn); ok && tc.CloseWrite() == nil {
		<-s.relayDone
	}
}

// upstreamOwns reports whether a command the proxy answers itself for
// clients on shared connections goes upstream instead, because Redis holds
// the state: the name and db of the client's own connection, or the
// transaction that queues it.
func (s *session) upstreamOwns(name string) bool {
	switch name {
	case "client", "select":
		return s.pinned()
	case "auth":
		return s.inMulti
	case "config":
		return s.srv.cfg.Upstream.Password == ""
	}
	return false
}

// handleStreaming relays everything in stream mode: Redis refuses most
// commands while subscribed, with its own text. Only a protocol switch is
// stopped here, since the relay speaks RESP2.
func (s *session) handleStreaming(cmd *resp.Command, name []byte) {
	switch string(name) {
	case "config":
		if s.srv.cfg.Upstream.Password != "" {
			s.replyError(msgConfigHidden)
			s.write()
			return
		}
	case "hello":
		if len(cmd.Args) > 1 && string(cmd.Args[1]) == "3" {
			// Redis must not switch this connection to RESP3. Version 4
			// gets the answer the proxy gives HELLO 3 (NOPROTO), or while
			// subscribed Redis's own refusal, in order with the rest.
			args := append([][]byte{cmd.Args[0], []byte("4")}, cmd.Args[2:]...)
			cmd = &resp.Command{Args: args}
		}
	case "reset":
		// RESET ends the stream: relay stops after Redis's +RESET, and
		// the client is back to request and reply on its own connection.
		if !s.streamSync(cmd, &streamMark{frame: []byte("+RESET\r\n"), pass: true, stop: true}) {
			s.quit = true
			return
		}
		s.endStream()
		s.resetState()
		return
	}
	if s.srv.up.Cluster != nil {
		s.clusterStreaming(cmd, string(name))
		return
	}
	s.forward(cmd)
}

// endStream returns the client to request and reply once relay stopped.
func (s *session) endStream() {
	s.streaming, s.relayDone = false, nil
	clear(s.cs.subs)
	s.cs.monitor = false
}

// local answers commands whose state the proxy keeps per client.
func (s *session) local(cmd *resp.Command, name string) {
	args := cmd.Args
	switch name {
	case "quit":
		s.reply([]byte("+OK\r\n"))
		s.quit = true
	case "auth":
		s.auth(args)
	case "hello":
		s.hello(args)
	case "select":
		s.selectDB(args)
	case "reset":
		if len(args) != 1 {
			s.replyError(wrongArity("reset"))
			return
		}
		s.flush()
		if s.own != nil {
			s.own.nc.Close()
			s.setOwn(nil)
		}
		s.resetState()
		s.reply([]byte("+RESET\r\n"))
	case "client":
		s.client(args)
	case "proxy":
		s.proxyCommand(args)
	case "config":
		if s.inMulti {
			s.replyError(msgConfigHidden)
			return
		}
		s.flush()
		mark := len(s.out)
		s.dispatch(cmd, name)
		s.flush()
		s.out = append(s.out[:mark], maskSecrets(s.out[mark:])...)
	}
}

// secretParams are the config parameters that hold the upstream password.
var secretParams = map[string]bool{"requirepass": true, "masterauth": true}

// maskSecrets hides the values of secretParams in a CONFIG GET reply (a
// flat array of name, value bulk strings), so the proxy's upstream password
// never reaches a client. Other replies come back unchanged.
func maskSecrets(reply []byte) []byte {
	br := bufio.NewReader(bytes.NewReader(reply))
	head, err := br.ReadSlice('\n')
	if err != nil || head[0] != '*' {
		return reply
	}
	out := append([]byte(nil), head...)
	secret := false
	for i := 0; ; i++ {
		elem, err := resp.ReadReply(br, nil)
		if err != nil {
			return out
		}
		if i%2 == 1 && secret {
			elem = resp.AppendBulk(nil, []byte("******"))
		}
		v, _ := resp.BulkValue(elem)
		secret = i%2 == 0 && secretParams[strings.ToLower(string(v))]
		out = append(out, elem...)
	}
}

func (s *session) resetState() {
	s.endTx()
	s.db, s.name, s.shared = 0, nil, nil
	s.authed = s.srv.config().Password == ""
	s.rd.SetAuthRequired(!s.authed)
}

func wrongArity(name string) string {
	return "ERR wrong number of arguments for '" + name + "' command"
}

// checkAuth authenticates as Redis's default user with the proxy's
// password; with no password set, the default user takes any password.
func (s *session) checkAuth(user, pass []byte) bool {
	want := string(s.srv.config().Password)
	if string(user) != "default" {
		return false
	}
	if want == "" || subtle.ConstantTimeCompare(pass, []byte(want)) == 1 {
		s.authed = true
		s.rd.SetAuthRequired(false)
		return true
	}
	return false
}

// auth answers AUTH as Redis 7.0 does.
func (s *session) auth(args [][]byte) {
	switch {
	case len(args) < 2:
		s.replyError(wrongArity("auth"))
	case len(args) > 3:
		s.replyError(msgSyntax)
	case len(args) == 2 && s.srv.config().Password == "":
		s.replyError(msgNoPassword)
	case len(args) == 2 && s.checkAuth([]byte("default"), args[1]),
		len(args) == 3 && s.checkAuth(args[1], args[2]):
		s.reply([]byte("+OK\r\n"))
	default:
		s.replyError(msgWrongPass)
	}
}

// hello answers HELLO as Redis 7.0 does for RESP2. The proxy relays RESP2
// only, so "HELLO 3" gets NOPROTO, from which clients fall back to RESP2.
// The server fields come from Redis; the id is the proxy's client id.
func (s *session) hello(args [][]byte) {
	if msg := helloVersionError(args); msg != "" {
		s.replyError(msg)
		return
	}
	if s.inMulti {
		s.forward(&resp.Command{Args: args}) // Redis queues it
		return
	}
	next := min(len(args), 2)
	var user, pass, name []byte
	for j := next; j < len(args); j++ {
		more := len(args) - 1 - j
		switch {
		case bytes.EqualFold(args[j], []byte("auth")) && more >= 2:
			user, pass = args[j+1], args[j+2]
			j += 2
		case bytes.EqualFold(args[j], []byte("setname")) && more >= 1:
			name = args[j+1]
			j++
		default:
			s.replyError("ERR Syntax error in HELLO option '" + string(args[j]) + "'")
			return
		}
	}
	if user != nil && !s.checkAuth(user, pass) {
		s.replyError(msgWrongPass)
		return
	}
	if !s.authed {
		s.replyError(msgHelloNoAuth)
		return
	}
	if name != nil && !s.setName(name) {
		return
	}
	s.flush()
	if s.pinned() {
		// The client's own connection keeps its name and id upstream.
		hello := [][]byte{[]byte("HELLO"), []byte("2")}
		if name != nil {
			hello = append(hello, []byte("SETNAME"), name)
		}
		s.forward(&resp.Command{Args: hello})
		return
	}
	mark := len(s.out)
	s.dispatch(&resp.Command{Args: [][]byte{[]byte("HELLO"), []byte("2")}}, "hello")
	s.flush()
	reply := patchHelloID(s.out[mark:], s.id)
	if s.srv.up.Cluster != nil {
		reply = standaloneHello(reply)
	}
	s.out = append(s.out[:mark], reply...)
}

// helloVersionError checks HELLO's protocol version: the proxy relays RESP2
// only, so 3 gets NOPROTO, from which clients fall back to RESP2.
func helloVersionError(args [][]byte) string {
	if len(args) < 2 {
		return ""
	}
	v, ok := resp.ParseInt(args[1])
	switch {
	case !ok:
		return msgBadProtover
	case v != 2:
		return msgNoProto
	}
	return ""
}

// patchHelloID replaces the upstream connection's id in a HELLO reply with
// the client's own, so HELLO and CLIENT ID agree.
func patchHelloID(reply []byte, id uint64) []byte {
	const field = "$2\r\nid\r\n:"
	i := bytes.Index(reply, []byte(field))
	if reply[0] != '*' || i < 0 {
		return reply
	}
	start := i + len(field)
	end := start + bytes.IndexByte(reply[start:], '\r')
	patched := append([]byte(nil), reply[:start]...)
	patched = strconv.AppendUint(patched, id, 10)
	return append(patched, reply[end:]...)
}

// standaloneHello makes the HELLO replies in reply from a cluster node say
// what clients of the proxy see: one standalone server.
func standaloneHello(reply []byte) []byte {
	return bytes.ReplaceAll(reply, []byte("$4\r\nmode\r\n$7\r\ncluster\r\n"), []byte("$4\r\nmode\r\n$10\r\nstandalone\r\n"))
}

// selectDB answers SELECT by moving the client to the shared connections of
// the new db; Redis itself checks the index when the first one is dialed.
// ownSelect follows a SELECT sent on the client's own connection: the
// session's db is what Redis took, once it answers. Queued in MULTI, it
// takes effect at EXEC, if at all: until the client selects again, the db
// is unknown (-1), and hot keys are not served as such.
func (s *session) ownSelect(cmd *resp.Command) {
	if s.inMulti {
		s.db = -1
		return
	}
	mark := len(s.out)
	s.flush()
	if n, ok := resp.ParseInt(cmd.Args[1]); ok && string(s.out[mark:]) == "+OK\r\n" {
		s.db = int(n)
	}
}

func (s *session) selectDB(args [][]byte) {
	if len(args) != 2 {
		s.replyError(wrongArity("select"))
		return
	}
	n, ok := resp.ParseInt(args[1])
	if !ok {
		s.replyError(msgNotInteger)
		return
	}
	if n < -1<<31 || n > 1<<31-1 {
		s.replyError(msgIntRange)
		return
	}
	if n < 0 {
		s.replyError("ERR DB index is out of range")
		return
	}
	s.flush()
	c, err := s.srv.up.Pool.Get(int(n), s.id)
	if err != nil {
		s.replyError(upstream.ErrorText(err))
		return
	}
	s.db, s.shared = int(n), c
	s.reply([]byte("+OK\r\n"))
}

// client answers CLIENT ID, SETNAME and GETNAME from the proxy's own state:
// the shared connections have no per-client name or id.
func (s *session) client(args [][]byte) {
	sub := strings.ToLower(string(args[1]))
	arity := map[string]int{"id": 2, "getname": 2, "setname": 3}[sub]
	if len(args) != arity {
		s.replyError(wrongArity("client|" + sub))
		return
	}
	switch sub {
	case "id":
		s.reply(resp.AppendInt(nil, int64(s.id)))
	case "getname":
		if len(s.name) == 0 {
			s.reply(resp.AppendNil(nil))
		} else {
			s.reply(resp.AppendBulk(nil, s.name))
		}
	case "setname":
		if s.setName(args[2]) {
			s.reply([]byte("+OK\r\n"))
		}
	}
}

// setName sets the client's name, or answers why it cannot be one.
func (s *session) setName(name []byte) bool {
	if !validName(name) {
		s.replyError(msgBadName)
		return false
	}
	s.name = append(s.name[:0:0], name...)
	return true
}

// validName checks a client name as Redis does: printable ASCII without
// spaces; empty clears it.
func validName(name []byte) bool {
	for _, c := range name {
		if c < '!' || c > '~' {
			return false
		}
	}
	return true
}
