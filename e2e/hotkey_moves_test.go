package e2e

// Moves of stock between buckets that survive their proxy's death, and a
// bucket that vanishes (rewrite/doc.go, hot-key contract 11 and 12;
// "Moves between buckets"): a proxy killed after a random step of a
// gather, a merge (PROXY UNSHARD) or a conversion while clients deduct
// through a second proxy, which finishes what the first left; and a
// bucket deleted behind the proxy while clients deduct.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
)

// mvMoveTimeout is hotkeys.move_timeout of these tests' proxies.
const mvMoveTimeout = 400 * time.Millisecond

// mvEnv is an upstream (a standalone server or a 3-master cluster), the
// surviving proxy in front of it (no hot-key rule: it learns every key),
// a client of Redis itself, and the upstream the killed proxies share.
type mvEnv struct {
	mode     string
	cfg      *config.Config
	survivor string // its address
	srv      *proxy.Server
	logs     *redistest.SyncBuffer // the survivor's log
	direct   redis.UniversalClient
	up       *upstream.Redis
}

func mvStart(t *testing.T, mode string) *mvEnv {
	t.Helper()
	e := &mvEnv{mode: mode, logs: &redistest.SyncBuffer{}}
	edit := func(c *config.Config) {
		c.Scripts = hkScripts(t)
		c.Hotkeys.MoveTimeout = config.Duration(mvMoveTimeout)
	}
	switch mode {
	case "standalone":
		rs := redistest.Start(t, localredis.Options{})
		e.cfg = testConfig(t, config.ModeStandalone, []string{rs.Addr()}, edit)
		e.direct = redis.NewClient(&redis.Options{Addr: rs.Addr(), Protocol: 2, MaxRetries: -1})
	case "cluster":
		c := redistest.StartCluster(t, localredis.ClusterOptions{Masters: 3, Replicas: 1})
		e.cfg = testConfig(t, config.ModeCluster, c.Seeds(), edit)
		e.direct = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Seeds(), Protocol: 2, MaxRetries: -1})
	}
	t.Cleanup(func() { e.direct.Close() })
	srv, err := proxy.New(e.cfg, slog.New(slog.NewTextHandler(e.logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	e.srv = serveProxy(t, srv)
	e.survivor = srv.Addr().String()
	if e.up, err = upstream.New(&e.cfg.Upstream, slog.New(slog.NewTextHandler(io.Discard, nil)), upstream.Metrics{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.up.Close)
	return e
}

// mvKillable is a proxy's upstream that can be stopped dead: from then
// on nothing more reaches Redis, as when the proxy is SIGKILLed.
type mvKillable struct {
	up   rewrite.Upstream
	dead atomic.Bool
}

func (k *mvKillable) Do(reqs []rewrite.Request) [][]byte {
	if !k.dead.Load() {
		return k.up.Do(reqs)
	}
	out := make([][]byte, len(reqs))
	for i := range out {
		out[i] = []byte("-ERR upstream unavailable: the proxy was killed\r\n")
	}
	return out
}

func (k *mvKillable) Placement() (int, func(uint16) int) { return k.up.Placement() }
func (k *mvKillable) Node(slot uint16) string            { return k.up.Node(slot) }

// victim is a proxy's hot-key engine over its own killable upstream, with
// the rules mv:g:* and mv:c:* (8 buckets), that dies after step kill
// (1-based) of its moves; killed is closed then.
func (e *mvEnv) victim(kill int) (*rewrite.Engine, chan struct{}) {
	cfg := *e.cfg
	cfg.Hotkeys.Keys = []config.KeyRule{
		{Match: "mv:g:*", Buckets: 8, Route: config.RouteRandom},
		{Match: "mv:c:*", Buckets: 8, Route: config.RouteRandom},
	}
	up := &mvKillable{up: e.up}
	v := rewrite.New(up, &cfg, slog.New(slog.DiscardHandler))
	killed := make(chan struct{})
	n := 0
	v.SetMoveHook(func(string) {
		if n++; n == kill {
			up.dead.Store(true)
			close(killed)
		}
	})
	return v, killed
}

// mvWhole is what Redis holds of a key, read directly: its layout (nil
// when plain), the sum of its buckets or its value, and the keys that
// name it ("…key#…") which are neither its buckets nor their applied
// marks: intents, lost records, buckets of no layout.
type mvWhole struct {
	layout *rewrite.Layout
	value  string
	sum    int64
	strays []string
}

func (e *mvEnv) read(t *testing.T, key string) mvWhole {
	t.Helper()
	ctx := context.Background()
	var w mvWhole
	v, err := e.direct.Get(ctx, key).Result()
	if err != nil && err != redis.Nil {
		t.Fatalf("GET %s directly: %v", key, err)
	}
	w.value = v
	named := map[string]bool{}
	if l, err := rewrite.ParseMarker(key, []byte(v)); err == nil {
		w.layout = l
		for i := range l.N() {
			b := string(l.Bucket(i))
			named[b], named[string(l.AppliedKey(i))] = true, true
			n, _ := e.direct.Get(ctx, b).Int64()
			w.sum += n
		}
	} else {
		w.sum, _ = strconv.ParseInt(v, 10, 64)
	}
	for _, k := range hkKeys(t, e.direct, "*"+key+"#*") {
		if !named[k] {
			w.strays = append(w.strays, k)
		}
	}
	slices.Sort(w.strays)
	return w
}

// intentsLeft counts the intents Redis holds for layout l.
func (e *mvEnv) intentsLeft(l *rewrite.Layout) int64 {
	var n int64
	for i := range l.N() {
		n += e.direct.HLen(context.Background(), string(l.IntentsKey(i))).Val()
	}
	return n
}

// mvClients deduct one unit at a time from key through addr (deduct-one,
// by EVALSHA) until stopped, counting what they were told they got.
type mvClients struct {
	stop chan struct{}
	wg   sync.WaitGroup
	sold atomic.Int64
	mu   sync.Mutex
	errs []string
}

func mvDeduct(t *testing.T, addr, key, sha string, n int) *mvClients {
	t.Helper()
	c := &mvClients{stop: make(chan struct{})}
	for range n {
		conn, err := hkDial(addr)
		if err != nil {
			t.Fatal(err)
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer conn.close()
			for {
				select {
				case <-c.stop:
					return
				default:
				}
				r, err := conn.do([]byte("EVALSHA"), []byte(sha), []byte("1"), []byte(key))
				v, ok := resp.IntValue(r)
				switch {
				case err != nil || !ok:
					c.mu.Lock()
					c.errs = append(c.errs, fmt.Sprintf("%q %v", r, err))
					c.mu.Unlock()
					if err != nil {
						return
					}
				case v >= 0:
					c.sold.Add(1)
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	return c
}

// end stops the clients and waits for them.
func (c *mvClients) end() { close(c.stop); c.wg.Wait() }

// TestHotKeyMoves runs, per upstream mode, 100 random kill points of a
// proxy moving stock between buckets while clients deduct through a
// second proxy, and a bucket deleted behind the proxy while clients
// deduct.
func TestHotKeyMoves(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			e := mvStart(t, mode)
			sha := hkDeductOne(t, hkScripts(t)).SHA1()
			hkMust(t, e.survivor, "$40\r\n"+sha+"\r\n", "SCRIPT", "LOAD", hkDeductOne(t, hkScripts(t)).Body)
			t.Run("killed at 100 points", func(t *testing.T) { mvKillPoints(t, e, sha) })
			t.Run("a bucket deleted behind the proxy", func(t *testing.T) { mvLostBucket(t, e, sha) })
		})
	}
}

// mvKillPoints: each kill point is a new key of 400 units, two clients
// deducting from it through the survivor, and a victim proxy that dies
// after a random step of one move: a gather (a deduct of 200 when no
// bucket holds that much), a merge (PROXY UNSHARD) or a conversion (of a
// plain value, on its first touch). The survivor finishes what it left;
// then the units sold plus what Redis holds are the stock exactly, no key
// is left behind but the layout's buckets and applied marks, and the
// intents were gone within move_timeout of the kill (less than the bound
// plus a second of leeway for a busy machine).
func mvKillPoints(t *testing.T, e *mvEnv, sha string) {
	const points, workers, stock = 100, 8, 400
	steps := map[string]int{"gather": 9, "merge": 5, "conversion": 3} // kill points drawn in 1..n
	ops := []string{"gather", "merge", "conversion"}
	var (
		next     atomic.Int64
		kills    atomic.Int64
		mu       sync.Mutex
		slowest  time.Duration
		problems []string
		wg       sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		problems = append(problems, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				i := int(next.Add(1)) - 1
				if i >= points {
					return
				}
				op := ops[i%len(ops)]
				kill := 1 + r.IntN(steps[op])
				key := fmt.Sprintf("mv:%c:%s:%d", op[0], e.mode, i)
				v, killed := e.victim(kill)
				var before *rewrite.Layout
				switch op {
				case "gather":
					v.Do([][]byte{[]byte("SET"), []byte(key), []byte(strconv.Itoa(stock))}, 1, 0)
				case "merge":
					hkMust(t, e.survivor, "+OK\r\n", "PROXY", "SHARD", key, "8")
					hkMust(t, e.survivor, "+OK\r\n", "SET", key, strconv.Itoa(stock))
					v.Learn([]byte(key))
				case "conversion":
					hkMust(t, e.survivor, "+OK\r\n", "SET", key, strconv.Itoa(stock))
				}
				before = e.read(t, key).layout
				clients := mvDeduct(t, e.survivor, key, sha, 2)
				time.Sleep(5 * time.Millisecond)
				var victimSold int64
				switch op {
				case "gather":
					if n, ok := resp.IntValue(v.Do([][]byte{[]byte("EVAL"), []byte(hkDeductN(t, hkScripts(t)).Body), []byte("1"), []byte(key), []byte("200")}, 3, 0)); ok && n >= 0 {
						victimSold = 200
					}
				case "merge":
					v.Unshard([]byte(key))
				case "conversion":
					v.Do([][]byte{[]byte("GET"), []byte(key)}, 1, 0)
				}
				var killedAt time.Time
				select {
				case <-killed:
					killedAt = time.Now()
					kills.Add(1)
				default:
				}
				time.Sleep(20 * time.Millisecond) // the clients go on meanwhile
				clients.end()
				where := fmt.Sprintf("%s %s, killed after step %d", op, key, kill)
				if killedAt.IsZero() {
					where = fmt.Sprintf("%s %s, not killed (fewer than %d steps)", op, key, kill)
				}
				if len(clients.errs) > 0 {
					fail("%s: %d client errors; first %s", where, len(clients.errs), clients.errs[0])
				}
				// The survivor finishes the intents by itself, within the
				// bound; the merge or conversion when it meets the key.
				layouts := []*rewrite.Layout{before}
				if l := e.read(t, key).layout; l != nil {
					layouts = append(layouts, l)
				}
				deadline := time.Now().Add(mvMoveTimeout + time.Second)
				for _, l := range layouts {
					for l != nil && e.intentsLeft(l) > 0 && time.Now().Before(deadline) {
						time.Sleep(5 * time.Millisecond)
					}
					if l != nil && e.intentsLeft(l) > 0 {
						fail("%s: intents of layout %s still there %v after the kill", where, l.Gen, time.Since(killedAt).Round(time.Millisecond))
					}
				}
				if !killedAt.IsZero() {
					mu.Lock()
					slowest = max(slowest, time.Since(killedAt))
					mu.Unlock()
				}
				var w mvWhole
				for try := 0; ; try++ {
					hkGet(t, e.survivor, key)
					w = e.read(t, key)
					if w.layout == nil || !w.layout.Pending && !w.layout.Merging || try == 100 {
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
				if got := w.sum + clients.sold.Load() + victimSold; got != stock || len(w.strays) > 0 || w.layout != nil && (w.layout.Pending || w.layout.Merging) {
					fail("%s: Redis holds %d (%.40q), the clients bought %d, the victim %d: %d in all, want %d; left behind: %v",
						where, w.sum, w.value, clients.sold.Load(), victimSold, got, stock, w.strays)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%s: %d of %d kill points hit a move before its end; the survivor finished what was left within %v of the kill at most",
		e.mode, kills.Load(), points, slowest.Round(time.Millisecond))
	for _, p := range problems[:min(10, len(problems))] {
		t.Error(p)
	}
	if kills.Load() < points*9/10 {
		t.Errorf("only %d of %d kill points hit a move in the middle", kills.Load(), points)
	}
}

// mvLostBucket: 20 clients deduct a key of 8 buckets through the survivor;
// bucket 3 is deleted directly (GETDEL, to know what it held). The
// others keep selling to the end; the deducts that meet bucket 3 get an
// error naming it; the survivor logs it once, counts it, and PROXY
// HOTKEYS shows it; units sold plus the units deleted are the stock.
func mvLostBucket(t *testing.T, e *mvEnv, sha string) {
	const stock, clients = 8000, 20
	key := "mv:lost:" + e.mode
	hkMust(t, e.survivor, "+OK\r\n", "PROXY", "SHARD", key, "8")
	hkMust(t, e.survivor, "+OK\r\n", "SET", key, strconv.Itoa(stock))
	l := e.read(t, key).layout
	bucket := string(l.Bucket(3))
	var (
		sold, lostErrs atomic.Int64
		mu             sync.Mutex
		others         []string
		wg             sync.WaitGroup
	)
	for range clients {
		conn, err := hkDial(e.survivor)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.close()
			for {
				r, err := conn.do([]byte("EVALSHA"), []byte(sha), []byte("1"), []byte(key))
				v, ok := resp.IntValue(r)
				switch {
				case ok && v == -1:
					return
				case ok && v >= 0:
					sold.Add(1)
				case err == nil && strings.HasPrefix(string(r), "-ERR hotkeyproxy: '"+key+"' lost bucket 3 ("+bucket+")"):
					lostErrs.Add(1)
				default:
					mu.Lock()
					others = append(others, fmt.Sprintf("%q %v", r, err))
					mu.Unlock()
					return
				}
			}
		}()
	}
	for sold.Load() < stock/8 {
		time.Sleep(time.Millisecond)
	}
	held, err := e.direct.GetDel(context.Background(), bucket).Int64()
	if err != nil {
		t.Fatalf("GETDEL %s: %v", bucket, err)
	}
	wg.Wait()
	if len(others) > 0 {
		t.Errorf("%d clients ended on another reply; first %s", len(others), others[0])
	}
	if got := sold.Load() + held; got != stock {
		t.Errorf("sold %d + %d deleted with bucket 3 = %d, want the stock %d", sold.Load(), held, got, stock)
	}
	if lostErrs.Load() == 0 {
		t.Errorf("no deduct got the error naming bucket 3")
	}
	if n := strings.Count(e.logs.String(), "hot key bucket lost"); n != 1 {
		t.Errorf("%d log lines of a lost bucket, want 1:\n%s", n, e.logs.String())
	}
	if !regexp.MustCompile(`hot key bucket lost.* key=` + regexp.QuoteMeta(key) + ` bucket=3 `).MatchString(e.logs.String()) {
		t.Errorf("the log line does not name %s's bucket 3:\n%s", key, e.logs.String())
	}
	metrics := e.metrics(t)
	for _, series := range []string{
		`hotkeyproxy_hotkey_buckets_lost_total{key="` + key + `"} 1`,
		`hotkeyproxy_hotkey_lost_units{key="` + key + `"} `,
	} {
		if !strings.Contains(metrics, "\n"+series) {
			t.Errorf("/metrics has no %q", series)
		}
	}
	c := redis.NewClient(&redis.Options{Addr: e.survivor, Protocol: 2, MaxRetries: -1})
	defer c.Close()
	v, err := c.Do(context.Background(), "PROXY", "HOTKEYS").Result()
	if err != nil {
		t.Fatal(err)
	}
	var entry string
	for _, en := range v.([]any) {
		if s := fmt.Sprint(en); strings.HasPrefix(s, "[key "+key+" ") {
			entry = s
		}
	}
	// The units last seen there: what it held, or a little more when
	// deducts were in flight as it went (one per client at most).
	m := regexp.MustCompile(` lost_buckets \[3\] lost_units \[(\d+)\]\]$`).FindStringSubmatch(entry)
	if units, _ := strconv.ParseInt(m[min(1, len(m)-1)], 10, 64); !strings.Contains(entry, " buckets 8 ") || len(m) != 2 || units < held || units > held+clients {
		t.Errorf("PROXY HOTKEYS does not show bucket 3 of %s lost, with the %d units it held: %s", key, held, entry)
	}
	t.Logf("%s: sold %d, bucket 3 held %d when deleted; %d deducts met it; PROXY HOTKEYS: %s", e.mode, sold.Load(), held, lostErrs.Load(), entry)
}

// metrics is the survivor's /metrics.
func (e *mvEnv) metrics(t *testing.T) string {
	t.Helper()
	rec := httptest.NewRecorder()
	e.srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}
