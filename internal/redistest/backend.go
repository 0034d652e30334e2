package redistest

import (
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/redcon"
)

// Reply is how a Backend answers one command.
type Reply struct {
	Raw   string // RESP written back, one reply or several
	Stall bool   // send the replies so far, then nothing: hold the connection until the test ends
	Drop  bool   // write the replies so far, then close the connection
}

// Echo answers with the last argument as a bulk string, so a client can
// tell whose reply it got.
func Echo(args []string) Reply {
	return Reply{Raw: string(redcon.AppendBulk(nil, []byte(args[len(args)-1])))}
}

// BackendOptions configure a Backend.
type BackendOptions struct {
	// Answer says how to answer each command, args[0] its name as sent.
	// It runs on the connection's goroutine; nil means Echo.
	Answer func(args []string) Reply
	// Delay is slept before answering each burst: the commands one read
	// brought.
	Delay time.Duration
	// TLS, when set, makes the backend serve TLS with it, as a Redis with
	// tls-port does; nil serves plain TCP.
	TLS *tls.Config
}

// Backend is a RESP server on a free loopback port standing in for Redis
// where a test needs to see what it was sent, or a Redis that misbehaves
// on cue: a redcon server that records every command and answers as
// BackendOptions.Answer says.
type Backend struct {
	opts    BackendOptions
	ln      net.Listener
	release chan struct{} // closed when the test ends: stalls end

	mu  sync.Mutex
	got [][]string // guarded by mu

	served atomic.Int64 // commands received
	bursts atomic.Int64 // reads that brought at least one command
	conns  atomic.Int64 // connections accepted
}

// StartBackend starts a Backend for the test tb and stops it when the test
// ends, failing tb when it cannot listen.
func StartBackend(tb testing.TB, opts BackendOptions) *Backend {
	tb.Helper()
	if opts.Answer == nil {
		opts.Answer = Echo
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	if opts.TLS != nil {
		ln = tls.NewListener(ln, opts.TLS)
	}
	b := &Backend{opts: opts, ln: ln, release: make(chan struct{})}
	srv := redcon.NewServer("", b.serve,
		func(redcon.Conn) bool { b.conns.Add(1); return true }, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(burstListener{ln, b})
	}()
	tb.Cleanup(func() {
		close(b.release)
		// Not srv.Close, which fails when Serve has not yet begun.
		ln.Close()
		<-done // Serve closes the connections before it returns
	})
	return b
}

// Addr is the address the backend listens on, host:port.
func (b *Backend) Addr() string { return b.ln.Addr().String() }

// Received is a copy of every command received so far, in the order read
// (connection by connection, interleaved as they arrived).
func (b *Backend) Received() [][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([][]string(nil), b.got...)
}

// Served is how many commands were received.
func (b *Backend) Served() int64 { return b.served.Load() }

// Bursts is how many reads brought at least one command.
func (b *Backend) Bursts() int64 { return b.bursts.Load() }

// Conns is how many connections were accepted.
func (b *Backend) Conns() int64 { return b.conns.Load() }

// serve answers cmd and the rest of the commands redcon has read with it.
func (b *Backend) serve(conn redcon.Conn, cmd redcon.Command) {
	for _, c := range append([]redcon.Command{cmd}, conn.ReadPipeline()...) {
		args := make([]string, len(c.Args))
		for i, a := range c.Args {
			args[i] = string(a)
		}
		b.mu.Lock()
		b.got = append(b.got, args)
		b.mu.Unlock()
		b.served.Add(1)
		r := b.opts.Answer(args)
		switch {
		case r.Stall:
			redcon.BaseWriter(conn).Flush()
			<-b.release
			conn.Close()
			return
		case r.Drop:
			redcon.BaseWriter(conn).Flush()
			conn.Close()
			return
		}
		conn.WriteRaw([]byte(r.Raw))
	}
}

// burstListener hands redcon connections that count bursts and delay each.
type burstListener struct {
	net.Listener
	b *Backend
}

func (l burstListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &burstConn{Conn: nc, b: l.b, buf: make([]byte, 1<<20)}, nil
}

// burstConn reads whatever the socket holds, up to 1 MiB, in one read: a
// burst. redcon reads 4 KiB at a time, which would cut one write of the
// client into several.
type burstConn struct {
	net.Conn
	b       *Backend
	buf     []byte
	pending []byte // read from the socket, not yet by redcon
}

func (c *burstConn) Read(p []byte) (int, error) {
	if len(c.pending) == 0 {
		n, err := c.Conn.Read(c.buf)
		if n == 0 {
			return 0, err
		}
		c.b.bursts.Add(1)
		time.Sleep(c.b.opts.Delay)
		c.pending = c.buf[:n]
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}
