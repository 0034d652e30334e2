package upstream

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tidwall/redcon"

	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// testPool is a pool of perDB shared connections per db to addr.
func testPool(t *testing.T, d dialer, perDB int, m *NodeMetrics) *Pool {
	t.Helper()
	if d.timeout == 0 {
		d.timeout = 5 * time.Second
	}
	if m == nil {
		m = Metrics{}.orNowhere().Node(d.addr)
	}
	p := newPool(d, perDB, 5*time.Second, m, slog.New(slog.DiscardHandler))
	t.Cleanup(p.close)
	return p
}

// echoBatch is a batch of ECHO requests of tags named after client and
// round, with the replies an echoing backend gives them.
func echoBatch(client, round, depth int) (b *Batch, want []string) {
	b = &Batch{N: depth, Ends: make([]int, 0, depth), DoneCh: make(chan struct{}, 1)}
	for i := range depth {
		tag := fmt.Sprintf("c%d-r%d-i%d", client, round, i)
		b.Req = resp.AppendCommand(b.Req, []byte("ECHO"), []byte(tag))
		want = append(want, string(redcon.AppendBulk(nil, []byte(tag))))
	}
	return b, want
}

// TestConnOrder has many clients pipeline through few shared connections;
// each must get exactly its own replies, in order.
func TestConnOrder(t *testing.T) {
	be := redistest.StartBackend(t, redistest.BackendOptions{})
	p := testPool(t, dialer{addr: be.Addr()}, 2, nil)
	// Replacing stalled connections is TestStallBound's: under -race on a
	// loaded machine a batch here can wait past stallAfter.
	p.stallAfter = time.Minute

	const clients, rounds, depth = 40, 50, 16
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for r := range rounds {
				conn, err := p.Get(Key{}, uint64(c))
				if err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				b, want := echoBatch(c, r, depth)
				conn.Send(b)
				<-b.DoneCh
				if b.Err != nil || b.Done != depth {
					t.Errorf("client %d round %d: %d replies, %v", c, r, b.Done, b.Err)
					return
				}
				if got := b.replies(nil); fmt.Sprintf("%q", got) != fmt.Sprintf("%q", want) {
					t.Errorf("client %d round %d: got %q, want %q", c, r, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
	if got, want := be.Served(), int64(clients*rounds*depth); got != want {
		t.Errorf("backend served %d commands, want %d", got, want)
	}
	if n := be.Conns(); n > 2 {
		t.Errorf("backend saw %d connections, want at most perDB=2", n)
	}
}

// TestConnFailure drops the connection every 100 commands while clients
// pipeline: every request gets its own reply or the batch's error, in
// order, nobody hangs, the failures are counted, and the pool redials.
func TestConnFailure(t *testing.T) {
	var served atomic.Int64
	be := redistest.StartBackend(t, redistest.BackendOptions{Answer: func(args []string) redistest.Reply {
		if served.Add(1)%100 == 0 {
			return redistest.Reply{Drop: true}
		}
		return redistest.Echo(args)
	}})
	m := Metrics{}.orNowhere().Node(be.Addr())
	p := testPool(t, dialer{addr: be.Addr()}, 4, m)

	const clients, rounds, depth = 8, 40, 8
	var wg sync.WaitGroup
	var failed, ok atomic.Int64
	for c := range clients {
		wg.Go(func() {
			for r := range rounds {
				conn, err := p.Get(Key{}, uint64(c))
				if err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				b, want := echoBatch(c, r, depth)
				conn.Send(b)
				<-b.DoneCh
				got := b.replies(nil)
				for i := range got {
					if string(got[i]) != want[i] {
						t.Errorf("client %d round %d: reply %d is %q, want %q", c, r, i, got[i], want[i])
						return
					}
				}
				ok.Add(int64(b.Done))
				if b.Done < depth {
					if text := ErrorText(b.Err); b.Err == nil || !strings.HasPrefix(text, "ERR upstream unavailable: ") {
						t.Errorf("client %d round %d: %d of %d replies, error %q", c, r, b.Done, depth, text)
						return
					}
					failed.Add(int64(depth - b.Done))
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() == 0 || ok.Load() == 0 {
		t.Errorf("ok=%d failed=%d: want both, the backend drops every 100 commands", ok.Load(), failed.Load())
	}
	if be.Conns() < 2 {
		t.Errorf("pool dialed %d times, want redials after failures", be.Conns())
	}
	if n := testutil.ToFloat64(m.Errors); n < 1 {
		t.Errorf("errors counted: %v, want the broken connections", n)
	}
	if n := testutil.ToFloat64(m.Requests); n < float64(ok.Load()) {
		t.Errorf("requests counted: %v, want at least the %d answered", n, ok.Load())
	}
}

// TestDialFailureShared: when dialing takes the whole dial timeout (a
// server that accepts but never answers AUTH), clients queued behind one
// dial share its failure instead of each waiting a timeout of their own.
func TestDialFailureShared(t *testing.T) {
	be := redistest.StartBackend(t, redistest.BackendOptions{Answer: func([]string) redistest.Reply {
		return redistest.Reply{Stall: true}
	}})
	const timeout = 300 * time.Millisecond
	p := testPool(t, dialer{addr: be.Addr(), password: "x", timeout: timeout}, 1, nil)
	const clients = 20
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			_, err := p.Get(Key{}, uint64(c))
			if text := ErrorText(err); err == nil || !strings.HasPrefix(text, "ERR upstream unavailable") {
				t.Errorf("Get: %v", err)
			}
		})
	}
	wg.Wait()
	if d := time.Since(start); d > 4*timeout {
		t.Errorf("%d clients took %v to fail, want about one dial timeout (%v)", clients, d, timeout)
	}
}

// TestDial checks what a dial sends and how it reads the answers: AUTH
// with or without a user, SELECT, a refused AUTH (or a NOAUTH: a password
// wanted and none sent) as an AuthError whose reply names the settings to
// change, counted, a refused SELECT as Redis's answer, and dbs past a
// refused one refused without dialing.
func TestDial(t *testing.T) {
	be := redistest.StartBackend(t, redistest.BackendOptions{Answer: func(args []string) redistest.Reply {
		switch strings.ToUpper(args[0]) {
		case "AUTH":
			if args[len(args)-1] != "secret" {
				return redistest.Reply{Raw: "-WRONGPASS invalid username-password pair or user is disabled.\r\n"}
			}
		case "SELECT":
			if args[1] == "7" {
				return redistest.Reply{Raw: "-NOAUTH Authentication required.\r\n"}
			}
			if db, _ := strconv.Atoi(args[1]); db >= 16 {
				return redistest.Reply{Raw: "-ERR DB index is out of range\r\n"}
			}
		}
		return redistest.Reply{Raw: "+OK\r\n"}
	}})
	cases := []struct {
		name     string
		d        dialer
		k        Key
		sent     string // the commands received, space-separated, one per line
		err      string // "" for none
		redisErr bool
		errors   float64 // counted as a transport failure
	}{
		{"plain", dialer{}, Key{}, "", "", false, 0},
		{"password", dialer{password: "secret"}, Key{}, "AUTH secret", "", false, 0},
		{"user", dialer{username: "u", password: "secret"}, Key{DB: 3}, "AUTH u secret\nSELECT 3", "", false, 0},
		{"resp3", dialer{password: "secret"}, Key{DB: 2, RESP3: true}, "AUTH secret\nHELLO 3\nSELECT 2", "", false, 0},
		{"wrong password", dialer{password: "nope"}, Key{}, "AUTH nope",
			"refused the proxy's credentials (WRONGPASS invalid username-password pair or user is disabled.): set upstream.username and upstream.password", false, 1},
		{"password wanted", dialer{}, Key{DB: 7}, "SELECT 7",
			"refused the proxy's credentials (NOAUTH Authentication required.): set upstream.username and upstream.password", false, 1},
		{"db out of range", dialer{}, Key{DB: 16}, "SELECT 16", "ERR DB index is out of range", true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.d.addr = be.Addr()
			m := Metrics{}.orNowhere().Node(be.Addr())
			p := testPool(t, tc.d, 1, m)
			before := len(be.Received())
			_, err := p.Get(tc.k, 0)
			var lines []string
			for _, cmd := range be.Received()[before:] {
				lines = append(lines, strings.Join(cmd, " "))
			}
			if got := strings.Join(lines, "\n"); got != tc.sent {
				t.Errorf("sent %q, want %q", got, tc.sent)
			}
			var re RedisError
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("Get: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(ErrorText(err), tc.err)):
				t.Errorf("Get: %v, want %q", err, tc.err)
			case err != nil && errors.As(err, &re) != tc.redisErr:
				t.Errorf("Get: %v is a RedisError: %v, want %v", err, !tc.redisErr, tc.redisErr)
			}
			if got := testutil.ToFloat64(m.Errors); got != tc.errors {
				t.Errorf("errors counted: %v, want %v", got, tc.errors)
			}
			if !tc.redisErr {
				return
			}
			// Past a db Redis refused, no dial.
			conns := be.Conns()
			if _, err2 := p.Get(Key{DB: tc.k.DB + 1, RESP3: true}, 0); err2 == nil || err2.Error() != err.Error() {
				t.Errorf("Get(%d) after %v: %v", tc.k.DB+1, err, err2)
			}
			if be.Conns() != conns {
				t.Errorf("Get of a db past a refused one dialed")
			}
			if _, err := p.Get(Key{DB: tc.k.DB - 1}, 0); err != nil {
				t.Errorf("Get(%d): %v", tc.k.DB-1, err)
			}
		})
	}
}

// TestPoolKeys: each db and protocol has connections of its own, which
// Get hands out again for the same Key.
func TestPoolKeys(t *testing.T) {
	be := redistest.StartBackend(t, redistest.BackendOptions{})
	p := testPool(t, dialer{addr: be.Addr()}, 1, nil)
	seen := map[*Conn]Key{}
	for _, k := range []Key{{}, {RESP3: true}, {DB: 1}, {DB: 1, RESP3: true}} {
		c, err := p.Get(k, 0)
		if err != nil {
			t.Fatalf("Get(%+v): %v", k, err)
		}
		if other, ok := seen[c]; ok {
			t.Errorf("Get(%+v) gave the connection of %+v", k, other)
		}
		seen[c] = k
		if again, err := p.Get(k, 0); err != nil || again != c {
			t.Errorf("Get(%+v) again: another connection (%v)", k, err)
		}
	}
}

// TestSendJoinsWriteUnderWay: a batch whose own connection has no write
// under way goes out in the write under way on another connection of its
// key, and gets its replies; the client keeps its own connection for
// later. It stays on its own when the other's oldest request in flight
// has waited joinAge or its write side was taken that long ago, when the
// other is stalled, and when no write is under way.
func TestSendJoinsWriteUnderWay(t *testing.T) {
	be, release := holdOn(t, "HOLD")
	p := testPool(t, dialer{addr: be.Addr()}, 2, nil)
	p.stallAfter = time.Minute
	p.joinAge = time.Minute
	busy, err := p.Get(Key{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	own, err := p.Get(Key{}, 1)
	if err != nil || own == busy {
		t.Fatalf("Get: %v, or the same connection twice", err)
	}
	var sent []*Batch
	var wants [][]string
	batch := func(client, round int) *Batch {
		b, want := echoBatch(client, round, 2)
		sent, wants = append(sent, b), append(wants, want)
		return b
	}
	pendingOn := func(c *Conn) int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.pending)
	}
	conn := own
	// round holds busy's write side, as a sender between its queue and its
	// write, and sends the client's batch meanwhile.
	round := func(n int, wantJoin bool, heldFor time.Duration) {
		t.Helper()
		if held, ok := busy.queue(batch(0, n)); !held || !ok {
			t.Fatalf("round %d: queue on busy: held %v, ok %v", n, held, ok)
		}
		time.Sleep(heldFor)
		on := p.queue(&conn, Key{}, 1, batch(1, n))
		switch joined := pendingOn(busy) == 2; {
		case joined != wantJoin:
			t.Fatalf("round %d: joined the write under way: %v, want %v", n, joined, wantJoin)
		case joined && on != nil, !joined && on != own:
			t.Fatalf("round %d: queue gave %p, want nil (joined) or its own %p", n, on, own)
		case conn != own:
			t.Fatalf("round %d: the client's own connection was replaced", n)
		}
		if on != nil {
			on.writeHeld()
		}
		busy.writeHeld()
	}

	hold := &Batch{N: 1, Ends: make([]int, 0, 1), DoneCh: make(chan struct{}, 1)}
	hold.Req = resp.AppendCommand(nil, []byte("HOLD"), []byte("x"))
	busy.Send(hold)
	round(1, true, 0) // behind a request in flight less than joinAge
	p.joinAge = time.Millisecond
	time.Sleep(5 * time.Millisecond)
	round(2, false, 0) // behind one in flight longer
	p.joinAge = time.Minute
	release()
	<-hold.DoneCh
	waited := len(sent)
	for _, b := range sent {
		<-b.DoneCh
	}
	round(3, true, 0) // behind nothing in flight
	p.joinAge = time.Millisecond
	round(4, false, 5*time.Millisecond) // a write side held longer
	p.joinAge = time.Minute
	busy.state.Store(connStalled)
	round(5, false, 0)
	busy.state.Store(0)
	if on := p.queue(&conn, Key{}, 1, batch(1, 6)); on != own {
		t.Fatalf("with no write under way: queue gave %p, want its own %p", on, own)
	}
	own.writeHeld()
	for i, b := range sent {
		if i >= waited {
			<-b.DoneCh
		}
		if got := b.replies(nil); b.Err != nil || fmt.Sprintf("%q", got) != fmt.Sprintf("%q", wants[i]) {
			t.Errorf("batch %d: got %q (%v), want %q", i, got, b.Err, wants[i])
		}
	}
}

// TestPoolClose: Close fails the batches in flight and later Gets with
// ErrClosed, which is not counted as a failure of the node.
func TestPoolClose(t *testing.T) {
	be := redistest.StartBackend(t, redistest.BackendOptions{Answer: func([]string) redistest.Reply {
		return redistest.Reply{Stall: true}
	}})
	m := Metrics{}.orNowhere().Node(be.Addr())
	p := testPool(t, dialer{addr: be.Addr()}, 1, m)
	conn, err := p.Get(Key{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := echoBatch(0, 0, 2)
	conn.Send(b)
	p.close()
	<-b.DoneCh
	if !errors.Is(b.Err, ErrClosed) || !conn.Failed() {
		t.Errorf("batch in flight at Close: %v, failed %v", b.Err, conn.Failed())
	}
	if _, err := p.Get(Key{}, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close: %v", err)
	}
	conn.Send(b)
	<-b.DoneCh
	if !errors.Is(b.Err, ErrClosed) {
		t.Errorf("Send after Close: %v", b.Err)
	}
	if got := testutil.ToFloat64(m.Errors); got != 0 {
		t.Errorf("errors counted: %v, want 0", got)
	}
}

// TestErrorText: Redis's words stay; a transport failure is one line.
func TestErrorText(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{RedisError("ERR DB index is out of range"), "ERR DB index is out of range"},
		{fmt.Errorf("dial: %w", RedisError("WRONGTYPE x")), "WRONGTYPE x"},
		{errors.New("read tcp: connection\r\nreset"), "ERR upstream unavailable: read tcp: connection  reset"},
		{ErrClosed, "ERR upstream unavailable: proxy: upstream connection closed"},
	} {
		if got := ErrorText(tc.err); got != tc.want {
			t.Errorf("ErrorText(%q) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// BenchmarkConnSend is the shared connections' cost per request: 64
// clients send batches of depth PINGs over a pool of 2 connections to a
// server that answers at once, as sessions do.
func BenchmarkConnSend(b *testing.B) {
	for _, depth := range []int{1, 16} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			addr := redistest.StartPong(b)
			p := newPool(dialer{addr: addr, timeout: 5 * time.Second}, 2, 5*time.Second, Metrics{}.orNowhere().Node(addr), slog.New(slog.DiscardHandler))
			b.Cleanup(p.close)
			var ids atomic.Uint64
			b.SetParallelism(32)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				conn, err := p.Get(Key{}, ids.Add(1))
				if err != nil {
					b.Error(err)
					return
				}
				bt := &Batch{DoneCh: make(chan struct{}, 1)}
				for range depth {
					bt.Req = resp.AppendCommand(bt.Req, []byte("PING"))
				}
				for pb.Next() {
					bt.N, bt.Out, bt.Done, bt.OKLen, bt.Err = depth, bt.Out[:0], 0, 0, nil
					conn.Send(bt)
					<-bt.DoneCh
					if bt.Err != nil || bt.Done != depth {
						b.Errorf("%d of %d replies: %v", bt.Done, depth, bt.Err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*depth), "ns/request")
		})
	}
}
