package upstream

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/tlstest"
)

// tlsUpstream is an upstream config with TLS on, trusting ca.
func tlsUpstream(ca *tlstest.CA, serverName string) *config.Upstream {
	cfg := config.Default().Upstream
	cfg.Password = "pw"
	cfg.TLS = config.UpstreamTLS{Enabled: true, CAFile: ca.CertFile, ServerName: serverName}
	return &cfg
}

// TestDialTLS: a TLS dial checks the node's certificate against the CA
// and the name, then authenticates over TLS; what fails says it was the
// TLS handshake, on one line.
func TestDialTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "redis")
	stranger := tlstest.NewCA(t, "stranger")
	byIP := ca.Issue(t, "by-ip", "127.0.0.1")
	byName := ca.Issue(t, "by-name", "redis.test")
	answer := answers(map[string][]string{"AUTH pw": {"+OK\r\n"}, "PING": {"+PONG\r\n"}})
	ipBackend := redistest.StartBackend(t, redistest.BackendOptions{Answer: answer, TLS: &tls.Config{Certificates: []tls.Certificate{byIP.TLS}}})
	nameBackend := redistest.StartBackend(t, redistest.BackendOptions{Answer: answer, TLS: &tls.Config{Certificates: []tls.Certificate{byName.TLS}}})

	for _, tc := range []struct {
		name       string
		ca         *tlstest.CA
		addr       string
		serverName string
		want       string // "" for success, else part of the error
	}{
		{"IP certificate, name from the address", ca, ipBackend.Addr(), "", ""},
		{"DNS certificate, server_name", ca, nameBackend.Addr(), "redis.test", ""},
		{"DNS certificate, name from the address", ca, nameBackend.Addr(), "", "cannot validate certificate for 127.0.0.1 because it doesn't contain any IP SANs"},
		{"wrong server_name", ca, ipBackend.Addr(), "other.test", "wanted to match other.test"},
		{"unknown CA", stranger, ipBackend.Addr(), "", "certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tlsUpstream(tc.ca, tc.serverName)
			cfg.Addrs = []string{tc.addr}
			r, err := New(cfg, slog.New(slog.DiscardHandler), Metrics{})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			err = r.Pool.Ping()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Ping over TLS: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Ping over TLS: %v, want an error with %q", err, tc.want)
			case tc.want != "":
				text := ErrorText(err)
				if !strings.HasPrefix(text, "ERR upstream unavailable: proxy: upstream "+tc.addr+": TLS handshake: ") || strings.ContainsAny(text, "\r\n") {
					t.Errorf("client sees %q", text)
				}
			}
		})
	}

	// A plain Redis behind a TLS upstream: the handshake fails within the
	// dial timeout rather than hang on a server that waits for a command.
	plain := redistest.StartBackend(t, redistest.BackendOptions{Answer: answer})
	cfg := tlsUpstream(ca, "")
	cfg.Addrs = []string{plain.Addr()}
	r, err := New(cfg, slog.New(slog.DiscardHandler), Metrics{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Pool.Ping(); err == nil || !strings.Contains(err.Error(), "TLS handshake") {
		t.Errorf("TLS to a plain server: %v", err)
	}
}

// TestDialTLSTimeout: a node that accepts and never answers the
// ClientHello fails the dial at the dial timeout.
func TestDialTLSTimeout(t *testing.T) {
	ca := tlstest.NewCA(t, "redis")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	cfg := tlsUpstream(ca, "")
	cfg.Addrs = []string{ln.Addr().String()}
	cfg.DialTimeout = config.Duration(200 * time.Millisecond)
	d := newDialer(cfg, mustClientConfig(t, cfg), ln.Addr().String())
	_, _, err = d.dial(Key{})
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !strings.Contains(err.Error(), "TLS handshake") {
		t.Errorf("dial to a silent node: %v, want a TLS handshake timeout", err)
	}
}

func mustClientConfig(t *testing.T, cfg *config.Upstream) *tls.Config {
	t.Helper()
	c, err := cfg.TLS.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestClusterTLSNames: each node's certificate is checked against the
// hostname CLUSTER SLOTS announces for it (Redis 7.0's fourth element),
// else the host of its address; server_name, when set, wins over both.
func TestClusterTLSNames(t *testing.T) {
	ca := tlstest.NewCA(t, "redis")
	// Two ranges: the first node announces a hostname, the second none
	// (an empty map, as Redis 7.0 sends then).
	slots := "*2\r\n" +
		"*3\r\n:0\r\n:8191\r\n*4\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n*2\r\n$8\r\nhostname\r\n$12\r\nnode-0.redis\r\n" +
		"*3\r\n:8192\r\n:16383\r\n*4\r\n$9\r\n127.0.0.2\r\n:7001\r\n$2\r\nid\r\n*0\r\n"
	for _, tc := range []struct {
		serverName   string
		first, other string
	}{
		{"", "node-0.redis", "127.0.0.2"},
		{"redis.internal", "redis.internal", "redis.internal"},
	} {
		cfg := tlsUpstream(ca, tc.serverName)
		c := testCluster(t)
		c.cfg, c.tls = cfg, mustClientConfig(t, cfg)
		if c.Node("127.0.0.1:7000").Pool.tls.serverName() != tc.serverName && tc.serverName != "" {
			t.Errorf("server_name %q not used before the slot map", tc.serverName)
		}
		if _, err := c.parseSlots([]byte(slots), "127.0.0.1"); err != nil {
			t.Fatal(err)
		}
		if got := c.Node("127.0.0.1:7000").Pool.tls.serverName(); got != tc.first {
			t.Errorf("server_name %q: node with a hostname is checked as %q, want %q", tc.serverName, got, tc.first)
		}
		if got := c.Node("127.0.0.2:7001").Pool.tls.serverName(); got != tc.other {
			t.Errorf("server_name %q: node without a hostname is checked as %q, want %q", tc.serverName, got, tc.other)
		}
		// The hostname goes: the name is the address's host again.
		if _, err := c.parseSlots([]byte(strings.Replace(slots, "*2\r\n$8\r\nhostname\r\n$12\r\nnode-0.redis\r\n", "*0\r\n", 1)), "127.0.0.1"); err != nil {
			t.Fatal(err)
		}
		want := "127.0.0.1"
		if tc.serverName != "" {
			want = tc.serverName
		}
		if got := c.Node("127.0.0.1:7000").Pool.tls.serverName(); got != want {
			t.Errorf("server_name %q: after the hostname went, checked as %q, want %q", tc.serverName, got, want)
		}
	}
}
