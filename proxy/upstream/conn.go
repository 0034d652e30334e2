package upstream

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// ErrClosed fails requests queued on a connection that has been retired:
// its pool was closed, or a Batch was sent after it failed for this reason.
// Its text names the proxy, as clients see it in "-ERR upstream
// unavailable: …".
var ErrClosed = errors.New("proxy: upstream connection closed")

// RedisError is an error reply from Redis, kept verbatim ("ERR …",
// "WRONGPASS …") so it can be relayed unchanged. Transport failures are
// plain errors instead: they retire the connection, a RedisError does not.
type RedisError string

func (e RedisError) Error() string { return string(e) }

// ErrorText turns an upstream failure into the text of an error reply,
// without the leading '-' and CRLF: Redis's own words for a RedisError;
// for a TimeoutError "ERR upstream timeout: no reply from host:port
// within 5s; the command may have run"; otherwise "ERR upstream
// unavailable: " and the cause on one line.
func ErrorText(err error) string {
	var re RedisError
	if errors.As(err, &re) {
		return string(re)
	}
	var ae *AuthError
	if errors.As(err, &ae) {
		return ae.text()
	}
	var te *TimeoutError
	if errors.As(err, &te) {
		return "ERR upstream timeout: " + te.Error() + "; the command may have run"
	}
	return "ERR upstream unavailable: " + strings.NewReplacer("\r", " ", "\n", " ").Replace(err.Error())
}

// Batch is one run of requests sent on a Conn together; the replies are
// appended to Out in order. Before each Send the sender sets Req, N and
// Out (the buffer to append to, nil for a new one), and resets Done,
// OKLen, Err and Ends; DoneCh is made once. The Conn owns the Batch from
// Send until it signals DoneCh, and the sender must not change Req
// meanwhile.
type Batch struct {
	Req   []byte // RESP frames to send
	N     int    // replies expected
	Out   []byte // replies are appended here
	Done  int    // replies complete in Out
	OKLen int    // len(Out) after the last complete reply
	// Ends, when not nil, gets len(Out) after each reply, so the replies
	// can be told apart.
	Ends []int
	// Err is why the replies after the first Done are missing: a transport
	// failure, after which Out[OKLen:] is a partial reply to drop.
	Err error
	// DoneCh is signalled once per Send, when all replies are in or the
	// connection failed. It must have a buffer of 1, so the reader never
	// waits on the sender.
	DoneCh chan struct{}

	// Held: a request in it is one a CLIENT PAUSE WRITE holds (it writes or
	// may replicate, as Redis's command flags say), so during such a pause
	// it goes where it holds no other client's requests (pause.go).
	Held bool
	// Rerun: every request in it only reads, so that Redis keeps the same
	// whether it runs once or twice. Written behind a stalled request, it
	// is sent again on another connection (Pool.rerun), and the replies
	// the stalled one gives it later are dropped.
	Rerun bool

	// wrote is monoNow when the write that carried it began: its read
	// timeout runs from there. timed marks the last batch of each write:
	// the metrics time writes, not batches.
	wrote time.Duration
	timed bool
}

// refuse answers each request of b that has no reply with the error e,
// as Redis answers them all when it refuses them (BUSY), and completes b.
func (b *Batch) refuse(e RedisError) {
	for ; b.Done < b.N; b.Done++ {
		b.Out = append(append(append(b.Out, '-'), e...), "\r\n"...)
		b.OKLen = len(b.Out)
		if b.Ends != nil {
			b.Ends = append(b.Ends, b.OKLen)
		}
	}
	b.DoneCh <- struct{}{}
}

// replies splits Out into the replies complete in it; Ends must be set.
func (b *Batch) replies(dst [][]byte) [][]byte {
	start := 0
	for _, end := range b.Ends {
		dst = append(dst, b.Out[start:end])
		start = end
	}
	return dst
}

// Conn multiplexes many clients' batches over one connection to Redis. A
// sender that finds no write in progress writes its batch itself, saving
// a goroutine hand-off; batches that arrive meanwhile queue up and the
// writer goroutine sends them together in one write. A reader goroutine
// fills replies in FIFO order: Redis answers in request order, so reply i
// belongs to the i-th request written. Nothing stateful may be sent on
// it (MULTI, SELECT, SUBSCRIBE): its users would see each other's state.
// Safe for concurrent use.
type Conn struct {
	nc    net.Conn
	br    *bufio.Reader
	m     *NodeMetrics
	pool  *Pool         // whose Refusal checks its replies
	watch *watchdog     // its pool's, armed when a write finds nothing in flight
	wake  chan struct{} // cap 1: writeLoop has pending batches to send
	quit  chan struct{} // closed when the connection fails

	mu sync.Mutex
	// writing: someone holds the write side, since taken (monoNow).
	// Changed under mu, loaded without it by Pool.queue to find a write
	// under way.
	writing  atomic.Bool
	taken    atomic.Int64
	pending  []*Batch // queued, not written; failed by fail
	inflight []*Batch // written or being written; failed only by readLoop
	reading  bool     // readLoop fills inflight[0]: a reply to it arrived
	unsent   int      // the last ones of inflight, which a write may still be reading
	err      error    // sticky failure; guarded by mu

	// since is the wrote of inflight[0], 0 while nothing is in flight:
	// how long the oldest request has waited, for the watchdog. Stored
	// under mu, loaded without it.
	since atomic.Int64
	// state is connFailed, connStalled and connDraining, readable without
	// mu on the hot path.
	state atomic.Uint32
	// key, at (its place in the pool's slots for key, -1 for a held one)
	// and siblings (those slots) are set before it is shared.
	key      Key
	at       int
	siblings []*sharedSlot
	// paused: it carries batches a CLIENT PAUSE holds (pause.go), set
	// before it is shared; claimed: a batch is about to be sent on it.
	paused  bool
	claimed atomic.Bool
	// rerunning: Pool.rerun moves batches off it.
	rerunning atomic.Bool

	// Scratch of the write side's holder.
	wbatches []*Batch
	wbufs    net.Buffers
}

// Conn states: any set keeps the pool from handing the connection out.
const (
	connFailed   = 1 << iota // err is set: batches sent on it fail at once
	connStalled              // its oldest request has waited past Pool.stallAfter
	connDraining             // replaced after a stall: closed once it is idle
)

func newConn(nc net.Conn, br *bufio.Reader, m *NodeMetrics, w *watchdog, p *Pool) *Conn {
	c := &Conn{
		nc: nc, br: br, m: m, pool: p, watch: w,
		wake: make(chan struct{}, 1),
		quit: make(chan struct{}),
	}
	go c.writeLoop()
	go c.readLoop()
	return c
}

// Failed reports whether the connection is retired; a Batch sent on it
// fails at once. Its pool dials a new one on the next Get.
func (c *Conn) Failed() bool { return c.state.Load()&connFailed != 0 }

// Usable reports whether new batches should go on c: it has not failed,
// and its oldest request in flight has not waited past the stall bound
// (a slow script, KEYS *), behind which they would wait too. When it is
// false, take the connection Pool.Get gives.
func (c *Conn) Usable() bool { return c.state.Load() == 0 }

// Send sends b; b.DoneCh is signalled when b is complete or failed. It
// reports false, with b untouched, only when c was replaced after a stall
// and closed since: b was never sent, so it may go on another connection.
func (c *Conn) Send(b *Batch) bool {
	held, ok := c.queue(b)
	if held {
		// Let the other clients the poller just woke queue their batches
		// too, so one write carries them all: per-request writes to Redis
		// cost more CPU than the proxy's own work.
		runtime.Gosched()
		c.writeHeld()
	}
	return ok
}

// queue is Send without the write: when held is true the caller took the
// write side, and must call writeHeld (after letting others queue).
func (c *Conn) queue(b *Batch) (held, ok bool) {
	c.mu.Lock()
	switch {
	case c.err == errDrained:
		c.mu.Unlock()
		return false, false
	case c.err != nil:
		err := c.err
		c.mu.Unlock()
		b.Err = err
		b.DoneCh <- struct{}{}
		return false, true
	case c.writing.Load():
		c.pending = append(c.pending, b)
		c.mu.Unlock()
		return false, true
	}
	c.writing.Store(true)
	c.taken.Store(int64(monoNow()))
	c.pending = append(c.pending, b)
	c.mu.Unlock()
	return true, true
}

// writeHeld writes what is queued, for the holder of the write side.
func (c *Conn) writeHeld() {
	if c.writePending() {
		c.endWrite()
	}
}

// writeAll writes what is queued on each of held, whose write sides the
// caller took, and returns held emptied.
func writeAll(held []*Conn) []*Conn {
	for _, c := range held {
		c.writeHeld()
	}
	clear(held)
	return held[:0]
}

// writePending writes every queued batch in one write. Only the holder of
// the write side calls it. It reports false when the connection failed.
func (c *Conn) writePending() bool {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return false
	}
	now := monoNow()
	n := 0
	for _, b := range c.pending {
		b.wrote, b.timed = now, false
		n += b.N
	}
	idle := len(c.inflight) == 0 && len(c.pending) > 0
	if len(c.pending) > 0 {
		c.pending[len(c.pending)-1].timed = true
	}
	if idle {
		c.since.Store(int64(now))
	}
	c.m.Requests.Add(float64(n))
	c.wbatches, c.pending = c.pending, c.wbatches[:0]
	c.inflight = append(c.inflight, c.wbatches...)
	c.unsent = len(c.wbatches)
	c.mu.Unlock()
	if idle {
		c.watch.arm()
	}
	c.wbufs = c.wbufs[:0]
	for _, b := range c.wbatches {
		c.wbufs = append(c.wbufs, b.Req)
	}
	// The requests stay owned by their senders, which reuse them only
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
func (c *Conn) endWrite() {
	c.mu.Lock()
	c.unsent = 0
	queued := len(c.pending) > 0
	c.writing.Store(queued)
	if queued {
		c.taken.Store(int64(monoNow())) // by writeLoop
	}
	c.mu.Unlock()
	if queued {
		signal(c.wake)
	}
}

// signal wakes the one goroutine that waits on ch, a channel of cap 1,
// unless it has been woken already.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// fail retires the connection: queued batches fail now, written ones fail in
// readLoop once it has stopped touching them.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	c.retire(err)
}

// retire is fail with mu held, which it unlocks.
func (c *Conn) retire(err error) {
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	c.state.Or(connFailed)
	if !errors.Is(err, ErrClosed) {
		c.m.Errors.Inc()
	}
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	close(c.quit)
	c.nc.Close()
	for _, b := range pending {
		b.Err = err
		b.DoneCh <- struct{}{}
	}
}

func (c *Conn) close() { c.fail(ErrClosed) }

// errDrained retires a connection replaced after a stall, once nothing
// is in flight on it; Send turns it away rather than fail a batch with it.
var errDrained = fmt.Errorf("%w after a stall", ErrClosed)

// closeIdle closes c when nothing is queued or in flight on it.
func (c *Conn) closeIdle() {
	c.mu.Lock()
	if c.err == nil && (c.writing.Load() || len(c.pending) > 0 || len(c.inflight) > 0) {
		c.mu.Unlock()
		return
	}
	c.retire(errDrained)
}

// writeLoop sends queued batches while it holds the write side, which
// endWrite hands it.
func (c *Conn) writeLoop() {
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
func (c *Conn) readLoop() {
	for {
		_, err := c.br.Peek(1)
		var b *Batch
		if err == nil {
			c.mu.Lock()
			if len(c.inflight) > 0 {
				b = c.inflight[0] // written before Redis could answer it
				c.reading = true
			} else {
				err = fmt.Errorf("%w: a reply nobody asked for", resp.ErrBadReply)
			}
			c.mu.Unlock()
		}
		for err == nil && b.Done < b.N {
			start := len(b.Out)
			if b.Out, err = resp.ReadReply(c.br, b.Out); err == nil {
				b.Out = c.pool.Refusal(b.Out, start)
				b.Done++
				b.OKLen = len(b.Out)
				if b.Ends != nil {
					b.Ends = append(b.Ends, b.OKLen)
				}
			}
		}
		if err != nil {
			c.fail(fmt.Errorf("proxy: reading from upstream: %w", err))
			c.failInflight()
			return
		}
		c.mu.Lock()
		c.reading = false
		c.inflight[0] = nil
		c.inflight = c.inflight[1:]
		if len(c.inflight) > 0 {
			c.since.Store(int64(c.inflight[0].wrote))
		} else {
			c.since.Store(0)
		}
		c.mu.Unlock()
		if b.timed {
			c.m.Seconds.Observe((monoNow() - b.wrote).Seconds())
		}
		b.DoneCh <- struct{}{}
	}
}

// movable reports whether inflight[i] may be sent again elsewhere: it is
// Rerun, its write is over (its Req is the sender's again once it is
// answered) and no reply to it came. The oldest may only with a batch
// behind it that may not move: Redis may have run it and hold its reply
// while that one runs (a busy script's connection gets nothing until the
// script ends); alone, it is itself the slow request, and would only be
// slow again elsewhere. c.mu must be held.
func (c *Conn) movable(i int) bool {
	if !c.inflight[i].Rerun || i >= len(c.inflight)-c.unsent {
		return false
	}
	if i > 0 {
		return true
	}
	return !c.reading && slices.ContainsFunc(c.inflight[1:], func(b *Batch) bool { return !b.Rerun })
}

// hasReruns reports whether takeReruns would take a batch off c.
func (c *Conn) hasReruns() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	for i := range c.inflight {
		if c.movable(i) {
			return true
		}
	}
	return slices.ContainsFunc(c.pending, func(b *Batch) bool { return b.Rerun })
}

// takeReruns takes the batches off c that may be sent again elsewhere: a
// queued Rerun one is removed, a movable written one gives its place to a
// stand-in that takes its replies and drops them. A batch moves once:
// each taken one's Rerun is cleared.
func (c *Conn) takeReruns() []*Batch {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil
	}
	var moved []*Batch
	for i, b := range c.inflight {
		if c.movable(i) {
			c.inflight[i] = &Batch{N: b.N, DoneCh: make(chan struct{}, 1), wrote: b.wrote, timed: b.timed}
			b.Rerun = false
			moved = append(moved, b)
		}
	}
	c.pending = slices.DeleteFunc(c.pending, func(b *Batch) bool {
		if b.Rerun {
			b.Rerun = false
			moved = append(moved, b)
			return true
		}
		return false
	})
	return moved
}

// failInflight fails the written batches once readLoop no longer touches
// them; fail has set c.err, so no more are added.
func (c *Conn) failInflight() {
	c.mu.Lock()
	inflight, err := c.inflight, c.err
	c.inflight = nil
	c.mu.Unlock()
	for _, b := range inflight {
		b.Err = err
		b.DoneCh <- struct{}{}
	}
}

// monoStart is the origin of monoNow.
var monoStart = time.Now()

// monoNow is the time on the monotonic clock, for durations: it reads one
// clock where time.Now reads two (wall and monotonic), which counts on the
// request path.
func monoNow() time.Duration { return time.Since(monoStart) }
