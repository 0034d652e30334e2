package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
)

// TestHotKeyPromotion (cluster, issue 5): redis-benchmark hammers one key
// that matches detect.promote through proxy A while other keys see light
// load. The detector finds it, A shards it live, its buckets appear on the
// masters, GET still answers the exact count, redis-benchmark saw no error,
// and proxy B — detection off, no rules — serves it as a hot key within a
// second of the promotion, having heard it on the layout channel.
func TestHotKeyPromotion(t *testing.T) {
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		t.Skip("redis-benchmark not installed")
	}
	const key, requests = "stock:promo", 100000
	scripts := hkScripts(t)
	e := startClusterEnv(t, func(c *config.Config) {
		c.Hotkeys.Keys = nil
		c.Scripts = scripts // the same file on both proxies, but for detection
		c.Hotkeys.Detect = config.Detect{Enabled: true, SampleRate: 0.05, Window: config.Duration(500 * time.Millisecond),
			Threshold: 1000, Capacity: 1000, Promote: []string{"stock:*"}}
	})
	cfgB := *e.Cfg
	cfgB.Hotkeys.Detect.Enabled = false
	b := startProxy(t, &cfgB).Addr().String()
	ctx := context.Background()
	direct := redis.NewClusterClient(&redis.ClusterOptions{Addrs: e.Cluster.Seeds(), Protocol: 2, MaxRetries: -1})
	defer direct.Close()
	rb := redis.NewClient(&redis.Options{Addr: b, Protocol: 2, MaxRetries: -1})
	defer rb.Close()

	// Light load on other keys, through A, all along.
	stop := make(chan struct{})
	var light sync.WaitGroup
	var lightErrs atomic.Int64
	light.Add(1)
	go func() {
		defer light.Done()
		c := redis.NewClient(&redis.Options{Addr: e.ProxyAddr(), Protocol: 2, MaxRetries: -1})
		defer c.Close()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			k := "light:" + strconv.Itoa(i%50)
			if c.Incr(ctx, k).Err() != nil {
				lightErrs.Add(1)
			}
		}
	}()

	// Watch for the promotion (the key's value turns into a layout) and
	// for B to list the key as hot.
	var promotedAt, learnedAt atomic.Int64
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		for learnedAt.Load() == 0 {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if promotedAt.Load() == 0 {
				if v, err := direct.Get(ctx, key).Result(); err == nil && rewrite.IsMarker([]byte(v)) {
					promotedAt.Store(time.Now().UnixNano())
				}
				continue
			}
			if r, err := rb.Do(ctx, "PROXY", "HOTKEYS").Result(); err == nil && strings.Contains(strings.ReplaceAll(fmtAny(r), " ", ""), key) {
				learnedAt.Store(time.Now().UnixNano())
			}
		}
	}()

	port := e.ProxyAddr()[strings.LastIndexByte(e.ProxyAddr(), ':')+1:]
	out, err := exec.Command("redis-benchmark", "-h", "127.0.0.1", "-p", port, "-c", "20", "-n", strconv.Itoa(requests),
		"INCR", key).CombinedOutput()
	time.Sleep(1200 * time.Millisecond) // for B to hear of it, if the promotion came late
	close(stop)
	light.Wait()
	watch.Wait()
	if err != nil {
		t.Fatalf("redis-benchmark: %v\n%s", err, out)
	}
	if bytes.Contains(out, []byte("rror")) { // redis-benchmark 7 stops at the first error reply
		t.Errorf("redis-benchmark saw errors:\n%s", errorLines(out, 10))
	}
	if n := lightErrs.Load(); n > 0 {
		t.Errorf("%d errors on the lightly loaded keys", n)
	}
	if promotedAt.Load() == 0 {
		t.Fatalf("%s was never promoted; PROXY HOTKEYS DETECTED on A: %v", key, proxyDo(t, e.ProxyAddr(), "PROXY", "HOTKEYS", "DETECTED"))
	}
	if learnedAt.Load() == 0 {
		t.Errorf("proxy B never listed %s as hot", key)
	} else if d := time.Duration(learnedAt.Load() - promotedAt.Load()); d > time.Second {
		t.Errorf("proxy B listed %s as hot %v after the promotion, want within a second", key, d)
	} else {
		t.Logf("promoted; proxy B served it as hot %v later", d.Round(time.Millisecond))
	}
	for _, addr := range []string{e.ProxyAddr(), b} {
		if v := proxyDo(t, addr, "GET", key); v != strconv.Itoa(requests) {
			t.Errorf("GET %s through %s = %v, want %d", key, addr, v, requests)
		}
	}
	v, _ := direct.Get(ctx, key).Result()
	l, err := rewrite.ParseMarker(key, []byte(v))
	if err != nil {
		t.Fatalf("%s holds %q in Redis, not a layout", key, v)
	}
	masters := map[string]bool{}
	var sum int64
	for i := range l.N() {
		bk := string(l.Bucket(i))
		n, err := direct.Get(ctx, bk).Int64()
		if err != nil {
			t.Fatalf("bucket %s: %v", bk, err)
		}
		sum += n
		slot, _ := direct.ClusterKeySlot(ctx, bk).Result()
		for _, s := range direct.ClusterSlots(ctx).Val() {
			if int64(s.Start) <= slot && slot <= int64(s.End) {
				masters[s.Nodes[0].Addr] = true
			}
		}
	}
	if sum != requests || len(masters) < 3 {
		t.Errorf("%s: %d buckets summing to %d over %d masters, want the sum %d over all 3 masters", key, l.N(), sum, len(masters), requests)
	}
	det := fmtAny(proxyDo(t, e.ProxyAddr(), "PROXY", "HOTKEYS", "DETECTED", "3"))
	if !strings.Contains(det, key) {
		t.Errorf("PROXY HOTKEYS DETECTED does not list %s: %s", key, det)
	}
	t.Logf("PROXY HOTKEYS DETECTED 3: %s", det)
}

// TestHotKeyShardLive (issue 5): 100 clients over two proxies deduct a
// plain key with the deduct-one script while it is sharded by PROXY SHARD
// on one proxy, merged back by PROXY UNSHARD on the other, and sharded
// again: units sold = stock, nothing left, no client error, no success
// after a sold-out reply.
func TestHotKeyShardLive(t *testing.T) {
	const stock, clients = 20000, 100
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			s := hkStart(t, mode, false, false)
			key := "live:" + mode
			script := hkDeductOne(t, hkScripts(t))
			sha := script.SHA1()
			proxies := []hkProxy{s.a, s.b}
			// Before the sale: a key sharded while missing is made
			// (holding 0), and the SET of the stock is then split.
			pre := "pre:" + mode
			hkMust(t, s.a.addr, "+OK\r\n", "PROXY", "SHARD", pre, "4")
			hkMust(t, s.b.addr, "+OK\r\n", "SET", pre, "100")
			if st := s.readBuckets(t, pre); st.layout.N() != 4 || st.sum != 100 || st.values[3] != 25 {
				t.Errorf("%s sharded while missing, then SET 100: %s, want 4 buckets of 25", pre, st)
			}
			hkMust(t, s.b.addr, "-ERR the detector is off: set hotkeys.detect.enabled in the config\r\n", "PROXY", "HOTKEYS", "DETECTED")

			hkMust(t, s.a.addr, "+OK\r\n", "SET", key, strconv.Itoa(stock))
			for _, p := range proxies {
				hkMust(t, p.addr, "$40\r\n"+sha+"\r\n", "SCRIPT", "LOAD", script.Body)
			}
			done := make(chan struct{})
			var steps []string
			var ctl sync.WaitGroup
			ctl.Add(1)
			go func() {
				defer ctl.Done()
				for i, step := range []struct {
					p    hkProxy
					args []string
				}{
					{s.a, []string{"PROXY", "SHARD", key}},
					{s.b, []string{"PROXY", "UNSHARD", key}},
					{s.b, []string{"PROXY", "SHARD", key, "4"}},
				} {
					select {
					case <-done:
						return
					case <-time.After(150 * time.Millisecond):
					}
					c, err := hkDial(step.p.addr)
					if err != nil {
						steps = append(steps, err.Error())
						return
					}
					r, err := c.doStr(step.args...)
					c.close()
					steps = append(steps, strconv.Itoa(i)+" "+strings.Join(step.args, " ")+" via "+step.p.name+": "+strings.TrimSpace(r)+errText(err))
				}
			}()
			r := hkRunSale(t, proxies, clients, func(c *hkClient) error {
				return c.sellScript([]byte("EVALSHA"), []byte(sha), []byte(key), 1)
			})
			close(done)
			ctl.Wait()
			t.Logf("%s: %d units in %v; steps: %s", mode, r.sold, r.dur.Round(time.Millisecond), strings.Join(steps, "; "))
			if len(steps) < 3 {
				t.Logf("the sale ended before every step ran (%d of 3)", len(steps))
			}
			for _, st := range steps {
				if !strings.HasSuffix(st, ": +OK") {
					t.Errorf("step %s, want +OK", st)
				}
			}
			if len(r.errs) > 0 {
				t.Errorf("%d clients failed; first: %s", len(r.errs), r.errs[0])
			}
			if r.sold != stock {
				t.Errorf("sold %d units of %d", r.sold, stock)
			}
			if _, late := r.falseSoldOut(); len(late) > 0 {
				t.Errorf("%d successes started after a sold-out reply ended; first %s", len(late), late[0])
			}
			for _, p := range proxies {
				if f := hkGet(t, p.addr, key); f != "$1\r\n0\r\n" {
					t.Errorf("final GET through %s = %q, want 0", p.name, f)
				}
			}
		})
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return " (" + err.Error() + ")"
}

// proxyDo runs one command through addr and returns its value.
func proxyDo(t *testing.T, addr string, args ...any) any {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, MaxRetries: -1})
	defer c.Close()
	v, err := c.Do(context.Background(), args...).Result()
	if err != nil {
		return err.Error()
	}
	return v
}

// fmtAny flattens a reply into one line.
func fmtAny(v any) string {
	switch x := v.(type) {
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = fmtAny(e)
		}
		return "[" + strings.Join(parts, " ") + "]"
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return ""
}

// errorLines are the first n lines of b that mention an error.
func errorLines(b []byte, n int) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "rror") && len(out) < n {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
