package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
)

// Server is the client-facing side of the proxy: it accepts connections,
// runs a session for each, and relays to the upstream Redis.
type Server struct {
	cfg      *config.Config                // as started: listen, upstream…
	live     atomic.Pointer[config.Config] // the running config: see config
	reloader func() error                  // PROXY CONFIG RELOAD; see SetReloader
	log      *slog.Logger
	up       *upstream.Redis // the Redis behind: a standalone server or a cluster
	hot      *rewrite.Engine // hot keys: the configured ones and those met
	detect   *detection      // finds hot keys in the traffic

	// tlsConf is what the TLS listener's handshakes use: tls.* of the
	// running config, loaded; nil without tls.listen. Apply swaps it, so
	// a reload changes new handshakes only. tlsBase hands it to each.
	tlsConf atomic.Pointer[tls.Config]
	tlsBase *tls.Config

	closing    atomic.Bool
	nextID     atomic.Uint64
	background sync.Once     // starts the goroutines every Serve shares
	stop       chan struct{} // closed by Shutdown: they end

	m           *metrics
	ready       readiness      // Ready's last answer
	httpServers []*http.Server // ServeMetrics's; guarded by mu

	mu       sync.Mutex   // guards ln, tlsLn, sessions, perIP and httpServers
	ln       net.Listener // Serve's
	tlsLn    net.Listener // ServeTLS's
	sessions map[*session]struct{}
	perIP    map[netip.Addr]int // sessions by the client's IP address
	wg       sync.WaitGroup     // one per running session

	clientMem clientMemory // what the sessions hold, for limits.max_client_memory
}

// New returns a server for cfg, which must have passed cfg.Validate. A
// standalone upstream is dialed on first use; a cluster's slot map is
// loaded before New returns when a seed answers, else in the background.
// Either way the proxy starts while Redis is still down and recovers when
// it is back.
func New(cfg *config.Config, log *slog.Logger) (*Server, error) {
	s := &Server{cfg: cfg, log: log, sessions: make(map[*session]struct{}), perIP: make(map[netip.Addr]int), stop: make(chan struct{})}
	s.live.Store(cfg)
	s.m = newMetrics(prometheus.NewRegistry(), s.Clients, s.clientMem.total.Load)
	var err error
	if cfg.TLS.Listen != "" {
		conf, err := cfg.TLS.ServerConfig()
		if err != nil {
			return nil, err
		}
		s.tlsConf.Store(conf)
		s.tlsBase = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.tlsConf.Load(), nil
		}}
	}
	s.up, err = upstream.New(&cfg.Upstream, log, upstream.Metrics{Node: s.m.node, Moved: s.m.moved, Ask: s.m.ask})
	if err != nil {
		return nil, err
	}
	s.hot = rewrite.New(s.up, cfg, log)
	if s.up.Cluster != nil {
		// A hot key's EVALSHA loads a script the proxy remembers where
		// it is missing, as the relay does for a plain key.
		s.hot.SetScriptMemory(s.up.Cluster.Scripts().Knows)
	}
	if s.detect, err = newDetection(cfg.Hotkeys.Detect); err != nil {
		return nil, err
	}
	s.m.reg.MustRegister(newHotKeyCollector(s), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hotkeyproxy_upstream_logins",
		Help: "ACL users whose upstream pools are open (upstream.client_auth: redis): those clients are logged in as, and those let go less than a minute ago; the clients that have not logged in count as one.",
	}, func() float64 { return float64(s.up.Logins.Len()) }))
	return s, nil
}

// ListenAndServe listens on cfg.Listen and, when set, cfg.TLS.Listen, and
// serves both until Shutdown. It returns the first listener's error.
func (s *Server) ListenAndServe() error {
	serves := []struct {
		addr  string
		serve func(net.Listener) error
	}{{s.cfg.Listen, s.Serve}, {s.cfg.TLS.Listen, s.ServeTLS}}
	errc := make(chan error, len(serves))
	n := 0
	for _, l := range serves {
		if l.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			s.Shutdown(context.Background())
			return err
		}
		n++
		go func() { errc <- l.serve(ln) }()
	}
	var first error
	for range n {
		if err := <-errc; err != nil && first == nil {
			first = err
			s.Shutdown(context.Background())
		}
	}
	return first
}

// Serve accepts clients on ln until Shutdown, after which it returns nil.
func (s *Server) Serve(ln net.Listener) error { return s.serve(ln, false) }

// ServeTLS is Serve for a TLS listener: each client first does a TLS
// handshake with the certificates of the running config (tls.cert_file,
// …, as last loaded by New or Apply), which must end within
// tls.handshake_timeout. A failed handshake closes the client and is
// counted, and logged at debug level. It needs tls.listen in the config
// the server was made with, though ln may listen elsewhere (tests use
// port 0).
func (s *Server) ServeTLS(ln net.Listener) error {
	if s.tlsBase == nil {
		ln.Close()
		return errors.New("proxy: ServeTLS without tls.listen in the config")
	}
	return s.serve(ln, true)
}

func (s *Server) serve(ln net.Listener, overTLS bool) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	if overTLS {
		s.tlsLn = ln
	} else {
		s.ln = ln
	}
	s.mu.Unlock()
	s.background.Do(func() {
		if c := s.cfg; len(c.Hotkeys.Keys) > 0 || len(c.Scripts) > 0 || c.Hotkeys.Detect.Enabled {
			go s.followLayouts(s.stop)
		}
		go s.watchDetected(s.stop)
		go s.finishMoves(s.stop)
	})

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// EMFILE and the like pass once clients leave: back off, as
			// net/http does, rather than spin or give up.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed; retrying", "err", err, "in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.accept(nc, overTLS)
	}
}

func (s *Server) accept(nc net.Conn, overTLS bool) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetKeepAlive(true)
	}
	ip := remoteIP(nc)
	cfg := s.config()
	limits := &cfg.Limits
	s.mu.Lock()
	var refusal string
	switch {
	case s.closing.Load():
	case len(s.sessions) >= limits.MaxClients:
		refusal = rediserr.MaxClients
		s.m.rejectedClients.Inc()
	case limits.MaxClientsPerIP > 0 && s.perIP[ip] >= limits.MaxClientsPerIP:
		refusal = msgMaxClientsPerIP
		s.m.rejectedPerIP.Inc()
	default:
		w := newClientWriter(nc, int(limits.QueryBuffer))
		if overTLS {
			// Set before the session is listed, so that Shutdown's deadline,
			// which wakes listed sessions, comes after it and wins.
			nc.SetDeadline(time.Now().Add(cfg.TLS.HandshakeTimeout.Duration()))
			nc = w.wrapTLS(s.tlsBase)
		}
		sess := newSession(s, nc, w, s.nextID.Add(1))
		s.sessions[sess] = struct{}{}
		s.perIP[ip]++
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer s.removeSession(sess, ip)
			if overTLS && !sess.handshake() {
				return
			}
			sess.serve()
		}()
		return
	}
	s.mu.Unlock()
	if refusal != "" && !overTLS { // a TLS client would read the words as a broken handshake
		nc.Write([]byte("-" + refusal + "\r\n"))
	}
	nc.Close()
}

// msgMaxClientsPerIP refuses a client past limits.max_clients_per_ip; Redis
// has no such limit, so no text of its own.
const msgMaxClientsPerIP = "ERR hotkeyproxy: max number of clients per IP address reached"

// remoteIP is the client's IP address, the key of limits.max_clients_per_ip;
// the zero Addr when nc is not an IP connection.
func remoteIP(nc net.Conn) netip.Addr {
	if ta, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

func (s *Server) removeSession(sess *session, ip netip.Addr) {
	s.mu.Lock()
	delete(s.sessions, sess)
	if s.perIP[ip]--; s.perIP[ip] <= 0 {
		delete(s.perIP, ip)
	}
	s.mu.Unlock()
}

// Addr is the address the server listens on, or nil before Serve.
func (s *Server) Addr() net.Addr { return s.addr(&s.ln) }

// TLSAddr is the address of the TLS listener, or nil before ServeTLS.
func (s *Server) TLSAddr() net.Addr { return s.addr(&s.tlsLn) }

func (s *Server) addr(ln *net.Listener) net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *ln == nil {
		return nil
	}
	return (*ln).Addr()
}

// Clients reports how many clients are connected.
func (s *Server) Clients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// Shutdown stops accepting, lets every session finish the pipeline it is
// running and write its replies, then closes. When ctx ends first, the
// remaining clients are disconnected and ctx's error is returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if !s.closing.Swap(true) {
		close(s.stop)
	}
	for _, ln := range []net.Listener{s.ln, s.tlsLn} {
		if ln != nil {
			ln.Close()
		}
	}
	for sess := range s.sessions {
		// Wakes sessions waiting for input; a session in the middle of a
		// pipeline finds closing set before its next read.
		sess.nc.SetReadDeadline(time.Unix(1, 0))
	}
	s.mu.Unlock()

	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		s.mu.Lock()
		for sess := range s.sessions {
			sess.abort()
		}
		s.mu.Unlock()
		s.up.Close()
		<-done
	}
	s.up.Close()
	s.closeMetrics()
	return err
}
