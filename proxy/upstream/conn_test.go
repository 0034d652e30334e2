package upstream

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

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
	p := newPool(d, perDB, m, slog.New(slog.DiscardHandler))
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
		want = append(want, string(resp.AppendBulk(nil, []byte(tag))))
	}
	return b, want
}

// TestConnOrder has many clients pipeline through few shared connections;
// each must get exactly its own replies, in order.
func TestConnOrder(t *testing.T) {
	be := redistest.StartBackend(t, redistest.BackendOptions{})
	p := testPool(t, dialer{addr: be.Addr()}, 2, nil)

	const clients, rounds, depth = 40, 50, 16
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for r := range rounds {
				conn, err := p.Get(0, uint64(c))
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
				conn, err := p.Get(0, uint64(c))
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
			_, err := p.Get(0, uint64(c))
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
