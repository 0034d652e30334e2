package localredis

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

const (
	// pollInterval is the pause between PING attempts while a server starts.
	pollInterval = 20 * time.Millisecond
	// probeTimeout bounds one PING attempt (dial, write, read).
	probeTimeout = time.Second
	// maxBulk bounds the INFO reply probe reads, in bytes, in case the port
	// belongs to something that is not Redis.
	maxBulk = 1 << 20
)

// waitReady polls addr until it answers PING, for at most readyTimeout. It
// fails early once exited is closed. Answering PING is not enough: another
// process may have bound the port first (see Start), so the server must also
// report pid as its process_id in INFO.
func waitReady(addr, password string, pid int, exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		err := probe(addr, password, pid, deadline)
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("no answer to PING within %v: %w", readyTimeout, err)
		}
		t := time.NewTimer(pollInterval)
		select {
		case <-exited:
			t.Stop()
			return fmt.Errorf("exited before answering PING (last attempt: %w)", err)
		case <-t.C:
		}
	}
}

// probe sends [AUTH password] PING and INFO server over one connection and
// checks the replies.
func probe(addr, password string, pid int, deadline time.Time) error {
	if d := time.Now().Add(probeTimeout); d.Before(deadline) {
		deadline = d
	}
	conn, err := net.DialTimeout("tcp", addr, time.Until(deadline))
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}

	var req []byte
	if password != "" {
		req = appendCommand(req, "AUTH", password)
	}
	req = appendCommand(req, "PING")
	req = appendCommand(req, "INFO", "server")
	if _, err := conn.Write(req); err != nil {
		return err
	}

	r := bufio.NewReader(conn)
	if password != "" {
		if err := expectLine(r, "+OK"); err != nil {
			return fmt.Errorf("AUTH: %w", err)
		}
	}
	if err := expectLine(r, "+PONG"); err != nil {
		return fmt.Errorf("PING: %w", err)
	}
	info, err := readBulk(r)
	if err != nil {
		return fmt.Errorf("INFO: %w", err)
	}
	if got := infoField(info, "process_id"); got != strconv.Itoa(pid) {
		return fmt.Errorf("port answered by process_id %q, want %d", got, pid)
	}
	return nil
}

// appendCommand appends args as a RESP array of bulk strings.
func appendCommand(b []byte, args ...string) []byte {
	b = fmt.Appendf(b, "*%d\r\n", len(args))
	for _, a := range args {
		b = fmt.Appendf(b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b
}

// readLine reads one CRLF-terminated line without the CRLF.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(line, "\r\n"), nil
}

// expectLine reads one line and fails unless it equals want.
func expectLine(r *bufio.Reader, want string) error {
	line, err := readLine(r)
	if err != nil {
		return err
	}
	if line != want {
		return fmt.Errorf("got %q, want %q", line, want)
	}
	return nil
}

// readBulk reads a RESP bulk string reply ($len CRLF data CRLF).
func readBulk(r *bufio.Reader) (string, error) {
	line, err := readLine(r)
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(line, "$") {
		return "", fmt.Errorf("got %q, want a bulk string", line)
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 0 || n > maxBulk {
		return "", errors.New("bad bulk length " + strconv.Quote(line))
	}
	b := make([]byte, n+2)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b[:n]), nil
}

// infoField returns the value of "name:value" in an INFO reply, or "".
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return ""
}
