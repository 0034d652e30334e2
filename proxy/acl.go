package proxy

import (
	"bytes"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
	"github.com/tidwall/redcon"
)

// redisChecks reports whether Redis checks clients' passwords
// (upstream.client_auth: redis), which only a restart changes.
func (s *session) redisChecks() bool { return s.srv.cfg.Upstream.ClientAuth == config.ClientAuthRedis }

// logIn makes the client's commands run as the ACL user l: on its pools
// from the next command on, every request before answered as before. The
// Login the client held is let go. An own connection that holds no state
// (in cluster mode, kept from a blocking command) is closed: the next is
// dialed as l.
func (s *session) logIn(l *upstream.Login) {
	s.flush()
	if s.own != nil && !s.pinned() {
		s.own.nc.Close()
		s.setOwn(nil)
	}
	if s.login != nil {
		s.login.Release()
	}
	s.login, s.user, s.shared = l, l.User(), nil
	if s.srv.up.Cluster == nil {
		s.pool = s.userPool(s.srv.up.Pool)
	}
	s.cs.RoundTrip.SetLogin(l)
}

// userPool is the pool of p's node that runs the client's commands: its
// user's when Redis checks passwords, else p.
func (s *session) userPool(p *upstream.Pool) *upstream.Pool {
	if s.login != nil {
		return s.login.Pool(p)
	}
	return p
}

// verifyAuth has Redis check auth, an AUTH with the password alone or
// user and password, and logs the client in as the user when Redis
// accepts it; else it replies as Redis did (a WRONGPASS counted and
// delayed as the proxy's own refusals are) and returns false. The check
// runs on a node's verification connection, or on the client's own
// connection when it has one, which must run as the user from then on:
// either way a wrong password opens no connection.
func (s *session) verifyAuth(auth [][]byte) bool {
	s.flush()
	var reply []byte
	var err error
	if s.pinned() {
		reply = s.ask(auth)
	} else {
		reply, err = s.srv.up.Verify(resp.AppendCommand(nil, auth...))
	}
	switch {
	case err != nil:
		s.replyError(upstream.ErrorText(err))
	case bytes.HasPrefix(reply, []byte("-WRONGPASS ")):
		s.authFailed()
	case string(reply) == "+OK\r\n":
		s.logInAs(auth)
		return true
	default:
		s.reply(reply) // Redis's words: AUTH <password> with no password set…
	}
	return false
}

// logInAs logs the client in as the user of an AUTH Redis accepted.
func (s *session) logInAs(auth [][]byte) {
	user, pass := "default", auth[1]
	if len(auth) == 3 {
		user, pass = string(auth[1]), auth[2]
	}
	s.logIn(s.srv.up.Logins.Get(user, string(pass)))
	s.authed = true
}

// mayRun reports whether the client may run commands: with the proxy's password, once it AUTHed; when Redis
// checks passwords, once Redis accepts the client's user, which for a
// client that has not AUTHed (Redis's default user) is asked with a PING
// on its connections: a default user without a password needs no AUTH.
func (s *session) mayRun() bool {
	if !s.authed && s.redisChecks() && !bytes.HasPrefix(s.pingAsUser(), []byte("-NOAUTH ")) {
		s.authed = true
	}
	return s.authed
}

var pingArgs = [][]byte{[]byte("PING")}

// pingAsUser sends PING to Redis as the client's user, once every request
// before it is answered, and returns the reply: on the client's
// connections in standalone mode, on the first master's in cluster mode
// (where the proxy answers a client's PING itself).
func (s *session) pingAsUser() []byte {
	s.flush()
	c := s.srv.up.Cluster
	if c == nil || s.pinned() {
		return s.ask(pingArgs)
	}
	t, _, err := c.Current()
	if err != nil {
		return redcon.AppendError(nil, upstream.ErrorText(err))
	}
	r := &s.cs.RoundTrip
	r.Queue(t.Masters[0], -1, nil, pingArgs)
	r.Run()
	reply := bytes.Clone(r.Reply(0))
	r.Reset()
	return reply
}

// ask sends args as the client's commands go, once every request before
// it is answered, and returns the reply, which the client does not get.
func (s *session) ask(args [][]byte) []byte {
	mark := s.exchange(&resp.Command{Args: args})
	reply := bytes.Clone(s.out[mark:])
	s.out = s.out[:mark]
	return reply
}

// whoami answers ACL WHOAMI with the client's user. When Redis checks
// passwords, the client's connections are authenticated as its user, so
// Redis answers (and applies the user's permission to ask); with the
// proxy's password the user is "default".
func (s *session) whoami(cmd *resp.Command) {
	if s.redisChecks() {
		var buf [24]byte
		c, _ := lookup(cmd.Args, &buf)
		s.dispatch(cmd, c)
		return
	}
	if len(cmd.Args) != 2 {
		s.replyError(rediserr.WrongArity("acl|whoami"))
		return
	}
	s.reply(redcon.AppendBulkString(nil, s.user))
}
