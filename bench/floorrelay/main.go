// Command floorrelay is the least a relay written in Go does per request:
// one goroutine waits on a level-triggered epoll of its own over every
// client and one connection to Redis; it reads each socket epoll reports
// ready once, writes all clients' requests upstream in one write per
// wakeup and each client's replies back in one write, and matches replies
// to clients in FIFO order. It parses nothing but RESP
// framing and holds no session state (no db, no transaction, no protocol
// version): it is no proxy, only the floor that bench/passthrough.sh sets
// beside hotkeyproxy, twemproxy and predixy, the CPU a relay in Go spends
// on the same machine, Redis, clients and system calls with none of a
// proxy's work.
//
//	floorrelay -listen 127.0.0.1:7000 -upstream 127.0.0.1:6379
//
// Both addresses are IPv4. Clients must send RESP2 commands, multibulk or
// inline, and no blank line (which Redis skips unanswered); nothing that
// makes Redis send what was not asked for (SUBSCRIBE, MONITOR, HELLO 3
// with CLIENT TRACKING). A write the socket does not take whole is retried
// at once, so one client that stops reading its replies stalls every
// other: redis-benchmark reads them, and this is a benchmark's relay.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"syscall"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7000", "host:port to listen on (IPv4)")
	up := flag.String("upstream", "127.0.0.1:6379", "host:port of Redis (IPv4)")
	flag.Parse()
	r, err := newRelay(*listen, *up)
	if err != nil {
		fmt.Fprintln(os.Stderr, "floorrelay:", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "floorrelay: listening on", *listen)
	if err := r.run(); err != nil {
		fmt.Fprintln(os.Stderr, "floorrelay:", err)
		os.Exit(1)
	}
}

// client is one client connection: input not yet a whole command, and
// replies not yet written.
type client struct {
	fd      int
	in, out []byte // out is not empty while the client is in relay.ready
}

type relay struct {
	ep, lfd, ufd int
	clients      []*client // by fd
	// waiting holds the client of each request in flight, in order, from
	// head on; nil for a client gone since.
	waiting     []*client
	head        int
	upIn, upOut []byte
	ready       []*client // clients with replies to write
	buf         []byte
	events      []syscall.EpollEvent
	err         error // why run ends
}

func newRelay(listen, upstream string) (*relay, error) {
	la, err := netip.ParseAddrPort(listen)
	if err != nil || !la.Addr().Is4() {
		return nil, fmt.Errorf("-listen %q: want an IPv4 host:port", listen)
	}
	ua, err := netip.ParseAddrPort(upstream)
	if err != nil || !ua.Addr().Is4() {
		return nil, fmt.Errorf("-upstream %q: want an IPv4 host:port", upstream)
	}
	r := &relay{buf: make([]byte, 64<<10), events: make([]syscall.EpollEvent, 256)}
	if r.lfd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0); err != nil {
		return nil, err
	}
	syscall.SetsockoptInt(r.lfd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	if err = syscall.Bind(r.lfd, &syscall.SockaddrInet4{Port: int(la.Port()), Addr: la.Addr().As4()}); err != nil {
		return nil, err
	}
	if err = syscall.Listen(r.lfd, 1024); err != nil {
		return nil, err
	}
	if r.ufd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0); err != nil {
		return nil, err
	}
	if err = syscall.Connect(r.ufd, &syscall.SockaddrInet4{Port: int(ua.Port()), Addr: ua.Addr().As4()}); err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", upstream, err)
	}
	syscall.SetsockoptInt(r.ufd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	syscall.SetNonblock(r.ufd, true)
	if r.ep, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return nil, err
	}
	for _, fd := range []int{r.lfd, r.ufd} {
		if err = r.watch(fd); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (r *relay) watch(fd int) error {
	return syscall.EpollCtl(r.ep, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)})
}

// run serves until Redis closes its connection. It waits in a blocking
// epoll_wait, which holds the goroutine's P meanwhile (sysmon hands the P
// to another thread when the wait is long); waiting in Go's poller on the
// epoll's own descriptor instead cost more per request side by side:
// 10.65–10.9 µs against 9.8–10.1 with a core of its own, 7.7–8.8
// against 6.9–8.5 on shared cores (depth 1, 3 rounds each).
func (r *relay) run() error {
	for r.err == nil {
		n, err := syscall.EpollWait(r.ep, r.events, -1)
		switch {
		case err == syscall.EINTR:
		case err != nil:
			return err
		default:
			r.handle(r.events[:n])
		}
	}
	return r.err
}

// handle serves the sockets epoll reported ready: reads each once, then
// writes what they brought, upstream and to the clients.
func (r *relay) handle(events []syscall.EpollEvent) {
	for _, ev := range events {
		switch fd := int(ev.Fd); fd {
		case r.lfd:
			r.accept()
		case r.ufd:
			if err := r.readUpstream(); err != nil {
				r.err = err
				return
			}
		default:
			r.readClient(r.clients[fd])
		}
	}
	if len(r.upOut) > 0 {
		if err := writeAll(r.ufd, r.upOut); err != nil {
			r.err = fmt.Errorf("writing to Redis: %w", err)
			return
		}
		r.upOut = r.upOut[:0]
	}
	for _, c := range r.ready {
		if c.fd >= 0 && writeAll(c.fd, c.out) != nil {
			r.drop(c)
		}
		c.out = c.out[:0]
	}
	clear(r.ready)
	r.ready = r.ready[:0]
}

func (r *relay) accept() {
	for {
		fd, _, err := syscall.Accept4(r.lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN; or EMFILE, tried again on the next wakeup
		}
		syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		if r.watch(fd) != nil {
			syscall.Close(fd)
			continue
		}
		for len(r.clients) <= fd {
			r.clients = append(r.clients, nil)
		}
		r.clients[fd] = &client{fd: fd}
	}
}

// readClient moves the whole commands c sent to the upstream write.
func (r *relay) readClient(c *client) {
	if c == nil {
		return
	}
	n, err := syscall.Read(c.fd, r.buf)
	if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
		return
	}
	if n <= 0 {
		r.drop(c)
		return
	}
	in := r.buf[:n]
	if len(c.in) > 0 {
		c.in = append(c.in, in...)
		in = c.in
	}
	off := 0
	for {
		m := frameLen(in[off:])
		if m == 0 {
			break
		}
		off += m
		r.waiting = append(r.waiting, c)
	}
	r.upOut = append(r.upOut, in[:off]...)
	c.in = append(c.in[:0], in[off:]...)
}

// readUpstream hands each whole reply to the client of the oldest request.
func (r *relay) readUpstream() error {
	n, err := syscall.Read(r.ufd, r.buf)
	if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
		return nil
	}
	if n == 0 {
		return errors.New("Redis closed the connection")
	}
	if n < 0 {
		return fmt.Errorf("reading from Redis: %w", err)
	}
	in := r.buf[:n]
	if len(r.upIn) > 0 {
		r.upIn = append(r.upIn, in...)
		in = r.upIn
	}
	off := 0
	for r.head < len(r.waiting) {
		m := frameLen(in[off:])
		if m == 0 {
			break
		}
		if c := r.waiting[r.head]; c != nil {
			if len(c.out) == 0 {
				r.ready = append(r.ready, c)
			}
			c.out = append(c.out, in[off:off+m]...)
		}
		r.waiting[r.head] = nil
		r.head++
		off += m
	}
	r.upIn = append(r.upIn[:0], in[off:]...)
	if r.head > len(r.waiting)/2 { // keep what is in flight at the front
		r.waiting = r.waiting[:copy(r.waiting, r.waiting[r.head:])]
		r.head = 0
	}
	return nil
}

// drop closes c; the replies to its requests in flight go nowhere.
func (r *relay) drop(c *client) {
	syscall.EpollCtl(r.ep, syscall.EPOLL_CTL_DEL, c.fd, nil)
	syscall.Close(c.fd)
	r.clients[c.fd] = nil
	c.fd = -1 // a client accepted since may have the number
	for i := r.head; i < len(r.waiting); i++ {
		if r.waiting[i] == c {
			r.waiting[i] = nil
		}
	}
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := syscall.Write(fd, b)
		if n > 0 {
			b = b[n:]
		}
		if err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
	return nil
}

// frameLen is the length of the whole RESP2 frame at the start of b, or 0
// while it is incomplete. An inline command is a frame to its line's end.
func frameLen(b []byte) int {
	eol := bytes.Index(b, []byte("\r\n"))
	if eol < 1 {
		return 0
	}
	switch b[0] {
	case '$':
		n := atoi(b[1:eol])
		if n < 0 {
			return eol + 2
		}
		if len(b) < eol+2+n+2 {
			return 0
		}
		return eol + 2 + n + 2
	case '*':
		n := atoi(b[1:eol])
		off := eol + 2
		for range max(n, 0) {
			m := frameLen(b[off:])
			if m == 0 {
				return 0
			}
			off += m
		}
		return off
	default: // + - : and inline commands
		return eol + 2
	}
}

// atoi reads a frame's length; -1 for a negative one (a nil).
func atoi(b []byte) int {
	if len(b) > 0 && b[0] == '-' {
		return -1
	}
	n := 0
	for _, d := range b {
		n = n*10 + int(d-'0')
	}
	return n
}
