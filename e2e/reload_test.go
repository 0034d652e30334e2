package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
)

// TestConfigReload (issue 6): the proxy binary serves 10 clients that
// INCR a key over connections they keep; the config file gains a rule
// that makes the key hot (written in place, as an editor does), and the
// key becomes hot with no connection dropped and no count lost. An
// invalid edit is refused, logged, and the old config keeps serving; a
// SIGHUP and PROXY CONFIG RELOAD reload too, and the log level follows
// the file.
func TestConfigReload(t *testing.T) {
	const key, clients = "stock:reload", 10
	bin := hkBuild(t)
	rs := redistest.Start(t, localredis.Options{})
	listen := hkFreeAddr(t)
	cfgPath := filepath.Join(t.TempDir(), "proxy.yaml")
	write := func(v any) {
		t.Helper()
		b, ok := v.([]byte)
		if !ok {
			var err error
			if b, err = yaml.Marshal(v); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base := func(level string, keys ...map[string]any) map[string]any {
		return map[string]any{
			"listen":   listen,
			"upstream": map[string]any{"addrs": []string{rs.Addr()}},
			"log":      map[string]any{"level": level},
			"hotkeys":  map[string]any{"keys": keys},
			"metrics":  map[string]any{"listen": ""},
		}
	}
	write(base("info"))
	proc := hkSpawn(t, bin, cfgPath, listen)
	ctx := context.Background()
	direct := redis.NewClient(&redis.Options{Addr: rs.Addr(), Protocol: 2})
	defer direct.Close()

	var ok, errs atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range clients {
		c, err := hkDial(listen)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.close()
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := c.doStr("INCR", key)
				if err != nil || !strings.HasPrefix(r, ":") {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, r+errText(err))
					if err != nil {
						return // the connection is gone
					}
					continue
				}
				ok.Add(1)
			}
		}()
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5s\nproxy log:\n%s", what, proc.out)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	isHot := func() bool {
		v, err := direct.Get(ctx, key).Result()
		return err == nil && rewrite.IsMarker([]byte(v))
	}
	time.Sleep(200 * time.Millisecond)
	if isHot() {
		t.Fatal("the key is hot before any rule names it")
	}

	// A rule for the key, written in place.
	write(base("debug", map[string]any{"match": "stock:*", "buckets": 4}))
	waitFor("the key held as buckets after the file gained its rule", isHot)
	waitFor("the reload logged", func() bool { return strings.Contains(proc.out.String(), "config reloaded") })

	// An invalid edit: refused, the old config keeps serving.
	write([]byte("hotkeys:\n  keys:\n    - match: \"\"\n"))
	waitFor("the invalid file refused", func() bool { return strings.Contains(proc.out.String(), "config reload refused") })
	if got := proxyDo(t, listen, "PROXY", "CONFIG", "GET", "hotkeys.keys"); !strings.Contains(fmtAny(got), "stock:*") {
		t.Errorf("after an invalid edit, PROXY CONFIG GET hotkeys.keys = %v, want the old rule", fmtAny(got))
	}
	if r := proxyDo(t, listen, "PROXY", "CONFIG", "RELOAD"); !strings.Contains(fmtAny(r), "config not reloaded") {
		t.Errorf("PROXY CONFIG RELOAD of the invalid file = %v, want the refusal", fmtAny(r))
	}

	// The rule goes again, by SIGHUP after a rename into place: the key
	// stays hot (dropping a rule never strands stock). The file also
	// moves listen, which needs a restart: CONFIG GET shows what runs.
	tmp := cfgPath + ".new"
	moved := base("info")
	moved["listen"] = "127.0.0.1:1"
	b, _ := yaml.Marshal(moved)
	os.WriteFile(tmp, b, 0o644)
	os.Rename(tmp, cfgPath)
	proc.cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(500 * time.Millisecond)
	if r := proxyDo(t, listen, "PROXY", "CONFIG", "RELOAD"); r != "OK" {
		t.Errorf("PROXY CONFIG RELOAD = %v, want OK", r)
	}
	if got := fmtAny(proxyDo(t, listen, "PROXY", "CONFIG", "GET", "log.level")); got != "[log.level info]" {
		t.Errorf("PROXY CONFIG GET log.level = %s, want [log.level info]", got)
	}
	if got := fmtAny(proxyDo(t, listen, "PROXY", "CONFIG", "GET", "listen")); got != "[listen "+listen+"]" {
		t.Errorf("PROXY CONFIG GET listen = %s, want the address it runs on, %s", got, listen)
	}
	if !strings.Contains(proc.out.String(), "needs_restart=[listen]") {
		t.Errorf("the reload that moved listen did not say it needs a restart")
	}
	close(stop)
	wg.Wait()
	if !isHot() {
		t.Errorf("the key is no longer held as buckets after its rule was removed")
	}
	if n := errs.Load(); n > 0 {
		t.Errorf("%d client errors or dropped connections; first: %v", n, firstErr.Load())
	}
	got := proxyDo(t, listen, "GET", key)
	if got != itoa(ok.Load()) {
		t.Errorf("GET %s = %v after %d INCRs", key, got, ok.Load())
	}
	t.Logf("%d INCRs over %d connections across 4 reloads; log:\n%s", ok.Load(), clients, lastLogLines(proc.out.String(), 8))
}

func itoa(n int64) string { return strings.TrimSpace(fmtAny(n)) }

func lastLogLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
