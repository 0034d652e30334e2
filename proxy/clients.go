package proxy

import (
	"bytes"
	"cmp"
	"crypto/tls"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
)

// The CLIENT family is about the proxy's own clients: CLIENT LIST shows
// them, CLIENT KILL closes them, CLIENT UNBLOCK and CLIENT TRACKING …
// REDIRECT take their ids. Redis's ids of the upstream connections never
// reach a client: where Redis needs one (UNBLOCK, REDIRECT), the proxy
// finds the Redis id of the client's own connection by its address.

// clientInfo is what other sessions may read of a session: CLIENT LIST's
// fields, published by the session itself (see publish), and by its relay
// for the subscription counts.
type clientInfo struct {
	// Set when the session is made, then only read.
	addr, laddr string // as Redis prints them: ip:port, [ipv6]:port, path:0
	fd          int    // the proxy's socket for the client; -1 when unknown
	created     int64  // unix seconds
	unix        bool   // a client of a Unix socket

	mu sync.Mutex // guards the rest
	clientShown
}

// clientShown is the part of clientInfo that changes.
type clientShown struct {
	name      string
	db        int
	user      string // the ACL user; "" is default
	proto     int
	cmd       string // the last command, as Redis names it: "get", "client|list", "NULL"
	lastIO    int64  // unix seconds of the last command read
	multi     int    // commands queued in a transaction; -1 outside one
	sub, psub int    // subscriptions: channels, patterns
	ssub      int    // shard channels
	monitor   bool
	blocked   bool  // a blocking command waits upstream
	noEvict   bool  // CLIENT NO-EVICT ON
	tracking  bool  // CLIENT TRACKING ON
	bcast     bool  // … BCAST
	redir     int64 // … REDIRECT: a proxy id; 0 without
}

// newClientInfo is the fixed part of the info of the client on nc.
func newClientInfo(nc net.Conn) *clientInfo {
	ci := &clientInfo{addr: addrString(nc.RemoteAddr()), laddr: addrString(nc.LocalAddr()), fd: -1, created: time.Now().Unix()}
	ci.multi, ci.proto = -1, 2
	ci.fd = connFD(nc)
	_, ci.unix = nc.LocalAddr().(*net.UnixAddr)
	if ci.unix {
		ci.addr = ci.laddr // Redis shows the socket's path for both
	}
	return ci
}

// connFD is the file descriptor of nc's socket (under TLS, of the
// connection beneath), or -1.
func connFD(nc net.Conn) int {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	raw.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// addrString is a client address as Redis prints it.
func addrString(a net.Addr) string {
	if u, ok := a.(*net.UnixAddr); ok {
		return u.Name + ":0"
	}
	if a == nil {
		return "?:0"
	}
	return a.String()
}

// publish copies what CLIENT LIST shows of the session into its info, for
// other sessions to read: once per batch of commands, before a blocking
// command, and before the session lists clients itself.
func (s *session) publish() {
	ci := s.info
	ci.mu.Lock()
	defer ci.mu.Unlock()
	if ci.name != string(s.name) {
		ci.name = string(s.name)
	}
	ci.db, ci.user, ci.proto, ci.cmd = s.db, s.user, int(s.proto), s.lastCmd
	ci.lastIO = s.lastIO
	ci.multi = -1
	if s.tx.open {
		ci.multi = s.tx.queued
	}
	ci.monitor = s.streaming && s.cs.monitor || s.monitoring
}

// noEvicting reports whether the client sent CLIENT NO-EVICT ON.
func (ci *clientInfo) noEvicting() bool {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	return ci.noEvict
}

// clientType is a client's type for CLIENT LIST TYPE and CLIENT KILL TYPE:
// pubsub while it has a subscription, else normal (a MONITOR client too,
// as Redis shows it).
func (c *clientShown) clientType() string {
	if c.sub+c.psub+c.ssub > 0 {
		return "pubsub"
	}
	return "normal"
}

// clientTypeName parses a client type as Redis 7.0 does ("slave" is
// "replica"); ok is false for a name it does not know.
func clientTypeName(name []byte) (t string, ok bool) {
	switch t = strings.ToLower(string(name)); t {
	case "normal", "master", "replica", "pubsub":
		return t, true
	case "slave":
		return "replica", true
	}
	return "", false
}

// appendClientLine appends a client's line of CLIENT LIST, without the
// newline, in Redis 7.0's format (catClientInfoString): the same fields
// in the same order. What the proxy does not keep per client shows as a
// Redis client idle for a while shows it: qbuf=0 qbuf-free=0 argv-mem=0
// multi-mem=0 rbs=1024 rbp=0 obl=0 oll=0 omem=0 tot-mem=1800 events=r; no
// d flag (a watched key touched) and no R (a broken redirect).
func appendClientLine(b []byte, id uint64, ci *clientInfo, now int64) []byte {
	ci.mu.Lock()
	c := ci.clientShown
	ci.mu.Unlock()
	b = append(b, "id="...)
	b = strconv.AppendUint(b, id, 10)
	b = append(b, " addr="...)
	b = append(b, ci.addr...)
	b = append(b, " laddr="...)
	b = append(b, ci.laddr...)
	b = append(b, " fd="...)
	b = strconv.AppendInt(b, int64(ci.fd), 10)
	b = append(b, " name="...)
	b = append(b, c.name...)
	b = append(b, " age="...)
	b = strconv.AppendInt(b, now-ci.created, 10)
	b = append(b, " idle="...)
	b = strconv.AppendInt(b, now-c.lastIO, 10)
	b = append(b, " flags="...)
	b = c.appendFlags(b, ci.unix)
	b = append(b, " db="...)
	b = strconv.AppendInt(b, int64(c.db), 10)
	for _, f := range []struct {
		name string
		n    int
	}{{" sub=", c.sub}, {" psub=", c.psub}, {" ssub=", c.ssub}, {" multi=", c.multi}} {
		b = append(b, f.name...)
		b = strconv.AppendInt(b, int64(f.n), 10)
	}
	b = append(b, " qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=1024 rbp=0 obl=0 oll=0 omem=0 tot-mem=1800 events=r cmd="...)
	b = append(b, c.cmd...)
	b = append(b, " user="...)
	b = append(b, cmp.Or(c.user, "default")...)
	b = append(b, " redir="...)
	redir := int64(-1)
	if c.tracking {
		redir = c.redir
	}
	b = strconv.AppendInt(b, redir, 10)
	b = append(b, " resp="...)
	return strconv.AppendInt(b, int64(c.proto), 10)
}

// appendFlags appends the flags field, letters in Redis's order.
func (c *clientShown) appendFlags(b []byte, unix bool) []byte {
	n := len(b)
	for _, f := range []struct {
		on   bool
		flag byte
	}{
		{c.monitor, 'O'},
		{c.sub+c.psub+c.ssub > 0, 'P'},
		{c.multi >= 0, 'x'},
		{c.blocked, 'b'},
		{c.tracking, 't'},
		{c.tracking && c.bcast, 'B'},
		{unix, 'U'},
		{c.noEvict, 'e'},
	} {
		if f.on {
			b = append(b, f.flag)
		}
	}
	if len(b) == n {
		b = append(b, 'N')
	}
	return b
}

// sessionsByID is every session, by id: the order of CLIENT LIST. A
// session killed is gone from it at once, as from Redis's list, though its
// goroutine may not have ended yet.
func (srv *Server) sessionsByID() []*session {
	srv.mu.Lock()
	list := make([]*session, 0, len(srv.sessions))
	for sess := range srv.sessions {
		if !sess.killed.Load() {
			list = append(list, sess)
		}
	}
	srv.mu.Unlock()
	slices.SortFunc(list, func(a, b *session) int { return cmpUint(a.id, b.id) })
	return list
}

// session is the session with the proxy id id, or nil (killed ones too).
func (srv *Server) session(id uint64) *session {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for sess := range srv.sessions {
		if sess.id == id && !sess.killed.Load() {
			return sess
		}
	}
	return nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ownAddr is the address of the client's own connection as Redis shows it
// (its addr field) and the pool of its node; ok is false without one.
func (s *session) ownAddr() (addr string, p *upstream.Pool, ok bool) {
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	if s.ownNC == nil {
		return "", nil, false
	}
	return addrString(s.ownNC.LocalAddr()), s.ownPool, true
}

var clientListReq = resp.AppendCommand(nil, []byte("CLIENT"), []byte("LIST"))

// redisID is the id Redis gave the connection whose address is addr,
// found in CLIENT LIST on a connection of its own to p's node; 0 when
// Redis lists no such connection.
func redisID(p *upstream.Pool, addr string) (int64, error) {
	replies, err := p.Ask(clientListReq, 1)
	if err != nil {
		return 0, err
	}
	if resp.IsError(replies[0]) {
		return 0, upstream.RedisError(replies[0][1 : len(replies[0])-2])
	}
	list, _ := resp.BulkValue(replies[0])
	for line := range bytes.SplitSeq(list, []byte("\n")) {
		if !bytes.Contains(line, []byte(" addr="+addr+" ")) {
			continue
		}
		id, _, _ := bytes.Cut(bytes.TrimPrefix(line, []byte("id=")), []byte(" "))
		n, _ := resp.ParseInt(id)
		return n, nil
	}
	return 0, nil
}

// subKinds are the subscription replies, by the kind Redis names first in
// them; each ends with the count its kind of subscription comes to.
var subKinds = []string{"subscribe", "unsubscribe", "psubscribe", "punsubscribe", "ssubscribe", "sunsubscribe"}

// countSubs follows the client's subscription counts in a frame Redis sent
// on its own connection: a (un)subscribe reply gives the channels and
// patterns together ("count" in Redis 7.0), or the shard channels alone,
// so the kind it names is that count less the other kind.
func (s *session) countSubs(frame []byte) {
	if len(frame) < 16 || frame[0] != '*' && frame[0] != '>' || string(frame[1:5]) != "3\r\n$" {
		return
	}
	rest := frame[5:]
	for _, kind := range subKinds {
		head := strconv.Itoa(len(kind)) + "\r\n" + kind + "\r\n"
		if !bytes.HasPrefix(rest, []byte(head)) {
			continue
		}
		rest = rest[len(head):]
		rest = rest[resp.FrameLen(rest):] // the channel
		n, ok := resp.IntValue(rest)
		if !ok {
			return
		}
		ci := s.info
		ci.mu.Lock()
		switch kind {
		case "subscribe", "unsubscribe":
			ci.sub = int(n) - ci.psub
		case "psubscribe", "punsubscribe":
			ci.psub = int(n) - ci.sub
		default:
			ci.ssub = int(n)
		}
		ci.mu.Unlock()
		return
	}
}
