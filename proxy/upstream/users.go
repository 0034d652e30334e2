package upstream

import (
	"bufio"
	"net"
	"sync"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// LoginIdle is how long the pools of an ACL user no client is logged in
// as are kept, for a client that logs in again, before they are closed.
const LoginIdle = time.Minute

// verifier is a node's connection for checking clients' passwords: it
// carries AUTH only, one at a time, so a wrong password costs one round
// trip on it and never a connection of its own. Which user it ends up
// authenticated as does not matter: nothing else runs on it.
type verifier struct {
	mu sync.Mutex // one AUTH at a time; guards nc and br
	nc net.Conn   // nil until the first AUTH, and after a failure
	br *bufio.Reader
}

// Verify sends req, a client's AUTH (the password alone, or user and
// password), to the node on its verification connection and returns
// Redis's reply: +OK, or the error Redis gives (WRONGPASS…). The error is
// the transport's, or the dial's; the dial timeout bounds each exchange.
// A kept connection Redis closed meanwhile (its timeout setting, or the
// user it was left authenticated as deleted) is dialed again once.
func (p *Pool) Verify(req []byte) ([]byte, error) {
	v := &p.verify
	v.mu.Lock()
	defer v.mu.Unlock()
	for kept := v.nc != nil; ; kept = false {
		if v.nc == nil {
			nc, br, err := p.Dial(Key{})
			if err != nil {
				return nil, err
			}
			v.nc, v.br = nc, br
		}
		v.nc.SetDeadline(time.Now().Add(p.timeout))
		_, err := v.nc.Write(req)
		var reply []byte
		if err == nil {
			reply, err = resp.ReadReply(v.br, nil)
		}
		if err == nil {
			return reply, nil
		}
		v.nc.Close()
		v.nc, v.br = nil, nil
		if !kept {
			return nil, err
		}
	}
}

func (v *verifier) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.nc != nil {
		v.nc.Close()
		v.nc, v.br = nil, nil
	}
}

// Login is an ACL user as clients of the proxy logged in: its name and
// password, and for each node a pool whose connections authenticate as
// it, so that Redis applies the user's permissions. The anonymous Login
// (Logins.Get with an empty name) sends no AUTH at all: its clients are
// Redis's default user, as a new connection to Redis is. A Login is held
// by its clients (Get, Release); its pools are closed LoginIdle after the
// last one let go. Safe for concurrent use.
type Login struct {
	user, pass string
	logins     *Logins

	refs int       // clients holding it; under logins.mu
	idle time.Time // when refs last fell to 0; under logins.mu

	mu     sync.Mutex
	pools  map[*Pool]*Pool // a node's pool → this user's pool of the node
	closed bool
}

// User is the ACL user's name, "default" for the anonymous Login.
func (l *Login) User() string {
	if l.user == "" {
		return "default"
	}
	return l.user
}

// Pool is the user's pool of the node whose pool is p: as many shared
// connections per db as p has (upstream.conns_per_node), each dialed with
// the user's name and password when a client of the user first needs it.
func (l *Login) Pool(p *Pool) *Pool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if up := l.pools[p]; up != nil {
		return up
	}
	d := p.dialer
	d.username, d.password, d.login = l.user, l.pass, true
	up := newPool(d, p.perDB, p.readTimeout, p.m, p.log)
	up.stallAfter, up.probeIdle, up.authRetry = p.stallAfter, p.probeIdle, p.authRetry
	up.pause = p.pause // a pause is the node's
	if l.closed {
		up.close() // a straggler after the proxy closed: fails with ErrClosed
	}
	l.pools[p] = up
	return up
}

// Release says a client holding l logged out or left.
func (l *Login) Release() { l.logins.release(l) }

func (l *Login) close() {
	l.mu.Lock()
	l.closed = true
	pools := l.pools
	l.mu.Unlock()
	for _, p := range pools {
		p.close()
	}
}

type loginKey struct{ user, pass string }

// Logins are the ACL users clients logged in as, by name and password, so
// that the clients of one user share its pools. Safe for concurrent use.
type Logins struct {
	idleAfter time.Duration // LoginIdle; tests change it before the first Get

	mu     sync.Mutex
	byKey  map[loginKey]*Login
	reaper bool          // reapLoop runs
	quit   chan struct{} // closed by close
	closed bool
}

func newLogins() *Logins {
	return &Logins{idleAfter: LoginIdle, byKey: make(map[loginKey]*Login), quit: make(chan struct{})}
}

// Get holds the Login of user with pass for a client, making it when no
// client holds it and its pools were closed; the client calls Release
// when it logs out or leaves. An empty user is the anonymous Login. The
// password is not checked here: Verify does that first.
func (ls *Logins) Get(user, pass string) *Login {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	k := loginKey{user, pass}
	l := ls.byKey[k]
	if l == nil {
		l = &Login{user: user, pass: pass, logins: ls, pools: make(map[*Pool]*Pool)}
		if ls.closed {
			l.closed = true
		}
		ls.byKey[k] = l
	}
	l.refs++
	if !ls.reaper && !ls.closed {
		ls.reaper = true
		go ls.reapLoop()
	}
	return l
}

func (ls *Logins) release(l *Login) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l.refs--; l.refs == 0 {
		l.idle = time.Now()
	}
}

// Len is the number of Logins whose pools are open: held by a client, or
// let go within LoginIdle.
func (ls *Logins) Len() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.byKey)
}

// reapLoop closes, every idleAfter/2, the pools of the Logins no client
// held for idleAfter, until close.
func (ls *Logins) reapLoop() {
	tick := time.NewTicker(ls.idleAfter / 2)
	defer tick.Stop()
	for {
		select {
		case <-ls.quit:
			return
		case <-tick.C:
		}
		ls.reap(time.Now().Add(-ls.idleAfter))
	}
}

// reap closes the pools of the Logins nobody held since before.
func (ls *Logins) reap(before time.Time) {
	var idle []*Login
	ls.mu.Lock()
	for k, l := range ls.byKey {
		if l.refs == 0 && l.idle.Before(before) {
			delete(ls.byKey, k)
			idle = append(idle, l)
		}
	}
	ls.mu.Unlock()
	for _, l := range idle {
		l.close()
	}
}

// close closes every Login's pools and stops the reaping.
func (ls *Logins) close() {
	ls.mu.Lock()
	if ls.closed {
		ls.mu.Unlock()
		return
	}
	ls.closed = true
	close(ls.quit)
	all := make([]*Login, 0, len(ls.byKey))
	for _, l := range ls.byKey {
		all = append(all, l)
	}
	ls.mu.Unlock()
	for _, l := range all {
		l.close()
	}
}
