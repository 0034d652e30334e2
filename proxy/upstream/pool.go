package upstream

import (
	"bufio"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

// Pool holds one node's shared connections: perDB of them for each db, so
// a client that SELECTs never changes another client's db. It also dials
// the connections a client needs for itself. Safe for concurrent use.
type Pool struct {
	dialer
	perDB int
	m     *NodeMetrics
	log   *slog.Logger
	state atomic.Int32 // nodeUnknown, nodeUp or nodeDown, by the last dial

	mu     sync.Mutex
	conns  map[int][]*sharedSlot // by db
	closed bool
	// Redis refused SELECT of dbs from noDB on (it has fewer); SELECTs
	// past it are refused without dialing, so a client cannot make us
	// open a connection per attempt. 0 while none was refused.
	noDB    int
	noDBErr RedisError
}

// sharedSlot is one place in the pool; its own lock serialises redials, so
// clients wait for one dial rather than each making their own.
type sharedSlot struct {
	mu      sync.Mutex
	conn    *Conn
	dialErr error     // the last dial's failure
	failed  time.Time // when it failed
}

func newPool(d dialer, perDB int, m *NodeMetrics, log *slog.Logger) *Pool {
	return &Pool{dialer: d, perDB: perDB, conns: make(map[int][]*sharedSlot), m: m, log: log}
}

// A node's state, as the pool's last dial found it.
const (
	nodeUnknown = iota // not dialed yet
	nodeUp
	nodeDown
)

// DialTimeout bounds a dial with its AUTH and SELECT; callers use it for
// the requests of their own on a connection from Dial too.
func (p *Pool) DialTimeout() time.Duration { return p.timeout }

// Dial opens a connection of the caller's own to the node, authenticated
// and in db. A failure to connect or authenticate is counted, and the
// node going down (the first failure, or the first after a success) and
// coming back are logged. Redis refusing SELECT is an answer, not a
// failure: it comes back as a RedisError.
func (p *Pool) Dial(db int) (net.Conn, *bufio.Reader, error) {
	nc, br, err := p.dialer.dial(db)
	var refused RedisError
	switch {
	case err == nil || errors.As(err, &refused):
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

// Get returns a healthy shared connection for db, dialing when its place
// in the pool is empty or its connection failed. Callers are spread over
// the perDB places by id. Clients that wait while a dial fails share its
// error. The error is ErrClosed after Close, a RedisError when Redis
// refused db, else the dial's.
func (p *Pool) Get(db int, id uint64) (*Conn, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if p.noDB > 0 && db >= p.noDB {
		p.mu.Unlock()
		return nil, p.noDBErr
	}
	slots := p.conns[db]
	if slots == nil {
		slots = make([]*sharedSlot, p.perDB)
		for i := range slots {
			slots[i] = &sharedSlot{}
		}
		p.conns[db] = slots
	}
	p.mu.Unlock()

	s := slots[id%uint64(len(slots))]
	asked := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil && !s.conn.Failed() {
		return s.conn, nil
	}
	if s.dialErr != nil && s.failed.After(asked) {
		// A dial failed while we waited for it: share its answer, so a
		// queue of clients waits one dial timeout, not one each.
		return nil, s.dialErr
	}
	nc, br, err := p.Dial(db)
	var refused RedisError
	if errors.As(err, &refused) && strings.HasPrefix(string(refused), rediserr.DBRange) {
		p.mu.Lock()
		if p.noDB == 0 || db < p.noDB {
			p.noDB, p.noDBErr = db, refused
		}
		delete(p.conns, db)
		p.mu.Unlock()
	}
	if err != nil {
		s.dialErr, s.failed = err, time.Now()
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		nc.Close()
		return nil, ErrClosed
	}
	s.conn = newConn(nc, br, p.m)
	return s.conn, nil
}

// ask sends n requests of the proxy's own on a new connection and returns
// the n replies. The dial timeout bounds it all: a node that accepts but
// does not answer (stopped, overloaded) must not stall the caller, and
// the shared connections are not held up behind it either.
func (p *Pool) ask(req []byte, n int) ([][]byte, error) {
	nc, br, err := p.Dial(0)
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
	replies, err := p.ask(pingReq, 1)
	if err != nil {
		return err
	}
	if reply := replies[0]; resp.IsError(reply) {
		return RedisError(reply[1 : len(reply)-2])
	}
	return nil
}

// close retires every shared connection; batches in flight fail.
func (p *Pool) close() {
	p.mu.Lock()
	p.closed = true
	var slots []*sharedSlot
	for _, s := range p.conns {
		slots = append(slots, s...)
	}
	p.mu.Unlock()
	for _, s := range slots { // slot locks are never taken under p.mu
		s.mu.Lock()
		if s.conn != nil {
			s.conn.close()
		}
		s.mu.Unlock()
	}
}
