package upstream

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// dialer opens connections to one node.
type dialer struct {
	addr     string
	username string
	password string // "": no AUTH
	timeout  time.Duration
}

// dial connects, authenticates and selects db, all within the dial timeout.
// A Redis error reply to SELECT comes back as RedisError so the client sees
// Redis's own text ("ERR DB index is out of range").
func (d *dialer) dial(db int) (net.Conn, *bufio.Reader, error) {
	nc, err := net.DialTimeout("tcp", d.addr, d.timeout)
	if err != nil {
		return nil, nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	var req []byte
	steps := 0
	if d.password != "" {
		if d.username != "" {
			req = resp.AppendCommand(req, []byte("AUTH"), []byte(d.username), []byte(d.password))
		} else {
			req = resp.AppendCommand(req, []byte("AUTH"), []byte(d.password))
		}
		steps++
	}
	if db != 0 {
		req = resp.AppendCommand(req, []byte("SELECT"), strconv.AppendInt(nil, int64(db), 10))
		steps++
	}
	br := bufio.NewReaderSize(nc, 16<<10)
	if steps == 0 {
		return nc, br, nil
	}
	nc.SetDeadline(time.Now().Add(d.timeout))
	err = func() error {
		if _, err := nc.Write(req); err != nil {
			return err
		}
		for i := 0; i < steps; i++ {
			reply, err := resp.ReadReply(br, nil)
			if err != nil {
				return err
			}
			if reply[0] == '-' {
				msg := string(reply[1 : len(reply)-2])
				if i == 0 && d.password != "" {
					return fmt.Errorf("proxy: upstream %s refused our AUTH: %s", d.addr, msg)
				}
				return RedisError(msg)
			}
		}
		return nil
	}()
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	nc.SetDeadline(time.Time{})
	return nc, br, nil
}
