package upstream

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// batchOf is a batch of the commands given, each a space-separated line.
func batchOf(cmds ...string) *Batch {
	b := &Batch{N: len(cmds), Ends: make([]int, 0, len(cmds)), DoneCh: make(chan struct{}, 1)}
	for _, c := range cmds {
		var args [][]byte
		for _, a := range strings.Fields(c) {
			args = append(args, []byte(a))
		}
		b.Req = resp.AppendCommand(b.Req, args...)
	}
	return b
}

// wait waits for b's DoneCh, failing the test when it has not come
// within limit: a batch that waits behind a stalled request never does.
func wait(t *testing.T, b *Batch, limit time.Duration, what string) {
	t.Helper()
	select {
	case <-b.DoneCh:
	case <-time.After(limit):
		t.Fatalf("%s: no answer within %v", what, limit)
	}
}

// eventually polls cond every 5 ms for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
	}
}

// stallOn is a backend that echoes, except that name stalls for good.
func stallOn(name string) redistest.BackendOptions {
	return redistest.BackendOptions{Answer: func(args []string) redistest.Reply {
		if strings.EqualFold(args[0], name) {
			return redistest.Reply{Stall: true}
		}
		return redistest.Echo(args)
	}}
}

// holdOn is a backend that echoes, except that name is answered only
// once the test calls release (or ends): a request in flight for as long
// as the test needs, holding its connection's later ones, as a WAIT does
// until replicas acknowledge.
func holdOn(t *testing.T, name string) (be *redistest.Backend, release func()) {
	gate := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	be = redistest.StartBackend(t, redistest.BackendOptions{Answer: func(args []string) redistest.Reply {
		if strings.EqualFold(args[0], name) {
			<-gate
		}
		return redistest.Echo(args)
	}})
	t.Cleanup(release) // before the backend's, which waits for what it holds
	return be, release
}

// TestReadTimeout: a request with no reply within the read timeout fails,
// with every request after it on its connection, once each and with the
// timeout's words; the replies before it are kept; the connection is
// retired and counted, and the next Get dials a fresh one that works.
// The node answers the probe, so it is not marked down.
func TestReadTimeout(t *testing.T) {
	be := redistest.StartBackend(t, stallOn("SLOW"))
	m := Metrics{}.orNowhere().Node(be.Addr())
	p := testPool(t, dialer{addr: be.Addr()}, 1, m)
	p.readTimeout = 300 * time.Millisecond
	conn, err := p.Get(Key{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	first, second := batchOf("ECHO a", "SLOW", "ECHO b"), batchOf("ECHO c")
	start := time.Now()
	conn.Send(first)
	conn.Send(second)
	wait(t, first, 10*time.Second, "the batch with SLOW")
	wait(t, second, 10*time.Second, "the batch behind it")
	took := time.Since(start)
	if got := string(first.Out[:first.OKLen]); first.Done != 1 || got != "$1\r\na\r\n" {
		t.Errorf("before the timeout: %d replies %q, want 1, the ECHO's", first.Done, got)
	}
	want := "ERR upstream timeout: no reply from " + be.Addr() + " within 300ms; the command may have run"
	for i, b := range []*Batch{first, second} {
		var te *TimeoutError
		if !errors.As(b.Err, &te) || ErrorText(b.Err) != want {
			t.Errorf("batch %d: %v (%q), want %q", i, b.Err, ErrorText(b.Err), want)
		}
	}
	if took < p.readTimeout || took > p.readTimeout+time.Second {
		t.Errorf("failed after %v, want the read timeout, %v, and little more", took, p.readTimeout)
	}
	if !conn.Failed() {
		t.Error("the connection that timed out is still in use")
	}
	if got := testutil.ToFloat64(m.Timeouts); got != 1 {
		t.Errorf("timeouts counted: %v, want 1", got)
	}
	again, err := p.Get(Key{}, 0)
	if err != nil || again == conn {
		t.Fatalf("Get after the timeout: %v, the same connection %v", err, again == conn)
	}
	b := batchOf("ECHO d")
	again.Send(b)
	wait(t, b, 10*time.Second, "ECHO on the new connection")
	if b.Err != nil || string(b.Out) != "$1\r\nd\r\n" {
		t.Errorf("on the new connection: %q, %v", b.Out, b.Err)
	}
	eventually(t, "the node is probed", func() bool {
		for _, cmd := range be.Received() {
			if cmd[0] == "PING" {
				return true
			}
		}
		return false
	})
	eventually(t, "the probe is over", func() bool { return !p.probing.Load() })
	if d := p.down.Load(); d != nil {
		t.Errorf("node marked down though it answers: %v", d)
	}
}

// slowOnOne starts a pool of one connection per key, with a read timeout
// of a minute, on a backend that echoes but holds SLOW until release is
// closed, and sends SLOW (client 7, Key{}): conn is where it went.
func slowOnOne(t *testing.T) (p *Pool, be *redistest.Backend, release chan struct{}, slow *Batch, conn *Conn) {
	release = make(chan struct{})
	be = redistest.StartBackend(t, redistest.BackendOptions{Answer: func(args []string) redistest.Reply {
		if args[0] == "SLOW" {
			<-release
		}
		return redistest.Echo(args)
	}})
	p = testPool(t, dialer{addr: be.Addr()}, 1, nil)
	p.readTimeout = time.Minute
	slow = batchOf("SLOW")
	p.Send(&conn, Key{}, 7, slow)
	return p, be, release, slow, conn
}

// TestStallMovesOn: behind a request that has waited past stallAfter, new
// requests go on another connection and are answered at once, while the
// slow one is answered in its time on the old connection, which is then
// closed; the watchdog stops ticking when nothing is in flight.
func TestStallMovesOn(t *testing.T) {
	p, be, release, slow, cached := slowOnOne(t)
	stalled := cached
	eventually(t, "the connection is stalled", func() bool { return !stalled.Usable() })
	if !p.watch.armed.Load() {
		t.Error("watchdog not armed with a request in flight")
	}
	for i := range 3 {
		b := batchOf(fmt.Sprintf("ECHO x%d", i))
		p.Send(&cached, Key{}, 7, b)
		wait(t, b, 10*time.Second, "ECHO sent behind a stalled request") // it would wait for release
		if want := fmt.Sprintf("$2\r\nx%d\r\n", i); b.Err != nil || string(b.Out) != want {
			t.Errorf("ECHO %d: %q, %v", i, b.Out, b.Err)
		}
	}
	if cached == stalled || be.Conns() != 2 {
		t.Errorf("the ECHOs went on the stalled connection %v; %d connections dialed, want 2", cached == stalled, be.Conns())
	}
	select {
	case <-slow.DoneCh:
		t.Fatal("the slow request was answered before its reply came")
	default:
	}
	close(release)
	wait(t, slow, 10*time.Second, "SLOW after its release")
	if slow.Err != nil || string(slow.Out) != "$4\r\nSLOW\r\n" {
		t.Errorf("SLOW: %q, %v", slow.Out, slow.Err)
	}
	eventually(t, "the stalled connection closed once idle", stalled.Failed)
	if stalled.Send(batchOf("ECHO late")) {
		t.Error("Send on the connection closed after its stall took the batch")
	}
	eventually(t, "the watchdog disarmed", func() bool { return !p.watch.armed.Load() })
}

// TestRerunBehindStall: of the batches written behind a request that
// stalls, a Rerun one is sent again on another connection and answered
// there at once; one that writes waits for the stalled request. Once that
// is answered, the first connection's late reply to the Rerun batch is
// dropped: every batch gets its own replies.
func TestRerunBehindStall(t *testing.T) {
	p, be, release, slow, cached := slowOnOne(t)
	stalled := cached
	write, read, read2 := batchOf("ECHO w"), batchOf("ECHO r", "ECHO s"), batchOf("ECHO t")
	read.Rerun, read2.Rerun = true, true
	for _, b := range []*Batch{write, read, read2} {
		stalled.Send(b) // written before the stall is seen, as a client's would be
	}
	wait(t, read, 10*time.Second, "a Rerun batch behind a stalled request")
	wait(t, read2, 10*time.Second, "the second Rerun batch")
	if read.Err != nil || string(read.Out) != "$1\r\nr\r\n$1\r\ns\r\n" || read2.Err != nil || string(read2.Out) != "$1\r\nt\r\n" {
		t.Errorf("the reruns: %q, %v; %q, %v", read.Out, read.Err, read2.Out, read2.Err)
	}
	select {
	case <-write.DoneCh:
		t.Fatal("the batch that writes was answered before the stalled request")
	case <-slow.DoneCh:
		t.Fatal("the stalled request was answered before its release")
	default:
	}
	close(release)
	wait(t, slow, 10*time.Second, "SLOW after its release")
	wait(t, write, 10*time.Second, "the batch behind SLOW")
	if slow.Err != nil || string(slow.Out) != "$4\r\nSLOW\r\n" || write.Err != nil || string(write.Out) != "$1\r\nw\r\n" {
		t.Errorf("on the stalled connection: %q, %v; %q, %v", slow.Out, slow.Err, write.Out, write.Err)
	}
	ran := 0
	for _, cmd := range be.Received() {
		if cmd[0] == "ECHO" && cmd[1] == "r" {
			ran++
		}
	}
	if ran != 2 {
		t.Errorf("ECHO r ran %d times, want 2: once where it was written, once elsewhere", ran)
	}
	next := batchOf("ECHO n")
	p.Send(&cached, Key{}, 7, next)
	wait(t, next, 10*time.Second, "a batch after the stall")
	if string(next.Out) != "$1\r\nn\r\n" {
		t.Errorf("after the stall: %q, %v", next.Out, next.Err)
	}
}

// TestRerunStalledHead: a Rerun batch that is the oldest on its
// connection, with no reply yet and a batch that may not move behind it
// (Redis holds a busy script's connection's replies), is sent again
// elsewhere; alone, it is the slow request itself, and stays, with no
// dial, until it is answered.
func TestRerunStalledHead(t *testing.T) {
	var first atomic.Bool
	release := make(chan struct{})
	be := redistest.StartBackend(t, redistest.BackendOptions{Answer: func(args []string) redistest.Reply {
		switch {
		case args[0] == "PEND" && !first.Swap(true):
			return redistest.Reply{Stall: true} // only where it was first written
		case args[0] == "SLOW":
			<-release
		}
		return redistest.Echo(args)
	}})
	p := testPool(t, dialer{addr: be.Addr()}, 2, nil)
	p.readTimeout = time.Minute

	t.Run("alone", func(t *testing.T) {
		var cached *Conn
		slow := batchOf("SLOW")
		slow.Rerun = true
		p.Send(&cached, Key{}, 0, slow)
		eventually(t, "the connection is stalled", func() bool { return !cached.Usable() })
		time.Sleep(4 * p.stallAfter) // the watchdog ticks over it, and must leave it
		if n := be.Conns(); n != 1 {
			t.Errorf("%d connections dialed for a slow read alone, want 1", n)
		}
		close(release)
		wait(t, slow, 10*time.Second, "the slow read")
		if slow.Err != nil || string(slow.Out) != "$4\r\nSLOW\r\n" {
			t.Errorf("the slow read: %q, %v", slow.Out, slow.Err)
		}
	})
	t.Run("before a batch that may not move", func(t *testing.T) {
		var cached *Conn
		head, write := batchOf("PEND"), batchOf("ECHO w")
		head.Rerun = true
		p.Send(&cached, Key{}, 1, head)
		cached.Send(write)
		wait(t, head, 10*time.Second, "a stalled Rerun batch")
		if head.Err != nil || string(head.Out) != "$4\r\nPEND\r\n" {
			t.Errorf("the rerun head: %q, %v", head.Out, head.Err)
		}
	})
}

// TestRerunNotWhileWriting: a Rerun batch whose write is still under way
// (Redis reads nothing while a script runs, and the socket fills) stays:
// its request is its sender's again once it is answered elsewhere, while
// the first write may still be reading it.
func TestRerunNotWhileWriting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			t.Cleanup(func() { nc.Close() }) // read nothing, answer nothing
		}
	}()
	p := testPool(t, dialer{addr: ln.Addr().String()}, 1, nil)
	p.readTimeout = time.Minute
	var cached *Conn
	p.Send(&cached, Key{}, 7, batchOf("EVAL busy 0"))
	big := batchOf("PING")
	big.Req = bytes.Repeat(big.Req, 8<<20/len(big.Req)) // more than the sockets hold
	big.N, big.Rerun = 8<<20/len("*1\r\n$4\r\nPING\r\n"), true
	go cached.Send(big) // its write blocks until the pool closes
	eventually(t, "the connection is stalled", func() bool { return !cached.Usable() })
	time.Sleep(4 * p.stallAfter) // the watchdog ticks over it, and must leave it
	if n := accepted.Load(); n != 1 {
		t.Errorf("%d connections dialed, want 1: a batch being written was moved", n)
	}
}

// TestStallBound: a node on which every connection stalls (stopped, or
// running KEYS *) gets at most perDB connections beside its perDB own,
// however many requests come; past that, requests wait on a stalled one.
func TestStallBound(t *testing.T) {
	be := redistest.StartBackend(t, stallOn("SLOW"))
	const perDB = 2
	p := testPool(t, dialer{addr: be.Addr()}, perDB, nil)
	p.readTimeout = time.Minute
	for i := range 10 {
		var conn *Conn
		p.Send(&conn, Key{}, uint64(i), batchOf("SLOW"))
		eventually(t, "the connection is stalled", func() bool { return !conn.Usable() })
	}
	if n := be.Conns(); n != 2*perDB {
		t.Errorf("%d connections dialed, want %d", n, 2*perDB)
	}
}

// TestBlockingNeverStalls: a Blocking connection (Key.Blocking) whose
// request waits past the stall bound stays usable, where a shared one
// beside it stalls: a WAIT waits by design.
func TestBlockingNeverStalls(t *testing.T) {
	be := redistest.StartBackend(t, stallOn("SLOW"))
	p := testPool(t, dialer{addr: be.Addr()}, 2, nil)
	p.readTimeout = time.Minute
	var blocking, shared *Conn
	p.Send(&blocking, Key{Blocking: true}, 0, batchOf("SLOW"))
	p.Send(&shared, Key{}, 0, batchOf("SLOW"))
	eventually(t, "the shared connection is stalled", func() bool { return !shared.Usable() })
	if !blocking.Usable() {
		t.Error("the Blocking connection stalled, its request older than the shared one's")
	}
}

// stoppable is a backend that holds every command while stopped, as a
// SIGSTOPped Redis: connections are accepted, nothing is answered, and
// what was sent is answered once it resumes.
type stoppable struct {
	*redistest.Backend
	mu      sync.Mutex
	resumed chan struct{}
}

func startStoppable(t *testing.T) *stoppable {
	s := &stoppable{resumed: make(chan struct{})}
	close(s.resumed)
	s.Backend = redistest.StartBackend(t, redistest.BackendOptions{Answer: func(args []string) redistest.Reply {
		s.mu.Lock()
		ch := s.resumed
		s.mu.Unlock()
		<-ch
		return redistest.Echo(args)
	}})
	t.Cleanup(s.resume) // before the backend waits for its connections
	return s
}

func (s *stoppable) stop() {
	s.mu.Lock()
	s.resumed = make(chan struct{})
	s.mu.Unlock()
}

func (s *stoppable) resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.resumed:
	default:
		close(s.resumed)
	}
}

// TestNodeDown: a node that times out and does not answer the probe is
// down: Get, Dial and Ask fail at once with an error naming it, without a
// dial each, until a probe gets an answer; then it serves again. Each
// transition is logged once.
func TestNodeDown(t *testing.T) {
	be := startStoppable(t)
	var logs redistest.SyncBuffer
	p := newPool(dialer{addr: be.Addr(), timeout: 200 * time.Millisecond}, 2, 300*time.Millisecond,
		Metrics{}.orNowhere().Node(be.Addr()), slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(p.close)
	var conn *Conn
	b := batchOf("ECHO before")
	p.Send(&conn, Key{}, 0, b)
	wait(t, b, 10*time.Second, "ECHO before the stop")

	be.stop()
	b = batchOf("ECHO during")
	p.Send(&conn, Key{}, 0, b)
	wait(t, b, 10*time.Second, "ECHO on the stopped node")
	var te *TimeoutError
	if !errors.As(b.Err, &te) {
		t.Fatalf("ECHO on the stopped node: %v, want a timeout", b.Err)
	}
	var down *DownError
	eventually(t, "the node is down", func() bool {
		_, err := p.Get(Key{}, 0)
		return errors.As(err, &down)
	})
	if want := "ERR upstream unavailable: node " + be.Addr() + " is down (no reply within 300ms, nor to PING within 200ms); probing it every 1s"; ErrorText(down) != want {
		t.Errorf("Get while down: %q, want %q", ErrorText(down), want)
	}
	conns := be.Conns()
	for i := range 100 {
		b := batchOf("ECHO down")
		p.Send(&conn, Key{}, uint64(i), b)
		<-b.DoneCh
		if !errors.As(b.Err, &down) {
			t.Fatalf("Send while down: %v", b.Err)
		}
	}
	if _, _, err := p.Dial(Key{}); !errors.As(err, &down) {
		t.Errorf("Dial while down: %v", err)
	}
	if _, err := p.Ask(pingReq, 1); !errors.As(err, &down) {
		t.Errorf("Ask while down: %v", err)
	}
	if n := be.Conns() - conns; n > 1 { // a probe may have dialed
		t.Errorf("100 requests while down dialed %d times", n)
	}

	be.resume()
	eventually(t, "the node serves again", func() bool {
		b := batchOf("ECHO after")
		p.Send(&conn, Key{}, 0, b)
		<-b.DoneCh
		return b.Err == nil && string(b.Out) == "$5\r\nafter\r\n"
	})
	text := logs.String()
	if n, m := strings.Count(text, "upstream node down"), strings.Count(text, "upstream node up"); n != 1 || m != 1 {
		t.Errorf("logged down %d times and up %d times, want once each:\n%s", n, m, text)
	}
}

// TestProbeIdle: the probes of a down node stop once nobody has asked
// for it for probeIdle; the next request dials it again.
func TestProbeIdle(t *testing.T) {
	be := startStoppable(t)
	p := newPool(dialer{addr: be.Addr(), timeout: 100 * time.Millisecond}, 1, 200*time.Millisecond,
		Metrics{}.orNowhere().Node(be.Addr()), slog.New(slog.DiscardHandler))
	p.probeIdle = 300 * time.Millisecond
	t.Cleanup(p.close)
	be.stop()
	var conn *Conn
	b := batchOf("ECHO x")
	p.Send(&conn, Key{}, 0, b)
	wait(t, b, 10*time.Second, "ECHO on the stopped node")
	var down *DownError
	if _, err := p.Get(Key{}, 0); !errors.As(err, &down) {
		t.Fatalf("Get after the timeout: %v, want the node down", err)
	}
	eventually(t, "the probes stopped", func() bool { return !p.probing.Load() })
	conns := be.Conns()
	if _, err := p.Get(Key{}, 0); err != nil {
		t.Errorf("Get once the probes stopped: %v, want a dial", err)
	}
	eventually(t, "Get once the probes stopped dialed", func() bool { return be.Conns() == conns+1 })
}

// TestSendAfterDrainRace: many clients keep sending while connections
// stall and are replaced and closed under them; none gets an error, and
// every reply is the client's own, in order.
func TestSendAfterDrainRace(t *testing.T) {
	var served atomic.Int64
	be := redistest.StartBackend(t, redistest.BackendOptions{Answer: func(args []string) redistest.Reply {
		if served.Add(1)%200 == 0 {
			time.Sleep(2 * stallAfter) // a slow command now and then
		}
		return redistest.Echo(args)
	}})
	p := testPool(t, dialer{addr: be.Addr()}, 2, nil)
	p.readTimeout = time.Minute
	var wg sync.WaitGroup
	for c := range 16 {
		wg.Go(func() {
			var conn *Conn
			for r := range 60 {
				b, want := echoBatch(c, r, 4)
				p.Send(&conn, Key{}, uint64(c), b)
				<-b.DoneCh
				if got := b.replies(nil); b.Err != nil || !bytes.Equal(bytes.Join(got, nil), []byte(strings.Join(want, ""))) {
					t.Errorf("client %d round %d: %q, %v", c, r, got, b.Err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := be.Conns(); n <= 2 {
		t.Logf("no stall replaced a connection (%d dialed)", n)
	}
}
