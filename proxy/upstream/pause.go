package upstream

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// A CLIENT PAUSE makes Redis hold the commands of its kind (every command
// with ALL; with WRITE those that write or may replicate, PFCOUNT, PUBLISH
// and EVAL among them) until it ends, and with each held command every
// later one of its connection: Redis holds the client. On a shared
// connection that client is every client queued behind it, and the wait
// would run into the read timeout. The proxy relays CLIENT PAUSE and
// UNPAUSE, so it learns from Redis's +OK that a pause is in force, of
// which kind, and until when (Pool.Paused), and then:
//
//   - with WRITE, a batch marked Held (it has a command the pause holds)
//     goes on a held connection of its own, one per such batch up to
//     maxHeld per Key, so that Redis holds that client only, as it would
//     without the proxy: the other clients' reads are answered meanwhile.
//     Held connections are closed once idle after the pause.
//   - with ALL, everything waits as on Redis; stalled connections are not
//     replaced (a new connection's AUTH, HELLO or SELECT would wait too).
//   - no request held by the pause times out before the pause's end plus
//     the read timeout: those on held connections, with ALL those on
//     every connection, and those on the clients' own connections (see
//     ReadDeadline).
//
// What the proxy does not see (a pause sent to Redis directly, by another
// proxy, or inside MULTI, which applies it at EXEC) is met as any slow
// request is: the stall bound and the read timeout.

// maxHeld bounds the held connections per Key: past them, held batches
// queue on the held connections in turn, behind batches Redis holds
// anyway.
const maxHeld = 32

// nodePause is what the proxy knows of the CLIENT PAUSE in force on a
// node; its pools (the proxy's and its users') share it.
type nodePause struct {
	mu sync.Mutex // serialises Paused and Unpaused
	// end is monoNow when the last pause seen ends or ended (UNPAUSE: when
	// it was answered); 0 while none was seen. all: that pause is ALL.
	end atomic.Int64
	all atomic.Bool
}

// on reports whether a pause is in force at now, and whether it is ALL.
func (np *nodePause) on(now time.Duration) (on, all bool) {
	if now >= time.Duration(np.end.Load()) {
		return false, false
	}
	return true, np.all.Load()
}

// pausedAll reports whether a CLIENT PAUSE ALL is in force.
func (p *Pool) pausedAll() bool {
	_, all := p.pause.on(monoNow())
	return all
}

// Paused records that the node accepted CLIENT PAUSE d [WRITE|ALL] (all:
// ALL, Redis's default): as Redis does, a pause in force is extended to
// the later end and to the stricter kind.
func (p *Pool) Paused(d time.Duration, all bool) {
	np := p.pause
	np.mu.Lock()
	defer np.mu.Unlock()
	now := monoNow()
	end := now + d
	if d < 0 || end < now {
		end = 1<<63 - 1 // overflows: as long as a Duration goes
	}
	if on, wasAll := np.on(now); on {
		end = max(end, time.Duration(np.end.Load()))
		all = all || wasAll
	}
	np.all.Store(all)
	np.end.Store(int64(end))
}

// Unpaused records that the node accepted CLIENT UNPAUSE.
func (p *Pool) Unpaused() {
	np := p.pause
	np.mu.Lock()
	defer np.mu.Unlock()
	if now := monoNow(); now < time.Duration(np.end.Load()) {
		np.end.Store(int64(now))
	}
}

// ReadDeadline is when a request written now on a connection of the
// caller's own may fail for having had no reply within limit: now plus
// limit, or, while a pause is in force, its end plus limit.
func (p *Pool) ReadDeadline(limit time.Duration) time.Time {
	now := monoNow()
	return time.Now().Add(max(time.Duration(p.pause.end.Load())-now, 0) + limit)
}

// heldSince is when the wait of c's oldest request, written at since,
// starts counting toward the read timeout: the end of a pause that may
// hold it, if later.
func (p *Pool) heldSince(c *Conn, since time.Duration) time.Duration {
	if c.paused || p.pause.all.Load() {
		return max(since, time.Duration(p.pause.end.Load()))
	}
	return since
}

// sendHeld sends b, which a CLIENT PAUSE WRITE in force holds, on a held
// connection of k: an idle one, else a new one while there are fewer than
// maxHeld, else the next in turn.
func (p *Pool) sendHeld(k Key, b *Batch) {
	for {
		c, err := p.heldConn(k)
		if err != nil {
			b.Err = err
			b.DoneCh <- struct{}{}
			return
		}
		sent := c.Send(b)
		c.claimed.Store(false)
		if sent {
			return
		}
	}
}

// heldConn picks the held connection of k for a batch and claims it, so
// that a batch sent meanwhile takes another; see sendHeld.
func (p *Pool) heldConn(k Key) (*Conn, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	held := slices.DeleteFunc(p.held[k], (*Conn).Failed)
	p.held[k] = held
	for _, c := range held {
		if !c.Failed() && c.since.Load() == 0 && c.claimed.CompareAndSwap(false, true) {
			p.mu.Unlock()
			return c, nil
		}
	}
	if len(held) >= maxHeld {
		p.turn++
		c := held[p.turn%len(held)]
		c.claimed.Store(true)
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()
	nc, br, err := p.Dial(k)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c, err := p.adopt(nc, br, k, -1)
	if err != nil {
		return nil, err
	}
	c.paused = true
	c.claimed.Store(true)
	p.held[k] = append(p.held[k], c)
	return c, nil
}

// pruneHeld forgets the held connections that failed or were closed;
// with p.mu held. It reports whether any are left.
func (p *Pool) pruneHeld() bool {
	left := false
	for k, held := range p.held {
		held = slices.DeleteFunc(held, (*Conn).Failed)
		if len(held) == 0 {
			delete(p.held, k)
			continue
		}
		p.held[k] = held
		left = true
	}
	return left
}
