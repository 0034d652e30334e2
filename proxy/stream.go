package proxy

import (
	"bytes"
	"strings"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// startStream switches to stream mode: replies written so far go out first,
// then relay owns the way from Redis to the client.
func (s *session) startStream() {
	s.flush()
	if !s.write() {
		s.quit = true
	}
	s.streaming = true
	s.nc.SetReadDeadline(time.Time{}) // Redis's timeout spares subscribers too
	// A subscription is not timed: Redis sends when there is news.
	s.own.nc.SetDeadline(time.Time{})
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
	// prefix: the reply is one that starts with frame (HELLO's, whose id
	// varies). patch, if set, rewrites a reply passed on.
	prefix bool
	patch  func([]byte) []byte
}

// matches reports whether frame is the reply m waits for.
func (m *streamMark) matches(frame []byte) bool {
	if m.prefix {
		return bytes.HasPrefix(frame, m.frame)
	}
	return bytes.Equal(frame, m.frame)
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
		if err == nil {
			s.countSubs(buf[start:])
		}
		if m := s.mark.Load(); err == nil && m != nil {
			frame := buf[start:]
			m.altHit = m.alt != nil && bytes.Equal(frame, m.alt)
			if m.altHit || m.matches(frame) {
				switch {
				case !m.pass || m.altHit:
					buf = buf[:start]
				case m.patch != nil:
					buf = append(buf[:start], m.patch(bytes.Clone(frame))...)
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
	// *net.TCPConn sends a FIN, *tls.Conn (upstream.tls) a close_notify:
	// Redis takes either as the end of input.
	if cw, ok := s.own.nc.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		<-s.relayDone
	}
}

// handleStreaming relays everything in stream mode: Redis refuses most
// commands while a RESP2 client is subscribed, with its own text, and runs
// any command of a RESP3 one, its replies between the pushes.
func (s *session) handleStreaming(cmd *resp.Command, name []byte) {
	switch string(name) {
	case "config":
		if s.srv.cfg.Upstream.Password != "" {
			s.replyError(msgConfigHidden)
			s.write()
			return
		}
	case "hello":
		s.streamHello(cmd)
		return
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
	if s.tx.open {
		// A transaction opened before the stream (SUBSCRIBE queued):
		// Redis queues what follows, the proxy's own requests to sync
		// with the stream too, so everything goes as it is until EXEC.
		if name := string(name); name == "exec" || name == "discard" {
			s.endTx()
		}
		s.forward(cmd)
		return
	}
	if s.proto == resp.RESP3 && string(name) == "multi" {
		// Redis would queue what follows on the connection relay reads,
		// where the proxy syncs with the stream by requests of its own,
		// and a hot key's steps could not join the transaction.
		s.streamReplyError("ERR hotkeyproxy: MULTI is not supported while subscribed; unsubscribe first")
		return
	}
	if s.srv.up.Cluster != nil {
		s.clusterStreaming(cmd, string(name))
		return
	}
	if s.streamSubscriptions(cmd, string(name)) {
		return
	}
	if s.proto == resp.RESP3 {
		var buf [24]byte
		// The proxy answers for its clients (CLIENT, AUTH, SELECT …) and
		// rewrites hot keys; Redis must not, on the client's connection.
		if c, lname := lookup(cmd.Args, &buf); c.route == routeLocal || s.namesHotKey(cmd) {
			s.streamAside(cmd, c, lname)
			return
		}
	}
	s.forward(cmd)
}

// streamHello answers HELLO in stream mode, in order with the stream.
// Redis runs a RESP3 client's, and a RESP2 one's only when it counts no
// subscription of it (else it refuses it, with its own text), which the
// reply to a PING tells first. The session checks the options as it does
// for any client, follows the switch, and the client gets Redis's reply
// with its proxy id.
func (s *session) streamHello(cmd *resp.Command) {
	proto, msg := helloProto(cmd.Args, s.proto)
	nonce := []byte("hotkeyproxy-stream-hello")
	m := &streamMark{frame: s.streamPing(nonce, true), alt: s.streamPing(nonce, false)}
	if !s.streamSync(&resp.Command{Args: [][]byte{[]byte("PING"), nonce}}, m) {
		s.quit = true
		return
	}
	if msg != "" || s.proto == resp.RESP2 && !m.altHit {
		s.forward(cmd) // Redis's refusal, or its error for the version
		return
	}
	name, ok := s.helloOptions(cmd.Args)
	if !ok {
		s.write()
		return
	}
	hello := [][]byte{[]byte("HELLO"), protoArg(proto)}
	if name != nil {
		hello = append(hello, []byte("SETNAME"), name)
	}
	s.switchShared(proto)
	head := append(proto.AppendMap(nil, 7), "$6\r\nserver\r\n"...)
	if !s.streamSync(&resp.Command{Args: hello}, &streamMark{frame: head, prefix: true, pass: true, patch: s.helloReply}) {
		s.quit = true
	}
}

// streamPing is Redis's reply to PING nonce on a stream: an array in
// RESP2 while subscribed, else the nonce.
func (s *session) streamPing(nonce []byte, subscribed bool) []byte {
	if s.proto == resp.RESP2 && subscribed {
		return redcon.AppendBulk(redcon.AppendBulk(redcon.AppendArray(nil, 2), []byte("pong")), nonce)
	}
	return redcon.AppendBulk(nil, nonce)
}

// endStream returns the client to request and reply once relay stopped.
func (s *session) endStream() {
	s.streaming, s.relayDone = false, nil
	clear(s.cs.subs)
	s.cs.monitor = false
}

// clusterStream starts pub/sub or MONITOR on a node: the node of the shard
// channel for SSUBSCRIBE, else the first master, which also gets every
// PUBLISH and PUBSUB, so that their counts of subscribers are right
// (cluster pub/sub delivers messages on every node, counts per node).
// UNSUBSCRIBE and the like without a subscription are answered here, as
// Redis does, so they cost no connection.
func (s *session) clusterStream(cmd *resp.Command, c *command) {
	name := c.name
	if strings.HasSuffix(name, "unsubscribe") {
		s.reply(unsubscribeReplies(s.proto, cmd.Args, name))
		return
	}
	t, slot, ok := s.clusterSlot(cmd, c)
	if !ok {
		return
	}
	n := t.Masters[0]
	if slot >= 0 {
		n = t.Node(slot)
	}
	s.flush()
	if !s.ownOn(n) {
		return
	}
	if name == "ssubscribe" {
		// The first reply says whether the map was right: a stale one
		// gets MOVED, followed here before the stream starts.
		s.cs.hold = true
		mark := s.ownExchange(cmd, false, false, s.ownOn)
		s.cs.hold = false
		if !bytes.HasPrefix(s.out[mark:], s.proto.AppendPush(nil, 3)) {
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
func unsubscribeReplies(p resp.Proto, args [][]byte, name string) []byte {
	one := func(b []byte, ch []byte) []byte {
		b = p.AppendPush(b, 3)
		b = redcon.AppendBulk(b, []byte(name))
		if ch == nil {
			b = p.AppendNull(b)
		} else {
			b = redcon.AppendBulk(b, ch)
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

// clusterStreaming sends a command of a streaming client to its node. The
// proxy keeps count of the subscriptions, as Redis does (sets of channels,
// patterns, shard channels), so that it knows when the last one is gone:
// the client then leaves the stream and its commands are routed by slot
// again. While subscribed, a command with keys is refused here, in order
// with the stream: its node would answer MOVED first.
func (s *session) clusterStreaming(cmd *resp.Command, name string) {
	cs := &s.cs
	if isShardSub(name) && !s.shardChannelsHere(cmd.Args[1:]) {
		s.streamReplyError(rediserr.CrossSlot)
		return
	}
	if s.streamSubscriptions(cmd, name) {
		return
	}
	if name == "monitor" {
		cs.monitor = true
	}
	var buf [24]byte
	if c, lname := lookup(cmd.Args, &buf); s.proto == resp.RESP3 && name != "ping" && (c.route == routeShared || c.route == routeLocal) {
		s.streamAside(cmd, c, lname)
		return
	}
	if _, keys, err := s.srv.up.Cluster.Current(); err == nil && len(cs.subs) > 0 {
		if len(s.keyPositions(keys, cmd)) > 0 {
			s.streamReplyError(rediserr.Subscribed(name))
			return
		}
	}
	s.forward(cmd)
}

// isShardSub reports whether name is SSUBSCRIBE or SUNSUBSCRIBE.
func isShardSub(name string) bool { return name == "ssubscribe" || name == "sunsubscribe" }

// streamSubscriptions sends a (un)subscribe command of a streaming
// client, and keeps count of its subscriptions as Redis does (sets of
// channels, patterns, shard channels), so that it knows when the last one
// is gone: the client then leaves the stream, and its commands are
// handled (hot keys, CLIENT, routing) as any client's again. False when
// cmd is no such command.
func (s *session) streamSubscriptions(cmd *resp.Command, name string) bool {
	cs := &s.cs
	switch name {
	case "subscribe", "psubscribe", "ssubscribe", "unsubscribe", "punsubscribe", "sunsubscribe":
	default:
		return false
	}
	unsub := strings.HasSuffix(name, "unsubscribe")
	kind := "c" // subscribe, unsubscribe
	if name[0] == 'p' || isShardSub(name) {
		kind = name[:1]
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
	if len(cs.subs) == 0 && !cs.monitor && !s.monitoring && !s.tx.open {
		s.tryEndStream()
	}
	return true
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
		if t.Node(int(slot)) != s.cs.ownNode && !s.followsSlot(slot) {
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
	if !s.streamSync(&resp.Command{Args: [][]byte{[]byte("PING"), nonce}}, &streamMark{frame: s.streamPing(nonce, true)}) {
		s.quit = true
		return
	}
	s.replyError(msg)
	s.write()
}

// streamAside runs a command of a RESP3 subscriber, which Redis 7.0
// would run, as it runs for a client that is not subscribed, once every
// reply before it reached the client: in cluster mode by slot on the
// shared connections or answered here (the node the client streams from
// may not serve its keys, and must not be seen as a cluster node); on a
// hot key, with its buckets. c is a command that needs no connection of
// its own.
func (s *session) streamAside(cmd *resp.Command, c *command, name []byte) {
	nonce := []byte("hotkeyproxy-stream-aside")
	if !s.streamSync(&resp.Command{Args: [][]byte{[]byte("PING"), nonce}}, &streamMark{frame: s.streamPing(nonce, true)}) {
		s.quit = true
		return
	}
	// It must not go on the connection relay reads: with s.own hidden,
	// route takes the shared connections (abort still finds it in ownNC).
	own := s.own
	s.streaming, s.own = false, nil
	s.run(cmd, c, name)
	s.flush()
	s.streaming, s.own = true, own
	s.write()
}

// namesHotKey reports whether cmd names a hot key, by the command table.
func (s *session) namesHotKey(cmd *resp.Command) bool {
	e := s.srv.hot
	if s.db != 0 || !e.Any() {
		return false
	}
	table := s.srv.up.KeyTable()
	if table == nil {
		return false
	}
	for _, i := range s.keyPositions(table, cmd) {
		if e.Hot(cmd.Args[i]) {
			return true
		}
	}
	return false
}

// tryEndStream ends the stream once the proxy counts no subscription
// left: an ECHO comes back when Redis agrees; while Redis still counts
// one, it refuses the ECHO and the stream goes on.
func (s *session) tryEndStream() {
	nonce := []byte("hotkeyproxy-stream-end")
	m := &streamMark{
		frame: redcon.AppendBulk(nil, nonce),
		stop:  true,
		alt:   redcon.AppendError(nil, rediserr.Subscribed("echo")),
	}
	if !s.streamSync(&resp.Command{Args: [][]byte{[]byte("ECHO"), nonce}}, m) {
		s.quit = true
		return
	}
	if !m.altHit {
		s.endStream()
	}
}
