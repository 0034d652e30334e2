package proxy

import (
	"context"
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

	closing atomic.Bool
	nextID  atomic.Uint64

	m           *metrics
	ready       readiness      // Ready's last answer
	httpServers []*http.Server // ServeMetrics's; guarded by mu

	mu       sync.Mutex // guards ln, sessions, perIP and httpServers
	ln       net.Listener
	sessions map[*session]struct{}
	perIP    map[netip.Addr]int // sessions by the client's IP address
	wg       sync.WaitGroup     // one per running session

	clientMem clientMemory  // what the sessions hold, for limits.max_client_memory
	stopping  chan struct{} // closed when Shutdown begins: wakes sessions that wait
}

// New returns a server for cfg, which must have passed cfg.Validate. A
// standalone upstream is dialed on first use; a cluster's slot map is
// loaded before New returns when a seed answers, else in the background.
// Either way the proxy starts while Redis is still down and recovers when
// it is back.
func New(cfg *config.Config, log *slog.Logger) (*Server, error) {
	s := &Server{cfg: cfg, log: log, sessions: make(map[*session]struct{}), perIP: make(map[netip.Addr]int), stopping: make(chan struct{})}
	s.live.Store(cfg)
	s.m = newMetrics(prometheus.NewRegistry(), s.Clients, s.clientMem.total.Load)
	var err error
	s.up, err = upstream.New(&cfg.Upstream, log, upstream.Metrics{Node: s.m.node, Moved: s.m.moved, Ask: s.m.ask})
	if err != nil {
		return nil, err
	}
	s.hot = rewrite.New(s.up, cfg)
	if s.detect, err = newDetection(cfg.Hotkeys.Detect); err != nil {
		return nil, err
	}
	s.m.reg.MustRegister(newHotKeyCollector(s))
	return s, nil
}

// ListenAndServe listens on cfg.Listen and serves until Shutdown.
func (s *Server) ListenAndServe() error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return err
	}
	return s.Serve(ln)
}

// Serve accepts clients on ln until Shutdown, after which it returns nil.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.ln = ln
	s.mu.Unlock()
	stop := make(chan struct{})
	defer close(stop)
	if c := s.cfg; len(c.Hotkeys.Keys) > 0 || len(c.Scripts) > 0 || c.Hotkeys.Detect.Enabled {
		go s.followLayouts(stop)
	}
	go s.watchDetected(stop)

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
		s.accept(nc)
	}
}

func (s *Server) accept(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetKeepAlive(true)
	}
	ip := remoteIP(nc)
	limits := &s.config().Limits
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
		sess := newSession(s, nc, s.nextID.Add(1))
		s.sessions[sess] = struct{}{}
		s.perIP[ip]++
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer s.removeSession(sess, ip)
			sess.serve()
		}()
		return
	}
	s.mu.Unlock()
	if refusal != "" {
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
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
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
		close(s.stopping)
	}
	if s.ln != nil {
		s.ln.Close()
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
