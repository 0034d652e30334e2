package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/internal/tlstest"
)

// tlsProxy is a proxy with a plain and a TLS listener in front of an
// echoing backend.
type tlsProxy struct {
	srv        *Server
	cfg        *config.Config
	plain, tls string // listener addresses
}

func startTLSProxy(t *testing.T, cert *tlstest.Cert, edit func(*config.Config)) *tlsProxy {
	t.Helper()
	be := redistest.StartBackend(t, redistest.BackendOptions{})
	cfg := config.Default()
	cfg.Upstream.Addrs = []string{be.Addr()}
	cfg.Metrics.Listen = ""
	cfg.TLS.Listen = "127.0.0.1:0"
	cfg.TLS.CertFile, cfg.TLS.KeyFile = cert.CertFile, cert.KeyFile
	if edit != nil {
		edit(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	p := &tlsProxy{srv: srv, cfg: cfg}
	for _, l := range []struct {
		addr  *string
		serve func(net.Listener) error
	}{{&p.plain, srv.Serve}, {&p.tls, srv.ServeTLS}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		*l.addr = ln.Addr().String()
		go l.serve(ln)
	}
	t.Cleanup(func() { srv.Shutdown(t.Context()) })
	return p
}

// tlsClient connects over TLS and returns the connection after the
// handshake, every read and write bounded by 10 s.
func tlsClient(addr string, conf *tls.Config) (*tls.Conn, *bufio.Reader, error) {
	nc, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, conf)
	if err != nil {
		return nil, nil, err
	}
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	return nc, bufio.NewReader(nc), nil
}

// mustTLSClient is tlsClient that fails the test when the handshake
// does, and closes the connection when it ends.
func mustTLSClient(t *testing.T, addr string, conf *tls.Config) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	nc, br, err := tlsClient(addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc, br
}

// echo sends ECHO word and checks the reply.
func echo(t *testing.T, nc net.Conn, br *bufio.Reader, word string) {
	t.Helper()
	if _, err := nc.Write(resp.AppendCommand(nil, []byte("ECHO"), []byte(word))); err != nil {
		t.Fatalf("write: %v", err)
	}
	got, err := resp.ReadReply(br, nil)
	if want := "$" + strconv.Itoa(len(word)) + "\r\n" + word + "\r\n"; err != nil || string(got) != want {
		t.Fatalf("ECHO %s: %q, %v; want %q", word, got, err, want)
	}
}

// TestTLSListener: the TLS listener serves beside the plain one, with the
// certificate of the config; a reload serves a new certificate to new
// handshakes while a client connected before keeps its session; a reload
// whose certificate does not load changes nothing.
func TestTLSListener(t *testing.T) {
	ca := tlstest.NewCA(t, "proxy")
	cert := ca.Issue(t, "proxy", "127.0.0.1")
	p := startTLSProxy(t, cert, nil)
	roots := &tls.Config{RootCAs: ca.Pool()}

	nc, br := mustTLSClient(t, p.tls, roots)
	echo(t, nc, br, "over-tls")
	if got := nc.ConnectionState().PeerCertificates[0]; !got.Equal(cert.Leaf()) {
		t.Fatalf("served %v, want the configured certificate", got.Subject)
	}
	if nc.ConnectionState().Version < tls.VersionTLS12 {
		t.Errorf("TLS version %x", nc.ConnectionState().Version)
	}
	pc, pbr, err := dialClient(p.plain, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	echo(t, pc, pbr, "plain")

	// Rotate: same paths, new certificate, then the reload.
	rotated := ca.Issue(t, "proxy", "127.0.0.1")
	cfg := *p.cfg
	if restart, err := p.srv.Apply(&cfg); err != nil || len(restart) != 0 {
		t.Fatalf("Apply = %v, %v", restart, err)
	}
	nc2, br2 := mustTLSClient(t, p.tls, roots)
	if got := nc2.ConnectionState().PeerCertificates[0]; !got.Equal(rotated.Leaf()) {
		t.Errorf("after the reload a new client got %v, want the rotated certificate", got.SerialNumber)
	}
	echo(t, nc2, br2, "new")
	echo(t, nc, br, "still-here") // connected before the reload

	// A certificate that does not load: the reload is refused and the
	// rotated one stays.
	bad := cfg
	bad.TLS.KeyFile = ca.Issue(t, "other", "127.0.0.1").KeyFile
	if _, err := p.srv.Apply(&bad); err == nil || !strings.Contains(err.Error(), "tls.key_file") {
		t.Errorf("Apply of a mismatched key: %v, want an error naming tls.key_file", err)
	}
	nc3, _ := mustTLSClient(t, p.tls, roots)
	if got := nc3.ConnectionState().PeerCertificates[0]; !got.Equal(rotated.Leaf()) {
		t.Errorf("after a refused reload a new client got %v, want the rotated certificate still", got.SerialNumber)
	}

	// tls.listen itself needs a restart, and says so.
	moved := cfg
	moved.TLS.Listen = "127.0.0.1:1"
	if restart, err := p.srv.Apply(&moved); err != nil || strings.Join(restart, ",") != "tls.listen" {
		t.Errorf("Apply of a new tls.listen = %v, %v; want [tls.listen]", restart, err)
	}
	if got := p.srv.config().TLS.Listen; got != p.cfg.TLS.Listen {
		t.Errorf("running tls.listen = %q, want the one started with", got)
	}
}

// TestTLSHandshakeFailures: a client that sends nothing is closed at
// tls.handshake_timeout, one that speaks plain RESP to the TLS port at
// once; both are counted, neither leaves a session behind, and neither
// disturbs a client being served.
func TestTLSHandshakeFailures(t *testing.T) {
	ca := tlstest.NewCA(t, "proxy")
	p := startTLSProxy(t, ca.Issue(t, "proxy", "127.0.0.1"), func(c *config.Config) {
		c.TLS.HandshakeTimeout = config.Duration(100 * time.Millisecond)
	})
	good, gbr := mustTLSClient(t, p.tls, &tls.Config{RootCAs: ca.Pool()})

	silent, err := net.Dial("tcp", p.tls)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	silent.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("a silent client: read %d bytes, %v; want the proxy to close it", n, err)
	}

	plain, err := net.Dial("tcp", p.tls)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	plain.Write([]byte("*1\r\n$4\r\nPING\r\n"))
	plain.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, _ := io.ReadAll(plain); bytes.Contains(b, []byte("PONG")) {
		t.Errorf("plain RESP on the TLS port was answered: %q", b)
	}

	// A client that does not trust the proxy's CA gives up.
	if c, _, err := tlsClient(p.tls, &tls.Config{RootCAs: tlstest.NewCA(t, "stranger").Pool()}); err == nil {
		c.Close()
		t.Error("a client with another CA completed the handshake")
	}

	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(p.srv.m.tlsHandshakeFailures) < 3 || p.srv.Clients() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("handshake failures %v, clients %d; want 3 and 1", testutil.ToFloat64(p.srv.m.tlsHandshakeFailures), p.srv.Clients())
		}
		time.Sleep(5 * time.Millisecond)
	}
	echo(t, good, gbr, "unharmed")
}

// TestTLSMutual: with client_ca_file, a client without a certificate of
// that CA is refused; one with a certificate is served. min_version 1.3
// refuses a TLS 1.2 client.
func TestTLSMutual(t *testing.T) {
	ca := tlstest.NewCA(t, "proxy")
	clients := tlstest.NewCA(t, "clients")
	mine := clients.Issue(t, "client", "app.test")
	theirs := ca.Issue(t, "not-a-client-ca", "app.test")
	p := startTLSProxy(t, ca.Issue(t, "proxy", "127.0.0.1"), func(c *config.Config) {
		c.TLS.ClientCAFile = clients.CertFile
		c.TLS.MinVersion = config.TLS13
	})
	for _, tc := range []struct {
		name string
		conf *tls.Config
		ok   bool
	}{
		{"with a client certificate", &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{mine.TLS}}, true},
		{"without", &tls.Config{RootCAs: ca.Pool()}, false},
		{"signed by another CA", &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{theirs.TLS}}, false},
		{"TLS 1.2", &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{mine.TLS}, MaxVersion: tls.VersionTLS12}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, br, err := tlsClient(p.tls, tc.conf)
			if err != nil {
				if tc.ok {
					t.Fatal(err)
				}
				return
			}
			defer nc.Close()
			// In TLS 1.3 the server checks the client's certificate after
			// the client's handshake ends: the refusal comes on the first read.
			nc.Write(resp.AppendCommand(nil, []byte("ECHO"), []byte("x")))
			got, err := resp.ReadReply(br, nil)
			if tc.ok && (err != nil || string(got) != "$1\r\nx\r\n") {
				t.Errorf("ECHO x = %q, %v", got, err)
			}
			if !tc.ok && err == nil {
				t.Errorf("served %q without an acceptable client certificate", got)
			}
		})
	}
}

// TestTLSPipelineBeforeReading: a TLS client that writes a whole large
// pipeline before reading any reply is served, as a plain one is: the
// proxy's replies never wait on a client that is still writing.
func TestTLSPipelineBeforeReading(t *testing.T) {
	ca := tlstest.NewCA(t, "proxy")
	p := startTLSProxy(t, ca.Issue(t, "proxy", "127.0.0.1"), nil)
	nc, br := mustTLSClient(t, p.tls, &tls.Config{RootCAs: ca.Pool()})
	const n = 4000
	value := bytes.Repeat([]byte("v"), 2048) // 8 MB of replies, more than the sockets hold
	var req []byte
	for range n {
		req = resp.AppendCommand(req, []byte("ECHO"), value)
	}
	if _, err := nc.Write(req); err != nil {
		t.Fatalf("writing the pipeline before reading: %v", err)
	}
	want := "$2048\r\n" + string(value) + "\r\n"
	for i := range n {
		got, err := resp.ReadReply(br, nil)
		if err != nil || string(got) != want {
			t.Fatalf("reply %d: %.40q, %v", i, got, err)
		}
	}
}
