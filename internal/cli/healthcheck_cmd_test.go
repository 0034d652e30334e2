package cli

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/proxy"
)

// readyzServer answers /readyz with code and body, like a proxy would.
func readyzServer(t *testing.T, code int, body string) string {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(code)
		io.WriteString(w, body)
	}))
	t.Cleanup(hs.Close)
	return strings.TrimPrefix(hs.URL, "http://")
}

func TestHealthcheck(t *testing.T) {
	ready := readyzServer(t, http.StatusOK, "ready\n")
	notReady := readyzServer(t, http.StatusServiceUnavailable, "not ready: dial tcp 127.0.0.1:6379: connect: connection refused\n")
	_, readyPort, _ := net.SplitHostPort(ready)
	dir := t.TempDir()
	writeConfig := func(name, yml string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(yml), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	checkRuns(t, []string{"healthcheck"}, func(t *testing.T, tc runCase, all string) {
		if tc.code != 2 && tc.name != "help" && strings.Count(strings.TrimSpace(all), "\n") != 0 {
			t.Errorf("output %q is not one line", all)
		}
	}, []runCase{
		{"ready", []string{"--addr", ready}, 0, "ready"},
		{"not ready says why", []string{"--addr", notReady}, 1, "not ready: dial tcp 127.0.0.1:6379: connect: connection refused (HTTP 503)"},
		{"nothing listening", []string{"--addr", freeAddr(t)}, 1, "no answer"},
		{"address from the config", []string{"--config", writeConfig("ok.yaml", "metrics:\n  listen: "+ready+"\n")}, 0, "ready"},
		{"unspecified host asked on loopback", []string{"--config", writeConfig("any.yaml", "metrics:\n  listen: 0.0.0.0:"+readyPort+"\n")}, 0, "http://127.0.0.1:" + readyPort + "/readyz"},
		{"--addr wins over the config", []string{"--config", writeConfig("other.yaml", "metrics:\n  listen: "+notReady+"\n"), "--addr", ready}, 0, "ready"},
		{"metrics disabled", []string{"--config", writeConfig("off.yaml", "metrics:\n  listen: \"\"\n")}, 1, "metrics.listen is empty"},
		{"bad config", []string{"--config", writeConfig("bad.yaml", "metrics:\n  listen: 9121\n")}, 1, "metrics.listen"},
		{"bad address", []string{"--addr", "localhost"}, 2, `want host:port, got "localhost"`},
		{"stray argument", []string{"--addr", ready, "now"}, 2, `unexpected argument "now"`},
		{"help", []string{"--help"}, 0, "exits 0 when it is ready"},
	})
}

// TestHealthcheckProxy runs the subcommand against a real proxy whose
// Redis goes away and comes back.
func TestHealthcheckProxy(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{})
	cfg := config.Default()
	cfg.Upstream.Addrs = []string{rs.Addr()}
	srv, err := proxy.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeMetrics(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		if err := <-done; err != nil {
			t.Errorf("ServeMetrics: %v", err)
		}
	})
	addr := ln.Addr().String()
	check := func(want int) string {
		t.Helper()
		var out bytes.Buffer
		code := -1
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			out.Reset()
			if code = run([]string{"healthcheck", "--addr", addr}, &out, &out); code == want {
				return out.String()
			}
		}
		t.Fatalf("exit %d, want %d: %s", code, want, out.String())
		return ""
	}
	check(0)
	if err := rs.Kill(); err != nil {
		t.Fatal(err)
	}
	if msg := check(1); !strings.Contains(msg, "not ready: ") || !strings.Contains(msg, rs.Addr()) {
		t.Errorf("with Redis down: %q", msg)
	}
	if err := rs.Restart(); err != nil {
		t.Fatal(err)
	}
	check(0)
}

func TestMetricsListenFlag(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flag  *string
		want  string
		fails bool
	}{
		{"not given: the file's", nil, "127.0.0.1:9121", false},
		{"given", ptr("127.0.0.1:9200"), "127.0.0.1:9200", false},
		{"empty disables", ptr(""), "", false},
		{"checked like the field", ptr("9121"), "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loadConfig("proxy.yaml", "", "", "", tc.flag)
			if tc.fails {
				if err == nil || !strings.Contains(err.Error(), "metrics.listen") {
					t.Errorf("err %v, want one naming metrics.listen", err)
				}
				return
			}
			if err != nil || cfg.Metrics.Listen != tc.want {
				t.Errorf("metrics.listen %q (err %v), want %q", cfg.Metrics.Listen, err, tc.want)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// TestBinaryMetrics runs the real binary as the container does: with
// --metrics-listen, healthcheck reports it ready; with the metrics port
// taken, it serves clients anyway and says why there are no metrics.
func TestBinaryMetrics(t *testing.T) {
	bin := buildBinary(t)
	rs := redistest.Start(t, localredis.Options{})
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tc := range []struct {
		name    string
		metrics string
		log     string
	}{
		{"metrics served", freeAddr(t), "metrics listening"},
		{"metrics port taken", taken.Addr().String(), "metrics not served"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listen := freeAddr(t)
			cmd := exec.Command(bin, "--config", "proxy.yaml", "--listen", listen, "--upstream", rs.Addr(), "--metrics-listen", tc.metrics)
			stderr := &redistest.SyncBuffer{}
			cmd.Stderr = stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				cmd.Process.Signal(syscall.SIGTERM)
				if err := cmd.Wait(); err != nil {
					t.Errorf("exit: %v\n%s", err, stderr.String())
				}
			}()
			ping(t, listen)
			for deadline := time.Now().Add(5 * time.Second); !strings.Contains(stderr.String(), tc.log); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("log lacks %q:\n%s", tc.log, stderr.String())
				}
			}
			if tc.log != "metrics listening" {
				return
			}
			var out bytes.Buffer
			if code := run([]string{"healthcheck", "--addr", tc.metrics}, &out, &out); code != 0 {
				t.Errorf("healthcheck: exit %d: %s", code, out.String())
			}
		})
	}
}
