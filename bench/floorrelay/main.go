// Command floorrelay is the least a relay written in Go does per request:
// one goroutine waits on a level-triggered epoll over every client and one
// connection to Redis, reads what is ready, writes each client's requests
// upstream in one write per wakeup and each client's replies back in one
// write, matching replies to clients in FIFO order. It parses nothing but
// RESP framing, keeps no per-client state, and handles nothing a proxy must
// (SELECT, MULTI, blocking commands, errors of Redis's connection): it is
// no proxy, only the floor bench/passthrough.sh measures hotkeyproxy
// against, the CPU a Go program cannot go below on the same machine with
// the same Redis, clients and syscalls.
//
//	floorrelay -listen 127.0.0.1:7000 -upstream 127.0.0.1:6379
//
// Clients must send multibulk commands (as redis-benchmark does). A write
// the socket does not take whole is retried at once, which is enough on
// loopback and would not be in production.
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
	listen := flag.String("listen", "127.0.0.1:7000", "host:port to listen on")
	up := flag.String("upstream", "127.0.0.1:6379", "host:port of Redis")
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
	in, out []byte
	queued  bool // in relay.ready
}

type relay struct {
	ep, lfd, ufd int
	clients      map[int]*client
	waiting      []*client // the client of each request in flight, in order; nil: gone
	upIn, upOut  []byte
	ready        []*client // clients with replies to write
	buf          []byte
}

func newRelay(listen, upstream string) (*relay, error) {
	la, err := netip.ParseAddrPort(listen)
	if err != nil {
		return nil, err
	}
	ua, err := netip.ParseAddrPort(upstream)
	if err != nil {
		return nil, err
	}
	r := &relay{clients: make(map[int]*client), buf: make([]byte, 64<<10)}
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

// run serves until Redis closes its connection.
func (r *relay) run() error {
	events := make([]syscall.EpollEvent, 256)
	for {
		n, err := syscall.EpollWait(r.ep, events, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		for _, ev := range events[:n] {
			switch fd := int(ev.Fd); fd {
			case r.lfd:
				r.accept()
			case r.ufd:
				if err := r.readUpstream(); err != nil {
					return err
				}
			default:
				r.readClient(r.clients[fd])
			}
		}
		if len(r.upOut) > 0 {
			if err := writeAll(r.ufd, r.upOut); err != nil {
				return fmt.Errorf("writing to Redis: %w", err)
			}
			r.upOut = r.upOut[:0]
		}
		for _, c := range r.ready {
			if c.fd >= 0 && writeAll(c.fd, c.out) != nil {
				r.drop(c)
			}
			c.out, c.queued = c.out[:0], false
		}
		clear(r.ready)
		r.ready = r.ready[:0]
	}
}

func (r *relay) accept() {
	for {
		fd, _, err := syscall.Accept4(r.lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			return
		}
		syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		r.clients[fd] = &client{fd: fd}
		if r.watch(fd) != nil {
			syscall.Close(fd)
			delete(r.clients, fd)
		}
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
	c.in = append(c.in, r.buf[:n]...)
	off := 0
	for {
		m := frameLen(c.in[off:])
		if m == 0 {
			break
		}
		r.upOut = append(r.upOut, c.in[off:off+m]...)
		r.waiting = append(r.waiting, c)
		off += m
	}
	c.in = append(c.in[:0], c.in[off:]...)
}

// readUpstream hands each whole reply to the client of the oldest request.
func (r *relay) readUpstream() error {
	n, err := syscall.Read(r.ufd, r.buf)
	if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
		return nil
	}
	if n <= 0 {
		return fmt.Errorf("Redis closed the connection (%v)", err)
	}
	r.upIn = append(r.upIn, r.buf[:n]...)
	off := 0
	for len(r.waiting) > 0 {
		m := frameLen(r.upIn[off:])
		if m == 0 {
			break
		}
		if c := r.waiting[0]; c != nil {
			c.out = append(c.out, r.upIn[off:off+m]...)
			if !c.queued {
				c.queued = true
				r.ready = append(r.ready, c)
			}
		}
		r.waiting = r.waiting[1:]
		off += m
	}
	r.upIn = append(r.upIn[:0], r.upIn[off:]...)
	return nil
}

// drop closes c; the replies to its requests in flight go nowhere.
func (r *relay) drop(c *client) {
	syscall.EpollCtl(r.ep, syscall.EPOLL_CTL_DEL, c.fd, nil)
	syscall.Close(c.fd)
	delete(r.clients, c.fd)
	c.fd = -1 // a client accepted since may have the number
	for i, w := range r.waiting {
		if w == c {
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
// while it is incomplete.
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
	default: // + - :
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
