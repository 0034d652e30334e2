package proxy

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// BenchmarkIdleClients reports what an idle client costs the proxy: the
// live heap and goroutine stack bytes per client while idleClients clients
// wait, each after one local and one relayed command (bench/idle_rss.sh
// measures the resident memory of the whole process). The clients are raw
// sockets, so that the process's heap holds only the proxy's side.
func BenchmarkIdleClients(b *testing.B) {
	const idleClients = 1000
	up := redistest.StartPong(b)
	req := []byte("*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")
	var heap, stack float64
	for b.Loop() {
		srv, addr := startTestServer(b, up, nil)
		before := memInUse()
		fds := make([]int, 0, idleClients)
		for range idleClients {
			fd := dialRaw(b, netip.MustParseAddrPort(addr))
			fds = append(fds, fd)
			if _, err := syscall.Write(fd, req); err != nil {
				b.Fatal(err)
			}
			readFull(b, fd, len("+PONG\r\n+PONG\r\n"))
		}
		after := memInUse()
		heap += (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / idleClients
		stack += (float64(after.StackInuse) - float64(before.StackInuse)) / idleClients
		for _, fd := range fds {
			syscall.Close(fd)
		}
		if err := srv.Shutdown(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(heap/float64(b.N), "heap-B/client")
	b.ReportMetric(stack/float64(b.N), "stack-B/client")
}

// memInUse is the runtime's memory statistics after a collection.
func memInUse() runtime.MemStats {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms
}

// dialRaw connects a blocking socket, which the Go runtime knows nothing of.
func dialRaw(tb testing.TB, ap netip.AddrPort) int {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if err := syscall.Connect(fd, &syscall.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}); err != nil {
		syscall.Close(fd)
		tb.Fatal(err)
	}
	return fd
}

// readFull reads n bytes from the blocking socket fd.
func readFull(tb testing.TB, fd, n int) {
	tb.Helper()
	buf := make([]byte, n)
	for got := 0; got < n; {
		m, err := syscall.Read(fd, buf[got:])
		if err != nil || m == 0 {
			tb.Fatalf("read %d of %d bytes: %v", got, n, err)
		}
		got += m
	}
}

// TestBigCommandLeavesNoMemory: a client that once sent a command of many
// keys holds nothing for them once it waits idle, with a hot-key rule in
// force (the key positions of every command are looked up): not their
// positions, not the parser's offsets of its arguments.
func TestBigCommandLeavesNoMemory(t *testing.T) {
	const (
		clients = 10
		keys    = 50000
		kept    = 64 << 10 // bytes each client may still hold: small buffers kept for reuse
	)
	up := redistest.Start(t, localredis.Options{}).Addr()
	addr := startTestProxy(t, up, func(c *config.Config) {
		c.Hotkeys.Keys = []config.KeyRule{{Match: "stock:*", Buckets: 4}}
	})
	args := [][]byte{[]byte("DEL")} // a reply of a few bytes: only the request is big
	for i := range keys {
		args = append(args, []byte("k"+strconv.Itoa(i)))
	}
	del := resp.AppendCommand(nil, args...)
	ping := resp.AppendCommand(nil, []byte("PING"))
	type client struct {
		nc net.Conn
		br *bufio.Reader
	}
	do := func(c client, req []byte, want string) {
		t.Helper()
		if _, err := c.nc.Write(req); err != nil {
			t.Fatal(err)
		}
		if r, err := resp.ReadReply(c.br, nil); err != nil || string(r) != want {
			t.Fatalf("got %q, %v; want %q", r, err, want)
		}
	}
	conns := make([]client, clients)
	for i := range conns {
		nc, br, err := dialClient(addr, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		conns[i] = client{nc, br}
		do(conns[i], ping, "+PONG\r\n")
	}
	before := memInUse()
	for _, c := range conns {
		do(c, del, ":0\r\n")
		do(c, ping, "+PONG\r\n")
	}
	after := memInUse()
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d bytes more on the heap for %d idle clients", grown, clients)
	if grown > clients*kept {
		t.Fatalf("%d idle clients hold %d bytes more after one DEL of %d keys each (at most %d each)", clients, grown, keys, kept)
	}
}
