package proxy

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// errOutputLimit closes a client that lets more replies pile up unread than
// its limit allows (Redis's client-output-buffer-limit does the same).
var errOutputLimit = errors.New("proxy: client output buffer limit reached")

// clientWriter writes replies to a client without making the session wait
// while the client is still sending. Redis reads and writes a client at the
// same time; a client that writes a whole pipeline before reading any reply
// (redis-py's execute, go-redis's Exec) would otherwise block on its write
// while the proxy blocks on its own. Replies go straight to the socket while
// it takes them; the rest goes to a goroutine that writes it in order in the
// background, and later replies queue behind it until it is done.
//
// A TLS client's replies take the same path once encrypted: wrapTLS puts
// the tls.Conn on top, whose records come back to send.
//
// What is queued is a copy, sized to the bytes, so that the session keeps
// reusing its reply buffer and the queue holds no spare capacity; only a
// buffer too big to keep is handed over as it is.
type clientWriter struct {
	nc    net.Conn
	raw   syscall.RawConn // nil when nc is not a socket: then writes block
	limit int             // most bytes queued for the background writer
	tls   *tls.Conn       // set by wrapTLS: replies are written through it
	mem   *memAccount     // the client's share of limits.max_client_memory; set by newSession

	// tryWrite's state, of the session's goroutine only (of the tls.Conn's
	// writer, which holds its own lock around every record, over TLS).
	try     tryState
	writeFD func(fd uintptr) bool

	mu       sync.Mutex
	queue    [][]byte
	queued   atomic.Int64  // bytes in queue or being written from it; written under mu, read without
	running  chan struct{} // non-nil while the background writer runs; closed when it ends
	progress chan struct{} // cap 1: the background writer wrote some; made when it first starts
	err      error         // sticky
}

// Sizes of the background writer.
const (
	// keepMax is the largest reply buffer a session keeps for reuse: one
	// bigger is handed to the queue as it is, not copied.
	keepMax = 8 * maxPendingOut
	// drainPiece is the most one write of the background writer sends,
	// so that its progress shows in steps a slow reader can make.
	drainPiece = maxPendingOut
)

func newClientWriter(nc net.Conn, limit int) *clientWriter {
	w := &clientWriter{nc: nc, limit: limit}
	if sc, ok := nc.(syscall.Conn); ok {
		w.raw, _ = sc.SyscallConn()
	}
	w.writeFD = w.writeStep
	return w
}

// tryState is one tryWrite: what to write, how much went, why it stopped.
type tryState struct {
	p   []byte
	n   int
	err error
}

// wrapTLS makes w a TLS server's writer and returns the connection to
// read the client from: the tls.Conn over w's socket, whose records go
// out through send, so that writing a reply still never waits.
func (w *clientWriter) wrapTLS(conf *tls.Config) *tls.Conn {
	w.tls = tls.Server(recordConn{w.nc, w}, conf)
	return w.tls
}

// recordConn is the socket under a client's tls.Conn: it writes records
// as the clientWriter writes replies, queueing what the socket does not
// take at once.
type recordConn struct {
	net.Conn
	w *clientWriter
}

func (c recordConn) Write(p []byte) (int, error) {
	// tls.Conn reuses p once Write returns: whatever is queued is a copy.
	if _, err := c.w.send(p, true); err != nil {
		return 0, err
	}
	return len(p), nil
}

// write sends p, or queues it and reports kept: the caller must then not
// reuse p.
func (w *clientWriter) write(p []byte) (kept bool, err error) {
	if w.tls != nil {
		_, err := w.tls.Write(p) // encrypted into records that send takes
		return false, err
	}
	return w.send(p, false)
}

// send is write on the socket itself. With clone set, what is queued is a
// copy of p, so the caller may reuse p whatever kept says.
func (w *clientWriter) send(p []byte, clone bool) (kept bool, err error) {
	w.mu.Lock()
	if w.err != nil || w.running != nil {
		kept, added := w.enqueue(p, clone)
		err := w.err
		w.mu.Unlock()
		w.mem.add(int64(added))
		return kept, err
	}
	w.mu.Unlock()
	n, err := w.tryWrite(p)
	if err != nil {
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		return false, err
	}
	if n == len(p) {
		return false, nil
	}
	w.mu.Lock()
	w.running = make(chan struct{})
	if w.progress == nil {
		// Set once, under mu, before anything is queued: waitBelow, which
		// only selects on it with bytes queued, reads it after mu.
		w.progress = make(chan struct{}, 1)
	}
	kept, added := w.enqueue(p[n:], clone)
	err = w.err
	go w.drain(w.running)
	w.mu.Unlock()
	w.mem.add(int64(added))
	return kept, err
}

// enqueue adds p, or a copy of it, for the background writer and returns
// whether it kept p and how many bytes it queued; w.mu is held. It copies
// when clone is set or p is small enough for the caller to keep reusing.
func (w *clientWriter) enqueue(p []byte, clone bool) (kept bool, added int) {
	if w.err != nil || len(p) == 0 {
		return false, 0
	}
	kept = !clone && cap(p) > keepMax
	if !kept {
		p = bytes.Clone(p)
	}
	w.queue = append(w.queue, p)
	if w.queued.Add(int64(len(p))) > int64(w.limit) {
		w.err = errOutputLimit
	}
	return kept, len(p)
}

// pending is how many bytes wait for the background writer.
func (w *clientWriter) pending() int { return int(w.queued.Load()) }

// waitBelow waits until at most bound bytes wait to be written, the client
// failed, or stop is closed; or until the client took nothing for grace,
// which it reports: the client is not reading.
func (w *clientWriter) waitBelow(bound int, grace time.Duration, stop <-chan struct{}) (stalled bool) {
	var timer *time.Timer
	for {
		w.mu.Lock()
		queued, err := int(w.queued.Load()), w.err
		w.mu.Unlock()
		if queued <= bound || err != nil {
			return false
		}
		if timer == nil {
			timer = time.NewTimer(grace)
			defer timer.Stop()
		} else {
			timer.Reset(grace)
		}
		select {
		case <-w.progress:
		case <-timer.C:
			return true
		case <-stop:
			return false
		}
	}
}

// tryWrite writes what the socket takes now, without waiting.
func (w *clientWriter) tryWrite(p []byte) (int, error) {
	if w.raw == nil {
		return w.nc.Write(p)
	}
	w.try = tryState{p: p}
	err := w.raw.Write(w.writeFD)
	if w.try.err != nil {
		err = w.try.err
	}
	n := w.try.n
	w.try = tryState{}
	return n, err
}

// writeStep is tryWrite's step on the socket; writeFD holds it as a method
// value made once, so that a write allocates no closure.
func (w *clientWriter) writeStep(fd uintptr) bool {
	t := &w.try
	for t.n < len(t.p) {
		m, err := syscall.Write(int(fd), t.p[t.n:])
		if m > 0 {
			t.n += m
		}
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			if err != syscall.EAGAIN {
				t.err = err
			}
			break
		}
	}
	return true // never wait: what is left goes to the background
}

func (w *clientWriter) drain(done chan struct{}) {
	defer close(done)
	for {
		w.mu.Lock()
		q := w.queue
		w.queue = nil
		if len(q) == 0 || w.err != nil {
			dropped := w.queued.Swap(0) // never to be written: the client failed
			w.running = nil
			w.mu.Unlock()
			w.mem.add(-dropped)
			w.signalProgress() // a session waiting on a failed client goes on
			return
		}
		w.mu.Unlock()
		for _, b := range q {
			if !w.drainOne(b) {
				break
			}
		}
	}
}

// drainOne writes b in pieces, accounting each; it reports false when the
// client failed.
func (w *clientWriter) drainOne(b []byte) bool {
	for len(b) > 0 {
		piece := b[:min(len(b), drainPiece)]
		_, err := w.nc.Write(piece)
		b = b[len(piece):]
		w.mu.Lock()
		if err != nil {
			w.err = err
			w.mu.Unlock()
			return false
		}
		w.queued.Add(-int64(len(piece)))
		w.mu.Unlock()
		w.mem.add(-int64(len(piece)))
		w.signalProgress()
	}
	return true
}

// signalProgress wakes waitBelow, unless it has been woken already.
func (w *clientWriter) signalProgress() {
	select {
	case w.progress <- struct{}{}:
	default:
	}
}

// wait returns once everything written so far has reached the socket, or
// at once when the client failed or went over its limit: then there is
// nothing to wait for but a client that does not read.
func (w *clientWriter) wait() error {
	w.mu.Lock()
	done, err := w.running, w.err
	w.mu.Unlock()
	if done != nil && err == nil {
		<-done
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}
