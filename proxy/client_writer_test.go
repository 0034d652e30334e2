package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// tcpPair is a connected loopback pair: the proxy's side and the client's,
// with small buffers so that a client that does not read fills them fast.
func tcpPair(t *testing.T) (proxySide, clientSide *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	proxySide, clientSide = p.(*net.TCPConn), c.(*net.TCPConn)
	proxySide.SetWriteBuffer(16 << 10)
	clientSide.SetReadBuffer(16 << 10)
	t.Cleanup(func() { proxySide.Close(); clientSide.Close() })
	return proxySide, clientSide
}

func testAccount() *memAccount {
	srv := &Server{}
	srv.live.Store(config.Default())
	return &memAccount{srv: srv}
}

// TestClientWriterBackpressure: what the socket does not take is queued
// and accounted; waitBelow reports a client that reads nothing, returns
// once a reading client has brought the queue under the bound, and the
// account ends at zero.
func TestClientWriterBackpressure(t *testing.T) {
	p, c := tcpPair(t)
	mem := testAccount()
	w := newClientWriter(p, 64<<20)
	w.mem = mem
	var data []byte
	buf := make([]byte, 1<<20) // the session's reply buffer, reused
	for i := range 8 {
		for j := range buf {
			buf[j] = byte('a' + i)
		}
		data = append(data, buf...)
		if kept, err := w.write(buf); err != nil || kept {
			t.Fatalf("write %d: kept %v, %v; want a copy queued", i, kept, err)
		}
	}
	clear(buf) // the queue must not share it
	if q := w.pending(); q < 4<<20 || int64(q) != mem.held.Load() || mem.srv.clientMem.total.Load() != mem.held.Load() {
		t.Fatalf("pending %d, account %d, total %d", q, mem.held.Load(), mem.srv.clientMem.total.Load())
	}
	if !w.waitBelow(1<<20, 50*time.Millisecond, nil) {
		t.Error("waitBelow did not report a client that reads nothing")
	}
	got := make(chan []byte)
	go func() {
		b := make([]byte, len(data))
		io.ReadFull(c, b)
		got <- b
	}()
	if w.waitBelow(1<<20, 10*time.Second, nil) || w.pending() > 1<<20 {
		t.Errorf("waitBelow with a reading client: pending %d", w.pending())
	}
	if b := <-got; !bytes.Equal(b, data) {
		t.Error("the client got other bytes than were written")
	}
	if err := w.wait(); err != nil {
		t.Fatal(err)
	}
	if n := mem.held.Load(); n != 0 {
		t.Errorf("account %d after everything was written, want 0", n)
	}
}

// TestClientWriterLimit: past its limit the writer fails with
// errOutputLimit, and what it queued is given back once it ends.
func TestClientWriterLimit(t *testing.T) {
	p, _ := tcpPair(t)
	mem := testAccount()
	w := newClientWriter(p, 1<<20)
	w.mem = mem
	chunk := make([]byte, 256<<10)
	var err error
	for i := 0; i < 64 && err == nil; i++ {
		_, err = w.write(chunk)
	}
	if !errors.Is(err, errOutputLimit) {
		t.Fatalf("write past the limit: %v", err)
	}
	p.Close() // as the session does: the background writer fails and ends
	w.wait()
	waitUntil(t, func() bool { return mem.held.Load() == 0 && mem.srv.clientMem.total.Load() == 0 })
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
