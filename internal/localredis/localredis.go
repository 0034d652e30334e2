package localredis

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
)

const (
	// readyTimeout bounds how long Start and Restart wait for PING to answer.
	readyTimeout = 10 * time.Second
	// stopTimeout is how long Stop waits after SIGTERM before SIGKILL.
	stopTimeout = 5 * time.Second
	// maxStartAttempts is how many free ports Start tries when the port it
	// picked is taken before redis-server binds it.
	maxStartAttempts = 5
	// logName is the file in the server's dir that receives its log.
	logName = "redis.log"
	// logTailLines is how many log lines a start error quotes.
	logTailLines = 20
	// msgAddrInUse is what redis-server logs when it cannot bind its port.
	msgAddrInUse = "Address already in use"
)

// errAddrInUse marks a start that failed because the port was taken, which
// Start answers by trying another port.
var errAddrInUse = errors.New("localredis: port already in use")

// Options configures Start. The zero value starts a real redis-server from
// PATH on a free loopback port in a new temp dir, without a password.
type Options struct {
	// Dir is the redis-server working dir (--dir) and holds its log file
	// redis.log. If empty, Start makes a new dir with os.MkdirTemp and Stop
	// removes it; a dir given here is created if missing and never removed.
	// Ignored when Embedded.
	Dir string

	// Password, if not empty, is required from clients (--requirepass, or
	// miniredis RequireAuth when Embedded).
	Password string

	// Args are extra redis-server arguments appended after the defaults,
	// for example []string{"--databases", "4"}. Ignored when Embedded.
	Args []string

	// Embedded starts an in-process miniredis instead of redis-server.
	Embedded bool

	// Port is the TCP port on 127.0.0.1. If 0, Start picks a free port and
	// retries with another one if it is taken before the server binds it; a
	// non-zero port is tried once.
	Port int

	// Binary is the redis-server executable, a path or a name looked up in
	// PATH. It must be redis-server itself or exec it: Start checks the pid
	// that answers. If empty, "redis-server" is used. Ignored when Embedded.
	Binary string

	// Stdout, if not nil, also receives the server's stdout and stderr. The
	// log always goes to redis.log in Dir; if nil it goes nowhere else.
	// Ignored when Embedded.
	Stdout io.Writer

	// TLS, if not nil, makes the server also listen with TLS, on a second
	// free loopback port (TLSAddr), kept across Restart. The plain port
	// stays: Start's readiness check and the cluster's setup use it.
	// Embedded servers have no TLS: Start fails.
	TLS *TLSOptions
}

// TLSOptions are the TLS settings of a real redis-server.
type TLSOptions struct {
	// CertFile and KeyFile are the server's certificate and key
	// (--tls-cert-file, --tls-key-file). A cluster node also presents
	// them to its peers, so the certificate must allow client auth too.
	CertFile, KeyFile string
	// CAFile is the CA that signs peers' certificates (--tls-ca-cert-file):
	// clients', when AuthClients is set, and the other nodes' of a cluster.
	CAFile string
	// AuthClients makes clients present a certificate CAFile signed
	// (--tls-auth-clients yes, Redis's default); false lets any client in
	// (--tls-auth-clients no).
	AuthClients bool
}

// args are the redis-server arguments of o for the TLS port.
func (o *TLSOptions) args(port string) []string {
	auth := "no"
	if o.AuthClients {
		auth = "yes"
	}
	return []string{
		"--tls-port", port,
		"--tls-cert-file", o.CertFile,
		"--tls-key-file", o.KeyFile,
		"--tls-ca-cert-file", o.CAFile,
		"--tls-auth-clients", auth,
	}
}

// Server is a running local Redis server, real or embedded. Its methods are
// safe for concurrent use; Stop, Kill and Restart run one at a time.
type Server struct {
	opts    Options // as given to Start; never changed
	addr    string  // 127.0.0.1:port; fixed for the Server's life
	tlsAddr string  // 127.0.0.1:port of the TLS port; "" without TLS; fixed
	dir     string  // redis-server --dir; empty when embedded
	ownDir  bool    // dir was made by Start, so Stop removes it
	bin     string  // resolved redis-server path; empty when embedded

	mu   sync.Mutex           // guards proc and mini
	proc *process             // running redis-server; nil when stopped or embedded
	mini *miniredis.Miniredis // running miniredis; nil when stopped or real
}

// process is one run of a redis-server child.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait has returned and the log is closed
}

// Available reports whether a redis-server executable is on PATH.
func Available() bool {
	_, err := exec.LookPath("redis-server")
	return err == nil
}

// Start starts a server and waits up to 10 seconds until it answers PING.
// A real server runs as
//
//	redis-server --port P --bind 127.0.0.1 --save "" --appendonly no \
//	    --dir DIR --daemonize no --protected-mode no [--requirepass PW] \
//	    [--tls-port TP --tls-cert-file … --tls-key-file … \
//	    --tls-ca-cert-file … --tls-auth-clients yes|no] ARGS...
//
// Start returns an error if the binary is not found, the dir cannot be made,
// or the server does not answer in time; that error quotes the last lines of
// the server's log. Start never falls back to embedded mode on its own.
// The caller must call Stop.
func Start(opts Options) (*Server, error) {
	if opts.Port < 0 || opts.Port > 65535 {
		return nil, fmt.Errorf("localredis: invalid port %d", opts.Port)
	}
	if opts.Embedded {
		if opts.TLS != nil {
			return nil, errors.New("localredis: an embedded server has no TLS")
		}
		return startEmbedded(opts)
	}

	name := opts.Binary
	if name == "" {
		name = "redis-server"
	}
	bin, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("localredis: %w", err)
	}
	s := &Server{opts: opts, bin: bin, dir: opts.Dir}
	if s.dir == "" {
		if s.dir, err = os.MkdirTemp("", "localredis-"); err != nil {
			return nil, fmt.Errorf("localredis: %w", err)
		}
		s.ownDir = true
	}
	if s.dir, err = filepath.Abs(s.dir); err != nil {
		return nil, s.abort(fmt.Errorf("localredis: %w", err))
	}

	for attempt := 1; ; attempt++ {
		port := opts.Port
		if port == 0 {
			if port, err = freePort(); err != nil {
				return nil, s.abort(err)
			}
		}
		s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if opts.TLS != nil {
			tlsPort, err := freePort()
			if err != nil {
				return nil, s.abort(err)
			}
			s.tlsAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
		}
		err = s.launch()
		if err == nil {
			return s, nil
		}
		if opts.Port != 0 || attempt == maxStartAttempts || !errors.Is(err, errAddrInUse) {
			return nil, s.abort(err)
		}
	}
}

// abort removes a dir made by a failed Start and returns err.
func (s *Server) abort(err error) error {
	if s.ownDir {
		os.RemoveAll(s.dir)
	}
	return err
}

func startEmbedded(opts Options) (*Server, error) {
	s := &Server{opts: opts}
	if err := s.startMini(net.JoinHostPort("127.0.0.1", strconv.Itoa(opts.Port))); err != nil {
		return nil, err
	}
	s.addr = s.mini.Addr()
	return s, nil
}

// startMini starts a fresh miniredis on addr. The caller holds s.mu or owns s.
func (s *Server) startMini(addr string) error {
	m := miniredis.NewMiniRedis()
	if s.opts.Password != "" {
		m.RequireAuth(s.opts.Password)
	}
	if err := m.StartAddr(addr); err != nil {
		return fmt.Errorf("localredis: start embedded server on %s: %w", addr, err)
	}
	s.mini = m
	return nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("localredis: find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// launch runs redis-server on s.addr and waits until it answers. On failure
// the child is killed and reaped. The caller holds s.mu or owns s.
func (s *Server) launch() error {
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("localredis: %w", err)
	}
	logPath := filepath.Join(s.dir, logName)
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("localredis: %w", err)
	}
	// The log is kept across Restart; quote only what this run wrote.
	logStart, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		logFile.Close()
		return fmt.Errorf("localredis: %w", err)
	}

	_, port, _ := net.SplitHostPort(s.addr)
	args := []string{
		"--port", port,
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--protected-mode", "no",
	}
	if s.opts.Password != "" {
		args = append(args, "--requirepass", s.opts.Password)
	}
	if s.opts.TLS != nil {
		_, tlsPort, _ := net.SplitHostPort(s.tlsAddr)
		args = append(args, s.opts.TLS.args(tlsPort)...)
	}
	args = append(args, s.opts.Args...)

	cmd := exec.Command(s.bin, args...)
	var out io.Writer = logFile
	if s.opts.Stdout != nil {
		out = io.MultiWriter(logFile, s.opts.Stdout)
		// With a non-file writer, Wait also waits for the copy goroutine,
		// which a forked child (BGSAVE) could hold open after a kill.
		cmd.WaitDelay = time.Second
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("localredis: start %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		logFile.Close()
		close(p.done)
	}()

	if err := waitReady(s.addr, s.opts.Password, cmd.Process.Pid, p.done); err != nil {
		p.kill()
		tail := logTail(logPath, logStart, logTailLines)
		detail := fmt.Sprintf("\n--- last lines of %s ---\n%s", logPath, tail)
		if strings.Contains(tail, msgAddrInUse) {
			return fmt.Errorf("%w: redis-server on %s: %w%s", errAddrInUse, s.addr, err, detail)
		}
		return fmt.Errorf("localredis: redis-server on %s: %w%s", s.addr, err, detail)
	}
	s.proc = p
	return nil
}

// logTail returns the last n lines written to path at or after offset off.
func logTail(path string, off int64, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	if off > int64(len(b)) {
		off = 0
	}
	lines := strings.Split(strings.TrimRight(string(b[off:]), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// terminate sends SIGTERM, waits up to timeout for the exit, then sends
// SIGKILL. It returns once the process is reaped.
func (p *process) terminate(timeout time.Duration) error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("localredis: stop pid %d: %w", p.cmd.Process.Pid, err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return p.kill()
	}
}

// kill sends SIGKILL and returns once the process is reaped.
func (p *process) kill() error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("localredis: kill pid %d: %w", p.cmd.Process.Pid, err)
	}
	<-p.done
	return nil
}

// Addr returns the server's address as "127.0.0.1:port". It does not change
// across Kill, Stop and Restart.
func (s *Server) Addr() string {
	return s.addr
}

// TLSAddr returns the address of the server's TLS port, "127.0.0.1:port",
// or "" when Options.TLS was nil. It does not change across Kill, Stop
// and Restart.
func (s *Server) TLSAddr() string {
	return s.tlsAddr
}

// Embedded reports whether the server is an in-process miniredis.
func (s *Server) Embedded() bool {
	return s.opts.Embedded
}

// Pid returns the redis-server process id, or 0 when the server is embedded
// or not running.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// Stop shuts the server down: SIGTERM, then SIGKILL if the process has not
// exited within 5 seconds. It waits until the process is gone and removes the
// temp dir that Start made (a dir given in Options.Dir is kept). Stop is
// idempotent and returns an error only if signalling or removing the dir
// fails. Restart after Stop starts the server again on the same port.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.mini != nil {
		s.mini.Close()
		s.mini = nil
	}
	if s.proc != nil {
		errs = append(errs, s.proc.terminate(stopTimeout))
		s.proc = nil
	}
	if s.ownDir {
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("localredis: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Kill stops the server abruptly, for fault tests: SIGKILL for a real server,
// Close for an embedded one. It waits until the process is gone, keeps the
// dir so Restart can use it, and is a no-op on a server that is not running.
// It returns an error only if the signal cannot be sent.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mini != nil {
		s.mini.Close()
		s.mini = nil
	}
	if s.proc == nil {
		return nil
	}
	err := s.proc.kill()
	s.proc = nil
	return err
}

// Restart starts the server again on the same address, dir and options, and
// waits up to 10 seconds until it answers PING. A running server is stopped
// first as by Stop, but its dir is kept. The restarted server is empty, real
// or embedded. Restart returns an error if the port has been taken meanwhile
// or the server does not answer; the port is never changed.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.Embedded {
		if s.mini != nil {
			s.mini.Close()
			s.mini = nil
		}
		return s.startMini(s.addr)
	}
	if s.proc != nil {
		if err := s.proc.terminate(stopTimeout); err != nil {
			return err
		}
		s.proc = nil
	}
	return s.launch()
}
