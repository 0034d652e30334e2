package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/tlstest"
	"github.com/hotkeyproxy/hotkeyproxy/proxy"
)

// startTLSProxy serves cfg, which has tls.listen, on free loopback ports:
// its TLS listener, and its plain one unless cfg.Listen is "". Both stop
// when the test ends. It returns the server and the TLS address.
func startTLSProxy(t *testing.T, cfg *config.Config) (*proxy.Server, string) {
	t.Helper()
	srv, err := proxy.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	listen := func(serve func(net.Listener) error) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { done <- serve(ln) }()
		return ln.Addr().String()
	}
	n := 1
	addr := listen(srv.ServeTLS)
	if cfg.Listen != "" {
		n++
		listen(srv.Serve)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		for range n {
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		}
	})
	for srv.TLSAddr() == nil || (cfg.Listen != "" && srv.Addr() == nil) {
		time.Sleep(time.Millisecond)
	}
	return srv, addr
}

// tlsClient is a go-redis client of addr over TLS with conf.
func tlsClient(t *testing.T, addr string, conf *tls.Config) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, MaxRetries: -1, TLSConfig: conf, DialTimeout: 5 * time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

// redisCLITLS runs redis-cli --tls against addr with args, skipping the
// test when redis-cli is not installed; it returns the output and whether
// redis-cli exited 0.
func redisCLITLS(t *testing.T, addr string, args ...string) (string, bool) {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skip("redis-cli not installed")
	}
	host, port, _ := net.SplitHostPort(addr)
	c := newClientCmd(t, "redis-cli", append([]string{"--tls", "-h", host, "-p", port}, args...)...)
	err := c.Run()
	return c.out.String(), err == nil
}

// sessionChecks runs what a client's session holds state for, through c,
// with other (another client of the same Redis) checking: a SET it sees,
// MULTI/EXEC, and a subscription that gets what other publishes. prefix
// names the keys and channel.
func sessionChecks(t *testing.T, c, other *redis.Client, prefix string) {
	t.Helper()
	ctx := context.Background()
	if err := c.Set(ctx, prefix+":k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if v, err := other.Get(ctx, prefix+":k").Result(); err != nil || v != "v" {
		t.Errorf("GET by another client = %q, %v", v, err)
	}
	cmds, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Incr(ctx, prefix+":n")
		p.Incr(ctx, prefix+":n")
		return nil
	})
	if err != nil || cmds[1].(*redis.IntCmd).Val() != 2 {
		t.Errorf("MULTI/EXEC: %v %v", cmds, err)
	}
	sub := c.Subscribe(ctx, prefix+":ch")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatalf("SUBSCRIBE: %v", err)
	}
	if err := other.Publish(ctx, prefix+":ch", "hello").Err(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if m, err := sub.ReceiveMessage(rctx); err != nil || m.Payload != "hello" {
		t.Errorf("message: %v, %v", m, err)
	}
}

// servedCert is the certificate a fresh TLS handshake with addr presents.
func servedCert(t *testing.T, addr string, conf *tls.Config) *x509.Certificate {
	t.Helper()
	nc, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, conf)
	if err != nil {
		t.Fatalf("TLS handshake with %s: %v", addr, err)
	}
	defer nc.Close()
	return nc.ConnectionState().PeerCertificates[0]
}

// TestTLSClients (security issue, item 1): clients reach the proxy over
// TLS, beside plain clients, with go-redis and redis-cli --tls; the
// stateful paths (MULTI, pub/sub) work over TLS too.
func TestTLSClients(t *testing.T) {
	ca := tlstest.NewCA(t, "proxy")
	cert := ca.Issue(t, "proxy", "127.0.0.1", "localhost")
	rs := redistest.Start(t, localredis.Options{})
	cfg := testConfig(t, config.ModeStandalone, []string{rs.Addr()}, func(c *config.Config) {
		c.TLS.Listen = "127.0.0.1:0"
		c.TLS.CertFile, c.TLS.KeyFile = cert.CertFile, cert.KeyFile
	})
	srv, addr := startTLSProxy(t, cfg)
	ctx := context.Background()
	c := tlsClient(t, addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"})
	plain := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), Protocol: 2, MaxRetries: -1})
	defer plain.Close()
	sessionChecks(t, c, plain, "tls") // a TLS client, checked by a plain one
	if _, err := tlsClient(t, addr, &tls.Config{RootCAs: tlstest.NewCA(t, "stranger").Pool()}).Ping(ctx).Result(); err == nil {
		t.Error("a client that does not trust the proxy's CA was served")
	}

	t.Run("redis-cli", func(t *testing.T) {
		out, ok := redisCLITLS(t, addr, "--cacert", ca.CertFile, "GET", "tls:k")
		if !ok || strings.TrimSpace(out) != "v" {
			t.Errorf("redis-cli --tls --cacert GET = %q (exit ok %v)", out, ok)
		}
		if out, ok := redisCLITLS(t, addr, "GET", "tls:k"); ok && strings.TrimSpace(out) == "v" {
			t.Errorf("redis-cli --tls without the CA was served: %q", out)
		}
	})
}

// TestTLSMutualClients: with tls.client_ca_file, a client without a
// certificate of that CA is refused, one with it served; the proxy's
// listener may be TLS only (listen: "").
func TestTLSMutualClients(t *testing.T) {
	ca := tlstest.NewCA(t, "proxy")
	clientCA := tlstest.NewCA(t, "clients")
	client := clientCA.Issue(t, "app", "app.test")
	rs := redistest.Start(t, localredis.Options{})
	cfg := testConfig(t, config.ModeStandalone, []string{rs.Addr()}, func(c *config.Config) {
		c.Listen = ""
		c.TLS.Listen = "127.0.0.1:0"
		cert := ca.Issue(t, "proxy", "127.0.0.1")
		c.TLS.CertFile, c.TLS.KeyFile, c.TLS.ClientCAFile = cert.CertFile, cert.KeyFile, clientCA.CertFile
	})
	srv, addr := startTLSProxy(t, cfg)
	if srv.Addr() != nil {
		t.Errorf("listen \"\" serves a plain listener at %v", srv.Addr())
	}
	ctx := context.Background()
	with := tlsClient(t, addr, &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client.TLS}})
	if err := with.Set(ctx, "mtls:k", "1", 0).Err(); err != nil {
		t.Errorf("SET with a client certificate: %v", err)
	}
	if err := tlsClient(t, addr, &tls.Config{RootCAs: ca.Pool()}).Set(ctx, "mtls:k", "2", 0).Err(); err == nil {
		t.Error("SET without a client certificate succeeded")
	}
	if v, _ := with.Get(ctx, "mtls:k").Result(); v != "1" {
		t.Errorf("mtls:k = %q: the refused client's SET ran", v)
	}

	t.Run("redis-cli", func(t *testing.T) {
		if out, ok := redisCLITLS(t, addr, "--cacert", ca.CertFile, "--cert", client.CertFile, "--key", client.KeyFile, "GET", "mtls:k"); !ok || strings.TrimSpace(out) != "1" {
			t.Errorf("redis-cli with a client certificate: %q (exit ok %v)", out, ok)
		}
		if out, ok := redisCLITLS(t, addr, "--cacert", ca.CertFile, "GET", "mtls:k"); ok && strings.TrimSpace(out) == "1" {
			t.Errorf("redis-cli without a client certificate was served: %q", out)
		}
	})
}

// TestTLSReload: the proxy binary, TLS only, serves a certificate; the
// files are replaced by a new certificate and PROXY CONFIG RELOAD makes
// new handshakes see it while a client connected before keeps its
// connection; a reload with a broken certificate is refused and the
// certificate in use stays.
func TestTLSReload(t *testing.T) {
	bin := hkBuild(t)
	ca := tlstest.NewCA(t, "proxy")
	first := ca.Issue(t, "proxy", "127.0.0.1")
	rs := redistest.Start(t, localredis.Options{})
	listen := hkFreeAddr(t)
	cfgPath := filepath.Join(t.TempDir(), "proxy.yaml")
	b, err := yaml.Marshal(map[string]any{
		"listen":   "",
		"tls":      map[string]any{"listen": listen, "cert_file": first.CertFile, "key_file": first.KeyFile},
		"upstream": map[string]any{"addrs": []string{rs.Addr()}},
		"metrics":  map[string]any{"listen": ""},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	p := &hkProc{cmd: exec.Command(bin, "--config", cfgPath), out: &redistest.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.kill)

	ctx := context.Background()
	roots := &tls.Config{RootCAs: ca.Pool()}
	kept := tlsClient(t, listen, roots)
	deadline := time.Now().Add(10 * time.Second)
	for kept.Ping(ctx).Err() != nil {
		select {
		case <-p.done:
			t.Fatalf("proxy exited: %v\n%s", p.err, p.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy does not answer PING over TLS on %s after 10s\n%s", listen, p.out)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// One connection, kept for the whole test: its CLIENT ID upstream of
	// the proxy would change if it were redialed, so compare the proxy's.
	conn := kept.Conn()
	defer conn.Close()
	id, err := conn.ClientID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if got := servedCert(t, listen, roots); !got.Equal(first.Leaf()) {
		t.Fatalf("served serial %v, want the configured certificate", got.SerialNumber)
	}

	second := ca.Issue(t, "proxy", "127.0.0.1") // the same files, a new certificate
	if r, err := conn.Do(ctx, "PROXY", "CONFIG", "RELOAD").Text(); err != nil || r != "OK" {
		t.Fatalf("PROXY CONFIG RELOAD = %q, %v\n%s", r, err, p.out)
	}
	if got := servedCert(t, listen, roots); !got.Equal(second.Leaf()) {
		t.Errorf("after the reload a new handshake got serial %v, want the new certificate's %v", got.SerialNumber, second.Leaf().SerialNumber)
	}
	if again, err := conn.ClientID(ctx).Result(); err != nil || again != id {
		t.Errorf("the client connected before the reload: CLIENT ID %d, %v; want %d on the same connection", again, err, id)
	}

	// A broken certificate: refused, logged, the new one still served.
	if err := os.WriteFile(second.CertFile, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := conn.Do(ctx, "PROXY", "CONFIG", "RELOAD").Text()
	if err == nil || !strings.Contains(err.Error(), "config not reloaded") || !strings.Contains(err.Error(), "tls.cert_file") {
		t.Errorf("PROXY CONFIG RELOAD of a broken certificate = %q, %v; want the refusal naming tls.cert_file", r, err)
	}
	if got := servedCert(t, listen, roots); !got.Equal(second.Leaf()) {
		t.Errorf("after a refused reload a new handshake got serial %v, want the one in use, %v", got.SerialNumber, second.Leaf().SerialNumber)
	}
	if again, err := conn.ClientID(ctx).Result(); err != nil || again != id {
		t.Errorf("after the refused reload: CLIENT ID %d, %v; want %d", again, err, id)
	}
	if !strings.Contains(p.out.String(), "config reload refused") {
		t.Errorf("the refused reload is not logged:\n%s", p.out)
	}
}

// tlsRedis is the TLS material of Redis servers and of the proxy as their
// client: one CA signs the servers' certificate and the proxy's.
type tlsRedis struct {
	ca     *tlstest.CA
	server *tlstest.Cert
	proxy  *tlstest.Cert
}

func newTLSRedis(t *testing.T, names ...string) *tlsRedis {
	ca := tlstest.NewCA(t, "redis")
	return &tlsRedis{ca: ca, server: ca.Issue(t, "redis", names...), proxy: ca.Issue(t, "hotkeyproxy", "hotkeyproxy")}
}

// options are the servers' TLS options: clients must present a
// certificate, Redis's default.
func (r *tlsRedis) options() *localredis.TLSOptions {
	return &localredis.TLSOptions{CertFile: r.server.CertFile, KeyFile: r.server.KeyFile, CAFile: r.ca.CertFile, AuthClients: true}
}

// upstream is upstream.tls for the proxy, with its client certificate.
func (r *tlsRedis) upstream() config.UpstreamTLS {
	return config.UpstreamTLS{Enabled: true, CAFile: r.ca.CertFile, CertFile: r.proxy.CertFile, KeyFile: r.proxy.KeyFile}
}

// TestTLSUpstreamStandalone (security issue, item 2): the proxy reaches a
// Redis that serves only TLS to it (tls-auth-clients yes) with its client
// certificate, for shared and own connections, SELECT, pub/sub and hot
// keys; without the certificate, or trusting another CA, clients get a
// clear error.
func TestTLSUpstreamStandalone(t *testing.T) {
	r := newTLSRedis(t, "127.0.0.1")
	rs := redistest.Start(t, localredis.Options{TLS: r.options()})
	e := &env{Redis: rs}
	e.Cfg = testConfig(t, config.ModeStandalone, []string{rs.TLSAddr()}, func(c *config.Config) {
		c.Upstream.TLS = r.upstream()
		c.Hotkeys.Keys = []config.KeyRule{{Match: "stock:tls", Buckets: 4, Route: config.RouteRandom}}
	})
	e.Proxy = startProxy(t, e.Cfg)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: e.ProxyAddr(), Protocol: 2, MaxRetries: -1})
	defer c.Close()
	direct := redis.NewClient(&redis.Options{Addr: rs.Addr(), Protocol: 2}) // the plain port, to check
	defer direct.Close()

	sessionChecks(t, c, direct, "up") // shared and own TLS connections upstream
	conn := c.Conn()
	defer conn.Close()
	if err := conn.Select(ctx, 2).Err(); err != nil {
		t.Fatal(err)
	}
	if err := conn.Set(ctx, "up:db2", "x", 0).Err(); err != nil {
		t.Errorf("SET in db 2 over TLS: %v", err)
	}
	if v, _ := direct.Do(ctx, "EVAL", "redis.call('select', 2) return redis.call('get', KEYS[1])", 1, "up:db2").Text(); v != "x" {
		t.Errorf("db 2 holds up:db2 = %q", v)
	}
	// A hot key: its buckets and scripts go over TLS too.
	if err := c.Set(ctx, "stock:tls", 100, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.DecrBy(ctx, "stock:tls", 30).Result(); err != nil || n != 70 {
		t.Errorf("DECRBY on a hot key over TLS = %d, %v", n, err)
	}
	if v, _ := c.Get(ctx, "stock:tls").Result(); v != "70" {
		t.Errorf("GET of the hot key = %q, want 70", v)
	}

	for _, tc := range []struct {
		name string
		tls  config.UpstreamTLS
		want string
	}{
		{"no client certificate", config.UpstreamTLS{Enabled: true, CAFile: r.ca.CertFile}, "ERR upstream unavailable: "},
		{"another CA", config.UpstreamTLS{Enabled: true, CAFile: tlstest.NewCA(t, "stranger").CertFile, CertFile: r.proxy.CertFile, KeyFile: r.proxy.KeyFile},
			"TLS handshake: tls: failed to verify certificate: x509: certificate signed by unknown authority"},
		{"plain port", r.upstream(), "TLS handshake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := rs.TLSAddr()
			if tc.name == "plain port" {
				addr = rs.Addr()
			}
			cfg := testConfig(t, config.ModeStandalone, []string{addr}, func(c *config.Config) {
				c.Upstream.TLS = tc.tls
				c.Upstream.DialTimeout = config.Duration(300 * time.Millisecond) // the plain port never answers the ClientHello
			})
			p := startProxy(t, cfg)
			got := proxyDo(t, p.Addr().String(), "GET", "up:k")
			if s, _ := got.(string); !strings.Contains(s, tc.want) || s == "v" {
				t.Errorf("GET = %v, want an error with %q", got, tc.want)
			}
		})
	}
}

// TestTLSUpstreamCluster (security issue, item 2): the proxy reaches a
// TLS cluster (tls-cluster, tls-replication) over the TLS ports that
// CLUSTER SLOTS gives a TLS client. The nodes' certificate names only
// "localhost", which they announce as their hostname while CLUSTER SLOTS
// gives their IP: every node past the seed is reachable only if the
// proxy checks it against the announced hostname. Clients come over TLS
// too.
func TestTLSUpstreamCluster(t *testing.T) {
	r := newTLSRedis(t, "localhost")
	cl := redistest.StartCluster(t, localredis.ClusterOptions{Masters: 3, Replicas: 1, TLS: r.options(),
		Args: []string{"--cluster-announce-hostname", "localhost"}})
	seeds := cl.TLSSeeds()
	_, port, _ := net.SplitHostPort(seeds[0])
	clientCA := tlstest.NewCA(t, "proxy")
	front := clientCA.Issue(t, "proxy", "127.0.0.1")
	cfg := testConfig(t, config.ModeCluster, []string{net.JoinHostPort("localhost", port)}, func(c *config.Config) {
		c.Upstream.TLS = r.upstream()
		c.TLS.Listen = "127.0.0.1:0"
		c.TLS.CertFile, c.TLS.KeyFile = front.CertFile, front.KeyFile
		c.Hotkeys.Keys = []config.KeyRule{{Match: "stock:tls", Buckets: 6, Route: config.RouteRandom}}
	})
	_, addr := startTLSProxy(t, cfg)
	ctx := context.Background()
	c := tlsClient(t, addr, &tls.Config{RootCAs: clientCA.Pool()})

	// Keys on every master, then MGET across them.
	var keys []string
	vals := map[string]string{}
	for i := range 30 {
		k := fmt.Sprintf("tls:{%d}", i)
		keys = append(keys, k)
		vals[k] = fmt.Sprint(i)
		if err := c.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s through a TLS cluster: %v", k, err)
		}
	}
	got, err := c.MGet(ctx, keys...).Result()
	if err != nil {
		t.Fatalf("MGET across the masters: %v", err)
	}
	for i, k := range keys {
		if got[i] != vals[k] {
			t.Errorf("MGET %s = %v, want %s", k, got[i], vals[k])
		}
	}
	// Each master holds its share, as seen on its plain port.
	masters, err := cl.Masters()
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, m := range masters {
		d := redis.NewClient(&redis.Options{Addr: m.Addr(), Protocol: 2})
		n, err := d.DBSize(ctx).Result()
		d.Close()
		if err != nil || n == 0 {
			t.Errorf("master %s holds %d keys (%v); want some of ours", m.Addr(), n, err)
		}
		held += int(n)
	}
	if held != len(keys) {
		t.Errorf("the masters hold %d keys, want %d", held, len(keys))
	}
	// A hot key spreads its buckets over the masters, over TLS.
	if err := c.Set(ctx, "stock:tls", 600, 0).Err(); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if err := c.Decr(ctx, "stock:tls").Err(); err != nil {
			t.Fatalf("DECR on a hot key over a TLS cluster: %v", err)
		}
	}
	if v, _ := c.Get(ctx, "stock:tls").Result(); v != "590" {
		t.Errorf("GET stock:tls = %q, want 590", v)
	}

	t.Run("redis-cli", func(t *testing.T) {
		if out, ok := redisCLITLS(t, addr, "--cacert", clientCA.CertFile, "GET", "tls:{7}"); !ok || strings.TrimSpace(out) != "7" {
			t.Errorf("redis-cli --tls through the proxy to a TLS cluster: %q (exit ok %v)", out, ok)
		}
	})
}
