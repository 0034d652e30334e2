package proxy

import (
	"sync"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
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
// its own connection and has nothing buffered to run; stop ends it before
// the connection is used again (nil: no watch). A failure of the
// connection or of the client's writes closes the client, as Redis closes
// one whose output failed: its invalidations would be lost.
func (s *session) watchPushes() (stop func()) {
	if !s.track.on || s.proto != resp.RESP3 || s.own == nil || s.streaming || s.quit ||
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
