package upstream

import (
	"bufio"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"syscall"
)

// maxSpareDBs bounds the dbs a pool keeps a spare connection for: Redis
// has 16 by default, and a client cannot make us dial one per db it names.
const maxSpareDBs = 16

// spares are connections dialed in advance, one per db, for the clients
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
	ready   map[int]spareConn // by db
	dialing map[int]bool
	closed  bool
}

type spareConn struct {
	nc net.Conn
	br *bufio.Reader
}

// DialOwn is Dial for a connection of a client's own, without waiting
// for a dial when it can: it takes the spare connection of db, dialed in
// advance, when one is idle and still open (Redis's timeout may have
// closed it), and dials the next spare of db in the background. The
// cost is one idle connection per db used, per node.
func (p *Pool) DialOwn(db int) (net.Conn, *bufio.Reader, error) {
	if err := p.healthy(); err != nil {
		return nil, nil, err
	}
	sc, ok := p.spare.take(db)
	p.refillSpare(db)
	if ok {
		return sc.nc, sc.br, nil
	}
	return p.Dial(db)
}

// KeepSpare makes the pool keep a spare connection for db from now on,
// so that even the first client to need one of its own there takes it
// without a dial. Cheap when it has one.
func (p *Pool) KeepSpare(db int) { p.refillSpare(db) }

// take removes db's spare and returns it if it is still usable.
func (s *spares) take(db int) (spareConn, bool) {
	s.mu.Lock()
	sc, ok := s.ready[db]
	delete(s.ready, db)
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

// refillSpare dials a spare connection for db in the background, unless
// db has one, one is being dialed, Redis refused db, or the pool keeps
// spares for maxSpareDBs other dbs already.
func (p *Pool) refillSpare(db int) {
	p.mu.Lock()
	refused := p.noDB > 0 && db >= p.noDB
	p.mu.Unlock()
	s := &p.spare
	s.mu.Lock()
	defer s.mu.Unlock()
	_, has := s.ready[db]
	if refused || has || s.dialing[db] || s.closed || len(s.ready)+len(s.dialing) >= maxSpareDBs {
		return
	}
	if s.ready == nil {
		s.ready, s.dialing = make(map[int]spareConn), make(map[int]bool)
	}
	s.dialing[db] = true
	go func() {
		nc, br, err := p.Dial(db)
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.dialing, db)
		switch {
		case err != nil:
		case s.closed:
			nc.Close()
		default:
			s.ready[db] = spareConn{nc: nc, br: br}
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
