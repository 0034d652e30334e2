package proxy

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
)

// Redis writes a push (a key invalidation, tracking-redir-broken) to a
// RESP3 client that tracks keys the moment it has one, whether the client
// waits for a reply or not. The session reads the client's own connection
// only while it expects replies there, so while it waits for the client's
// next commands a watch copies what Redis sends to the client at once;
// the session stops it before it sends anything. In RESP2 Redis pushes
// nothing on a tracking connection (a REDIRECT target's subscription is
// a stream, relayed as such).

// watchPushes starts the watch when the client tracks keys in RESP3 on
// its own connection, or is the target of another's (see ownForPushes), and has nothing buffered to run; stop ends it before
// the connection is used again (nil: no watch). A failure of the
// connection or of the client's writes closes the client, as Redis closes
// one whose output failed: its invalidations would be lost.
func (s *session) watchPushes() (stop func()) {
	if !s.track.on && !s.pushTarget || s.proto != resp.RESP3 || s.own == nil || s.streaming || s.quit ||
		s.srv.up.Cluster != nil || s.rd.Buffered() > 0 {
		return nil
	}
	own := s.own
	own.nc.SetReadDeadline(time.Time{}) // no timeout while the client is idle
	var mu sync.Mutex                   // held while a frame is read; guards stopped and own's read deadline
	stopped := false
	done := make(chan struct{})
	go func() {
		defer close(done)
		var buf []byte
		for {
			// Peek takes nothing: when stop interrupts it, a frame that
			// began to arrive stays for the session.
			_, err := own.br.Peek(1)
			mu.Lock()
			if stopped {
				mu.Unlock()
				return
			}
			if err == nil {
				buf, err = s.readPushes(own, buf[:0])
			}
			mu.Unlock()
			if err == nil && len(buf) > 0 {
				var kept bool
				if kept, err = s.w.write(buf); kept {
					buf = nil
				}
			}
			if err != nil {
				own.nc.Close() // a frame may be cut: the session must not read on
				s.nc.Close()   // the session's read of the client ends
				return
			}
		}
	}()
	return func() {
		mu.Lock()
		stopped = true
		own.nc.SetReadDeadline(time.Unix(1, 0)) // a Peek in progress returns
		mu.Unlock()
		<-done
	}
}

// readPushes appends to buf the frames Redis sent on own, every one that
// has arrived, within upstream.read_timeout: Redis writes a frame whole.
func (s *session) readPushes(own *ownConn, buf []byte) ([]byte, error) {
	own.nc.SetReadDeadline(time.Now().Add(s.srv.cfg.Upstream.ReadTimeout.Duration()))
	defer own.nc.SetReadDeadline(time.Time{})
	for {
		var err error
		if buf, err = resp.ReadReply(own.br, buf); err != nil {
			return buf, err
		}
		if own.br.Buffered() == 0 || len(buf) >= maxPendingOut {
			return buf, nil
		}
	}
}

// pushesOnly keeps only the pushes of the replies in out, in place: what
// Redis sends a client whose replies CLIENT REPLY OFF or SKIP silences.
func pushesOnly(out []byte) []byte {
	kept := 0
	for rest := out; len(rest) > 0; {
		n := resp.FrameLen(rest)
		if rest[0] == '>' {
			kept += copy(out[kept:], rest[:n])
		}
		rest = rest[n:]
	}
	return out[:kept]
}

// A client may REDIRECT its invalidations to a RESP3 client that neither
// tracks nor subscribes: Redis pushes them to that client's connection.
// Through the proxy that is the target's own connection, which the target
// may not have: the redirecting session asks the target's goroutine to
// dial one (a session's connections are its own to touch), waking it from
// its wait for commands with a read deadline in the past.

// ownForPushes is ownAddr of t once t has its own connection for
// another client's invalidations; ok is false when t is not in RESP3
// (Redis would push nothing to it), left, or got none within
// upstream.dial_timeout and upstream.read_timeout (a batch running).
func (t *session) ownForPushes() (addr string, p *upstream.Pool, ok bool) {
	t.info.mu.Lock()
	proto := t.info.proto
	t.info.mu.Unlock()
	if proto != int(resp.RESP3) || t.srv.up.Cluster != nil {
		return "", nil, false
	}
	t.ownMu.Lock()
	if t.ownAsked == nil {
		t.ownAsked = make(chan struct{})
		t.nc.SetReadDeadline(time.Unix(1, 0))
	}
	asked := t.ownAsked
	t.ownMu.Unlock()
	timer := time.NewTimer(t.srv.up.Pool.DialTimeout() + t.srv.cfg.Upstream.ReadTimeout.Duration())
	defer timer.Stop()
	select {
	case <-asked:
	case <-timer.C:
	case <-t.srv.stop:
	}
	return t.ownAddr()
}

// giveOwn answers another session's ownForPushes, at the top of the
// session's loop: a RESP3 client gets its own connection (a dial error is
// no reply of the client's: it is dropped, and the asker finds none) and
// is watched for pushes from then on. The read deadline that woke it is
// replaced by deadline, under ownMu, so that a request that comes later
// wakes it again.
func (s *session) giveOwn(deadline time.Time) {
	s.ownMu.Lock()
	asked := s.ownAsked
	if asked != nil {
		s.ownAsked = nil
		s.nc.SetReadDeadline(deadline)
	}
	s.ownMu.Unlock()
	if asked == nil {
		return
	}
	defer close(asked)
	if s.proto != resp.RESP3 || s.streaming || s.srv.up.Cluster != nil || !s.mayRun() {
		return
	}
	if mark := len(s.out); s.own == nil && !s.pin(s.srv.up.Pool) {
		s.out = s.out[:mark]
		return
	}
	s.pushTarget = true
}

// wokenForOwn reports whether err is the read deadline ownForPushes set:
// then the session goes on, and giveOwn answers.
func (s *session) wokenForOwn(err error) bool {
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		return false
	}
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	return s.ownAsked != nil
}

// endOwnAsks answers, when the session ends, whoever asks it for a
// connection from now on: with none.
func (s *session) endOwnAsks() {
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	if s.ownAsked == nil {
		s.ownAsked = make(chan struct{})
	}
	select {
	case <-s.ownAsked:
	default:
		close(s.ownAsked)
	}
}
