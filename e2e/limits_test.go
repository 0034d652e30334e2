package e2e

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/proxy"
)

// metricValue is the value of series (name and labels, as exposed) in srv's
// /metrics, or -1 when it is not there.
func metricValue(t testing.TB, srv *proxy.Server, series string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(rec.Body.String())
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

const clientMemory = "hotkeyproxy_client_memory_bytes"

// startEnvLog is startEnv with the proxy's log written to the returned
// buffer, at debug level.
func startEnvLog(t *testing.T, edit func(*config.Config)) (*env, *redistest.SyncBuffer) {
	t.Helper()
	rs := redistest.Start(t, localredis.Options{})
	cfg := testConfig(t, config.ModeStandalone, []string{rs.Addr()}, edit)
	log := &redistest.SyncBuffer{}
	srv, err := proxy.New(cfg, slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	return &env{Redis: rs, Proxy: serveProxy(t, srv), Cfg: cfg}, log
}

// pingsAnswered checks that a client other than the one under test is
// served while it runs: n PINGs in a row, each answered.
func pingsAnswered(t *testing.T, addr string, n int) {
	t.Helper()
	c := dialRaw(t, addr)
	defer c.nc.Close()
	for i := range n {
		if got := c.do("PING"); got != "+PONG\r\n" {
			t.Fatalf("other client, PING %d: %q", i, got)
		}
	}
}

// TestLimitClientNeverReads: a client that pipelines GETs and never reads a
// reply is held at limits.max_pending_output while the proxy stops reading
// it; after a second without reading it is read on, as Redis would, until
// its replies pass limits.query_buffer; then it is closed, logged and
// counted. Other clients are served all along.
func TestLimitClientNeverReads(t *testing.T) {
	e, log := startEnvLog(t, func(c *config.Config) {
		c.Limits.QueryBuffer = 8 * config.MB
		c.Limits.MaxBulk = 4 * config.MB
		c.Limits.MaxPendingOutput = 1 * config.MB
	})
	bad := dialRaw(t, e.ProxyAddr())
	bad.do("SET", "big", strings.Repeat("b", 1000))
	go bad.nc.Write([]byte(strings.Repeat("*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n", 100000)))
	// Held: the memory it takes stops near max_pending_output (the
	// replies the socket took are not counted) while the proxy waits.
	waitFor(t, func() bool { return metricValue(t, e.Proxy, clientMemory) > float64(config.MB) })
	held := metricValue(t, e.Proxy, clientMemory)
	pingsAnswered(t, e.ProxyAddr(), 20)
	if e.Proxy.Clients() == 2 && held > float64(4*config.MB) {
		t.Errorf("a client over max_pending_output (1mb) holds %v bytes before the grace", held)
	}
	waitFor(t, func() bool { return e.Proxy.Clients() == 0 })
	if v := metricValue(t, e.Proxy, `hotkeyproxy_evicted_clients_total{reason="output_limit"}`); v != 1 {
		t.Errorf("evicted_clients_total{reason=output_limit} = %v, want 1", v)
	}
	if !strings.Contains(log.String(), "closing client that does not read its replies") {
		t.Errorf("no log line for the closed client:\n%s", log)
	}
	waitFor(t, func() bool { return metricValue(t, e.Proxy, clientMemory) == 0 })
	pingsAnswered(t, e.ProxyAddr(), 5)
}

// TestLimitSlowReader: a client that writes a long pipeline of GETs and
// reads their replies slowly gets them all, while the memory the proxy
// holds for it stays near limits.max_pending_output instead of growing
// with the replies it has not read (100 MB here).
func TestLimitSlowReader(t *testing.T) {
	e := startEnv(t, func(c *config.Config) { c.Limits.MaxPendingOutput = 1 * config.MB })
	const n, size = 1000, 100 << 10
	value := strings.Repeat("s", size)
	c := dialRaw(t, e.ProxyAddr())
	c.do("SET", "slow", value)
	go c.nc.Write([]byte(strings.Repeat("*2\r\n$3\r\nGET\r\n$4\r\nslow\r\n", n)))
	stop := make(chan struct{})
	most := make(chan float64)
	go func() {
		m := 0.0
		for {
			select {
			case <-stop:
				most <- m
				return
			case <-time.After(5 * time.Millisecond):
				m = max(m, metricValue(t, e.Proxy, clientMemory))
			}
		}
	}()
	reply := "$" + strconv.Itoa(size) + "\r\n" + value + "\r\n"
	buf := make([]byte, 64<<10)
	// The replies are checked as they come, not kept: 100 MB held and
	// compared here would be garbage collected work in the process the
	// proxy runs in, and could pause this reader past the proxy's grace.
	twice := reply + reply
	read, differ := 0, false
	var gap time.Duration // the longest this reader went without reading
	last := time.Now()
	c.nc.SetReadDeadline(time.Now().Add(60 * time.Second))
	for read < n*len(reply) {
		k, err := c.br.Read(buf)
		if err != nil {
			t.Fatalf("after %d bytes: %v", read, err)
		}
		o := read % len(reply)
		differ = differ || string(buf[:k]) != twice[o:o+k] // k < len(reply)
		read += k
		now := time.Now()
		gap, last = max(gap, now.Sub(last)), now
		time.Sleep(time.Millisecond) // about 64 KiB a millisecond at most
	}
	close(stop)
	if differ {
		t.Error("the replies differ from what Redis holds")
	}
	m := <-most
	if gap >= 900*time.Millisecond {
		// A client that reads nothing for a second is read on (proxy
		// doc): this one was held up itself, so no bound applies.
		t.Logf("the reader itself paused %v; the proxy held up to %v bytes", gap, m)
		return
	}
	// 1 MiB pending, a first batch of up to 128 replies (12.5 MiB), the
	// buffers kept.
	if m > 32<<20 {
		t.Errorf("the proxy held up to %v bytes for a slow reader (which paused at most %v), want about max_pending_output (1mb)", m, gap)
	}
}

// TestLimitHugePipeline: a pipeline far bigger than the socket buffers,
// written whole before any reply is read (redis-py's execute), is served
// as Redis serves it: 100 MB of SETs cost the proxy a few buffers, not the
// pipeline, and 64 MiB of GET replies are held until the client reads them.
// Another client is served meanwhile.
func TestLimitHugePipeline(t *testing.T) {
	e := startEnv(t, nil)
	value := strings.Repeat("h", 1000)
	run := func(req string, n int, reply string) float64 {
		t.Helper()
		c := dialRaw(t, e.ProxyAddr())
		written := make(chan error, 1)
		go func() {
			c.nc.SetWriteDeadline(time.Now().Add(120 * time.Second))
			_, err := io.WriteString(c.nc, req)
			written <- err
		}()
		pingsAnswered(t, e.ProxyAddr(), 10) // while the pipeline is being written
		most := 0.0
		for done := false; !done; {
			select {
			case err := <-written:
				if err != nil {
					t.Fatalf("writing the pipeline: %v", err)
				}
				done = true
			case <-time.After(5 * time.Millisecond):
				most = max(most, metricValue(t, e.Proxy, clientMemory))
			}
		}
		c.nc.SetReadDeadline(time.Now().Add(120 * time.Second))
		buf := make([]byte, len(reply))
		for i := range n {
			if _, err := io.ReadFull(c.br, buf); err != nil || string(buf) != reply {
				t.Fatalf("reply %d of %d: %.40q, %v", i+1, n, buf, err)
			}
		}
		return most
	}
	const sets = 100000
	var req strings.Builder
	for i := range sets {
		fmt.Fprintf(&req, "*3\r\n$3\r\nSET\r\n$%d\r\nk%d\r\n$1000\r\n%s\r\n", len(strconv.Itoa(i))+1, i, value)
	}
	if most := run(req.String(), sets, "+OK\r\n"); most > 16<<20 {
		t.Errorf("100 MB of SETs held up to %v bytes in the proxy", most)
	}
	const gets = 64
	big := strings.Repeat("g", 1<<20)
	dialRaw(t, e.ProxyAddr()).do("SET", "big", big)
	run(strings.Repeat("*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n", gets), gets, "$1048576\r\n"+big+"\r\n")
	waitFor(t, func() bool { return metricValue(t, e.Proxy, clientMemory) < 1<<20 })
}

// TestLimitMaxClientMemory: when the clients together hold more than
// limits.max_client_memory, the one holding the most is closed, logged and
// counted; the others carry on.
func TestLimitMaxClientMemory(t *testing.T) {
	e, log := startEnvLog(t, func(c *config.Config) {
		c.Limits.MaxClientMemory = 8 * config.MB
		c.Limits.MaxPendingOutput = 0 // no backpressure: the client piles up replies at once
	})
	others := []*rawConn{dialRaw(t, e.ProxyAddr()), dialRaw(t, e.ProxyAddr())}
	for _, o := range others {
		o.do("PING")
	}
	hog := dialRaw(t, e.ProxyAddr())
	hog.do("SET", "big", strings.Repeat("m", 100000))
	hog.send([]byte(strings.Repeat("*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n", 2000)))
	waitFor(t, func() bool { return e.Proxy.Clients() == 2 })
	if got, _ := io.ReadAll(hog.br); len(got) >= 2000*100000 {
		t.Errorf("the hog got all its replies: %d bytes", len(got))
	}
	if v := metricValue(t, e.Proxy, `hotkeyproxy_evicted_clients_total{reason="max_client_memory"}`); v != 1 {
		t.Errorf("evicted_clients_total{reason=max_client_memory} = %v, want 1", v)
	}
	want := "closing the client holding the most memory"
	if l := log.String(); !strings.Contains(l, want) || !strings.Contains(l, "client="+hog.nc.LocalAddr().String()) {
		t.Errorf("log lacks %q with the client's address:\n%s", want, l)
	}
	for _, o := range others {
		if got := o.do("PING"); got != "+PONG\r\n" {
			t.Errorf("another client after the eviction: %q", got)
		}
	}
}

// TestLimitMaxClientsPerIP: 2,000 connections from one address. With
// limits.max_clients_per_ip at 100, the first 100 are served and the rest
// get an error and are closed, while a client from another address and
// the first 100 are served; without it, all 2,000 are.
func TestLimitMaxClientsPerIP(t *testing.T) {
	const n, limit = 2000, 100
	dialFrom := func(t *testing.T, from, addr string) net.Conn {
		t.Helper()
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return nc
	}
	connectAll := func(t *testing.T, addr string) (served, refused int) {
		t.Helper()
		conns := make([]*rawConn, n)
		for i := range conns {
			nc := dialFrom(t, "127.0.0.1", addr)
			conns[i] = &rawConn{t: t, nc: nc, br: bufio.NewReader(nc)}
			conns[i].send([]byte("PING\r\n"))
		}
		for _, c := range conns {
			switch got := c.readReplies(1); got {
			case "+PONG\r\n":
				served++
			case "-ERR hotkeyproxy: max number of clients per IP address reached\r\n":
				refused++
				if rest := c.readUntilClose(); rest != "" {
					t.Errorf("a refused client got more: %q", rest)
				}
			default:
				t.Fatalf("PING: %q", got)
			}
		}
		return served, refused
	}
	t.Run("bounded", func(t *testing.T) {
		e := startEnv(t, func(c *config.Config) { c.Limits.MaxClientsPerIP = limit })
		served, refused := connectAll(t, e.ProxyAddr())
		if served != limit || refused != n-limit {
			t.Errorf("served %d, refused %d; want %d and %d", served, refused, limit, n-limit)
		}
		other := dialFrom(t, "127.0.0.2", e.ProxyAddr())
		oc := &rawConn{t: t, nc: other, br: bufio.NewReader(other)}
		if got := oc.do("PING"); got != "+PONG\r\n" {
			t.Errorf("a client from another address: %q", got)
		}
		if v := metricValue(t, e.Proxy, `hotkeyproxy_rejected_clients_total{reason="max_clients_per_ip"}`); v != n-limit {
			t.Errorf("rejected_clients_total{reason=max_clients_per_ip} = %v, want %d", v, n-limit)
		}
	})
	t.Run("unbounded", func(t *testing.T) {
		e := startEnv(t, nil) // max_clients 10000, no per-address limit
		if served, refused := connectAll(t, e.ProxyAddr()); served != n || refused != 0 {
			t.Errorf("served %d, refused %d; want all %d served", served, refused, n)
		}
	})
}

// TestAuthBruteForce: 1,000 wrong passwords in a row on one connection are
// each refused with Redis's text, each after limits.auth_failure_delay,
// and counted; HELLO … AUTH failures too; the right password still works
// and other clients are served meanwhile.
func TestAuthBruteForce(t *testing.T) {
	const tries, delay = 1000, 2 * time.Millisecond
	e := startEnv(t, func(c *config.Config) {
		c.Password = "right"
		c.Limits.AuthFailureDelay = config.Duration(delay)
	})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c := dialRaw(t, e.ProxyAddr())
		c.do("AUTH", "right")
		for range 50 {
			if got := c.do("PING"); got != "+PONG\r\n" {
				t.Errorf("another client during the attack: %q", got)
				return
			}
		}
	}()
	c := dialRaw(t, e.ProxyAddr())
	start := time.Now()
	for i := range tries {
		if got := c.do("AUTH", "guess"+strconv.Itoa(i)); got != "-WRONGPASS invalid username-password pair or user is disabled.\r\n" {
			t.Fatalf("AUTH %d: %q", i, got)
		}
	}
	if d := time.Since(start); d < tries*delay {
		t.Errorf("%d failed AUTHs took %v, less than %d × %v", tries, d, tries, delay)
	}
	if v := metricValue(t, e.Proxy, "hotkeyproxy_auth_failures_total"); v != tries {
		t.Errorf("auth_failures_total = %v, want %d", v, tries)
	}
	if got := c.do("HELLO", "2", "AUTH", "default", "guess"); !strings.HasPrefix(got, "-WRONGPASS") {
		t.Errorf("HELLO AUTH with a wrong password: %q", got)
	}
	if got := c.do("AUTH", "right"); got != "+OK\r\n" {
		t.Errorf("the right password after the attack: %q", got)
	}
	if v := metricValue(t, e.Proxy, "hotkeyproxy_auth_failures_total"); v != tries+1 {
		t.Errorf("auth_failures_total = %v after HELLO, want %d", v, tries+1)
	}
	wg.Wait()
}
