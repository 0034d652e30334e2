package proxy

import (
	"bytes"
	"cmp"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
	"github.com/tidwall/redcon"
)

// Redis 7.0's replies to the CLIENT subcommands the proxy answers.
const (
	msgNoSuchClient   = "ERR No such client"
	msgInvalidID      = "ERR Invalid client ID"
	msgKillID         = "ERR client-id should be greater than 0"
	msgUnblockReason  = "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"
	msgMaxAge         = "ERR maxage is not an integer or out of range"
	msgMaxAgePositive = "ERR maxage should be greater than 0"
	msgCachingOff     = "ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled"
	// msgRedirUnsubscribed: Redis sends a RESP2 client's invalidations to
	// another connection, which through the proxy must be the target's own:
	// it has one once it subscribed (to __redis__:invalidate).
	msgRedirUnsubscribed = "ERR hotkeyproxy: the client to redirect to must subscribe to __redis__:invalidate first"
)

// replyMode is CLIENT REPLY's state.
type replyMode uint8

const (
	replyOn   replyMode = iota
	replyOff            // no command's reply is sent
	replySkip           // the next command's reply is not sent
)

// tracking is the client's CLIENT TRACKING state, as Redis last took it
// on the client's own connection.
type tracking struct {
	on    bool
	bcast bool
	redir int64 // the proxy id of the client its invalidations go to; 0: none
}

// subcommandError is Redis's reply to a CLIENT subcommand with the wrong
// number of arguments that its arity does not catch.
func subcommandError(args [][]byte) string {
	return "ERR unknown subcommand or wrong number of arguments for '" + string(args[1]) + "'. Try CLIENT HELP."
}

// clientAbout answers the CLIENT subcommands about the proxy's clients, as
// Redis 7.0 does about its own (arities as its command table has them).
func (s *session) clientAbout(args [][]byte, sub string) {
	n := len(args)
	switch {
	case sub == "no-touch":
		// Redis 7.2's; 7.0 does not know it.
		s.replyError(rediserr.UnknownSubcommand(string(args[1]), "CLIENT"))
		return
	case n != 2 && (sub == "id" || sub == "info" || sub == "getredir" || sub == "trackinginfo"),
		n != 3 && (sub == "reply" || sub == "no-evict" || sub == "caching"),
		n < 3 && (sub == "kill" || sub == "unblock"):
		s.replyError(rediserr.WrongArity("client|" + sub))
		return
	}
	switch sub {
	case "id":
		s.reply(redcon.AppendInt(nil, int64(s.id)))
	case "info":
		s.flush()
		s.publish()
		line := appendClientLine(nil, s.id, s.info, time.Now().Unix())
		s.reply(s.proto.AppendVerbatim(nil, append(line, '\n')))
	case "list":
		s.clientList(args)
	case "kill":
		s.clientKill(args)
	case "unblock":
		s.clientUnblock(args)
	case "reply":
		s.clientReply(args[2])
	case "no-evict":
		switch strings.ToLower(string(args[2])) {
		case "on", "off":
			s.info.mu.Lock()
			s.info.noEvict = strings.EqualFold(string(args[2]), "on")
			s.info.mu.Unlock()
			s.reply([]byte("+OK\r\n"))
		default:
			s.replyError(rediserr.Syntax)
		}
	case "caching":
		s.replyError(msgCachingOff) // tracking, the client has its own connection
	case "getredir":
		redir := int64(-1)
		if s.track.on {
			redir = s.track.redir
		}
		s.reply(redcon.AppendInt(nil, redir))
	case "trackinginfo":
		s.trackingInfo()
	}
}

// clientList answers CLIENT LIST [TYPE type | ID id …].
func (s *session) clientList(args [][]byte) {
	var typ string
	var ids []uint64
	switch {
	case len(args) == 4 && bytes.EqualFold(args[2], []byte("type")):
		t, ok := clientTypeName(args[3])
		if !ok {
			s.replyError("ERR Unknown client type '" + string(args[3]) + "'")
			return
		}
		typ = t
	case len(args) > 3 && bytes.EqualFold(args[2], []byte("id")):
		for _, a := range args[3:] {
			id, ok := resp.ParseInt(a)
			if !ok {
				s.replyError(msgInvalidID)
				return
			}
			ids = append(ids, uint64(id))
		}
	case len(args) != 2:
		s.replyError(rediserr.Syntax)
		return
	}
	s.flush()
	s.publish()
	now := time.Now().Unix()
	var out []byte
	if ids != nil {
		for _, id := range ids {
			if sess := s.srv.session(id); sess != nil {
				out = append(appendClientLine(out, id, sess.info, now), '\n')
			}
		}
	} else {
		for _, sess := range s.srv.sessionsByID() {
			if typ != "" && sess.info.typeOf() != typ {
				continue
			}
			out = append(appendClientLine(out, sess.id, sess.info, now), '\n')
		}
	}
	s.reply(s.proto.AppendVerbatim(nil, out))
}

// typeOf is the client's type (clientShown.clientType).
func (ci *clientInfo) typeOf() string {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	return ci.clientType()
}

// killFilter is what CLIENT KILL matches clients by; the zero value of a
// field (nil for a string) matches every client.
type killFilter struct {
	id          uint64
	addr, laddr *string
	typ         string
	user        *string
	maxAge      int64
	skipMe      bool
}

// clientKill answers CLIENT KILL addr:port (+OK, or "No such client"; the
// client may kill itself) and CLIENT KILL filter value … (the number
// killed; SKIPME yes by default), with Redis 7.0's filters and errors, and
// Redis 7.4's MAXAGE (clients connected for at least that many seconds).
// A client killed is closed at once, as Redis frees it; the client itself
// is closed after this reply.
func (s *session) clientKill(args [][]byte) {
	f, ok := s.killFilter(args)
	if !ok {
		return
	}
	s.flush()
	s.publish()
	now := time.Now().Unix()
	killed, self := 0, false
	for _, sess := range s.srv.sessionsByID() {
		if !f.matches(sess, now) || sess == s && f.skipMe {
			continue
		}
		killed++
		if sess == s {
			self = true
		} else {
			sess.kill()
		}
	}
	switch {
	case len(args) > 3:
		s.reply(redcon.AppendInt(nil, int64(killed)))
	case killed == 0:
		s.replyError(msgNoSuchClient)
	default:
		s.reply([]byte("+OK\r\n"))
	}
	s.quit = s.quit || self
}

// kill closes the client and its own upstream connection, from another
// session: it leaves the list of clients at once.
func (s *session) kill() {
	s.killed.Store(true)
	s.abort()
}

// killFilter parses CLIENT KILL's arguments, or answers why it cannot.
func (s *session) killFilter(args [][]byte) (f killFilter, ok bool) {
	if len(args) == 3 {
		addr := string(args[2])
		return killFilter{addr: &addr}, true
	}
	f.skipMe = true
	for i := 2; i < len(args); i += 2 {
		if i+1 >= len(args) {
			s.replyError(rediserr.Syntax)
			return f, false
		}
		v := args[i+1]
		switch strings.ToLower(string(args[i])) {
		case "id":
			n, ok := resp.ParseInt(v)
			if !ok || n < 1 {
				s.replyError(msgKillID)
				return f, false
			}
			f.id = uint64(n)
		case "maxage":
			n, ok := resp.ParseInt(v)
			switch {
			case !ok:
				s.replyError(msgMaxAge)
				return f, false
			case n <= 0:
				s.replyError(msgMaxAgePositive)
				return f, false
			}
			f.maxAge = n
		case "type":
			t, ok := clientTypeName(v)
			if !ok {
				s.replyError("ERR Unknown client type '" + string(v) + "'")
				return f, false
			}
			f.typ = t
		case "addr":
			f.addr = new(string(v))
		case "laddr":
			f.laddr = new(string(v))
		case "user":
			if !s.userExists(v) {
				s.replyError("ERR No such user '" + string(v) + "'")
				return f, false
			}
			f.user = new(string(v))
		case "skipme":
			switch strings.ToLower(string(v)) {
			case "yes":
				f.skipMe = true
			case "no":
				f.skipMe = false
			default:
				s.replyError(rediserr.Syntax)
				return f, false
			}
		default:
			s.replyError(rediserr.Syntax)
			return f, false
		}
	}
	return f, true
}

// matches reports whether the filter selects sess.
func (f *killFilter) matches(sess *session, now int64) bool {
	ci := sess.info
	ci.mu.Lock()
	defer ci.mu.Unlock()
	switch {
	case f.addr != nil && ci.addr != *f.addr,
		f.laddr != nil && ci.laddr != *f.laddr,
		f.typ != "" && ci.clientType() != f.typ,
		f.id != 0 && sess.id != f.id,
		f.user != nil && cmp.Or(ci.user, "default") != *f.user,
		f.maxAge != 0 && now-ci.created < f.maxAge:
		return false
	}
	return true
}

// userExists reports whether Redis knows the ACL user name: default, a
// user a client of the proxy is authenticated as, or one ACL GETUSER finds.
func (s *session) userExists(name []byte) bool {
	if string(name) == "default" {
		return true
	}
	for _, sess := range s.srv.sessionsByID() {
		sess.info.mu.Lock()
		found := sess.info.user == string(name)
		sess.info.mu.Unlock()
		if found {
			return true
		}
	}
	mark := s.exchange(&resp.Command{Args: [][]byte{[]byte("ACL"), []byte("GETUSER"), name}})
	reply := s.out[mark:]
	s.out = s.out[:mark]
	return len(reply) > 0 && reply[0] == '*' && string(reply) != "*-1\r\n"
}

// clientUnblock answers CLIENT UNBLOCK id [TIMEOUT|ERROR]: when the client
// id is blocked, Redis unblocks its command on the client's own
// connection, so the client gets Redis's own reply (nil, or the UNBLOCKED
// error), and this one Redis's :1; else :0.
func (s *session) clientUnblock(args [][]byte) {
	if len(args) > 4 {
		s.replyError(subcommandError(args))
		return
	}
	if len(args) == 4 && !bytes.EqualFold(args[3], []byte("timeout")) && !bytes.EqualFold(args[3], []byte("error")) {
		s.replyError(msgUnblockReason)
		return
	}
	id, ok := resp.ParseInt(args[2])
	if !ok {
		s.replyError(rediserr.NotInteger)
		return
	}
	s.flush()
	target := s.srv.session(uint64(id))
	if target == nil || !target.isBlocked() {
		s.reply([]byte(":0\r\n"))
		return
	}
	addr, p, ok := target.ownAddr()
	if !ok {
		s.reply([]byte(":0\r\n"))
		return
	}
	rid, err := redisID(p, addr)
	if err != nil {
		s.replyError(upstream.ErrorText(err))
		return
	}
	if rid == 0 {
		s.reply([]byte(":0\r\n"))
		return
	}
	req := append([][]byte{args[0], args[1], strconv.AppendInt(nil, rid, 10)}, args[3:]...)
	replies, err := p.Ask(resp.AppendCommand(nil, req...), 1)
	if err != nil {
		s.replyError(upstream.ErrorText(err))
		return
	}
	s.reply(replies[0])
}

func (s *session) isBlocked() bool {
	s.info.mu.Lock()
	defer s.info.mu.Unlock()
	return s.info.blocked
}

// setBlocked marks the client blocked in a command upstream, or no more.
func (s *session) setBlocked(on bool) {
	if on {
		s.publish()
	}
	s.info.mu.Lock()
	s.info.blocked = on
	s.info.mu.Unlock()
}

// clientReply answers CLIENT REPLY ON|OFF|SKIP: OFF and SKIP have no
// reply; ON's +OK is sent, even after OFF.
func (s *session) clientReply(mode []byte) {
	switch strings.ToLower(string(mode)) {
	case "on":
		s.replies, s.muted = replyOn, false
		s.reply([]byte("+OK\r\n"))
	case "off":
		s.replies = replyOff
	case "skip":
		if s.replies != replyOff {
			s.replies = replySkip
		}
	default:
		s.replyError(rediserr.Syntax)
	}
}

// handleMuted runs a command while CLIENT REPLY OFF or SKIP holds its reply
// back: on its own, so that its reply can be told apart and dropped.
// Messages of a subscription started meanwhile, and RESP3 pushes (key
// invalidations), still go out, as Redis pushes them regardless.
func (s *session) handleMuted(run func()) {
	s.flush()
	if s.replies == replySkip {
		s.replies = replyOn // this is the command skipped
	}
	mark := len(s.out)
	s.muted = true
	run()
	s.flush()
	if s.muted && !s.streaming {
		s.out = append(s.out[:mark], pushesOnly(s.out[mark:])...)
	}
	s.muted = false
}

// clientPause relays CLIENT PAUSE or UNPAUSE in standalone mode and,
// when Redis accepts it, tells the server's pools, which then keep what
// the pause holds from holding other clients and from timing out
// (upstream/pause.go). In cluster mode it goes to the client's home master
// as any keyless command, and is met there as any slow request.
func (s *session) clientPause(cmd *resp.Command) {
	mark := s.exchange(cmd)
	if string(s.out[mark:]) != "+OK\r\n" {
		return
	}
	pool := s.pool
	if len(cmd.Args) == 2 {
		pool.Unpaused()
		return
	}
	// Redis took it, so it is an integer of milliseconds, not negative.
	ms, _ := strconv.ParseInt(string(cmd.Args[2]), 10, 64)
	d := time.Duration(ms) * time.Millisecond
	if ms > int64(math.MaxInt64/time.Millisecond) {
		d = math.MaxInt64
	}
	pool.Paused(d, len(cmd.Args) == 3 || strings.EqualFold(string(cmd.Args[3]), "all"))
}
