package upstream

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// How the pool watches its shared connections (see watchLoop).
const (
	// stallAfter is how long the oldest request on a shared connection
	// may wait before new requests stop going on it (Pool.stallAfter):
	// Redis answers a connection in order, so they would wait behind it.
	// It is five times a batch's p99 round trip through the proxy under
	// full load (under 10 ms, README Speed) and Redis's own idea of a slow
	// command (slowlog-log-slower-than, 10 ms), so what trips it is a slow
	// command (a script, KEYS * or SORT on a big db), a big reply, a
	// stopped node, or a proxy starved of CPU; a false alarm costs one
	// dial. The watchdog ticks at half of it (or of the read timeout)
	// while requests are in flight, which bounds the error of both.
	stallAfter = 50 * time.Millisecond
	// probeInterval is the pause between two probes of a node that is
	// down.
	probeInterval = time.Second
	// probeIdle ends the probes of a node nobody asked for meanwhile (a
	// cluster node failed over and gone), Pool.probeIdle: it is then
	// dialed again, as a node never seen, when next asked for.
	probeIdle = time.Minute
)

// TimeoutError fails the requests of a connection whose oldest request
// had no reply within the read timeout (upstream.read_timeout, plus a
// blocking command's own timeout): the connection is closed, and a
// request may have run. ErrorText words it "ERR upstream timeout: …".
type TimeoutError struct {
	Node  string        // host:port
	After time.Duration // how long the request had waited
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("no reply from %s within %v", e.Node, e.After)
}

// Timeout reports true, as net.Error's Timeout does.
func (e *TimeoutError) Timeout() bool { return true }

// DownError is what Get, Dial and the proxy's own requests answer at once
// while a node that timed out does not answer a probe either: the proxy
// dials it no more than once per probeInterval until it answers.
type DownError struct {
	Node  string // host:port
	Cause error  // why the last probe failed
}

func (e *DownError) Error() string {
	return fmt.Sprintf("node %s is down (%v); probing it every %v", e.Node, e.Cause, probeInterval)
}

// watchdog is a pool's timer over its shared connections: armed by the
// first write that finds nothing in flight on a connection, it ticks
// until none has requests in flight, so an idle pool has no timer.
type watchdog struct {
	armed atomic.Bool
	wake  chan struct{} // cap 1: armed
}

// arm wakes the watchdog unless it is ticking already. It runs once per
// write that finds its connection idle, so it is one atomic load when the
// watchdog is armed.
func (w *watchdog) arm() {
	if !w.armed.Load() && w.armed.CompareAndSwap(false, true) {
		signal(w.wake)
	}
}

// watchLoop ticks while requests are in flight on the pool's shared
// connections, until the pool is closed. A connection whose oldest
// request has waited past p.stallAfter is stalled (not a Blocking one,
// whose WAITs wait by design): Get hands out another,
// and the session's cached one is dropped (Usable). Past the read
// timeout the connection fails with a TimeoutError, every request on it
// with it, and the node is probed. A connection replaced after a stall
// is closed once nothing is in flight on it.
//
// Disarming races with arm: the loop clears armed and then looks again,
// and arm stores since before it loads armed, so either the loop sees the
// new request or arm sees armed cleared and wakes the loop.
func (p *Pool) watchLoop() {
	every := min(p.stallAfter, p.readTimeout) / 2
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		tick.Stop()
		select {
		case <-p.quit:
			return
		case <-p.watch.wake:
		}
		tick.Reset(every)
		for {
			select {
			case <-p.quit:
				return
			case <-tick.C:
			}
			if p.check() {
				continue
			}
			p.watch.armed.Store(false)
			if !p.check() {
				break
			}
			p.watch.armed.Store(true)
		}
	}
}

// check is one tick of the watchdog over every shared connection; it
// reports whether the watchdog must keep ticking: requests are in flight,
// or a replaced connection waits to be closed.
func (p *Pool) check() bool {
	now := monoNow()
	p.mu.Lock()
	conns := append(p.watched[:0], p.live...)
	p.mu.Unlock()
	busy := false
	paused, _ := p.pause.on(now)
	for _, c := range conns {
		since, state := time.Duration(c.since.Load()), c.state.Load()
		switch {
		case state&connFailed != 0:
		case since == 0:
			switch {
			case state&connDraining != 0:
				c.closeIdle()
			case c.paused && !paused:
				c.closeIdle()
			case state&connStalled != 0:
				c.state.And(^uint32(connStalled))
			}
		case now-p.heldSince(c, since) >= p.readTimeout:
			p.suspect() // first, so that the clients told wait for the probe
			p.m.Timeouts.Inc()
			c.fail(&TimeoutError{Node: p.addr, After: p.readTimeout})
		case now-since >= p.stallAfter && !c.key.Blocking:
			// A Blocking one's WAIT waits by design, up to its timeout;
			// replacing it would only crowd the others onto fewer.
			c.state.Or(connStalled)
			if c.at >= 0 && !paused {
				p.rerun(c)
			}
			busy = true
		default:
			c.state.And(^uint32(connStalled))
			busy = true
		}
	}
	clear(conns)
	p.watched = conns
	p.mu.Lock()
	p.live = slices.DeleteFunc(p.live, (*Conn).Failed)
	p.draining = 0
	for _, c := range p.live {
		if c.state.Load()&connDraining != 0 {
			p.draining++
		}
	}
	busy = busy || p.draining > 0 || p.pruneHeld()
	p.mu.Unlock()
	return busy
}

// rerun sends the Rerun batches written behind the stalled oldest
// request of c, a shared connection, again on another shared connection
// of its Key: the one Get gives for c's place, which replaces c if it may,
// else another usable one. Redis then answers them as it answers a client
// of its own while the stalled request runs (-BUSY behind a busy script,
// also when the BUSY refuses the new connection's SELECT), instead of
// after it, and they do not fail with it when it times out.
// During a CLIENT PAUSE nothing moves: pause.go keeps what Redis holds
// apart. It runs in a goroutine of its own, one per connection at a time:
// a dial must not hold up the watchdog.
func (p *Pool) rerun(c *Conn) {
	if !c.hasReruns() || !c.rerunning.CompareAndSwap(false, true) {
		return // nothing to move (no goroutine, dial or drain), or a move runs
	}
	go func() {
		defer c.rerunning.Store(false)
		o, err := p.Get(c.key, uint64(c.at))
		var refused RedisError
		if errors.As(err, &refused) && strings.HasPrefix(string(refused), "BUSY ") {
			// A busy script refused the new connection's SELECT: it
			// refuses these requests alike, on any connection.
			for _, b := range c.takeReruns() {
				b.refuse(refused)
			}
			return
		}
		if err != nil || o == c || !o.Usable() {
			return // nowhere better: they wait where they are
		}
		var writers []*Conn
		for _, b := range c.takeReruns() {
			if mayDial(o) {
				writers = writeAll(writers) // as RoundTrip.sendRound
			}
			if w := p.queue(&o, c.key, uint64(c.at), b); w != nil {
				writers = append(writers, w)
			}
		}
		writeAll(writers)
	}()
}

// drain takes c, a stalled connection still in its slot, out of service
// for good (it is closed once idle), unless the pool has perDB such
// connections already: a node that stalls every connection (stopped,
// or running KEYS *) must not make the pool dial without end. It reports
// whether c may be replaced.
func (p *Pool) drain(c *Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.draining >= p.perDB {
		return false
	}
	p.draining++
	c.state.Or(connDraining)
	return true
}

// suspect probes the node after a request timed out on it, unless a
// probe runs already. Until its first answer, Get, Dial and Ask wait for
// it (at most the dial timeout, twice) rather than send more requests
// where one just timed out.
func (p *Pool) suspect() {
	if p.probing.CompareAndSwap(false, true) {
		first := make(chan struct{})
		p.probed.Store(&first)
		go p.probe(first)
	}
}

// probe sends PING to the node on a connection of its own, within the
// dial timeout, until any reply comes (an error reply such as BUSY or
// LOADING is an answer too): then the node is up. While none comes the
// node is down: the requests in flight on its shared connections fail
// (TimeoutError, with how long each waited), Get, Dial and Ask fail at
// once with a DownError, and the probe is tried again every
// probeInterval, for as long as clients ask for the node (p.probeIdle).
// The transitions are logged. first is closed after the first try.
func (p *Pool) probe(first chan struct{}) {
	defer p.probing.Store(false)
	for {
		_, err := p.exchange(p.dialer.dial, pingReq, 1)
		if err == nil {
			if p.state.Swap(nodeUp) == nodeDown {
				p.log.Info("upstream node up", "node", p.addr)
			}
			p.down.Store(nil)
		} else {
			p.markDown(err)
		}
		if first != nil {
			p.probed.Store(nil)
			close(first)
			first = nil
		}
		if err == nil {
			return
		}
		if monoNow()-time.Duration(p.refused.Load()) > p.probeIdle {
			p.down.Store(nil) // still nodeDown: the next dial logs it up
			return
		}
		select {
		case <-p.quit:
			return
		case <-time.After(probeInterval):
		}
	}
}

// markDown records that the node did not answer a probe (err): see probe.
func (p *Pool) markDown(err error) {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		err = fmt.Errorf("no reply within %v, nor to PING within %v", p.readTimeout, p.timeout)
	}
	if p.down.Swap(&DownError{Node: p.addr, Cause: err}) != nil {
		return
	}
	p.refused.Store(int64(monoNow()))
	if p.state.Swap(nodeDown) != nodeDown {
		p.log.Warn("upstream node down", "node", p.addr, "err", err)
	}
	now := monoNow()
	p.mu.Lock()
	live := slices.Clone(p.live)
	p.mu.Unlock()
	for _, c := range live {
		c.state.Or(connDraining) // the idle ones close at the next tick
		if since := time.Duration(c.since.Load()); since != 0 {
			p.m.Timeouts.Inc()
			c.fail(&TimeoutError{Node: p.addr, After: (now - since).Round(time.Millisecond)})
		}
	}
	p.watch.arm()
}

// healthy waits for the first answer of a probe under way, then returns
// the DownError while the node is down, else nil.
func (p *Pool) healthy() error {
	if first := p.probed.Load(); first != nil {
		select {
		case <-*first:
		case <-p.quit:
		}
	}
	if d := p.down.Load(); d != nil {
		p.refused.Store(int64(monoNow()))
		return d
	}
	return nil
}

// TimedOut reports that a request on a connection from Dial had no reply
// within after (the read timeout, plus a blocking command's own): it is
// counted, and the node probed as when a shared connection times out. It
// returns the error to fail the request with.
func (p *Pool) TimedOut(after time.Duration) error {
	p.m.Timeouts.Inc()
	p.m.Errors.Inc()
	p.suspect()
	return &TimeoutError{Node: p.addr, After: after}
}
