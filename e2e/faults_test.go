package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func newGoRedis(t testing.TB, addr string, edit func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: addr, Protocol: 2, MaxRetries: -1, DialTimeout: 5 * time.Second}
	if edit != nil {
		edit(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestUpstreamDownAndBack: with Redis down, clients get a clear error
// within the dial timeout; when Redis returns, the proxy serves again
// without a restart.
func TestUpstreamDownAndBack(t *testing.T) {
	e := startEnv(t, func(c *config.Config) { c.Upstream.DialTimeout = config.Duration(500 * time.Millisecond) })
	c := dialRaw(t, e.ProxyAddr())
	if got := c.do("SET", "k", "1"); got != "+OK\r\n" {
		t.Fatalf("SET before kill: %q", got)
	}
	if err := e.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got := c.do("GET", "k")
	if !strings.HasPrefix(got, "-ERR upstream unavailable") {
		t.Errorf("GET with Redis down: %q, want -ERR upstream unavailable…", got)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("error took %v, want within the dial timeout", d)
	}
	// A new client too, and the same client again: fast errors, no hang.
	if got := dialRaw(t, e.ProxyAddr()).do("PING"); !strings.HasPrefix(got, "-ERR upstream unavailable") {
		t.Errorf("PING from a new client with Redis down: %q", got)
	}
	if err := e.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := c.do("SET", "k", "2"); got != "+OK\r\n" {
		t.Errorf("SET after restart: %q", got)
	}
	if got := c.do("GET", "k"); got != "$1\r\n2\r\n" {
		t.Errorf("GET after restart: %q", got)
	}
}

// TestUpstreamKilledMidLoad kills Redis while 20 clients write, restarts
// it, and checks that every request got an answer (a reply or an error),
// nobody hung, and all clients work afterwards.
func TestUpstreamKilledMidLoad(t *testing.T) {
	e := startEnv(t, func(c *config.Config) { c.Upstream.DialTimeout = config.Duration(300 * time.Millisecond) })
	const clients = 20
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newGoRedis(t, e.ProxyAddr(), func(o *redis.Options) { o.PoolSize = 1; o.ReadTimeout = 5 * time.Second })
			for n := 0; ctx.Err() == nil; n++ {
				err := c.Set(context.Background(), fmt.Sprintf("k%d", i), n, 0).Err()
				switch {
				case err == nil:
					ok.Add(1)
				case strings.Contains(err.Error(), "upstream unavailable"), isConnErr(err):
					failed.Add(1)
				default:
					t.Errorf("client %d: unexpected error %v", i, err)
					return
				}
			}
		}()
	}
	waitFor(t, func() bool { return ok.Load() > 1000 })
	if err := e.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return failed.Load() > clients })
	if err := e.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	before := ok.Load()
	waitFor(t, func() bool { return ok.Load() > before+1000 })
	cancel()
	wg.Wait()
	t.Logf("ok=%d failed=%d", ok.Load(), failed.Load())
	c := newGoRedis(t, e.ProxyAddr(), nil)
	for i := range clients {
		if err := c.Get(context.Background(), fmt.Sprintf("k%d", i)).Err(); err != nil {
			t.Errorf("GET k%d after recovery: %v", i, err)
		}
	}
}

func isConnErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || strings.Contains(err.Error(), "EOF") || strings.Contains(err.Error(), "connection reset")
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestQueryBufferLimit: a client that sends more than limits.query_buffer
// without completing a command gets an error and is closed; the proxy and
// other clients carry on.
func TestQueryBufferLimit(t *testing.T) {
	e := startEnv(t, func(c *config.Config) {
		c.Limits.QueryBuffer = 64 * config.KB
		c.Limits.MaxBulk = 64 * config.KB
	})
	other := dialRaw(t, e.ProxyAddr())
	other.do("SET", "k", "v")

	// 1000 arguments of 1000 bytes: each within max_bulk, the whole
	// command far over query_buffer.
	big := dialRaw(t, e.ProxyAddr())
	go func() {
		arg := append(append([]byte("$1000\r\n"), make([]byte, 1000)...), "\r\n"...)
		if _, err := big.nc.Write([]byte("*1000\r\n")); err != nil {
			return
		}
		for range 1000 {
			if _, err := big.nc.Write(arg); err != nil {
				return
			}
		}
	}()
	if got := big.readUntilClose(); got != "-ERR max query buffer length reached, closing connection\r\n" {
		t.Errorf("over the limit: %q", got)
	}
	tooLong := dialRaw(t, e.ProxyAddr())
	tooLong.send([]byte("*1\r\n$70000\r\n"))
	if got := tooLong.readUntilClose(); got != "-ERR Protocol error: invalid bulk length\r\n" {
		t.Errorf("bulk over max_bulk: %q", got)
	}
	if got := other.do("GET", "k"); got != "$1\r\nv\r\n" {
		t.Errorf("other client after: %q", got)
	}
}

// TestMaxClients: past limits.max_clients a new client gets Redis's error
// and is closed; when one leaves, the next is admitted.
func TestMaxClients(t *testing.T) {
	e := startEnv(t, func(c *config.Config) { c.Limits.MaxClients = 2 })
	a := dialRaw(t, e.ProxyAddr())
	a.do("PING")
	b := dialRaw(t, e.ProxyAddr())
	b.do("PING")
	if got := dialRaw(t, e.ProxyAddr()).readUntilClose(); got != "-ERR max number of clients reached\r\n" {
		t.Errorf("third client: %q", got)
	}
	a.nc.Close()
	waitFor(t, func() bool { return e.Proxy.Clients() < 2 })
	if got := dialRaw(t, e.ProxyAddr()).do("PING"); got != "+PONG\r\n" {
		t.Errorf("after one left: %q", got)
	}
}

// TestPasswords: the proxy's own password is required as Redis requires
// requirepass; the upstream password is never shown to clients.
func TestPasswords(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{Password: "upstream-secret"})
	cfg := config.Default()
	cfg.Listen, cfg.Metrics.Listen = "127.0.0.1:0", ""
	cfg.Upstream.Addrs = []string{rs.Addr()}
	cfg.Upstream.Password = "upstream-secret"
	cfg.Password = "proxy-secret"
	srv := startProxy(t, cfg)
	addr := srv.Addr().String()

	c := dialRaw(t, addr)
	steps := []struct{ args, want string }{
		{"GET k", "-NOAUTH Authentication required.\r\n"},
		{"AUTH wrong", "-WRONGPASS invalid username-password pair or user is disabled.\r\n"},
		{"AUTH someone proxy-secret", "-WRONGPASS invalid username-password pair or user is disabled.\r\n"},
		{"HELLO 2", "-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n"},
		{"AUTH upstream-secret", "-WRONGPASS invalid username-password pair or user is disabled.\r\n"},
		{"AUTH proxy-secret", "+OK\r\n"},
		{"SET k v", "+OK\r\n"},
		{"AUTH default proxy-secret", "+OK\r\n"},
		{"CONFIG GET requirepass", "*2\r\n$11\r\nrequirepass\r\n$6\r\n******\r\n"},
		{"CONFIG GET maxmemory-policy", "*2\r\n$16\r\nmaxmemory-policy\r\n$10\r\nnoeviction\r\n"},
	}
	for _, s := range steps {
		if got := c.do(strings.Fields(s.args)...); got != s.want {
			t.Errorf("%s: got %q, want %q", s.args, got, s.want)
		}
	}
	for _, cmd := range []string{"CONFIG GET *", "CONFIG GET *pass*", "INFO", "CLIENT LIST", "HELLO"} {
		if got := c.do(strings.Fields(cmd)...); strings.Contains(got, "upstream-secret") {
			t.Errorf("%s leaks the upstream password: %q", cmd, got)
		}
	}
	c2 := dialRaw(t, addr)
	if got := c2.do("HELLO", "2", "AUTH", "default", "proxy-secret", "SETNAME", "n1"); !strings.HasPrefix(got, "*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n") {
		t.Errorf("HELLO with AUTH: %q", got)
	}
	if got := c2.do("CLIENT", "GETNAME"); got != "$2\r\nn1\r\n" {
		t.Errorf("CLIENT GETNAME after HELLO SETNAME: %q", got)
	}
}

// TestAbandonedBlockingCommand: a client that leaves while its BLPOP waits
// must not leave the BLPOP behind to take an element nobody receives.
func TestAbandonedBlockingCommand(t *testing.T) {
	e := startEnv(t, nil)
	c := dialRaw(t, e.ProxyAddr())
	c.send([]byte("*3\r\n$5\r\nBLPOP\r\n$1\r\nq\r\n$1\r\n0\r\n"))
	direct := dialRaw(t, e.Redis.Addr())
	waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), "blocked_clients:1") })
	c.nc.Close()
	waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), "blocked_clients:0") })
	direct.do("RPUSH", "q", "job")
	if got := direct.do("LRANGE", "q", "0", "-1"); got != "*1\r\n$3\r\njob\r\n" {
		t.Errorf("queue after the client left: %q, want the job still there", got)
	}
}

// TestPipelinedAfterBlocking: commands a client pipelines behind a blocking
// command, in the same write and while it waits, are answered after it, in
// order.
func TestPipelinedAfterBlocking(t *testing.T) {
	e := startEnv(t, nil)
	c := dialRaw(t, e.ProxyAddr())
	c.send([]byte("*3\r\n$5\r\nBLPOP\r\n$1\r\nq\r\n$1\r\n0\r\n*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\nb\r\n*2\r\n$3\r\nGET\r\n$1\r\na\r\n"))
	direct := dialRaw(t, e.Redis.Addr())
	waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), "blocked_clients:1") })
	// Read while BLPOP waits, parsed after it: these bytes must not land
	// on the SET and GET that are still waiting to run.
	var more, want strings.Builder
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&more, "*2\r\n$4\r\nINCR\r\n$1\r\nn\r\n")
		fmt.Fprintf(&want, ":%d\r\n", i)
	}
	c.send([]byte(more.String()))
	time.Sleep(50 * time.Millisecond) // let the proxy read them while BLPOP waits
	direct.do("RPUSH", "q", "job")
	if got, want := c.readReplies(3+10), "*2\r\n$1\r\nq\r\n$3\r\njob\r\n+OK\r\n$1\r\nb\r\n"+want.String(); got != want {
		t.Errorf("got %.200q…, want %.200q…", got, want)
	}
}

// TestIdleTimeout: limits.idle_timeout closes idle clients; 0 (default)
// never does.
func TestIdleTimeout(t *testing.T) {
	e := startEnv(t, func(c *config.Config) { c.Limits.IdleTimeout = config.Duration(200 * time.Millisecond) })
	c := dialRaw(t, e.ProxyAddr())
	c.do("PING")
	start := time.Now()
	if got := c.readUntilClose(); got != "" {
		t.Errorf("idle close sent %q", got)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("closed after %v, want about 200ms", d)
	}
}

// TestGracefulShutdown: a request in flight when the proxy stops still gets
// its reply; then the connection closes and Serve returns.
func TestGracefulShutdown(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{Args: []string{"--enable-debug-command", "yes"}})
	cfg := config.Default()
	cfg.Listen, cfg.Metrics.Listen = "127.0.0.1:0", ""
	cfg.Upstream.Addrs = []string{rs.Addr()}
	srv := startProxy(t, cfg)
	c := dialRaw(t, srv.Addr().String())
	blocked := dialRaw(t, srv.Addr().String())
	blocked.send([]byte("*3\r\n$5\r\nBLPOP\r\n$1\r\nq\r\n$3\r\n0.4\r\n"))
	idle := dialRaw(t, srv.Addr().String())
	idle.do("PING")
	c.send([]byte("*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n$3\r\n0.3\r\n"))
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.readUntilClose(); got != "+OK\r\n" {
		t.Errorf("in-flight reply: %q", got)
	}
	if got := blocked.readUntilClose(); got != "*-1\r\n" {
		t.Errorf("blocked client: %q, want its BLPOP timeout reply", got)
	}
	if got := idle.readUntilClose(); got != "" {
		t.Errorf("idle client got %q", got)
	}
	if _, err := net.DialTimeout("tcp", srv.Addr().String(), time.Second); err == nil {
		t.Error("still accepting after Shutdown")
	}
}

// TestShutdownForcesBlockedClients: a client blocked for ever (BLPOP q 0)
// does not hold up a stop past its deadline, and its BLPOP does not stay
// behind in Redis.
func TestShutdownForcesBlockedClients(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{})
	cfg := config.Default()
	cfg.Listen, cfg.Metrics.Listen = "127.0.0.1:0", ""
	cfg.Upstream.Addrs = []string{rs.Addr()}
	srv := startProxy(t, cfg)
	for _, cmd := range []string{"*3\r\n$5\r\nBLPOP\r\n$1\r\nq\r\n$1\r\n0\r\n", "XREAD BLOCK 0 STREAMS s $\r\n"} {
		dialRaw(t, srv.Addr().String()).send([]byte(cmd))
	}
	direct := dialRaw(t, rs.Addr())
	waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), "blocked_clients:2") })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Shutdown: %v, want the deadline error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown still waiting 10s after its 300ms deadline")
	}
	waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), "blocked_clients:0") })
}

// TestPipelineWrittenBeforeReading: a client that writes a whole pipeline
// before reading any reply (redis-py's execute) is served as Redis serves
// it, however much the replies outgrow the socket buffers.
func TestPipelineWrittenBeforeReading(t *testing.T) {
	e := startEnv(t, nil)
	c := dialRaw(t, e.ProxyAddr())
	value := strings.Repeat("v", 100)
	c.do("SET", "k", value)
	const n = 200000
	req := []byte(strings.Repeat("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", n))
	written := make(chan error, 1)
	go func() {
		c.nc.SetWriteDeadline(time.Now().Add(60 * time.Second))
		_, err := c.nc.Write(req)
		written <- err
	}()
	select {
	case err := <-written:
		if err != nil {
			t.Fatalf("writing the pipeline: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the proxy stopped reading the pipeline while its replies waited")
	}
	reply := "$100\r\n" + value + "\r\n"
	c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, len(reply))
	for i := range n {
		if _, err := io.ReadFull(c.br, buf); err != nil || string(buf) != reply {
			t.Fatalf("reply %d: %q, %v", i, buf, err)
		}
	}
}

// TestAttackRegressions pins bugs found by attacking the proxy.
func TestAttackRegressions(t *testing.T) {
	t.Run("AUTH pipelined with a command over the unauthenticated limits", func(t *testing.T) {
		e := startEnv(t, func(c *config.Config) { c.Password = "pw" })
		c := dialRaw(t, e.ProxyAddr())
		big := strings.Repeat("x", 20000)
		c.send([]byte("AUTH pw\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$20000\r\n" + big + "\r\n"))
		if got := c.readReplies(2); got != "+OK\r\n+OK\r\n" {
			t.Errorf("got %q", got)
		}
	})
	t.Run("RESET while subscribed, then AUTH again", func(t *testing.T) {
		e := startEnv(t, func(c *config.Config) { c.Password = "pw" })
		c := dialRaw(t, e.ProxyAddr())
		c.send([]byte("AUTH pw\r\nSUBSCRIBE a\r\nRESET\r\nGET k\r\nAUTH pw\r\nPING\r\n"))
		want := "+OK\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n+RESET\r\n-NOAUTH Authentication required.\r\n+OK\r\n+PONG\r\n"
		if got := c.readReplies(6); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	})
	t.Run("Redis closing idle shared connections costs no request", func(t *testing.T) {
		e := startEnv(t, nil)
		dialRaw(t, e.Redis.Addr()).do("CONFIG", "SET", "timeout", "1")
		c := dialRaw(t, e.ProxyAddr())
		c.do("INCR", "n")
		direct := dialRaw(t, e.Redis.Addr())
		// Redis drops idle connections after 1 s; ours among them.
		waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), "connected_clients:1\r\n") })
		time.Sleep(100 * time.Millisecond) // let the proxy notice
		if got := c.do("INCR", "n"); got != ":2\r\n" {
			t.Errorf("INCR after Redis closed the idle connection: %q", got)
		}
	})
	t.Run("XREADGROUP BLOCK with a group named streams", func(t *testing.T) {
		e := startEnv(t, func(c *config.Config) { c.Upstream.ConnsPerNode = 1 })
		c := dialRaw(t, e.ProxyAddr())
		c.do("XGROUP", "CREATE", "s", "streams", "$", "MKSTREAM")
		c.send([]byte("XREADGROUP GROUP streams c1 BLOCK 0 STREAMS s >\r\n"))
		direct := dialRaw(t, e.Redis.Addr())
		waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), "blocked_clients:1") })
		if got := dialRaw(t, e.ProxyAddr()).do("PING"); got != "+PONG\r\n" {
			t.Errorf("another client behind the blocked XREADGROUP: %q", got)
		}
		c.nc.Close()
		waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), "blocked_clients:0") })
	})
	t.Run("idle_timeout spares a blocked client and still cancels its BLPOP", func(t *testing.T) {
		e := startEnv(t, func(c *config.Config) { c.Limits.IdleTimeout = config.Duration(200 * time.Millisecond) })
		c := dialRaw(t, e.ProxyAddr())
		c.send([]byte("BLPOP iq 0\r\n"))
		direct := dialRaw(t, e.Redis.Addr())
		waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), "blocked_clients:1") })
		time.Sleep(400 * time.Millisecond) // past idle_timeout
		c.nc.Close()
		waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), "blocked_clients:0") })
		direct.do("RPUSH", "iq", "precious")
		if got := direct.do("LLEN", "iq"); got != ":1\r\n" {
			t.Errorf("LLEN after the client left: %q", got)
		}
	})
	t.Run("upstream password hidden inside MULTI", func(t *testing.T) {
		rs := redistest.Start(t, localredis.Options{Password: "up"})
		cfg := config.Default()
		cfg.Listen, cfg.Metrics.Listen = "127.0.0.1:0", ""
		cfg.Upstream.Addrs, cfg.Upstream.Password = []string{rs.Addr()}, "up"
		c := dialRaw(t, startProxy(t, cfg).Addr().String())
		c.send([]byte("MULTI\r\nCONFIG GET requirepass\r\nEXEC\r\n"))
		if got := c.readReplies(3); strings.Contains(got, "$2\r\nup\r\n") {
			t.Errorf("leaked: %q", got)
		}
	})
	t.Run("SCRIPT KILL reaches Redis while a script is busy", func(t *testing.T) {
		e := startEnv(t, func(c *config.Config) {
			c.Upstream.ConnsPerNode = 1
			// The script's client must still wait when Redis turns busy,
			// after busy-reply-threshold (5s, as the default read timeout).
			c.Upstream.ReadTimeout = config.Duration(20 * time.Second)
		})
		busy := dialRaw(t, e.ProxyAddr())
		busy.send([]byte("EVAL \"while true do end\" 0\r\n"))
		direct := dialRaw(t, e.Redis.Addr())
		waitFor(t, func() bool { return strings.HasPrefix(direct.do("PING"), "-BUSY") })
		if got := dialRaw(t, e.ProxyAddr()).do("SCRIPT", "KILL"); got != "+OK\r\n" {
			t.Errorf("SCRIPT KILL: %q", got)
		}
		if got := busy.readReplies(1); !strings.HasPrefix(got, "-ERR Script killed by user") {
			t.Errorf("killed script's reply: %q", got)
		}
	})
}

// TestSelectOutOfRangeDialsOnce: refused SELECTs are answered without
// opening a connection to Redis each time.
func TestSelectOutOfRangeDialsOnce(t *testing.T) {
	e := startEnv(t, nil)
	c := dialRaw(t, e.ProxyAddr())
	direct := dialRaw(t, e.Redis.Addr())
	before := direct.do("INFO", "stats")
	for i := range 200 {
		if got := c.do("SELECT", fmt.Sprint(100+i)); got != "-ERR DB index is out of range\r\n" {
			t.Fatalf("SELECT %d: %q", 100+i, got)
		}
	}
	if got := c.do("SELECT", "3"); got != "+OK\r\n" {
		t.Errorf("SELECT 3 afterwards: %q", got)
	}
	conns := func(info string) int {
		var n int
		fmt.Sscanf(info[strings.Index(info, "total_connections_received:"):], "total_connections_received:%d", &n)
		return n
	}
	// At most: the refused dial, db 3's shared connection, and the spare
	// own connections kept for db 0 (dialed as the client came, maybe
	// after before was read) and db 3.
	if n := conns(direct.do("INFO", "stats")) - conns(before); n > 4 {
		t.Errorf("200 refused SELECTs opened %d connections to Redis", n)
	}
}

// TestHalfClosedDuringBlocking: a client that half-closes while its BLPOP
// waits is closed quietly, as Redis closes it, and the BLPOP is dropped.
func TestHalfClosedDuringBlocking(t *testing.T) {
	e := startEnv(t, nil)
	for name, addr := range map[string]string{"redis": e.Redis.Addr(), "proxy": e.ProxyAddr()} {
		c := dialRaw(t, addr)
		c.send([]byte("BLPOP hq 0\r\n"))
		direct := dialRaw(t, e.Redis.Addr())
		waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), "blocked_clients:1") })
		c.nc.(*net.TCPConn).CloseWrite()
		if got := c.readUntilClose(); got != "" {
			t.Errorf("%s: half-closed client got %q, want a quiet close", name, got)
		}
		waitFor(t, func() bool { return strings.Contains(direct.do("INFO", "clients"), "blocked_clients:0") })
	}
}

// TestPipelineIntoSubscribeBeforeReading: a big pipeline, SUBSCRIBE and
// more commands, all written before reading, get what Redis sends.
func TestPipelineIntoSubscribeBeforeReading(t *testing.T) {
	e := startEnv(t, nil)
	var req strings.Builder
	req.WriteString(strings.Repeat("*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n", 5000))
	req.WriteString("*2\r\n$9\r\nSUBSCRIBE\r\n$1\r\nq\r\n")
	req.WriteString(strings.Repeat("*1\r\n$4\r\nPING\r\n", 100000))
	req.WriteString("*1\r\n$4\r\nQUIT\r\n")
	run := func(addr string) string {
		c := dialRaw(t, addr)
		c.do("SET", "big", strings.Repeat("b", 1000))
		written := make(chan error, 1)
		go func() { _, err := c.nc.Write([]byte(req.String())); written <- err }()
		select {
		case err := <-written:
			if err != nil {
				t.Fatalf("%s: write: %v", addr, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s stopped reading the pipeline", addr)
		}
		c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
		b, err := io.ReadAll(c.br)
		if err != nil {
			t.Fatalf("%s: read: %v", addr, err)
		}
		return string(b)
	}
	want, got := run(e.Redis.Addr()), run(e.ProxyAddr())
	if got != want {
		t.Errorf("proxy sent %d bytes, Redis %d (first difference at %d)", len(got), len(want), firstDiff(got, want))
	}
}

func firstDiff(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestClientThatNeverReads: replies piling up unread past the limit close
// the client and free its place.
func TestClientThatNeverReads(t *testing.T) {
	e := startEnv(t, func(c *config.Config) {
		c.Limits.QueryBuffer = 8 * config.MB
		c.Limits.MaxBulk = 4 * config.MB
	})
	c := dialRaw(t, e.ProxyAddr())
	c.do("SET", "big", strings.Repeat("b", 1000))
	go c.nc.Write([]byte(strings.Repeat("*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n", 100000)))
	waitFor(t, func() bool { return e.Proxy.Clients() == 0 })
}
