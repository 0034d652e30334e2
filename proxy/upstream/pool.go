package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/redcon"

	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// NodeMetrics are what one node's pool counts, children of metrics the
// caller registers, resolved once per node so the request path does no
// label lookups.
type NodeMetrics struct {
	Requests prometheus.Counter  // requests written to the shared connections
	Errors   prometheus.Counter  // failed dials and broken connections; not Redis error replies
	Seconds  prometheus.Observer // seconds from a write to its last reply, once per write
	Timeouts prometheus.Counter  // connections closed for a reply overdue (TimeoutError), also in Errors
}

// Metrics are what the upstream side counts. Nil fields count nowhere.
type Metrics struct {
	// Node returns the metrics of the node at addr (host:port). It is
	// called once per node, when the node is first named: the configured
	// ones and, in cluster mode, those the slot map and redirections name.
	Node  func(addr string) *NodeMetrics
	Moved prometheus.Counter // MOVED redirections followed
	Ask   prometheus.Counter // ASK redirections followed
}

// unregistered counts what nobody collects.
func unregistered() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: "unregistered_total", Help: "Not registered."})
}

// orNowhere is m with its nil fields counting nowhere.
func (m Metrics) orNowhere() Metrics {
	if m.Node == nil {
		m.Node = func(string) *NodeMetrics {
			return &NodeMetrics{
				Requests: unregistered(),
				Errors:   unregistered(),
				Timeouts: unregistered(),
				Seconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "unregistered_seconds", Help: "Not registered."}),
			}
		}
	}
	if m.Moved == nil {
		m.Moved = unregistered()
	}
	if m.Ask == nil {
		m.Ask = unregistered()
	}
	return m
}

// Pool holds one node's shared connections: perDB of them for each Key
// (db and protocol), so a client that SELECTs or says HELLO 3 never
// changes another client's db or protocol. It also dials
// the connections a client needs for itself, and watches the node's
// health (health.go): requests overdue, stalled connections, a node down.
// Safe for concurrent use.
type Pool struct {
	dialer
	perDB       int
	readTimeout time.Duration
	stallAfter  time.Duration // stallAfter; tests change it before the first Get
	probeIdle   time.Duration // probeIdle; likewise
	joinAge     time.Duration // joinAge; likewise
	authRetry   time.Duration // authRetry; likewise
	m           *NodeMetrics
	log         *slog.Logger
	state       atomic.Int32 // nodeUnknown, nodeUp or nodeDown, as last seen
	// down is set while the node does not answer probes: see probe.
	down    atomic.Pointer[DownError]
	probing atomic.Bool                   // a probe runs
	probed  atomic.Pointer[chan struct{}] // closed at a probe's first answer; nil after it
	refused atomic.Int64                  // monoNow when a DownError was last answered
	// badAuth: the last dial found the proxy's credentials refused (an
	// AuthError), so that is logged once, not once per dial.
	badAuth atomic.Bool
	// refusedAuth is the last dial's AuthError, at monoNow refusedAt;
	// nil after a dial that was not refused.
	refusedAuth atomic.Pointer[AuthError]
	refusedAt   atomic.Int64
	verify      verifier
	watch       watchdog
	quit        chan struct{} // closed by close
	watched     []*Conn       // the watchdog's scratch
	spare       spares        // connections dialed in advance for DialOwn

	mu     sync.Mutex
	conns  map[Key][]*sharedSlot
	closed bool
	// live are the shared connections the watchdog looks after: those in
	// conns and those replaced after a stall (draining of them), until
	// they fail or close. watching: watchLoop runs.
	live     []*Conn
	draining int
	watching bool
	// Redis refused SELECT of dbs from noDB on (it has fewer); SELECTs
	// past it are refused without dialing, so a client cannot make us
	// open a connection per attempt. 0 while none was refused.
	noDB    int
	noDBErr RedisError
	// held are the connections that carry batches a CLIENT PAUSE holds
	// (pause.go), also in live; turn picks among them once maxHeld are.
	held map[Key][]*Conn
	turn int
	// pause is what the proxy knows of a CLIENT PAUSE on the node.
	pause *nodePause
}

// Key names the shared connections a client's requests may go on: those
// of its db, speaking its protocol, so that Redis's replies reach it in
// the protocol it negotiated. The zero Key is db 0 in RESP2.
type Key struct {
	DB    int
	RESP3 bool // the connections said HELLO 3 when dialed
	// Blocking: the connections for batches that hold a request Redis
	// answers only when something else happens (WAIT), and until then
	// runs nothing else from its connection: blockingConns of them,
	// apart from clients', none joining another's write, none counted
	// stalled.
	Blocking bool
}

// blockingConns is how many connections a node has for a Key that is
// Blocking. A blocked WAIT holds its connection for a replication round
// trip, so a master's acknowledged changes go at most this many a round
// trip.
const blockingConns = 8

// sharedSlot is one place in the pool; its own lock serialises redials, so
// clients wait for one dial rather than each making their own. conn is
// stored under mu and may be loaded without it.
type sharedSlot struct {
	mu      sync.Mutex
	conn    atomic.Pointer[Conn]
	dialErr error     // the last dial's failure
	failed  time.Time // when it failed
}

func newPool(d dialer, perDB int, readTimeout time.Duration, m *NodeMetrics, log *slog.Logger) *Pool {
	return &Pool{
		dialer: d, perDB: perDB, readTimeout: readTimeout, stallAfter: stallAfter, probeIdle: probeIdle, joinAge: joinAge, authRetry: authRetry, m: m, log: log,
		conns: make(map[Key][]*sharedSlot),
		held:  make(map[Key][]*Conn),
		pause: &nodePause{},
		watch: watchdog{wake: make(chan struct{}, 1)},
		quit:  make(chan struct{}),
	}
}

// authRetry is how long after Redis refused a dial's credentials the
// next dial is tried: meanwhile the refusal is the answer.
const authRetry = time.Second

// A node's state, as the pool's last dial found it.
const (
	nodeUnknown = iota // not dialed yet
	nodeUp
	nodeDown
)

// DialTimeout bounds a dial with its AUTH and SELECT; callers use it for
// the requests of their own on a connection from Dial too.
func (p *Pool) DialTimeout() time.Duration { return p.timeout }

// Dial opens a connection of the caller's own to the node, authenticated,
// in k's db and speaking k's protocol. A failure to connect or
// authenticate is counted, and the node going down (the first failure,
// or the first after a success) and
// coming back are logged; so is Redis refusing the proxy's own
// credentials (an AuthError), once until a dial succeeds again, without
// the node counting as down. For authRetry after an AuthError, Dial
// returns it again without dialing: credentials Redis refused cost one
// connection a second, however many requests need one. Redis refusing
// SELECT is an answer, not a failure: it comes back as a RedisError.
// While the node is probed or down it waits or fails as Get does.
func (p *Pool) Dial(k Key) (net.Conn, *bufio.Reader, error) {
	if err := p.healthy(); err != nil {
		return nil, nil, err
	}
	if e := p.refusedAuth.Load(); e != nil && monoNow()-time.Duration(p.refusedAt.Load()) < p.authRetry {
		return nil, nil, e
	}
	nc, br, err := p.dialer.dial(k)
	var refused RedisError
	var badAuth *AuthError
	switch {
	case errors.As(err, &badAuth):
		p.m.Errors.Inc()
		p.refusedAt.Store(int64(monoNow()))
		p.refusedAuth.Store(badAuth)
		p.authRefused(badAuth)
	case err == nil || errors.As(err, &refused):
		p.refusedAuth.Store(nil)
		if !p.login && p.password != "" && p.badAuth.Swap(false) {
			p.log.Info("upstream accepts the proxy's credentials again", "node", p.addr)
		}
		if p.state.Swap(nodeUp) == nodeDown {
			p.log.Info("upstream node up", "node", p.addr)
		}
	default:
		p.m.Errors.Inc()
		if p.state.Swap(nodeDown) != nodeDown {
			p.log.Warn("upstream node down", "node", p.addr, "err", err)
		}
	}
	return nc, br, err
}

// Get returns a shared connection for k, dialing when its place in the
// pool is empty, its connection failed, or it stalled behind a slow
// request: the stalled one is closed once its requests are answered, and
// at most perDB are at a time; past that Get returns another usable
// connection of k, else the stalled one. Callers are spread over the
// perDB places by id. Clients that wait while a dial fails share its
// error. After a request timed out, Get waits for the node's probe (see
// probe). The error is ErrClosed after Close, a DownError while the node
// is down, a RedisError when Redis refused k's db, else the dial's.
func (p *Pool) Get(k Key, id uint64) (*Conn, error) {
	if err := p.healthy(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if p.noDB > 0 && k.DB >= p.noDB {
		p.mu.Unlock()
		return nil, p.noDBErr
	}
	slots := p.conns[k]
	if slots == nil {
		n := p.perDB
		if k.Blocking {
			n = blockingConns
		}
		slots = make([]*sharedSlot, n)
		for i := range slots {
			slots[i] = &sharedSlot{}
		}
		p.conns[k] = slots
	}
	p.mu.Unlock()

	at := int(id % uint64(len(slots)))
	s := slots[at]
	asked := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.conn.Load(); c != nil && c.state.Load()&(connFailed|connDraining) == 0 {
		if c.Usable() || p.pausedAll() || !p.drain(c) {
			return usable(slots, c), nil
		}
	}
	if s.dialErr != nil && s.failed.After(asked) {
		// A dial failed while we waited for it: share its answer, so a
		// queue of clients waits one dial timeout, not one each.
		return nil, s.dialErr
	}
	nc, br, err := p.Dial(k)
	var refused RedisError
	if errors.As(err, &refused) && strings.HasPrefix(string(refused), rediserr.DBRange) {
		p.mu.Lock()
		if p.noDB == 0 || k.DB < p.noDB {
			p.noDB, p.noDBErr = k.DB, refused
		}
		delete(p.conns, k)
		p.mu.Unlock()
	}
	if err != nil {
		s.dialErr, s.failed = err, time.Now()
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c, err := p.adopt(nc, br, k, at)
	if err == nil {
		c.siblings = slots
		s.conn.Store(c)
	}
	return c, err
}

// adopt makes a shared connection of nc for k, at place at of its
// slots, watched with the pool's others; ErrClosed, with nc closed, when
// the pool was closed meanwhile. p.mu must be held.
func (p *Pool) adopt(nc net.Conn, br *bufio.Reader, k Key, at int) (*Conn, error) {
	if p.closed {
		nc.Close()
		return nil, ErrClosed
	}
	c := newConn(nc, br, p.m, &p.watch, p)
	c.key, c.at = k, at
	p.live = append(p.live, c)
	if !p.watching {
		p.watching = true
		go p.watchLoop()
	}
	return c, nil
}

// authRefused logs, once until a dial's AUTH succeeds again, that Redis
// refused the proxy's own credentials; a client's are its own business.
func (p *Pool) authRefused(e *AuthError) {
	if !e.Login && !p.badAuth.Swap(true) {
		p.log.Error("upstream refused the proxy's credentials: set upstream.username and upstream.password to an ACL user Redis accepts",
			"node", p.addr, "reply", e.Reply)
	}
}

// Refusal checks the reply at out[start:], from a connection of p, for a
// NOAUTH: Redis asking the proxy's own connections for a password, as it
// does once requirepass is set behind the proxy (through it, even). Such
// a reply is replaced with the AuthError's words, which name the settings
// to change, and logged once; out is returned. A Login's pools keep
// Redis's NOAUTH, which is the client's own to see.
func (p *Pool) Refusal(out []byte, start int) []byte {
	if p.login || len(out) <= start || out[start] != '-' || !bytes.HasPrefix(out[start:], noAuthPrefix) {
		return out
	}
	e := &AuthError{Addr: p.addr, Reply: string(out[start+1 : len(out)-2])}
	p.authRefused(e)
	return redcon.AppendError(out[:start], e.text())
}

var noAuthPrefix = []byte("-NOAUTH ")

// usable is c when it is usable, else the first usable connection among
// slots, else c: a stalled connection is better than none.
func usable(slots []*sharedSlot, c *Conn) *Conn {
	if c.Usable() {
		return c
	}
	for _, s := range slots {
		if o := s.conn.Load(); o != nil && o.Usable() {
			return o
		}
	}
	return c
}

// Send sends b on a shared connection for k: *conn while it is usable,
// else the one Get(k, id) returns, which it leaves in *conn for the next
// call; but when another usable connection of k has a write under way
// and *conn has none, b goes out in that write (underWay). A Held batch
// during a CLIENT PAUSE WRITE goes on a held connection instead
// (pause.go). When Get fails, so does b, with Get's error. b.DoneCh is
// signalled when b is complete or failed.
func (p *Pool) Send(conn **Conn, k Key, id uint64, b *Batch) {
	if b.Held {
		if on, all := p.pause.on(monoNow()); on && !all {
			p.sendHeld(k, b)
			return
		}
	}
	if c := p.queue(conn, k, id, b); c != nil {
		runtime.Gosched() // as Conn.Send
		c.writeHeld()
	}
}

// queue is Send without the write: it returns the connection whose write
// side the caller took, to writeHeld, or nil.
func (p *Pool) queue(conn **Conn, k Key, id uint64, b *Batch) *Conn {
	for {
		c := *conn
		if mayDial(c) {
			var err error
			if c, err = p.Get(k, id); err != nil {
				*conn = nil
				b.Err = err
				b.DoneCh <- struct{}{}
				return nil
			}
			*conn = c
		}
		on := underWay(c)
		held, ok := on.queue(b)
		if ok {
			if held {
				return on
			}
			return nil
		}
		if on == c {
			*conn = nil // closed after a stall since Get gave it: b was not sent
		}
	}
}

// underWay is c when its write is under way, else another usable
// connection of its slots whose write is, taken less than joinAge ago,
// and whose oldest request in flight, if any, was written less than
// joinAge ago; else c. A batch queued behind a write under way goes out
// with the next one, not in a write of its own: at depth 16 in cluster
// mode the writes to Redis are a quarter of the proxy's CPU, and a
// client's batches may go on any of the connections, as each round waits
// for its replies before the next. The age bounds keep a batch from
// waiting behind a holder that is slow to write (a cluster round writing
// to a node that does not read first) or behind a request Redis answers
// late while others go on (a WAIT for lagging replicas, a reply of
// megabytes being read).
func underWay(c *Conn) *Conn {
	if c.writing.Load() || c.key.Blocking {
		return c // a Blocking one's batches are spread so that their WAITs block apart
	}
	var now time.Duration
	for _, s := range c.siblings {
		o := s.conn.Load()
		if o == nil || o == c || !o.writing.Load() || !o.Usable() {
			continue
		}
		if now == 0 {
			now = monoNow()
		}
		young := int64(now - o.pool.joinAge) // times after it are less than joinAge ago
		if oldest := o.since.Load(); o.taken.Load() > young && (oldest == 0 || oldest > young) {
			return o
		}
	}
	return c
}

// joinAge bounds how long the write side of a connection may have been
// held, and its oldest request in flight waited, for a batch to join its
// write. At full load (three masters, depth 16) this bound kept all of
// the joining's gain side by side.
const joinAge = 2 * time.Millisecond

// mayDial reports whether queueing on *conn may first dial (Get): a
// caller that holds other connections' write sides writes them before,
// as a dial can take a dial timeout and their clients would wait for it.
func mayDial(conn *Conn) bool { return conn == nil || !conn.Usable() }

// Ask sends n requests (RESP frames, back to back) on a new connection of
// db 0 and returns the n replies: for the proxy's own requests (CLUSTER
// SLOTS, COMMAND, PING) and those that must not wait behind the shared
// connections (SCRIPT KILL). The dial timeout bounds it all: a node that
// accepts but does not answer (stopped, overloaded) must not stall the
// caller. While the node is probed or down it waits or fails as Get does.
func (p *Pool) Ask(req []byte, n int) ([][]byte, error) { return p.exchange(p.Dial, req, n) }

// exchange is Ask on a connection from dial.
func (p *Pool) exchange(dial func(Key) (net.Conn, *bufio.Reader, error), req []byte, n int) ([][]byte, error) {
	nc, br, err := dial(Key{})
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(p.timeout))
	if _, err := nc.Write(req); err != nil {
		return nil, err
	}
	b := Batch{N: n, Ends: make([]int, 0, n)}
	for range n {
		if b.Out, err = resp.ReadReply(br, b.Out); err != nil {
			return nil, err
		}
		b.Ends = append(b.Ends, len(b.Out))
	}
	return b.replies(nil), nil
}

var pingReq = resp.AppendCommand(nil, []byte("PING"))

// Ping sends PING on a connection of its own, within the dial timeout,
// and returns nil for a reply that is not an error; a RedisError for an
// error reply (LOADING, MASTERDOWN…).
func (p *Pool) Ping() error {
	replies, err := p.Ask(pingReq, 1)
	if err != nil {
		return err
	}
	if reply := replies[0]; resp.IsError(reply) {
		return RedisError(reply[1 : len(reply)-2])
	}
	return nil
}

// close retires every shared connection, failing the batches in flight,
// and stops watching the node.
func (p *Pool) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.quit)
	live := p.live
	p.live = nil
	p.mu.Unlock()
	p.spare.close()
	for _, c := range live {
		c.close()
	}
	p.verify.close()
}
