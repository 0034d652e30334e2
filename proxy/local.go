package proxy

import (
	"bytes"
	"crypto/subtle"
	"strconv"
	"strings"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
	"github.com/tidwall/redcon"
)

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
			s.replyError(rediserr.WrongArity("reset"))
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
	case "acl":
		s.whoami(cmd)
	case "proxy":
		s.proxyCommand(args)
	case "config":
		if s.tx.open {
			s.replyError(msgConfigHidden)
			return
		}
		mark := s.exchange(cmd)
		s.out = append(s.out[:mark], maskSecrets(s.out[mark:])...)
	}
}

// secretParams are the config parameters that hold the upstream password.
var secretParams = map[string]bool{"requirepass": true, "masterauth": true}

// maskSecrets hides the values of secretParams in a CONFIG GET reply (a
// flat array of name, value bulk strings; a map of them in RESP3), so the proxy's upstream password
// never reaches a client. Other replies come back unchanged.
func maskSecrets(reply []byte) []byte {
	elems, ok := resp.ArrayElems(reply, nil)
	out := redcon.AppendArray(nil, len(elems))
	if !ok {
		if elems, ok = resp.MapElems(reply, nil); !ok {
			return reply
		}
		out = resp.RESP3.AppendMap(nil, len(elems)/2)
	}
	for i, e := range elems {
		if i%2 == 1 {
			if name, _ := resp.BulkValue(elems[i-1]); secretParams[strings.ToLower(string(name))] {
				e = redcon.AppendBulk(nil, []byte("******"))
			}
		}
		out = append(out, e...)
	}
	return out
}

func (s *session) resetState() {
	s.endTx()
	s.db, s.name, s.shared = 0, nil, nil
	s.switchShared(resp.RESP2) // as Redis's RESET does
	s.monitoring, s.replies, s.track, s.pushTarget = false, replyOn, tracking{}, false
	s.info.mu.Lock()
	s.info.tracking, s.info.sub, s.info.psub, s.info.ssub = false, 0, 0, 0 // NO-EVICT stays, as in Redis
	s.info.mu.Unlock()
	s.authed = s.srv.config().Password == ""
	s.rd.SetAuthRequired(!s.authed)
	s.user = "default"
	if s.redisChecks() {
		s.authed = false // Redis's RESET makes the client its default user
		s.rd.SetAuthRequired(false)
		s.logIn(s.srv.up.Logins.Get("", ""))
	}
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
		s.replyError(rediserr.WrongArity("auth"))
	case len(args) > 3:
		s.replyError(rediserr.Syntax)
	case s.redisChecks():
		if s.verifyAuth(args) {
			s.reply([]byte("+OK\r\n"))
		}
	case len(args) == 2 && s.srv.config().Password == "":
		s.replyError(rediserr.NoPassword)
	case len(args) == 2 && s.checkAuth([]byte("default"), args[1]),
		len(args) == 3 && s.checkAuth(args[1], args[2]):
		s.reply([]byte("+OK\r\n"))
	default:
		s.authFailed()
	}
}

// authFailed counts a refused AUTH and answers it after
// limits.auth_failure_delay: the session reads nothing meanwhile, so one
// connection guesses at most one password per delay.
func (s *session) authFailed() {
	s.srv.m.authFailures.Inc()
	if d := s.srv.config().Limits.AuthFailureDelay.Duration(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-s.srv.stop:
		}
		t.Stop()
	}
	s.replyError(rediserr.WrongPass)
}

// hello answers HELLO as Redis 7.0 does: it switches the client to the
// protocol asked (none: it stays), and the reply, a map in RESP3, comes
// from Redis on a connection in that protocol, so its server fields are
// Redis's; the id is the proxy's client id, the mode standalone.
func (s *session) hello(args [][]byte) {
	proto, msg := helloProto(args, s.proto)
	if msg != "" {
		s.replyError(msg)
		return
	}
	if s.tx.open {
		s.forward(&resp.Command{Args: args}) // Redis queues it
		return
	}
	name, ok := s.helloOptions(args)
	if !ok {
		return
	}
	s.flush()
	hello := [][]byte{[]byte("HELLO"), protoArg(proto)}
	if s.pinned() {
		// The client's own connection keeps its name and id upstream, and
		// Redis switches its protocol.
		if name != nil {
			hello = append(hello, []byte("SETNAME"), name)
		}
		s.switchShared(proto)
		s.forward(&resp.Command{Args: hello})
		return
	}
	if !s.setProto(proto) {
		return
	}
	mark := s.exchange(&resp.Command{Args: hello})
	s.out = append(s.out[:mark], s.helloReply(s.out[mark:])...)
}

// helloOptions applies HELLO's AUTH and SETNAME, as Redis 7.0 checks
// them, and returns the name set, if any; or answers why not.
func (s *session) helloOptions(args [][]byte) (name []byte, ok bool) {
	next := min(len(args), 2)
	var user, pass []byte
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
			s.replyError(rediserr.HelloOption(string(args[j])))
			return nil, false
		}
	}
	switch {
	case user == nil:
	case s.redisChecks():
		if !s.verifyAuth([][]byte{[]byte("AUTH"), user, pass}) {
			return nil, false
		}
	case !s.checkAuth(user, pass):
		s.authFailed()
		return nil, false
	}
	if !s.mayRun() {
		s.replyError(rediserr.HelloNoAuth)
		return nil, false
	}
	if name != nil && !s.setName(name) {
		return nil, false
	}
	return name, true
}

// helloReply is Redis's HELLO reply as the client must see it: with its
// proxy id, from a standalone server.
func (s *session) helloReply(reply []byte) []byte {
	reply = patchHelloID(reply, s.id)
	if s.srv.up.Cluster != nil {
		reply = standaloneHello(reply)
	}
	return reply
}

// setProto switches the client's requests to shared connections in
// proto, and an own connection it keeps but is not held on (cluster mode)
// to proto too, so that it is in the client's protocol when next used. It
// answers and returns false when that connection failed.
func (s *session) setProto(proto resp.Proto) bool {
	if proto == s.proto {
		return true
	}
	s.switchShared(proto)
	if s.own == nil {
		return true
	}
	if err := ownSay(s.own.nc, s.own.br, s.own.pool, []byte("HELLO"), protoArg(proto)); err != nil {
		s.own.nc.Close()
		s.setOwn(nil)
		s.replyError(upstream.ErrorText(err))
		s.quit = true // its watch is gone with it, as on any failure of it
		return false
	}
	return true
}

// switchShared makes the client's protocol proto, and its requests go to
// shared connections in it from now on.
func (s *session) switchShared(proto resp.Proto) {
	if proto != s.proto {
		s.proto, s.shared = proto, nil
		s.cs.RoundTrip.SetRESP3(proto == resp.RESP3)
		if s.srv.up.Cluster == nil {
			s.pool.KeepSpare(s.upstreamKey()) // for its first blocking command in proto
		}
	}
}

// protoArg is HELLO's argument for proto.
func protoArg(proto resp.Proto) []byte {
	if proto == resp.RESP3 {
		return []byte("3")
	}
	return []byte("2")
}

// helloProto is the protocol HELLO's arguments ask for, cur when they
// name none, or Redis 7.0's error text for a version it refuses.
func helloProto(args [][]byte, cur resp.Proto) (resp.Proto, string) {
	if len(args) < 2 {
		return cur, ""
	}
	v, ok := resp.ParseInt(args[1])
	switch {
	case !ok:
		return cur, rediserr.BadProtover
	case v != 2 && v != 3:
		return cur, rediserr.NoProto
	}
	return resp.Proto(v), ""
}

// patchHelloID replaces the upstream connection's id in a HELLO reply (a
// flat array in RESP2, a map in RESP3) with
// the client's own, so HELLO and CLIENT ID agree.
func patchHelloID(reply []byte, id uint64) []byte {
	return patchIntField(reply, "id", int64(id))
}

// patchIntField replaces the integer after the bulk string field in a
// reply that is an array or a map of fields (HELLO, CLIENT
// TRACKINGINFO) with v.
func patchIntField(reply []byte, field string, v int64) []byte {
	key := "$" + strconv.Itoa(len(field)) + "\r\n" + field + "\r\n:"
	i := bytes.Index(reply, []byte(key))
	if reply[0] != '*' && reply[0] != '%' || i < 0 {
		return reply
	}
	start := i + len(key)
	end := start + bytes.IndexByte(reply[start:], '\r')
	patched := append([]byte(nil), reply[:start]...)
	patched = strconv.AppendInt(patched, v, 10)
	return append(patched, reply[end:]...)
}

// helloReplyProto is the protocol the last HELLO reply in reply says the
// connection speaks.
func helloReplyProto(reply []byte) (resp.Proto, bool) {
	const field = "$5\r\nproto\r\n:"
	i := bytes.LastIndex(reply, []byte(field))
	if i < 0 || i+len(field) >= len(reply) {
		return 0, false
	}
	switch reply[i+len(field)] {
	case '2':
		return resp.RESP2, true
	case '3':
		return resp.RESP3, true
	}
	return 0, false
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
	if s.tx.open {
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
		s.replyError(rediserr.WrongArity("select"))
		return
	}
	n, ok := resp.ParseInt(args[1])
	if !ok {
		s.replyError(rediserr.NotInteger)
		return
	}
	if n < -1<<31 || n > 1<<31-1 {
		s.replyError(rediserr.IntRange)
		return
	}
	if n < 0 {
		s.replyError(rediserr.DBRange)
		return
	}
	s.flush()
	k := s.upstreamKey()
	k.DB = int(n)
	c, err := s.pool.Get(k, s.id)
	if err != nil {
		s.replyError(upstream.ErrorText(err))
		return
	}
	s.db, s.shared = int(n), c
	s.pool.KeepSpare(k) // for its first blocking command here
	s.reply([]byte("+OK\r\n"))
}

// client answers the CLIENT subcommands from the proxy's own state: the
// shared connections have no per-client name or id, and the proxy's
// clients are not Redis's.
func (s *session) client(args [][]byte) {
	sub := strings.ToLower(string(args[1]))
	arity, named := map[string]int{"getname": 2, "setname": 3}[sub]
	switch {
	case sub == "tracking":
		s.clientTracking(args)
		return
	case !named:
		s.clientAbout(args, sub)
		return
	case len(args) != arity:
		s.replyError(rediserr.WrongArity("client|" + sub))
		return
	}
	switch sub {
	case "getname":
		if len(s.name) == 0 {
			s.reply(s.proto.AppendNull(nil))
		} else {
			s.reply(redcon.AppendBulk(nil, s.name))
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
		s.replyError(rediserr.BadName)
		return false
	}
	s.name = append(s.name[:0:0], name...)
	return true
}

// ownSetName sends CLIENT SETNAME to the client's own connection, and the
// client's name is what Redis took.
func (s *session) ownSetName(cmd *resp.Command) {
	mark := s.exchange(cmd)
	if len(cmd.Args) == 3 && string(s.out[mark:]) == "+OK\r\n" {
		s.name = append(s.name[:0:0], cmd.Args[2]...)
	}
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

// clusterSelect answers SELECT as Redis Cluster does: only db 0 exists.
func (s *session) clusterSelect(args [][]byte) {
	if len(args) != 2 {
		s.replyError(rediserr.WrongArity("select"))
		return
	}
	n, ok := resp.ParseInt(args[1])
	switch {
	case !ok:
		s.replyError(rediserr.NotInteger)
	case n < -1<<31 || n > 1<<31-1:
		s.replyError(rediserr.IntRange)
	case n != 0:
		s.replyError(rediserr.SelectCluster)
	default:
		s.reply([]byte("+OK\r\n"))
	}
}
