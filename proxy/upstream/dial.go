package upstream

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// dialer opens connections to one node.
type dialer struct {
	addr     string
	username string
	password string // "": no AUTH
	// login: the credentials are a client's (Login), not the proxy's own
	// upstream.username and upstream.password.
	login   bool
	timeout time.Duration
	tls     *nodeTLS // nil: plain TCP
}

// newDialer returns the dialer of the node at addr as cfg says; base is
// cfg.TLS as loaded, nil when TLS is off.
func newDialer(cfg *config.Upstream, base *tls.Config, addr string) dialer {
	return dialer{
		addr:     addr,
		username: cfg.Username,
		password: string(cfg.Password),
		timeout:  cfg.DialTimeout.Duration(),
		tls:      newNodeTLS(base, cfg.TLS.ServerName, addr),
	}
}

// nodeTLS is how a dialer speaks TLS to its node: upstream.tls's config
// with the name the node's certificate must carry. Safe for concurrent
// use; a cluster's slot map may rename the node while it is dialed.
type nodeTLS struct {
	base  *tls.Config // upstream.tls as loaded, shared by every node; never changed
	fixed bool        // upstream.tls.server_name is set: no hostname replaces it
	host  string      // the host of the node's address
	conf  atomic.Pointer[tls.Config]
}

// newNodeTLS returns the TLS side of dialing addr, or nil when base is nil
// (TLS off). The name checked is serverName when set, else the host of
// addr until setHostname names another.
func newNodeTLS(base *tls.Config, serverName, addr string) *nodeTLS {
	if base == nil {
		return nil
	}
	t := &nodeTLS{base: base, fixed: serverName != ""}
	t.host, _, _ = net.SplitHostPort(addr)
	if serverName == "" {
		serverName = t.host
	}
	t.setName(serverName)
	return t
}

// setHostname makes hostname, as the cluster announces the node, the name
// its certificate is checked against, or the host of its address again
// when hostname is empty. It does nothing when upstream.tls.server_name is
// set.
func (t *nodeTLS) setHostname(hostname string) {
	if t.fixed {
		return
	}
	if hostname == "" {
		hostname = t.host
	}
	if t.serverName() != hostname {
		t.setName(hostname)
	}
}

func (t *nodeTLS) setName(name string) {
	c := t.base.Clone()
	c.ServerName = name
	t.conf.Store(c)
}

// serverName is the name the next handshake checks.
func (t *nodeTLS) serverName() string { return t.conf.Load().ServerName }

// dial connects, does the TLS handshake when TLS is on, authenticates,
// says HELLO 3 for a RESP3 k and selects k's db, all within the dial
// timeout. A Redis error reply to SELECT
// comes back as RedisError so the client sees Redis's own text ("ERR DB
// index is out of range").
func (d *dialer) dial(k Key) (net.Conn, *bufio.Reader, error) {
	deadline := time.Now().Add(d.timeout)
	nc, err := net.DialTimeout("tcp", d.addr, d.timeout)
	if err != nil {
		return nil, nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	nc.SetDeadline(deadline)
	if d.tls != nil {
		tc := tls.Client(nc, d.tls.conf.Load())
		if err := tc.Handshake(); err != nil {
			nc.Close()
			return nil, nil, fmt.Errorf("proxy: upstream %s: TLS handshake: %w", d.addr, err)
		}
		nc = tc
	}
	var req []byte
	steps := 0
	if d.password != "" {
		if d.username != "" {
			req = resp.AppendCommand(req, []byte("AUTH"), []byte(d.username), []byte(d.password))
		} else {
			req = resp.AppendCommand(req, []byte("AUTH"), []byte(d.password))
		}
		steps++
	}
	if k.RESP3 {
		req = resp.AppendCommand(req, []byte("HELLO"), []byte("3"))
		steps++
	}
	if k.DB != 0 {
		req = resp.AppendCommand(req, []byte("SELECT"), strconv.AppendInt(nil, int64(k.DB), 10))
		steps++
	}
	br := bufio.NewReaderSize(nc, 16<<10)
	err = func() error {
		if steps == 0 {
			return nil
		}
		if _, err := nc.Write(req); err != nil {
			return err
		}
		for i := 0; i < steps; i++ {
			reply, err := resp.ReadReply(br, nil)
			if err != nil {
				return err
			}
			if reply[0] == '-' {
				msg := string(reply[1 : len(reply)-2])
				if i == 0 && d.password != "" || strings.HasPrefix(msg, "NOAUTH ") {
					return &AuthError{Addr: d.addr, Reply: msg, Login: d.login}
				}
				return RedisError(msg)
			}
		}
		return nil
	}()
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	nc.SetDeadline(time.Time{})
	return nc, br, nil
}

// AuthError is Redis refusing the credentials a connection was dialed
// with: its AUTH answered with an error, or a command after it with
// NOAUTH (Redis asks for a password the proxy was not given, as after a
// CONFIG SET requirepass). Reply is Redis's error text, without '-' and
// CRLF.
type AuthError struct {
	Addr  string // the node, host:port
	Reply string
	Login bool // the credentials were a client's (Login), not upstream.username and upstream.password
}

func (e *AuthError) Error() string {
	return "upstream " + e.Addr + " refused the proxy's credentials: " + e.Reply
}

// text is the error reply a client gets for e, without '-' and CRLF: for
// a client's own credentials, Redis's words; for the proxy's, what the
// operator must change, after Redis's words.
func (e *AuthError) text() string {
	if e.Login {
		return e.Reply
	}
	return "ERR upstream " + e.Addr + " refused the proxy's credentials (" + e.Reply +
		"): set upstream.username and upstream.password (or upstream.password_file) to an ACL user Redis accepts, or undo the requirepass change on Redis"
}
