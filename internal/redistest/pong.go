package redistest

import (
	"net"
	"sync"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// StartPong starts a RESP server on a free loopback port that answers
// every command with +PONG, as cheaply as it can, for benchmarks of the
// proxy's own cost: unlike a Backend it records nothing. It stops, closing
// its connections, when tb ends. It returns its address, host:port.
func StartPong(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{} // open ones; nil once stopping
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if conns == nil {
				mu.Unlock()
				nc.Close()
				return
			}
			conns[nc] = struct{}{}
			mu.Unlock()
			wg.Go(func() { pong(nc) })
		}
	})
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for nc := range conns {
			nc.Close()
		}
		conns = nil
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// pong answers the commands on nc until it fails.
func pong(nc net.Conn) {
	rd := resp.NewCommandReader(nc, 1<<30, 512<<20)
	var out []byte
	for {
		cmds, err := rd.ReadCommands()
		out = out[:0]
		for range cmds {
			out = append(out, "+PONG\r\n"...)
		}
		if len(out) > 0 {
			if _, werr := nc.Write(out); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
