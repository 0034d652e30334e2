package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
	"github.com/tidwall/redcon"
)

// In cluster mode a client's own connection goes to one node, so it is
// used only while something holds the client there: a transaction, whose
// keys must then share one slot, as Redis Cluster requires; a blocking
// command; a subscription. Everything else is routed by slot, also
// between WATCH and MULTI: the watched keys live on the own connection's
// node, and a write to them from a shared connection still touches them.

// ownConn is an upstream connection that belongs to one client: for
// transactions, blocking commands and pub/sub. The session uses it
// synchronously, so it has no goroutines of its own.
type ownConn struct {
	nc   net.Conn
	br   *bufio.Reader
	pool *upstream.Pool // of its node
}

func (s *session) setOwn(own *ownConn) {
	s.own = own
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	s.ownNC, s.ownPool = nil, nil
	if own != nil {
		s.ownNC, s.ownPool = own.nc, own.pool
	}
}

// ownRoundTrip sends the batch on the client's own connection and reads
// its replies, within upstream.read_timeout, plus the own timeout of
// block, the command that ends the batch when it may block (BLPOP k 10:
// 10 s more; BLPOP k 0: no limit). On a timeout the client gets "ERR
// upstream timeout" and is closed, as on any failure of its connection.
func (s *session) ownRoundTrip(block *resp.Command) {
	b := &s.b
	limit, forever := s.srv.cfg.Upstream.ReadTimeout.Duration(), false
	if block != nil && !s.tx.open { // inside MULTI it is only queued
		d, f := blockTimeout(block.Args)
		limit, forever = limit+d, f
	}
	var deadline time.Time
	if !forever {
		deadline = s.own.pool.ReadDeadline(limit) // later while a CLIENT PAUSE may hold it
	}
	s.own.nc.SetDeadline(deadline)
	if block != nil && !s.tx.open {
		// Before the write: once Redis blocks it, CLIENT UNBLOCK must
		// find it blocked.
		s.setBlocked(true)
		defer s.setBlocked(false)
	}
	if _, err := s.own.nc.Write(b.Req); err != nil {
		s.failBatch(0, b.N, s.ownTimeout(err, limit))
		return
	}
	var stop func() (clientGone bool)
	if block != nil {
		stop = s.watchClient()
	}
	okLen, done := len(s.out), 0
	var err error
	for done < b.N {
		from := len(s.out)
		if s.out, err = resp.ReadReply(s.own.br, s.out); err != nil {
			err = s.ownTimeout(err, limit)
			break
		}
		s.out = s.own.pool.Refusal(s.out, okLen)
		if s.tx.open && string(s.out[okLen:]) == "+QUEUED\r\n" {
			s.tx.queued++
		}
		okLen = len(s.out)
		if !outOfBand(s.out[from:]) {
			done++
		}
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

// outOfBand reports whether reply is a RESP3 push Redis sends of its own
// accord (a message, a key invalidation), not as the reply to a request:
// it goes to the client where it came, between the replies, and counts as
// none of them. The replies to (un)subscribing are pushes too.
func outOfBand(reply []byte) bool {
	kind, ok := resp.PushKind(reply)
	return ok && !bytes.HasSuffix(bytes.ToLower(kind), []byte("subscribe"))
}

// ownTimeout is err, or the TimeoutError to give the client when err is
// the own connection's deadline passing after limit.
func (s *session) ownTimeout(err error, limit time.Duration) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return s.own.pool.TimedOut(limit)
	}
	return err
}

// blockTimeout is how long a command that may block can make Redis wait
// before it answers, by its own timeout argument as Redis 7.0 reads it:
// seconds, a decimal, for BLPOP, BRPOP, BRPOPLPUSH, BLMOVE, BZPOPMIN and
// BZPOPMAX (the last argument), BLMPOP and BZMPOP (the first);
// milliseconds for XREAD and XREADGROUP BLOCK, WAIT and WAITAOF (the
// last). forever is set for 0, which waits without a limit. Any other
// command, and a timeout Redis refuses (not a number, negative), gives 0:
// Redis answers at once.
func blockTimeout(args [][]byte) (d time.Duration, forever bool) {
	var buf [24]byte
	var arg []byte
	unit := time.Second
	switch name := string(lowerName(args[0], &buf)); name {
	case "blpop", "brpop", "brpoplpush", "blmove", "bzpopmin", "bzpopmax":
		arg = args[len(args)-1]
	case "blmpop", "bzmpop":
		if len(args) > 1 {
			arg = args[1]
		}
	case "xread", "xreadgroup", "wait", "waitaof":
		unit = time.Millisecond
		arg = args[len(args)-1]
		if name == "xread" || name == "xreadgroup" {
			arg, _ = blockOption(args)
		}
	}
	n, err := strconv.ParseFloat(string(arg), 64)
	switch {
	case err != nil || math.IsNaN(n) || n < 0 || unit == time.Millisecond && n != math.Trunc(n):
		return 0, false
	case n == 0 || n*float64(unit) >= math.MaxInt64: // none, or past any wait that matters
		return 0, true
	}
	return time.Duration(n * float64(unit)), false
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
// its db, protocol and with its name, after every request sent so far is
// answered.
func (s *session) pin(p *upstream.Pool) bool {
	s.flush()
	p = s.userPool(p)
	nc, br, err := p.DialOwn(s.upstreamKey())
	if err == nil && len(s.name) > 0 {
		if err = ownSay(nc, br, p, []byte("CLIENT"), []byte("SETNAME"), s.name); err != nil {
			nc.Close()
		}
	}
	if err != nil {
		s.out = redcon.AppendError(s.out, upstream.ErrorText(err))
		return false
	}
	s.setOwn(&ownConn{nc: nc, br: br, pool: p})
	return true
}

// ownSay sends a request of the proxy's on an own connection nc of p's
// node, within the dial timeout, and reads its reply, which the client
// never sees.
func ownSay(nc net.Conn, br *bufio.Reader, p *upstream.Pool, args ...[]byte) error {
	nc.SetDeadline(time.Now().Add(p.DialTimeout()))
	defer nc.SetDeadline(time.Time{})
	if _, err := nc.Write(resp.AppendCommand(nil, args...)); err != nil {
		return err
	}
	_, err := resp.ReadReply(br, nil)
	return err
}

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
		if s.tx.watching {
			// The watch went with the connection: the transaction it
			// guards must fail, as if a watched key had changed.
			s.tx.watching, s.tx.watchLost = false, true
		}
	}
	if !s.pin(n.Pool) {
		return false
	}
	s.cs.ownNode = n
	return true
}

// ownExchange sends cmd on the client's own connection once every request
// before it is answered, and returns where its reply starts in out. In
// cluster mode it follows the redirections of a slot that moved since the
// slot map was loaded: after MOVED, moveTo takes the client's connection
// state to the node named (its own connection; a transaction) and cmd is
// sent there; ASK is followed, with ASKING first, only when ask is set,
// since a transaction or a WATCH cannot be split between two nodes.
// blocking: cmd may block (see flushBlocking).
func (s *session) ownExchange(cmd *resp.Command, blocking, ask bool, moveTo func(*upstream.Node) bool) (mark int) {
	var block *resp.Command
	if blocking {
		block = cmd
	}
	for try := 0; ; try++ {
		s.flush()
		mark = len(s.out)
		s.forward(cmd)
		s.send(block)
		slot, addr, asking := upstream.ParseRedirect(s.out[mark:])
		if addr == "" || asking && !ask || s.quit {
			return mark
		}
		s.out = s.out[:mark]
		if try == upstream.MaxHops {
			s.out = redcon.AppendError(s.out, upstream.MsgSlotMoving)
			return mark
		}
		var n *upstream.Node
		if asking {
			n = s.srv.up.Cluster.Asked(addr)
		} else {
			n = s.srv.up.Cluster.Moved(slot, addr)
		}
		if !moveTo(n) {
			return mark
		}
		if asking {
			s.out = s.out[:s.exchange(&resp.Command{Args: [][]byte{[]byte("ASKING")}})]
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
		s.ownExchange(cmd, true, true, s.ownOn)
		s.cs.hold = false
		s.own.nc.Close()
	}
	s.setOwn(watch)
	s.cs.ownNode = watchNode
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
		reply := askAside(s.userPool(n.Pool), req)
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

// askAside sends req to p's node on a connection of its own in db 0,
// within the dial timeout, and returns the reply: a node running a script
// answers SCRIPT KILL at once, where it refuses the SELECT that a
// connection of another db begins with (-BUSY: only the commands Redis
// flags allow-busy run meanwhile).
func askAside(p *upstream.Pool, req []byte) []byte {
	replies, err := p.Ask(req, 1)
	if err != nil {
		return redcon.AppendError(nil, upstream.ErrorText(err))
	}
	return replies[0]
}

// rawOf is cmd as RESP, as it came when it came so.
func rawOf(cmd *resp.Command) []byte {
	if cmd.Raw != nil {
		return cmd.Raw
	}
	return resp.AppendCommand(nil, cmd.Args...)
}
