package proxy

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

func startTestProxy(t *testing.T, upstream string, edit func(*config.Config)) string {
	t.Helper()
	cfg := config.Default()
	cfg.Upstream.Addrs = []string{upstream}
	cfg.Metrics.Listen = ""
	if edit != nil {
		edit(cfg)
	}
	srv, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(t.Context()) })
	return ln.Addr().String()
}

// TestSharedConnOrder has many clients pipeline through few shared upstream
// connections; each must get exactly its own replies, in order.
func TestSharedConnOrder(t *testing.T) {
	be := redistest.StartBackend(t, redistest.BackendOptions{})
	addr := startTestProxy(t, be.Addr(), func(c *config.Config) { c.Upstream.ConnsPerNode = 2 })

	const clients, rounds, depth = 40, 50, 16
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- pipelineEcho(addr, c, rounds, depth)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got, want := be.Served(), int64(clients*rounds*depth); got != want {
		t.Errorf("backend served %d commands, want %d", got, want)
	}
	if n := be.Conns(); n > 2 {
		t.Errorf("backend saw %d connections, want at most conns_per_node=2", n)
	}
}

// dialClient connects a test client whose every read and write must be
// done within limit.
func dialClient(addr string, limit time.Duration) (net.Conn, *bufio.Reader, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	nc.SetDeadline(time.Now().Add(limit))
	return nc, bufio.NewReader(nc), nil
}

func pipelineEcho(addr string, client, rounds, depth int) error {
	nc, br, err := dialClient(addr, 30*time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	for r := range rounds {
		var req, want []byte
		for i := range depth {
			tag := []byte(fmt.Sprintf("c%d-r%d-i%d", client, r, i))
			req = resp.AppendCommand(req, []byte("ECHO"), tag)
			want = resp.AppendBulk(want, tag)
		}
		if _, err := nc.Write(req); err != nil {
			return err
		}
		var got []byte
		for range depth {
			if got, err = resp.ReadReply(br, got); err != nil {
				return fmt.Errorf("client %d round %d: %v", client, r, err)
			}
		}
		if string(got) != string(want) {
			return fmt.Errorf("client %d round %d: got %q, want %q", client, r, got, want)
		}
	}
	return nil
}

// TestPipelineBatched: a client's pipeline reaches Redis in a few writes,
// not one round trip per command, even when Redis is slow to answer.
func TestPipelineBatched(t *testing.T) {
	be := redistest.StartBackend(t, redistest.BackendOptions{Delay: 20 * time.Millisecond})
	addr := startTestProxy(t, be.Addr(), nil)
	if err := pipelineEcho(addr, 0, 1, 300); err != nil {
		t.Fatal(err)
	}
	if n := be.Bursts(); n > 3 {
		t.Errorf("300 pipelined commands reached the backend in %d bursts, want them batched", n)
	}
}

// TestSharedConnFailure drops the upstream connection every 100 commands
// while clients pipeline: every request gets its own reply or an error
// reply, in order, nobody hangs, and the proxy redials.
func TestSharedConnFailure(t *testing.T) {
	var served atomic.Int64
	be := redistest.StartBackend(t, redistest.BackendOptions{Answer: func(args []string) redistest.Reply {
		if served.Add(1)%100 == 0 {
			return redistest.Reply{Drop: true}
		}
		return redistest.Echo(args)
	}})
	addr := startTestProxy(t, be.Addr(), nil)

	const clients, rounds, depth = 8, 40, 8
	var wg sync.WaitGroup
	var failed, ok atomic.Int64
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, br, err := dialClient(addr, 30*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			defer nc.Close()
			for r := range rounds {
				var req []byte
				for i := range depth {
					req = resp.AppendCommand(req, []byte("ECHO"), fmt.Appendf(nil, "c%d-r%d-i%d", c, r, i))
				}
				nc.Write(req)
				for i := range depth {
					reply, err := resp.ReadReply(br, nil)
					if err != nil {
						t.Errorf("client %d: %v", c, err)
						return
					}
					want := fmt.Sprintf("c%d-r%d-i%d", c, r, i)
					switch {
					case strings.HasPrefix(string(reply), "-ERR upstream unavailable"):
						failed.Add(1)
					case string(reply) == string(resp.AppendBulk(nil, []byte(want))):
						ok.Add(1)
					default:
						t.Errorf("client %d: got %q, want %q or an error", c, reply, want)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() == 0 || ok.Load() == 0 {
		t.Errorf("ok=%d failed=%d: want both, the backend drops every 100 commands", ok.Load(), failed.Load())
	}
	if be.Conns() < 2 {
		t.Errorf("proxy dialed %d times, want redials after failures", be.Conns())
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
	addr := startTestProxy(t, be.Addr(), func(c *config.Config) {
		c.Upstream.Password = "x"
		c.Upstream.DialTimeout = config.Duration(timeout)
		c.Upstream.ConnsPerNode = 1
	})
	const clients = 20
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, br, err := dialClient(addr, 10*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			defer nc.Close()
			nc.Write([]byte("PING\r\n"))
			reply, err := resp.ReadReply(br, nil)
			if err != nil || !strings.HasPrefix(string(reply), "-ERR upstream unavailable") {
				t.Errorf("reply %q, %v", reply, err)
			}
		}()
	}
	wg.Wait()
	if d := time.Since(start); d > 4*timeout {
		t.Errorf("%d clients took %v to fail, want about one dial timeout (%v)", clients, d, timeout)
	}
}
