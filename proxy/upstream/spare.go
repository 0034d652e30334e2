package upstream

import (
	"bufio"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"syscall"
)

// maxSpares bounds the keys (db and protocol) a pool keeps a spare
// connection for: Redis has 16 dbs by default, and a client cannot make
// us dial one per db it names.
const maxSpares = 16

// spares are connections dialed in advance, one per key, for the clients
// that need one of their own (a blocking command, MULTI, SUBSCRIBE).
//
// Why: such a command used to wait for a dial (TCP, TLS, AUTH, SELECT)
// before it reached Redis, while a command another client sent a moment
// later went at once on a shared connection and overtook it. A client
// blocked in XREADGROUP while another deletes the stream then got
// "-NOGROUP No such key …" (the DEL ran first) where Redis gives
// "-UNBLOCKED the stream key no longer exists"; XREAD on a key whose type
// a later SET changed got WRONGTYPE instead of blocking. With a spare,
// the command is written as soon as it is read, as a direct client's is.
type spares struct {
	mu      sync.Mutex
	ready   map[Key]spareConn
	dialing map[Key]bool
	closed  bool
}

type spareConn struct {
	nc net.Conn
	br *bufio.Reader
}

// DialOwn is Dial for a connection of a client's own, without waiting
// for a dial when it can: it takes the spare connection of k, dialed in
// advance, when one is idle and still open (Redis's timeout may have
// closed it), and dials the next spare of k in the background. The
// cost is one idle connection per db and protocol used, per node.
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

// take removes k's spare and returns it if it is still usable.
func (s *spares) take(k Key) (spareConn, bool) {
	s.mu.Lock()
	sc, ok := s.ready[k]
	delete(s.ready, k)
	s.mu.Unlock()
	if ok && !idleOpen(sc) {
		sc.nc.Close()
		ok = false
	}
	return sc, ok
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

// refillSpare dials a spare connection for k in the background, unless
// k has one, one is being dialed, Redis refused k's db, or the pool keeps
// spares for maxSpares other keys already.
func (p *Pool) refillSpare(k Key) {
	p.mu.Lock()
	refused := p.noDB > 0 && k.DB >= p.noDB
	p.mu.Unlock()
	s := &p.spare
	s.mu.Lock()
	defer s.mu.Unlock()
	_, has := s.ready[k]
	if refused || has || s.dialing[k] || s.closed || len(s.ready)+len(s.dialing) >= maxSpares {
		return
	}
	if s.ready == nil {
		s.ready, s.dialing = make(map[Key]spareConn), make(map[Key]bool)
	}
	s.dialing[k] = true
	go func() {
		nc, br, err := p.Dial(k)
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.dialing, k)
		switch {
		case err != nil:
		case s.closed:
			nc.Close()
		default:
			s.ready[k] = spareConn{nc: nc, br: br}
		}
	}()
}

// close closes the spares; those being dialed close as they arrive.
func (s *spares) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for db, sc := range s.ready {
		sc.nc.Close()
		delete(s.ready, db)
	}
}
