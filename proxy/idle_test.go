package proxy

import (
	"context"
	"net/netip"
	"runtime"
	"syscall"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
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
