package proxy

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/tidwall/redcon"
)

func startTestProxy(t testing.TB, upstream string, edit func(*config.Config)) string {
	t.Helper()
	srv, addr := startTestServer(t, upstream, edit)
	t.Cleanup(func() { srv.Shutdown(t.Context()) })
	return addr
}

// startTestServer is startTestProxy for a caller that shuts the server
// down itself.
func startTestServer(t testing.TB, upstream string, edit func(*config.Config)) (*Server, string) {
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
	return srv, ln.Addr().String()
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
			want = redcon.AppendBulk(want, tag)
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

// TestRelayOrderAndIsolation: many clients send random pipelines through
// shared connections to a backend that answers each request with its tag
// and a sequence number in the order it served them, while one client
// sends a large pipeline and never reads. Every client gets exactly its
// own replies, in the order it sent them, served in that order; the one
// that does not read holds up nobody.
func TestRelayOrderAndIsolation(t *testing.T) {
	var seq atomic.Int64
	be := redistest.StartBackend(t, redistest.BackendOptions{Answer: func(args []string) redistest.Reply {
		n := seq.Add(1)
		return redistest.Reply{Raw: string(redcon.AppendBulk(nil, fmt.Appendf(nil, "%s@%d", args[len(args)-1], n)))}
	}})
	addr := startTestProxy(t, be.Addr(), func(c *config.Config) { c.Upstream.ConnsPerNode = 3 })

	stalled, _, err := dialClient(addr, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	var big []byte
	for i := range 20000 {
		big = resp.AppendCommand(big, []byte("ECHO"), fmt.Appendf(nil, "stalled-%d-%0200d", i, 0))
	}
	go stalled.Write(big) // blocks once the proxy stops taking it: nobody reads

	const clients, rounds = 24, 15
	errs := make(chan error, clients)
	for c := range clients {
		go func() {
			errs <- func() error {
				nc, br, err := dialClient(addr, 20*time.Second)
				if err != nil {
					return err
				}
				defer nc.Close()
				rng := rand.New(rand.NewPCG(uint64(c), 1))
				last := int64(0)
				for r := range rounds {
					depth := 1 + rng.IntN(300)
					var req []byte
					for i := range depth {
						req = resp.AppendCommand(req, []byte("ECHO"), fmt.Appendf(nil, "c%d-r%d-i%d", c, r, i))
					}
					if _, err := nc.Write(req); err != nil {
						return err
					}
					for i := range depth {
						reply, err := resp.ReadReply(br, nil)
						if err != nil {
							return fmt.Errorf("client %d round %d reply %d: %v", c, r, i, err)
						}
						v, _ := resp.BulkValue(reply)
						tag, n, _ := strings.Cut(string(v), "@")
						if want := fmt.Sprintf("c%d-r%d-i%d", c, r, i); tag != want {
							return fmt.Errorf("client %d round %d reply %d: %q, want %s", c, r, i, v, want)
						}
						served, _ := strconv.ParseInt(n, 10, 64)
						if served <= last {
							return fmt.Errorf("client %d round %d reply %d: served %d, after %d", c, r, i, served, last)
						}
						last = served
					}
				}
				return nil
			}()
		}()
	}
	for range clients {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// BenchmarkRelay is the relay's cost per request from client to upstream
// and back: 64 clients pipeline depth PINGs through the proxy to a server
// that answers at once.
func BenchmarkRelay(b *testing.B) {
	for _, depth := range []int{1, 16} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			addr := startTestProxy(b, redistest.StartPong(b), nil)
			var req []byte
			for range depth {
				req = resp.AppendCommand(req, []byte("PING"))
			}
			b.SetParallelism(32)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				nc, br, err := dialClient(addr, time.Hour)
				if err != nil {
					b.Error(err)
					return
				}
				defer nc.Close()
				var out []byte
				for pb.Next() {
					if _, err := nc.Write(req); err != nil {
						b.Error(err)
						return
					}
					out = out[:0]
					for range depth {
						if out, err = resp.ReadReply(br, out); err != nil {
							b.Error(err)
							return
						}
					}
				}
			})
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*depth), "ns/request")
		})
	}
}
