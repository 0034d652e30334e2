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
// flat array of name, value bulk strings), so the proxy's upstream password
// never reaches a client. Other replies come back unchanged.
func maskSecrets(reply []byte) []byte {
	elems, ok := resp.ArrayElems(reply, nil)
	if !ok {
		return reply
	}
	out := redcon.AppendArray(nil, len(elems))
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
	s.monitoring, s.replies, s.track = false, replyOn, tracking{}
	s.info.mu.Lock()
	s.info.tracking, s.info.sub, s.info.psub, s.info.ssub = false, 0, 0, 0 // NO-EVICT stays, as in Redis
	s.info.mu.Unlock()
	s.authed = s.srv.config().Password == ""
	s.rd.SetAuthRequired(!s.authed)
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

// hello answers HELLO as Redis 7.0 does for RESP2. The proxy relays RESP2
// only, so "HELLO 3" gets NOPROTO, from which clients fall back to RESP2.
// The server fields come from Redis; the id is the proxy's client id.
func (s *session) hello(args [][]byte) {
	if msg := helloVersionError(args); msg != "" {
		s.replyError(msg)
		return
	}
	if s.tx.open {
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
			s.replyError(rediserr.HelloOption(string(args[j])))
			return
		}
	}
	if user != nil && !s.checkAuth(user, pass) {
		s.authFailed()
		return
	}
	if !s.authed {
		s.replyError(rediserr.HelloNoAuth)
		return
	}
	if name != nil && !s.setName(name) {
		return
	}
	s.flush()
	hello := [][]byte{[]byte("HELLO"), []byte("2")}
	if name != nil && s.pinned() {
		// The client's own connection keeps its name upstream.
		hello = append(hello, []byte("SETNAME"), name)
	}
	mark := s.exchange(&resp.Command{Args: hello})
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
		return rediserr.BadProtover
	case v != 2:
		return rediserr.NoProto
	}
	return ""
}

// patchHelloID replaces the upstream connection's id in a HELLO reply with
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
	c, err := s.srv.up.Pool.Get(int(n), s.id)
	if err != nil {
		s.replyError(upstream.ErrorText(err))
		return
	}
	s.db, s.shared = int(n), c
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
			s.reply(redcon.AppendNull(nil))
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
