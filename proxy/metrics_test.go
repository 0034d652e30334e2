package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tidwall/redcon"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// metricsEnv is a real Redis, a proxy in front of it serving clients and
// its metrics listener, and the proxy's log.
type metricsEnv struct {
	redis   *localredis.Server
	srv     *Server
	addr    string // clients
	metrics string // http://host:port
	log     *redistest.SyncBuffer
}

func startMetricsEnv(t *testing.T, edit func(*config.Config)) *metricsEnv {
	t.Helper()
	rs := redistest.Start(t, localredis.Options{})
	cfg := config.Default()
	cfg.Upstream.Addrs = []string{rs.Addr()}
	cfg.Listen = "127.0.0.1:0"
	cfg.Metrics.Listen = ""
	if edit != nil {
		edit(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := &redistest.SyncBuffer{}
	srv, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 2)
	go func() { served <- srv.Serve(ln) }()
	go func() { served <- srv.ServeMetrics(mln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		for range 2 {
			if err := <-served; err != nil {
				t.Errorf("serve: %v", err)
			}
		}
	})
	return &metricsEnv{redis: rs, srv: srv, addr: ln.Addr().String(),
		metrics: "http://" + mln.Addr().String(), log: logs}
}

// pipeline sends raw requests on a new connection and reads n replies.
func pipeline(t *testing.T, addr, req string, n int) []string {
	t.Helper()
	nc, br, err := dialClient(addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	return readReplies(t, br, n)
}

func readReplies(t *testing.T, br *bufio.Reader, n int) []string {
	t.Helper()
	replies := make([]string, n)
	for i := range replies {
		r, err := resp.ReadReply(br, nil)
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		replies[i] = string(r)
	}
	return replies
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

// TestMetricsLint checks every metric of a server that has served traffic
// with promlint, and the whole registry as scraped.
func TestMetricsLint(t *testing.T) {
	e := startMetricsEnv(t, nil)
	pipeline(t, e.addr, "SET a 1\r\nGET a\r\nINCR a\r\nNOSUCH\r\n", 4)
	m := e.srv.m
	for _, c := range []prometheus.Collector{m.commands, m.commandSeconds, m.rejectedClients,
		m.upstreamRequests, m.upstreamErrors, m.upstreamSeconds, m.moved, m.ask, m.reloadOK} {
		problems, err := testutil.CollectAndLint(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
	problems, err := testutil.GatherAndLint(m.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint (registry): %s: %s", p.Metric, p.Text)
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total",
		"hotkeyproxy_connected_clients", "hotkeyproxy_cluster_redirections_total",
		"hotkeyproxy_config_reloads_total"} {
		if n, err := testutil.GatherAndCount(m.reg, name); err != nil || n == 0 {
			t.Errorf("%s: %d series (%v), want some", name, n, err)
		}
	}
}

// TestCommandMetrics checks the command counters against replies the test
// knows: by name and result, in a pipeline mixing relayed, local and
// refused commands, unknown names, and a subscription.
func TestCommandMetrics(t *testing.T) {
	e := startMetricsEnv(t, nil)
	replies := pipeline(t, e.addr, strings.Join([]string{
		"SET a x", "GET a", "INCR a", // INCR: not an integer
		"SELECT", // the proxy's own arity error
		"GET a", "NOSUCHCOMMAND b", "SCRIPT DEBUG yes", "PING", "",
	}, "\r\n"), 8)
	if !strings.HasPrefix(replies[2], "-ERR value is not an integer") || !strings.HasPrefix(replies[3], "-ERR wrong number") {
		t.Fatalf("replies %q", replies)
	}
	m := e.srv.m
	want := map[[2]string]float64{
		{"set", "ok"}: 1, {"get", "ok"}: 2, {"get", "error"}: 0,
		{"incr", "error"}: 1, {"incr", "ok"}: 0, {"select", "error"}: 1,
		{"other", "error"}: 1, {"script", "error"}: 1, {"ping", "ok"}: 1,
	}
	for labels, n := range want {
		if got := testutil.ToFloat64(m.commands.WithLabelValues(labels[0], labels[1])); got != n {
			t.Errorf("commands_total%v = %v, want %v", labels, got, n)
		}
	}
	if n := testutil.CollectAndCount(m.commandSeconds); n != 7 {
		t.Errorf("%d command latency series, want 7 (set get incr select other script ping)", n)
	}

	// A subscriber: SUBSCRIBE's replies come from the stream, and so do
	// those of commands sent while subscribed.
	nc, br, err := dialClient(e.addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write([]byte("GET a\r\nSUBSCRIBE ch\r\n"))
	readReplies(t, br, 2)
	nc.Write([]byte("PING\r\nUNSUBSCRIBE\r\nGET nosuch\r\n"))
	readReplies(t, br, 3)
	nc.Write([]byte("GET a\r\n"))
	readReplies(t, br, 1)
	for labels, n := range map[[2]string]float64{
		{"subscribe", "ok"}: 1, {"unsubscribe", "ok"}: 1, {"ping", "ok"}: 2, {"get", "ok"}: 5,
	} {
		if got := testutil.ToFloat64(m.commands.WithLabelValues(labels[0], labels[1])); got != n {
			t.Errorf("after pub/sub: commands_total%v = %v, want %v", labels, got, n)
		}
	}

	// Upstream: every relayed request was counted on the node, and batches
	// were timed.
	node := e.redis.Addr()
	if got := testutil.ToFloat64(m.upstreamRequests.WithLabelValues(node)); got < 6 {
		t.Errorf("upstream_requests_total{node=%s} = %v, want >= 6", node, got)
	}
	if n := testutil.CollectAndCount(m.upstreamSeconds); n != 1 {
		t.Errorf("%d upstream latency series, want 1", n)
	}
	code, body := get(t, e.metrics+"/metrics")
	for _, line := range []string{
		`hotkeyproxy_commands_total{command="set",result="ok"} 1`,
		`hotkeyproxy_command_duration_seconds_count{command="set"} 1`,
		fmt.Sprintf(`hotkeyproxy_upstream_batch_duration_seconds_count{node=%q}`, node),
		"hotkeyproxy_connected_clients 1",
	} {
		if code != http.StatusOK || !strings.Contains(body, line) {
			t.Errorf("/metrics (HTTP %d) lacks %q", code, line)
		}
	}
}

// TestClientMetrics checks the connected clients gauge and the counter of
// clients refused at limits.max_clients.
func TestClientMetrics(t *testing.T) {
	e := startMetricsEnv(t, func(c *config.Config) { c.Limits.MaxClients = 2 })
	for range 3 {
		nc, br, err := dialClient(e.addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.Write([]byte("PING\r\n"))
		readReplies(t, br, 1)
	}
	m := e.srv.m
	if got := testutil.ToFloat64(m.rejectedClients); got != 1 {
		t.Errorf("rejected_clients_total = %v, want 1", got)
	}
	_, body := get(t, e.metrics+"/metrics")
	if !strings.Contains(body, "hotkeyproxy_connected_clients 2\n") {
		t.Errorf("want 2 connected clients in\n%s", body)
	}
}

// TestReadyz stops the upstream Redis and starts it again: /readyz follows,
// /healthz stays 200, the upstream errors are counted, and the node going
// down and up is logged once each.
func TestReadyz(t *testing.T) {
	e := startMetricsEnv(t, nil)
	if code, body := get(t, e.metrics+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	waitReady := func(want int) string {
		t.Helper()
		var code int
		var body string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if code, body = get(t, e.metrics+"/readyz"); code == want {
				return body
			}
		}
		t.Fatalf("/readyz: %d %q, want %d", code, body, want)
		return ""
	}
	if body := waitReady(http.StatusOK); body != "ready\n" {
		t.Errorf("/readyz body %q", body)
	}
	pipeline(t, e.addr, "SET k v\r\n", 1)
	if err := e.redis.Kill(); err != nil {
		t.Fatal(err)
	}
	body := waitReady(http.StatusServiceUnavailable)
	if !strings.HasPrefix(body, "not ready: ") || !strings.Contains(body, "connection refused") {
		t.Errorf("/readyz body %q, want the reason", body)
	}
	if code, _ := get(t, e.metrics+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d while the upstream is down, want 200", code)
	}
	r := pipeline(t, e.addr, "GET k\r\nGET k\r\n", 2)
	if !strings.HasPrefix(r[0], "-ERR upstream unavailable") {
		t.Errorf("GET with Redis down: %q", r[0])
	}
	if err := e.redis.Restart(); err != nil {
		t.Fatal(err)
	}
	waitReady(http.StatusOK)
	if got := testutil.ToFloat64(e.srv.m.upstreamErrors.WithLabelValues(e.redis.Addr())); got < 2 {
		t.Errorf("upstream_errors_total = %v, want >= 2 (the broken connection, a failed dial)", got)
	}
	if got := testutil.ToFloat64(e.srv.m.commands.WithLabelValues("get", "error")); got != 2 {
		t.Errorf(`commands_total{get,error} = %v, want 2`, got)
	}
	logs := e.log.String()
	if n := strings.Count(logs, "upstream node down"); n != 1 {
		t.Errorf("%d 'upstream node down' lines, want 1:\n%s", n, logs)
	}
	if n := strings.Count(logs, "upstream node up"); n != 1 {
		t.Errorf("%d 'upstream node up' lines, want 1:\n%s", n, logs)
	}
}

// TestReadyShuttingDown: once Shutdown began, the proxy is not ready, and
// ServeMetrics returns nil when it ends.
func TestReadyShuttingDown(t *testing.T) {
	cfg := config.Default()
	cfg.Upstream.Addrs = []string{"127.0.0.1:1"}
	srv, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeMetrics(ln) }()
	url := "http://" + ln.Addr().String()
	if code, body := get(t, url+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "127.0.0.1:1") {
		t.Errorf("/readyz with no upstream: %d %q", code, body)
	}
	srv.Shutdown(t.Context())
	if err := <-done; err != nil {
		t.Errorf("ServeMetrics after Shutdown: %v", err)
	}
	if err := srv.Ready(); err != ErrShuttingDown {
		t.Errorf("Ready after Shutdown: %v", err)
	}
	if err := srv.ServeMetrics(ln); err != nil {
		t.Errorf("ServeMetrics after Shutdown: %v", err)
	}
}

// TestClusterNotReady: in cluster mode the proxy is ready only once the
// slot map is loaded, and says why not. (The redirection counters are
// tested with the round trip, in package upstream.)
func TestClusterNotReady(t *testing.T) {
	cfg := config.Default()
	cfg.Upstream.Mode = config.ModeCluster
	cfg.Upstream.Addrs = []string{"127.0.0.1:1"}
	srv, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(t.Context())
	if err := srv.Ready(); err == nil || !strings.Contains(err.Error(), "cluster slot map: 127.0.0.1:1") {
		t.Errorf("Ready with no slot map: %v", err)
	}
}

// TestCommandLabels: every label names one command of the table, and
// every command and subcommand has its command's label.
func TestCommandLabels(t *testing.T) {
	seen := map[string]bool{}
	for _, l := range commandLabels {
		if seen[l] {
			t.Errorf("label %q twice", l)
		}
		seen[l] = true
	}
	for name, c := range commands {
		if commandLabels[c.metric] != name || c.name != name {
			t.Errorf("%q has label %q, name %q", name, commandLabels[c.metric], c.name)
		}
		for sub, sc := range c.subs {
			if sc.metric != c.metric || sc.name != name {
				t.Errorf("%s %s has label %q, name %q", name, sub, commandLabels[sc.metric], sc.name)
			}
		}
	}
	if commandLabels[otherCommand.metric] != "other" {
		t.Errorf("unknown commands are labelled %q", commandLabels[otherCommand.metric])
	}
}

// BenchmarkSessionMetrics is the metrics' cost per command in a pipeline
// of 16 GETs: queue on handle, count on write.
func BenchmarkSessionMetrics(b *testing.B) {
	m := newMetrics(prometheus.NewRegistry(), func() int { return 0 }, func() int64 { return 0 })
	var out []byte
	for range 16 {
		out = redcon.AppendBulk(out, []byte("value-of-some-key"))
	}
	var sm sessionMetrics
	get := commands["get"]
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		for range 16 {
			sm.add(m, get, false)
		}
		sm.replied(out)
		n += 16
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/command")
}
