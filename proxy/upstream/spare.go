package upstream

import (
	"bufio"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"syscall"
)

// Spare bounds: a key (db and protocol) keeps at least one spare, and one
// more each time a client found none ready (a burst of blocking commands
// at once), up to maxSparesPerKey; a pool keeps at most maxSpares, ready
// or being dialed, so that clients cannot make it dial without end.
const (
	maxSparesPerKey = 8
	maxSpares       = 32
)

// spares are connections dialed in advance, per key, for the clients
// that need one of their own (a blocking command, MULTI, SUBSCRIBE).
//
// Why: such a command used to wait for a dial (TCP, TLS, AUTH, SELECT)
// before it reached Redis, while a command another client sent a moment
// later went at once on a shared connection and overtook it. A client
// blocked in XREADGROUP while another deletes the stream then got
// "-NOGROUP No such key …" (the DEL ran first) where Redis gives
// "-UNBLOCKED the stream key no longer exists"; XREAD on a key whose type
// a later SET changed got WRONGTYPE instead of blocking. With a spare,
// the command is written as soon as it is read, as a direct client's is;
// several clients blocking at once need several.
type spares struct {
	mu      sync.Mutex
	ready   map[Key][]spareConn
	dialing map[Key]int
	want    map[Key]int // how many k keeps, once a take found none: 1 before
	n       int         // ready and being dialed, over every key
	closed  bool
}

type spareConn struct {
	nc net.Conn
	br *bufio.Reader
}

// DialOwn is Dial for a connection of a client's own, without waiting
// for a dial when it can: it takes a spare connection of k, dialed in
// advance, when one is idle and still open (Redis's timeout may have
// closed it), and dials the next spares of k in the background. The
// cost is an idle connection per db and protocol used, per node, and
// one more per client that found none (up to maxSparesPerKey).
func (p *Pool) DialOwn(k Key) (net.Conn, *bufio.Reader, error) {
	if err := p.healthy(); err != nil {
		return nil, nil, err
	}
	sc, ok := p.spare.take(k)
	p.refillSpare(k)
	if ok {
		return sc.nc, sc.br, nil
	}
	return p.Dial(k)
}

// KeepSpare makes the pool keep a spare connection for k from now on,
// so that even the first client to need one of its own there takes it
// without a dial. Cheap when it has one.
func (p *Pool) KeepSpare(k Key) { p.refillSpare(k) }

// take removes one of k's spares and returns it if it is still usable;
// when none was, k keeps one more from now on.
func (s *spares) take(k Key) (spareConn, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.ready[k]) > 0 {
		last := len(s.ready[k]) - 1
		sc := s.ready[k][last]
		s.ready[k] = s.ready[k][:last]
		s.n--
		if idleOpen(sc) {
			return sc, true
		}
		sc.nc.Close()
	}
	s.init()
	s.want[k] = min(max(s.want[k], 1)+1, maxSparesPerKey)
	return spareConn{}, false
}

// init makes the maps; s.mu must be held.
func (s *spares) init() {
	if s.ready == nil {
		s.ready, s.dialing, s.want = make(map[Key][]spareConn), make(map[Key]int), make(map[Key]int)
	}
}

// idleOpen reports whether an idle connection is still open, by a peek
// at its socket that does not wait: nothing to read means open; the end
// (Redis closed it) or an error means closed. Bytes waiting are taken for
// open over TLS (a session ticket), for closed otherwise (nobody asked).
// A read deadline cannot tell: Go fails a read whose deadline has passed
// without trying the socket.
func idleOpen(sc spareConn) bool {
	if sc.br.Buffered() > 0 {
		return false
	}
	nc, overTLS := sc.nc, false
	if tc, ok := nc.(*tls.Conn); ok {
		nc, overTLS = tc.NetConn(), true
	}
	sys, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sys.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var buf [1]byte
	err = raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		open = errors.Is(err, syscall.EAGAIN) || n > 0 && overTLS
		return true // done, whatever it found: never wait
	})
	return err == nil && open
}

// refillSpare dials spare connections for k in the background until k
// has as many ready or being dialed as it keeps, unless Redis refused k's
// db or the pool keeps maxSpares already.
func (p *Pool) refillSpare(k Key) {
	p.mu.Lock()
	refused := p.noDB > 0 && k.DB >= p.noDB
	p.mu.Unlock()
	s := &p.spare
	s.mu.Lock()
	defer s.mu.Unlock()
	if refused || s.closed {
		return
	}
	s.init()
	for ; len(s.ready[k])+s.dialing[k] < max(s.want[k], 1) && s.n < maxSpares; s.n++ {
		s.dialing[k]++
		go func() {
			nc, br, err := p.Dial(k)
			s.mu.Lock()
			defer s.mu.Unlock()
			s.dialing[k]--
			switch {
			case err != nil:
				s.n--
			case s.closed:
				s.n--
				nc.Close()
			default:
				s.ready[k] = append(s.ready[k], spareConn{nc: nc, br: br})
			}
		}()
	}
}

// close closes the spares; those being dialed close as they arrive.
func (s *spares) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for k, scs := range s.ready {
		for _, sc := range scs {
			sc.nc.Close()
		}
		s.n -= len(scs)
		delete(s.ready, k)
	}
}
