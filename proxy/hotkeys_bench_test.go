package proxy

import (
	"bufio"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// BenchmarkDeduct is the deduct-one script by EVALSHA at depth 1 from 50
// clients through the proxy, on a plain key (relayed) and on a hot key of
// 8 buckets, in front of one redis-server and of a 3-master cluster.
// cpu-µs/op is this process's CPU (the proxy and the clients, whose share
// is the same in both) per deduct: the difference is what the hot-key
// path adds.
func BenchmarkDeduct(b *testing.B) {
	b.Run("standalone", func(b *testing.B) {
		benchDeduct(b, redistest.Start(b, localredis.Options{}).Addr(), config.ModeStandalone)
	})
	b.Run("cluster", func(b *testing.B) {
		benchDeduct(b, redistest.StartCluster(b, localredis.ClusterOptions{Masters: 3}).Seeds()[0], config.ModeCluster)
	})
}

func benchDeduct(b *testing.B, upstream, mode string) {
	const body = "if tonumber(redis.call('get', KEYS[1]) or '0') > 0 then return redis.call('decr', KEYS[1]) else return -1 end"
	addr := startTestProxy(b, upstream, func(c *config.Config) {
		c.Upstream.Mode = mode
		c.Hotkeys.Keys = []config.KeyRule{{Match: "hot", Buckets: 8}}
		c.Scripts = []config.Script{{Name: "deduct-one", Body: body, Amount: config.Amount{Const: 1}, Soldout: -1}}
	})
	sha := []byte(config.Script{Body: body}.SHA1())
	for _, key := range []string{"plain", "hot"} {
		b.Run(key, func(b *testing.B) {
			c := dialBench(b, addr)
			c.do(b, "SCRIPT", "LOAD", body)
			c.do(b, "SET", key, "1000000000000")
			req := resp.AppendCommand(nil, []byte("EVALSHA"), sha, []byte("1"), []byte(key))
			b.SetParallelism(25) // 50 clients on 2 cores
			b.ReportAllocs()
			b.ResetTimer() // the SET that splits the stock is no deduct's
			cpu0 := cpuTime()
			b.RunParallel(func(pb *testing.PB) {
				c := dialBench(b, addr)
				for pb.Next() {
					c.nc.Write(req)
					r, err := resp.ReadReply(c.br, nil)
					if err != nil || r[0] != ':' {
						b.Errorf("EVALSHA: %q, %v", r, err)
						return
					}
				}
			})
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

type benchConn struct {
	nc net.Conn
	br *bufio.Reader
}

func dialBench(b *testing.B, addr string) *benchConn {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nc.Close() })
	return &benchConn{nc, bufio.NewReader(nc)}
}

func (c *benchConn) do(b *testing.B, args ...string) {
	var bargs [][]byte
	for _, a := range args {
		bargs = append(bargs, []byte(a))
	}
	c.nc.Write(resp.AppendCommand(nil, bargs...))
	if r, err := resp.ReadReply(c.br, nil); err != nil || r[0] == '-' {
		b.Fatalf("%v: %q, %v", args, r, err)
	}
}

// cpuTime is the user and system CPU this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
