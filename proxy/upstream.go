package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// ErrUpstreamClosed fails requests queued on an upstream connection that has
// been retired.
var ErrUpstreamClosed = errors.New("proxy: upstream connection closed")

// RedisError is an error reply from Redis, kept verbatim ("ERR …",
// "WRONGPASS …") so it can be relayed unchanged. Transport failures are
// plain errors instead: they retire the connection, a RedisError does not.
type RedisError string

func (e RedisError) Error() string { return string(e) }

// dialer opens upstream connections to one node.
type dialer struct {
	addr     string
	username string
	password string
	timeout  time.Duration
}

// dial connects, authenticates and selects db, all within the dial timeout.
// A Redis error reply to SELECT comes back as RedisError so the client sees
// Redis's own text (rediserr.DBRange).
func (d *dialer) dial(db int) (net.Conn, *bufio.Reader, error) {
	nc, err := net.DialTimeout("tcp", d.addr, d.timeout)
	if err != nil {
		return nil, nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
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
	if db != 0 {
		req = resp.AppendCommand(req, []byte("SELECT"), strconv.AppendInt(nil, int64(db), 10))
		steps++
	}
	br := bufio.NewReaderSize(nc, 16<<10)
	if steps == 0 {
		return nc, br, nil
	}
	nc.SetDeadline(time.Now().Add(d.timeout))
	err = func() error {
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
				if i == 0 && d.password != "" {
					return fmt.Errorf("proxy: upstream %s refused our AUTH: %s", d.addr, msg)
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

// batch is one run of a client's requests sent to an upstream connection
// together; the replies are appended to out in order.
type batch struct {
	req   []byte // RESP frames to send
	n     int    // replies expected
	out   []byte // replies are appended here
	done  int    // replies complete in out
	okLen int    // len(out) after the last complete reply
	// ends, when not nil, gets len(out) after each reply, so the replies
	// can be told apart.
	ends []int
	err  error
	// sent is monoNow when the write that carried it began, set on the
	// last batch of each write only: the metrics time writes, not batches.
	sent time.Duration
	// doneCh is signalled once per send, when all replies are in or the
	// connection failed; cap 1 so the reader never waits on the session.
	doneCh chan struct{}
}

// sharedConn multiplexes many clients' batches over one upstream
// connection. A session that finds no write in progress writes its batch
// itself, saving a goroutine hand-off; batches that arrive meanwhile queue
// up and the writer goroutine sends them together in one write. A reader
// goroutine fills replies in FIFO order: Redis answers in request order, so
// reply i belongs to the i-th request written.
type sharedConn struct {
	nc   net.Conn
	br   *bufio.Reader
	m    *nodeMetrics
	wake chan struct{} // cap 1: writeLoop has pending batches to send
	quit chan struct{} // closed when the connection fails

	mu       sync.Mutex
	writing  bool        // someone holds the write side; guarded by mu
	pending  []*batch    // queued, not written; failed by fail
	inflight []*batch    // written or being written; failed only by readLoop
	err      error       // sticky failure; guarded by mu
	dead     atomic.Bool // err != nil, readable without mu on the hot path

	// Scratch of the write side's holder.
	wbatches []*batch
	wbufs    net.Buffers
}

func newSharedConn(nc net.Conn, br *bufio.Reader, m *nodeMetrics) *sharedConn {
	c := &sharedConn{
		nc: nc, br: br, m: m,
		wake: make(chan struct{}, 1),
		quit: make(chan struct{}),
	}
	go c.writeLoop()
	go c.readLoop()
	return c
}

// send sends b; b.doneCh is signalled when b is complete or failed.
func (c *sharedConn) send(b *batch) {
	c.mu.Lock()
	switch {
	case c.err != nil:
		err := c.err
		c.mu.Unlock()
		b.err = err
		b.doneCh <- struct{}{}
		return
	case c.writing:
		c.pending = append(c.pending, b)
		c.mu.Unlock()
		return
	}
	c.writing = true
	c.pending = append(c.pending, b)
	c.mu.Unlock()
	// Let the other clients the poller just woke queue their batches too,
	// so one write carries them all: per-request writes to Redis cost more
	// CPU than the proxy's own work.
	runtime.Gosched()
	if c.writePending() {
		c.endWrite()
	}
}

// writePending writes every queued batch in one write. Only the holder of
// the write side calls it. It reports false when the connection failed.
func (c *sharedConn) writePending() bool {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return false
	}
	n := 0
	for _, b := range c.pending {
		b.sent = 0
		n += b.n
	}
	if len(c.pending) > 0 {
		c.pending[len(c.pending)-1].sent = monoNow()
	}
	c.m.requests.Add(float64(n))
	c.wbatches, c.pending = c.pending, c.wbatches[:0]
	c.inflight = append(c.inflight, c.wbatches...)
	c.mu.Unlock()
	c.wbufs = c.wbufs[:0]
	for _, b := range c.wbatches {
		c.wbufs = append(c.wbufs, b.req)
	}
	// The requests stay owned by their sessions, which reuse them only
	// after their replies arrived, i.e. after the kernel took the bytes.
	bufs := c.wbufs // WriteTo consumes its receiver
	_, err := bufs.WriteTo(c.nc)
	clear(c.wbatches)
	if err != nil {
		c.fail(err) // the batches are in flight: readLoop fails them
		return false
	}
	return true
}

// endWrite gives up the write side, or hands it to writeLoop when batches
// queued up while we wrote.
func (c *sharedConn) endWrite() {
	c.mu.Lock()
	queued := len(c.pending) > 0
	c.writing = queued
	c.mu.Unlock()
	if queued {
		signal(c.wake)
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// fail retires the connection: queued batches fail now, written ones fail in
// readLoop once it has stopped touching them.
func (c *sharedConn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	c.dead.Store(true)
	if !errors.Is(err, ErrUpstreamClosed) {
		c.m.errors.Inc()
	}
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	close(c.quit)
	c.nc.Close()
	for _, b := range pending {
		b.err = err
		b.doneCh <- struct{}{}
	}
}

func (c *sharedConn) close() { c.fail(ErrUpstreamClosed) }

// writeLoop sends queued batches while it holds the write side, which
// endWrite hands it.
func (c *sharedConn) writeLoop() {
	for {
		select {
		case <-c.wake:
		case <-c.quit:
			return
		}
		if !c.writePending() {
			return
		}
		c.endWrite()
	}
}

// readLoop hands replies to batches in FIFO order. It waits for data even
// with nothing in flight, so a connection Redis closes while idle (its
// timeout, CLIENT KILL) is retired before a client's batch is sent on it.
func (c *sharedConn) readLoop() {
	for {
		_, err := c.br.Peek(1)
		var b *batch
		if err == nil {
			c.mu.Lock()
			if len(c.inflight) > 0 {
				b = c.inflight[0] // written before Redis could answer it
			} else {
				err = fmt.Errorf("%w: a reply nobody asked for", resp.ErrBadReply)
			}
			c.mu.Unlock()
		}
		for err == nil && b.done < b.n {
			if b.out, err = resp.ReadReply(c.br, b.out); err == nil {
				b.done++
				b.okLen = len(b.out)
				if b.ends != nil {
					b.ends = append(b.ends, b.okLen)
				}
			}
		}
		if err != nil {
			c.fail(fmt.Errorf("proxy: reading from upstream: %w", err))
			c.failInflight()
			return
		}
		c.mu.Lock()
		c.inflight[0] = nil
		c.inflight = c.inflight[1:]
		c.mu.Unlock()
		if b.sent != 0 {
			c.m.seconds.Observe((monoNow() - b.sent).Seconds())
		}
		b.doneCh <- struct{}{}
	}
}

// failInflight fails the written batches once readLoop no longer touches
// them; fail has set c.err, so no more are added.
func (c *sharedConn) failInflight() {
	c.mu.Lock()
	inflight, err := c.inflight, c.err
	c.inflight = nil
	c.mu.Unlock()
	for _, b := range inflight {
		b.err = err
		b.doneCh <- struct{}{}
	}
}

// pool holds one node's shared connections: perDB of them for each db, so a
// client that SELECTs never changes another client's db.
type pool struct {
	dialer
	perDB int
	m     *nodeMetrics
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
	conn    *sharedConn
	dialErr error     // the last dial's failure
	failed  time.Time // when it failed
}

func newPool(d dialer, perDB int) *pool {
	return &pool{dialer: d, perDB: perDB, conns: make(map[int][]*sharedSlot),
		m: noNodeMetrics, log: slog.New(slog.DiscardHandler)}
}

// A node's state, as the pool's last dial found it.
const (
	nodeUnknown = iota // not dialed yet
	nodeUp
	nodeDown
)

// dial is dialer.dial that counts failures and logs the node going down
// (the first failure, or the first after a success) and coming back.
// Redis refusing a SELECT is an answer, not a failure.
func (p *pool) dial(db int) (net.Conn, *bufio.Reader, error) {
	nc, br, err := p.dialer.dial(db)
	var refused RedisError
	switch {
	case err == nil || errors.As(err, &refused):
		if p.state.Swap(nodeUp) == nodeDown {
			p.log.Info("upstream node up", "node", p.addr)
		}
	default:
		p.m.errors.Inc()
		if p.state.Swap(nodeDown) != nodeDown {
			p.log.Warn("upstream node down", "node", p.addr, "err", err)
		}
	}
	return nc, br, err
}

// get returns a healthy shared connection for db, dialing when the slot is
// empty or its connection failed. Clients are spread over slots by id.
func (p *pool) get(db int, id uint64) (*sharedConn, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrUpstreamClosed
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
	if s.conn != nil && !s.conn.dead.Load() {
		return s.conn, nil
	}
	if s.dialErr != nil && s.failed.After(asked) {
		// A dial failed while we waited for it: share its answer, so a
		// queue of clients waits one dial timeout, not one each.
		return nil, s.dialErr
	}
	nc, br, err := p.dial(db)
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
		return nil, ErrUpstreamClosed
	}
	s.conn = newSharedConn(nc, br, p.m)
	return s.conn, nil
}

// ask sends n requests of the proxy's own on a new connection and returns
// the n replies. The dial timeout bounds it all: a node that accepts but
// does not answer (stopped, overloaded) must not stall the caller, and
// the shared connections are not held up behind it either.
func (p *pool) ask(req []byte, n int) ([][]byte, error) {
	nc, br, err := p.dial(0)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(p.timeout))
	if _, err := nc.Write(req); err != nil {
		return nil, err
	}
	b := batch{n: n, ends: make([]int, 0, n)}
	for range n {
		if b.out, err = resp.ReadReply(br, b.out); err != nil {
			return nil, err
		}
		b.ends = append(b.ends, len(b.out))
	}
	return b.replies(nil), nil
}

// replies splits out into the replies complete in it; ends must be set.
func (b *batch) replies(dst [][]byte) [][]byte {
	start := 0
	for _, end := range b.ends {
		dst = append(dst, b.out[start:end])
		start = end
	}
	return dst
}

// close retires every shared connection; batches in flight fail.
func (p *pool) close() {
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

// errorText turns an upstream failure into the text of an error reply:
// Redis's own words for a RedisError, otherwise one line naming the cause.
func errorText(err error) string {
	var re RedisError
	if errors.As(err, &re) {
		return string(re)
	}
	return "ERR upstream unavailable: " + strings.NewReplacer("\r", " ", "\n", " ").Replace(err.Error())
}
