package localredis_test

import (
	"bytes"
	"context"
	"errors"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// modes lists the two kinds of server; most tests run against both.
var modes = []struct {
	name     string
	embedded bool
}{
	{"real", false},
	{"embedded", true},
}

// requireRedisServer fails the test when redis-server is missing: CI installs
// it, so a missing binary is a broken setup, not a reason to skip.
func requireRedisServer(t *testing.T) {
	t.Helper()
	if !localredis.Available() {
		t.Fatal("redis-server not on PATH")
	}
}

// startMode starts a server of the given kind with opts and stops it at the
// end of the test.
func startMode(t *testing.T, embedded bool, opts localredis.Options) *localredis.Server {
	t.Helper()
	if !embedded {
		requireRedisServer(t)
	}
	opts.Embedded = embedded
	return redistest.Start(t, opts)
}

// newClient returns a go-redis client for addr that neither retries nor
// pools stale connections across Kill and Restart.
func newClient(t *testing.T, addr, password string, db int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		Password:        password,
		DB:              db,
		Protocol:        2,
		MaxRetries:      -1,
		DisableIdentity: true,
		DialTimeout:     time.Second,
		ReadTimeout:     time.Second,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// rawPing sends PING on a fresh connection to addr and returns the reply line
// or the error. It sends a RESP array: miniredis has no inline commands.
func rawPing(addr string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write(localredis.AppendCommand(nil, "PING")); err != nil {
		return "", err
	}
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(buf[:n])), nil
}

func TestStartPingSetGet(t *testing.T) {
	ctx := context.Background()
	for _, m := range modes {
		for _, pw := range []string{"", "s3cret pass"} {
			name := m.name
			if pw != "" {
				name += "/password"
			}
			t.Run(name, func(t *testing.T) {
				s := startMode(t, m.embedded, localredis.Options{Password: pw})
				if !strings.HasPrefix(s.Addr(), "127.0.0.1:") {
					t.Errorf("Addr() = %q, want 127.0.0.1:port", s.Addr())
				}
				if s.Embedded() != m.embedded {
					t.Errorf("Embedded() = %v, want %v", s.Embedded(), m.embedded)
				}
				if pid := s.Pid(); (pid != 0) == m.embedded {
					t.Errorf("Pid() = %d, embedded %v", pid, m.embedded)
				}
				c := newClient(t, s.Addr(), pw, 0)
				if err := c.Ping(ctx).Err(); err != nil {
					t.Fatalf("PING: %v", err)
				}
				if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
					t.Fatalf("SET: %v", err)
				}
				if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
					t.Fatalf("GET = %q, %v; want \"v\"", got, err)
				}
			})
		}
	}
}

func TestPasswordRequired(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s := startMode(t, m.embedded, localredis.Options{Password: "pw"})
			c := newClient(t, s.Addr(), "", 0)
			err := c.Get(context.Background(), "k").Err()
			if err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
				t.Fatalf("unauthenticated GET error = %v, want NOAUTH", err)
			}
		})
	}
}

func TestKillRestart(t *testing.T) {
	ctx := context.Background()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s := startMode(t, m.embedded, localredis.Options{})
			addr, pid := s.Addr(), s.Pid()
			c := newClient(t, addr, "", 0)
			if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
				t.Fatalf("SET: %v", err)
			}

			if err := s.Kill(); err != nil {
				t.Fatalf("Kill: %v", err)
			}
			if got, err := rawPing(addr); err == nil {
				t.Fatalf("PING after Kill = %q, want an error", got)
			}
			if s.Pid() != 0 {
				t.Errorf("Pid() after Kill = %d, want 0", s.Pid())
			}
			if !m.embedded {
				if _, err := os.Stat(s.Dir()); err != nil {
					t.Errorf("dir after Kill: %v", err)
				}
			}
			if err := s.Kill(); err != nil {
				t.Errorf("second Kill: %v", err)
			}

			if err := s.Restart(); err != nil {
				t.Fatalf("Restart: %v", err)
			}
			if s.Addr() != addr {
				t.Errorf("Addr() after Restart = %q, want %q", s.Addr(), addr)
			}
			if got, err := rawPing(addr); err != nil || got != "+PONG" {
				t.Fatalf("PING after Restart = %q, %v; want +PONG", got, err)
			}
			if !m.embedded && (s.Pid() == 0 || s.Pid() == pid) {
				t.Errorf("Pid() after Restart = %d, want a new pid (was %d)", s.Pid(), pid)
			}
			if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
				t.Errorf("EXISTS k after Restart = %d, %v; want 0 (empty server)", n, err)
			}
		})
	}
}

func TestRestartRunning(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s := startMode(t, m.embedded, localredis.Options{})
			if err := s.Restart(); err != nil {
				t.Fatalf("Restart: %v", err)
			}
			if got, err := rawPing(s.Addr()); err != nil || got != "+PONG" {
				t.Fatalf("PING after Restart = %q, %v; want +PONG", got, err)
			}
		})
	}
}

func TestStop(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s := startMode(t, m.embedded, localredis.Options{})
			addr, pid, dir := s.Addr(), s.Pid(), s.Dir()
			for i := range 2 {
				if err := s.Stop(); err != nil {
					t.Fatalf("Stop #%d: %v", i+1, err)
				}
			}
			if got, err := rawPing(addr); err == nil {
				t.Errorf("PING after Stop = %q, want an error", got)
			}
			if !m.embedded {
				if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
					t.Errorf("signal 0 to pid %d after Stop: %v, want ESRCH", pid, err)
				}
				if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("temp dir after Stop: %v, want not exist", err)
				}
			}

			// Restart after Stop works too; StartT's cleanup stops it again.
			if err := s.Restart(); err != nil {
				t.Fatalf("Restart after Stop: %v", err)
			}
			if got, err := rawPing(addr); err != nil || got != "+PONG" {
				t.Fatalf("PING after Restart = %q, %v; want +PONG", got, err)
			}
		})
	}
}

func TestDistinctPorts(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			a := startMode(t, m.embedded, localredis.Options{})
			b := startMode(t, m.embedded, localredis.Options{})
			if a.Addr() == b.Addr() {
				t.Fatalf("both servers on %s", a.Addr())
			}
		})
	}
}

func TestOptions(t *testing.T) {
	requireRedisServer(t)
	ctx := context.Background()

	t.Run("args", func(t *testing.T) {
		s := redistest.Start(t, localredis.Options{Args: []string{"--databases", "4"}})
		if err := newClient(t, s.Addr(), "", 3).Ping(ctx).Err(); err != nil {
			t.Errorf("DB 3: %v", err)
		}
		if err := newClient(t, s.Addr(), "", 4).Ping(ctx).Err(); err == nil {
			t.Errorf("DB 4 with --databases 4: no error")
		}
	})

	t.Run("dir and stdout", func(t *testing.T) {
		dir := t.TempDir()
		var out bytes.Buffer
		s, err := localredis.Start(localredis.Options{Dir: dir, Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
		// Stop has reaped the process, so the copy to out is finished.
		if !strings.Contains(out.String(), "Ready to accept connections") {
			t.Errorf("Stdout lacks the ready line:\n%s", out.String())
		}
		log, err := os.ReadFile(dir + "/" + localredis.LogName)
		if err != nil {
			t.Fatalf("given dir was removed or has no log: %v", err)
		}
		if !bytes.Contains(log, []byte("Ready to accept connections")) {
			t.Errorf("%s lacks the ready line:\n%s", localredis.LogName, log)
		}
	})

	t.Run("fixed port", func(t *testing.T) {
		s := redistest.Start(t, localredis.Options{Embedded: true})
		_, port, _ := net.SplitHostPort(s.Addr())
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
		want := s.Addr()
		r := redistest.Start(t, localredis.Options{Port: atoi(t, port)})
		if r.Addr() != want {
			t.Errorf("Addr() = %q, want %q", r.Addr(), want)
		}
	})
}

func TestStartErrors(t *testing.T) {
	requireRedisServer(t)
	busy := redistest.Start(t, localredis.Options{})
	_, busyPort, _ := net.SplitHostPort(busy.Addr())

	tests := []struct {
		name    string
		opts    localredis.Options
		wantErr string
	}{
		{"missing binary", localredis.Options{Binary: "no-such-redis-server"}, "no-such-redis-server"},
		{"bad port", localredis.Options{Port: -1}, "invalid port"},
		// The port answers PING, but from the other server: localredis.Start must
		// notice by pid and report the log, not return busy's address.
		{"port in use", localredis.Options{Port: atoi(t, busyPort)}, localredis.MsgAddrInUse},
		{"bad arg", localredis.Options{Args: []string{"--no-such-option", "1"}}, "no-such-option"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := localredis.Start(tt.opts)
			if err == nil {
				s.Stop()
				t.Fatalf("localredis.Start succeeded, want error containing %q", tt.wantErr)
			}
			t.Logf("error: %v", err)
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
