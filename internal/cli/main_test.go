package cli

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
)

func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("listen: 127.0.0.1:6380\nupstream:\n  mode: sharded\n"), 0o644)
	unknown := filepath.Join(dir, "unknown.yaml")
	os.WriteFile(unknown, []byte("lisen: 127.0.0.1:6380\n"), 0o644)
	checkRuns(t, nil, nil, []runCase{
		{"shipped proxy.yaml", []string{"--check-config", "proxy.yaml"}, 0, "proxy.yaml: ok"},
		{"bad value names the field", []string{"--check-config", bad}, 1, "upstream.mode"},
		{"unknown field names it", []string{"--check-config", unknown}, 1, "lisen"},
		{"missing file", []string{"--check-config", filepath.Join(dir, "none.yaml")}, 1, "none.yaml"},
		{"bad flag value is checked like a field", []string{"--upstream-mode", "sharded"}, 1, "upstream.mode"},
		{"bad listen flag", []string{"--listen", "nonsense"}, 1, "listen"},
		{"stray argument", []string{"serve"}, 2, `unexpected argument "serve"`},
		{"check applies flags", []string{"--check-config", "proxy.yaml", "--upstream-mode", "sharded"}, 1, "upstream.mode"},
		{"check accepts cluster mode without dialing", []string{"--check-config", "proxy.yaml", "--upstream-mode", "cluster", "--upstream", "127.0.0.1:1"}, 0, "proxy.yaml: ok"},
		{"help", []string{"--help"}, 0, "hotkeyproxy demo"},
	})
}

// buildBinary builds hotkeyproxy once per test into a temp dir.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "hotkeyproxy")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// ping sends PING until addr answers +PONG or 10 s pass.
func ping(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		nc, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			nc.SetDeadline(time.Now().Add(time.Second))
			nc.Write([]byte("PING\r\n"))
			line, _ := bufio.NewReader(nc).ReadString('\n')
			nc.Close()
			if line == "+PONG\r\n" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer PING: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBinarySignals runs the real binary: flags override the config, it
// serves, and SIGTERM stops it cleanly with exit status 0.
func TestBinarySignals(t *testing.T) {
	bin := buildBinary(t)
	rs := redistest.Start(t, localredis.Options{})
	listen := freeAddr(t)
	cmd := exec.Command(bin, "--config", "proxy.yaml", "--listen", listen, "--upstream", rs.Addr())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ping(t, listen)
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("still running 15s after SIGTERM\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "shutting down") {
		t.Errorf("no shutdown log line:\n%s", stderr.String())
	}
}

// TestDemo runs `hotkeyproxy demo` as a user would: it needs no config,
// serves, and Ctrl-C stops it and the redis-server it started.
func TestDemo(t *testing.T) {
	bin := buildBinary(t)
	listen := freeAddr(t)
	cmd := exec.Command(bin, "demo", "--listen", listen)
	// A file, not a bytes.Buffer: the child writes while the test reads.
	stdout, err := os.Create(filepath.Join(t.TempDir(), "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ping(t, listen)
	// The banner comes once the demo's hot key has its stock, just after
	// the proxy starts serving.
	var out string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(stdout.Name())
		if out = string(b); strings.Contains(out, "Ctrl-C stops") {
			break
		}
	}
	if !strings.Contains(out, "hot key:  stock:demo (it holds 100000 units in buckets)") {
		t.Errorf("demo does not say its hot key holds its stock:\n%s", out)
	}
	if !strings.Contains(out, "redis-cli -p "+listen[strings.LastIndex(listen, ":")+1:]) {
		t.Errorf("demo does not say how to connect:\n%s", out)
	}
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Errorf("demo exit: %v\n%s", err, stderr.String())
	}
	// It says it runs a cluster, and the nodes it announced must be gone.
	if !strings.Contains(out, "a Redis Cluster of 3 masters") {
		t.Errorf("demo does not say it started a cluster:\n%s", out)
	}
	i := strings.Index(out, " on 127.0.0.1:")
	if i < 0 {
		t.Fatalf("demo does not name its upstream:\n%s", out)
	}
	nodes := strings.Fields(strings.SplitN(out[i+4:], "\n", 2)[0])
	if len(nodes) != 3 {
		t.Errorf("demo names %d nodes, want 3: %q", len(nodes), nodes)
	}
	for _, upstream := range nodes {
		if nc, err := net.DialTimeout("tcp", upstream, time.Second); err == nil {
			nc.Close()
			t.Errorf("node %s still answers after the demo stopped", upstream)
		}
	}
}

// runCase is one command line of the binary and what it must give: its
// exit code, and a text its output contains.
type runCase struct {
	name     string
	args     []string
	code     int
	contains string
}

// checkRuns runs each case through run, its args after prefix; check, if
// set, looks further at a case's output.
func checkRuns(t *testing.T, prefix []string, check func(t *testing.T, tc runCase, output string), cases []runCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(append(slices.Clone(prefix), tc.args...), &out, &errOut)
			all := out.String() + errOut.String()
			if code != tc.code {
				t.Errorf("exit %d, want %d (output %q)", code, tc.code, all)
			}
			if !strings.Contains(all, tc.contains) {
				t.Errorf("output %q does not contain %q", all, tc.contains)
			}
			if check != nil {
				check(t, tc, all)
			}
		})
	}
}
