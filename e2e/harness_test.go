// Package e2e tests hotkeyproxy end to end: real redis-server processes on
// free loopback ports, the proxy in front of them, and real clients.
package e2e

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy"
)

// env is one upstream redis-server and a proxy in front of it.
type env struct {
	Redis *localredis.Server
	Proxy *proxy.Server
	Cfg   *config.Config
}

// ProxyAddr is where clients connect.
func (e *env) ProxyAddr() string { return e.Proxy.Addr().String() }

// startEnv starts a redis-server and a proxy; edit may change the proxy's
// config before it starts. Both stop when the test ends.
func startEnv(t testing.TB, edit func(*config.Config)) *env {
	t.Helper()
	rs := redistest.Start(t, localredis.Options{})
	cfg := testConfig(t, config.ModeStandalone, []string{rs.Addr()}, edit)
	return &env{Redis: rs, Proxy: startProxy(t, cfg), Cfg: cfg}
}

// testConfig is the default config with the upstream given, listening on
// a free loopback port, without metrics; edit may change it before it is
// validated.
func testConfig(t testing.TB, mode string, addrs []string, edit func(*config.Config)) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Upstream.Mode = mode
	cfg.Upstream.Addrs = addrs
	cfg.Listen = "127.0.0.1:0"
	cfg.Metrics.Listen = ""
	if edit != nil {
		edit(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startProxy serves cfg on a free loopback port until the test ends.
func startProxy(t testing.TB, cfg *config.Config) *proxy.Server {
	t.Helper()
	srv, err := proxy.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return serveProxy(t, srv)
}

// serveProxy serves srv on a free loopback port until the test ends.
func serveProxy(t testing.TB, srv *proxy.Server) *proxy.Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	for srv.Addr() == nil {
		time.Sleep(time.Millisecond)
	}
	return srv
}

// rawConn is a client that speaks bytes, for byte-exact comparisons.
type rawConn struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
}

func dialRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc, br: bufio.NewReader(nc)}
}

// send writes raw bytes.
func (c *rawConn) send(b []byte) {
	c.t.Helper()
	c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// do sends one command and returns its raw reply.
func (c *rawConn) do(args ...string) string {
	c.t.Helper()
	var req []byte
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	req = resp.AppendCommand(req, bs...)
	c.send(req)
	return c.readReplies(1)
}

// readReplies reads n raw replies, failing the test after 10 s.
func (c *rawConn) readReplies(n int) string {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var out []byte
	for i := 0; i < n; i++ {
		var err error
		if out, err = resp.ReadReply(c.br, out); err != nil {
			c.t.Fatalf("reading reply %d of %d: %v (got so far %q)", i+1, n, err, out)
		}
	}
	return string(out)
}

// readUntilClose reads everything until the server closes the connection
// (or 5 s pass, which is reported as a failure).
func (c *rawConn) readUntilClose() string {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c.br)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		c.t.Fatalf("connection still open after 5s; read %q", b)
	}
	return string(b)
}

// clusterEnv is a Redis Cluster (3 masters, 1 replica each) and a proxy in
// front of it.
type clusterEnv struct {
	Cluster *localredis.Cluster
	Proxy   *proxy.Server
	Cfg     *config.Config
}

// ProxyAddr is where clients connect.
func (e *clusterEnv) ProxyAddr() string { return e.Proxy.Addr().String() }

// startClusterEnv starts a cluster and a proxy over it; edit may change
// the proxy's config before it starts. Both stop when the test ends.
func startClusterEnv(t testing.TB, edit func(*config.Config)) *clusterEnv {
	t.Helper()
	c := redistest.StartCluster(t, localredis.ClusterOptions{Masters: 3, Replicas: 1})
	cfg := testConfig(t, config.ModeCluster, c.Seeds(), edit)
	return &clusterEnv{Cluster: c, Proxy: startProxy(t, cfg), Cfg: cfg}
}
