package e2e

// Flash sales on a hot key under concurrency (issue 4, Tests; rewrite/doc.go,
// hot-key contract 4, 7, 9 and 10): many clients over two proxy instances
// on one upstream sell a key out by the deduct script, by "DECR then INCR
// back if negative" and by DECRBY 2; a plain key is converted while 100
// clients deduct from it; a proxy process is SIGKILLed mid-sale and
// restarted. Every test counts the units the clients were told they got
// and compares them with the stock and with what the buckets, read
// directly from Redis, still hold.

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
)

// hkBucketCount is the bucket count of the hot-key rule of these tests.
const hkBucketCount = 8

// hkOpTimeout bounds one request: a proxy that hangs fails the test.
const hkOpTimeout = 10 * time.Second

// hkRules marks every stock:* key hot, as ops would for a flash sale.
func hkRules() []config.KeyRule {
	return []config.KeyRule{{Match: "stock:*", Buckets: hkBucketCount, Route: config.RouteRandom}}
}

// hkScripts are the deduct scripts of the default proxy.yaml (deduct-one:
// take 1 if > 0 else -1; deduct-n: take ARGV[1] if ≥ it else -1).
func hkScripts(t testing.TB) []config.Script {
	t.Helper()
	def, err := config.Load("../proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return def.Scripts
}

// hkDeductOne is the deduct-one script of scripts.
func hkDeductOne(t testing.TB, scripts []config.Script) config.Script {
	t.Helper()
	for _, s := range scripts {
		if s.Name == "deduct-one" {
			if s.Amount.Const != 1 || s.Soldout != -1 {
				t.Fatalf("deduct-one in ../proxy.yaml: amount %+v, soldout %d; want 1 and -1", s.Amount, s.Soldout)
			}
			return s
		}
	}
	t.Fatal("../proxy.yaml declares no deduct-one script")
	return config.Script{}
}

// hkDeductN is the deduct-n script of scripts (takes ARGV[1]).
func hkDeductN(t testing.TB, scripts []config.Script) config.Script {
	t.Helper()
	for _, s := range scripts {
		if s.Name == "deduct-n" {
			if s.Amount.ArgvIndex != 1 || s.Soldout != -1 {
				t.Fatalf("deduct-n in ../proxy.yaml: amount %+v, soldout %d; want argv:1 and -1", s.Amount, s.Soldout)
			}
			return s
		}
	}
	t.Fatal("../proxy.yaml declares no deduct-n script")
	return config.Script{}
}

// hkSetup is one upstream (a standalone server or a 3-master cluster) with
// two proxy instances in front of it, and a client that reads Redis
// directly, to look at the buckets.
type hkSetup struct {
	mode   string
	a, b   hkProxy
	direct redis.UniversalClient
}

// hkProxy is a proxy instance the clients use: a name for messages, and
// where it listens.
type hkProxy struct{ name, addr string }

// hkStart starts the upstream and proxies A and B; hotA and hotB say
// whether each has the stock:* rule. Both know the deduct scripts.
func hkStart(t *testing.T, mode string, hotA, hotB bool) *hkSetup {
	t.Helper()
	scripts := hkScripts(t)
	edit := func(c *config.Config) {
		c.Scripts = scripts
		c.Hotkeys.Keys = nil
		if hotA {
			c.Hotkeys.Keys = hkRules()
		}
	}
	s := &hkSetup{mode: mode, a: hkProxy{name: "A"}, b: hkProxy{name: "B"}}
	var cfgA *config.Config
	switch mode {
	case "standalone":
		e := startEnv(t, edit)
		cfgA, s.a.addr = e.Cfg, e.ProxyAddr()
		s.direct = redis.NewClient(&redis.Options{Addr: e.Redis.Addr(), Protocol: 2, MaxRetries: -1})
	case "cluster":
		e := startClusterEnv(t, edit)
		cfgA, s.a.addr = e.Cfg, e.ProxyAddr()
		s.direct = redis.NewClusterClient(&redis.ClusterOptions{Addrs: e.Cluster.Seeds(), Protocol: 2, MaxRetries: -1})
	default:
		t.Fatalf("mode %q", mode)
	}
	t.Cleanup(func() { s.direct.Close() })
	cfgB := *cfgA
	cfgB.Hotkeys.Keys = nil
	if hotB {
		cfgB.Hotkeys.Keys = hkRules()
	}
	if err := cfgB.Validate(); err != nil {
		t.Fatal(err)
	}
	s.b.addr = startProxy(t, &cfgB).Addr().String()
	return s
}

// hkConn is a minimal RESP client: one connection, one request at a time,
// so that a transport error is known to hit exactly one request.
type hkConn struct {
	nc  net.Conn
	br  *bufio.Reader
	req []byte
	rep []byte
}

func hkDial(addr string) (*hkConn, error) {
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &hkConn{nc: nc, br: bufio.NewReader(nc)}, nil
}

// do sends one command and returns its raw reply, valid until the next do.
func (c *hkConn) do(args ...[]byte) ([]byte, error) {
	c.req = resp.AppendCommand(c.req[:0], args...)
	c.nc.SetDeadline(time.Now().Add(hkOpTimeout))
	if _, err := c.nc.Write(c.req); err != nil {
		return nil, err
	}
	r, err := resp.ReadReply(c.br, c.rep[:0])
	c.rep = r
	return r, err
}

// doStr is do with string arguments, for setup steps.
func (c *hkConn) doStr(args ...string) (string, error) {
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	r, err := c.do(bs...)
	return string(r), err
}

func (c *hkConn) close() { c.nc.Close() }

// hkDo runs one command through addr on a connection of its own: its
// raw reply.
func hkDo(t testing.TB, addr string, args ...string) string {
	t.Helper()
	c, err := hkDial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	r, err := c.doStr(args...)
	if err != nil {
		t.Fatalf("%v through %s: %v", args, addr, err)
	}
	return r
}

// hkMust runs a setup command through addr and checks its raw reply.
func hkMust(t testing.TB, addr, want string, args ...string) {
	t.Helper()
	if got := hkDo(t, addr, args...); got != want {
		t.Fatalf("%v through %s: got %q, want %q", args, addr, got, want)
	}
}

// hkGet is GET key through addr, raw.
func hkGet(t testing.TB, addr, key string) string {
	t.Helper()
	c, err := hkDial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	got, err := c.doStr("GET", key)
	if err != nil {
		t.Fatalf("GET %s through %s: %v", key, addr, err)
	}
	return got
}

// hkBuckets is what Redis itself holds of a hot key.
type hkBuckets struct {
	marker string
	layout *rewrite.Layout
	values []int64
	sum    int64
	strays map[string]string // keys shaped like a bucket of the key that the layout does not name
}

func (b hkBuckets) String() string {
	s := fmt.Sprintf("buckets %v (sum %d)", b.values, b.sum)
	if len(b.strays) > 0 {
		s += fmt.Sprintf(", stray bucket-like keys %v", b.strays)
	}
	return s
}

// readBuckets reads key's layout marker and every bucket straight from
// Redis (each bucket on its node in cluster mode), and looks for keys
// shaped like buckets of key ("{tag}key#i.gen") that the layout does not name:
// the leftovers of a second layout.
func (s *hkSetup) readBuckets(t testing.TB, key string) hkBuckets {
	t.Helper()
	ctx := context.Background()
	var b hkBuckets
	m, err := s.direct.Get(ctx, key).Result()
	if err != nil {
		t.Fatalf("GET %s directly from Redis: %v", key, err)
	}
	b.marker = m
	if b.layout, err = rewrite.ParseMarker(key, []byte(m)); err != nil {
		t.Fatalf("%s holds %q in Redis, not a layout marker: %v", key, m, err)
	}
	named := map[string]bool{}
	for i := 0; i < b.layout.N(); i++ {
		bk := string(b.layout.Bucket(i))
		named[bk] = true
		v, err := s.direct.Get(ctx, bk).Result()
		switch {
		case errors.Is(err, redis.Nil):
			v = "0"
		case err != nil:
			t.Fatalf("GET bucket %s directly from Redis: %v", bk, err)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("bucket %s holds %q, not an integer", bk, v)
		}
		b.values = append(b.values, n)
		b.sum += n
	}
	shape := regexp.MustCompile(`^\{[0-9]+\}` + regexp.QuoteMeta(key) + `#[0-9]+\.[0-9a-f]+$`)
	for _, k := range hkKeys(t, s.direct, "*"+key+"#*") {
		if shape.MatchString(k) && !named[k] {
			if b.strays == nil {
				b.strays = map[string]string{}
			}
			b.strays[k] = s.direct.Get(ctx, k).Val()
		}
	}
	return b
}

// hkKeys is KEYS pattern straight from Redis: from every master in
// cluster mode.
func hkKeys(t testing.TB, direct redis.UniversalClient, pattern string) []string {
	t.Helper()
	ctx := context.Background()
	var keys []string
	var mu sync.Mutex
	scan := func(ctx context.Context, c *redis.Client) error {
		ks, err := c.Keys(ctx, pattern).Result()
		mu.Lock()
		keys = append(keys, ks...)
		mu.Unlock()
		return err
	}
	var err error
	switch d := direct.(type) {
	case *redis.ClusterClient:
		err = d.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, d)
	}
	if err != nil {
		t.Fatalf("KEYS directly from Redis: %v", err)
	}
	return keys
}

// What one request of a sale was told.
type hkKind uint8

const (
	hkSuccess  hkKind = iota // the deduct took units
	hkSoldOut                // told sold out (the script's -1, a negative DECR/DECRBY)
	hkGiveBack               // the INCR/INCRBY that undid a negative DECR/DECRBY
)

// hkEvent is one request: when it started and ended (nanoseconds since
// the sale began, one monotonic clock), on which client and proxy.
type hkEvent struct {
	start, end int64
	client     int
	proxy      string
	kind       hkKind
	units      int64 // taken, on success
	reply      int64
}

func (e hkEvent) String() string {
	kind := [...]string{"success", "sold out", "give-back"}[e.kind]
	return fmt.Sprintf("%s (reply %d) by client %d via proxy %s, [%.6fs, %.6fs]",
		kind, e.reply, e.client, e.proxy, float64(e.start)/1e9, float64(e.end)/1e9)
}

// hkClient is one buyer: it sells until told sold out and logs what it did.
type hkClient struct {
	id     int
	proxy  string
	conn   *hkConn
	next   hkProxy // the proxy after this client's in the sale's list
	now    func() int64
	events []hkEvent
}

// call sends one command and reads its integer reply.
func (c *hkClient) call(args ...[]byte) (v int64, start, end int64, err error) {
	return c.callOn(c.conn, args...)
}

// callOn is call on another connection of the client.
func (c *hkClient) callOn(conn *hkConn, args ...[]byte) (v int64, start, end int64, err error) {
	start = c.now()
	r, err := conn.do(args...)
	end = c.now()
	if err != nil {
		return 0, start, end, fmt.Errorf("%s: %w", args[0], err)
	}
	v, ok := resp.IntValue(r)
	if !ok {
		return 0, start, end, fmt.Errorf("%s: reply %q, not an integer", args[0], r)
	}
	return v, start, end, nil
}

func (c *hkClient) log(kind hkKind, start, end, units, reply int64) {
	c.events = append(c.events, hkEvent{start: start, end: end, client: c.id, proxy: c.proxy, kind: kind, units: units, reply: reply})
}

// sellScript deducts with a deduct script (EVALSHA sha, or EVAL body)
// that takes units per call (argv: its ARGV) until the reply is -1.
func (c *hkClient) sellScript(cmd, script, key []byte, units int64, argv ...[]byte) error {
	args := append([][]byte{cmd, script, []byte("1"), key}, argv...)
	for {
		v, st, en, err := c.call(args...)
		switch {
		case err != nil:
			return err
		case v == -1:
			c.log(hkSoldOut, st, en, 0, v)
			return nil
		case v < 0:
			return fmt.Errorf("%s: reply %d, neither the stock left nor the sold-out -1", cmd, v)
		}
		c.log(hkSuccess, st, en, units, v)
	}
}

// sellDecr deducts n with DECR (n = 1) or DECRBY n until the reply is
// negative, then gives the n back with INCR or INCRBY n: the client
// pattern that contract 4 keeps exact. crossed sends the give-back
// through the next proxy, as a pooled client behind a load balancer may.
func (c *hkClient) sellDecr(key []byte, n int64, crossed bool) error {
	down := [][]byte{[]byte("DECR"), key}
	up := [][]byte{[]byte("INCR"), key}
	if n != 1 {
		amt := []byte(strconv.FormatInt(n, 10))
		down = [][]byte{[]byte("DECRBY"), key, amt}
		up = [][]byte{[]byte("INCRBY"), key, amt}
	}
	for {
		v, st, en, err := c.call(down...)
		if err != nil {
			return err
		}
		if v >= 0 {
			c.log(hkSuccess, st, en, n, v)
			continue
		}
		c.log(hkSoldOut, st, en, 0, v)
		conn := c.conn
		if crossed {
			if conn, err = hkDial(c.next.addr); err != nil {
				return err
			}
			defer conn.close()
		}
		v, st, en, err = c.callOn(conn, up...)
		if err != nil {
			return fmt.Errorf("give-back: %w", err)
		}
		c.log(hkGiveBack, st, en, 0, v)
		return nil
	}
}

// hkSaleResult is what the clients of one sale were told.
type hkSaleResult struct {
	sold     int64 // units the successes took
	success  int   // successful requests
	soldOuts int
	errs     []string
	dur      time.Duration // first request start to last request end
	events   []hkEvent     // all, sorted by start
}

// hkRunSale connects clients round-robin to proxies, starts them all at
// once (a barrier) and runs sell on each until every client is done.
func hkRunSale(t *testing.T, proxies []hkProxy, clients int, sell func(c *hkClient) error) hkSaleResult {
	t.Helper()
	cs := make([]*hkClient, clients)
	for i := range cs {
		p := proxies[i%len(proxies)]
		conn, err := hkDial(p.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.close)
		cs[i] = &hkClient{id: i, proxy: p.name, conn: conn, next: proxies[(i+1)%len(proxies)]}
	}
	var res hkSaleResult
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	t0 := time.Now()
	now := func() int64 { return int64(time.Since(t0)) }
	for _, c := range cs {
		c.now = now
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := sell(c); err != nil {
				mu.Lock()
				res.errs = append(res.errs, fmt.Sprintf("client %d via proxy %s: %v", c.id, c.proxy, err))
				mu.Unlock()
			}
		}()
	}
	close(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		for _, c := range cs {
			c.conn.close()
		}
		<-done
		t.Fatalf("the sale did not end within 3 minutes")
	}
	first, last := int64(-1), int64(0)
	for _, c := range cs {
		for _, e := range c.events {
			switch e.kind {
			case hkSuccess:
				res.sold += e.units
				res.success++
			case hkSoldOut:
				res.soldOuts++
			}
			if first < 0 || e.start < first {
				first = e.start
			}
			last = max(last, e.end)
		}
		res.events = append(res.events, c.events...)
	}
	slices.SortFunc(res.events, func(a, b hkEvent) int { return cmp.Compare(a.start, b.start) })
	res.dur = time.Duration(last - max(first, 0))
	return res
}

// falseSoldOut finds the contract-7 violation of a sale without
// give-backs: a success that started after a sold-out reply had ended.
// The earliest-ending sold-out reply is the one any such success follows.
func (r hkSaleResult) falseSoldOut() (soldOut hkEvent, late []hkEvent) {
	found := false
	for _, e := range r.events {
		if e.kind == hkSoldOut && (!found || e.end < soldOut.end) {
			soldOut, found = e, true
		}
	}
	if !found {
		return soldOut, nil
	}
	for _, e := range r.events {
		if e.kind == hkSuccess && e.start > soldOut.end {
			late = append(late, e)
		}
	}
	return soldOut, late
}

func (r hkSaleResult) rate(units int64) string {
	if r.dur <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f units/s", float64(units)/r.dur.Seconds())
}

// check reports what the contract requires of a sale of stock units that
// ran to the end: every client was told sold out, units sold = stock,
// GET = 0 through every proxy, the buckets in Redis sum to 0, and, when
// strict (no give-backs), no success began after a sold-out reply ended.
// A failing sale is one error with all the numbers.
func (r hkSaleResult) check(t *testing.T, s *hkSetup, key string, stock int64, clients int, strict bool, proxies ...hkProxy) {
	t.Helper()
	var problems []string
	if len(r.errs) > 0 {
		problems = append(problems, fmt.Sprintf("%d clients failed; first: %s", len(r.errs), strings.Join(r.errs[:min(5, len(r.errs))], "; ")))
	}
	var finals []string
	for _, p := range proxies {
		f := hkGet(t, p.addr, key)
		finals = append(finals, fmt.Sprintf("%s %q", p.name, f))
		if f != "$1\r\n0\r\n" {
			problems = append(problems, fmt.Sprintf("final GET through proxy %s = %q, want \"0\"", p.name, f))
		}
	}
	b := s.readBuckets(t, key)
	switch {
	case r.sold > stock:
		problems = append(problems, fmt.Sprintf("OVERSELL by %d units", r.sold-stock))
	case r.sold < stock:
		problems = append(problems, fmt.Sprintf("%d units UNSOLD although every client was told sold out (lost, or a false sold-out)", stock-r.sold))
	}
	if b.sum != 0 || len(b.strays) > 0 {
		problems = append(problems, fmt.Sprintf("the buckets in Redis hold %d, want 0 and no strays", b.sum))
	}
	if b.layout.N() != hkBucketCount {
		problems = append(problems, fmt.Sprintf("layout has %d buckets, want %d (marker %q)", b.layout.N(), hkBucketCount, b.marker))
	}
	if r.soldOuts != clients && len(r.errs) == 0 {
		problems = append(problems, fmt.Sprintf("%d sold-out replies, want one per client (%d)", r.soldOuts, clients))
	}
	soldOut, late := r.falseSoldOut()
	switch {
	case strict && len(late) > 0:
		problems = append(problems, fmt.Sprintf("FALSE SOLD-OUT: %d successes started after a sold-out reply had ended; the first sold-out to end: %s; the first success after it: %s",
			len(late), soldOut, late[0]))
	case len(late) > 0:
		t.Logf("%d successes started after the first sold-out reply ended (%s); allowed here: give-backs reopen stock", len(late), soldOut)
	}
	summary := fmt.Sprintf("sold %d of stock %d (%d successes, %d sold-out replies, %d clients over %d proxies); final GET %s; in Redis %s",
		r.sold, stock, r.success, r.soldOuts, clients, len(proxies), strings.Join(finals, ", "), b)
	if len(problems) == 0 {
		t.Logf("%s: %s", key, summary)
		return
	}
	// The requests around the first sold-out reply, where a sale that
	// breaks the contract usually starts to.
	first := slices.IndexFunc(r.events, func(e hkEvent) bool { return e.kind == hkSoldOut })
	var around []string
	if first >= 0 {
		for _, e := range r.events[max(0, first-4):min(len(r.events), first+8)] {
			around = append(around, "\n\t"+e.String())
		}
	}
	t.Errorf("%s: %s\n%s\nrequests around the first sold-out reply to start:%s", key, strings.Join(problems, "\n"), summary, strings.Join(around, ""))
}

// TestHotKeySellOut: 200 clients over two proxies on one upstream sell a
// hot key out the three ways, and by deduct-n (issue 4,
// "Concurrency"; contract 3, 4 and 7).
func TestHotKeySellOut(t *testing.T) {
	const clients = 200
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			s := hkStart(t, mode, true, true)
			script := hkDeductOne(t, hkScripts(t))
			scriptN := hkDeductN(t, hkScripts(t))
			proxies := []hkProxy{s.a, s.b}

			t.Run("script", func(t *testing.T) {
				// (a) EVALSHA of deduct-one, loaded by SCRIPT LOAD through
				// each proxy first, until -1.
				const stock = 20000
				key := "stock:sellout:script"
				hkMust(t, s.a.addr, "+OK\r\n", "SET", key, strconv.Itoa(stock))
				sha := script.SHA1()
				for _, p := range proxies {
					hkMust(t, p.addr, fmt.Sprintf("$%d\r\n%s\r\n", len(sha), sha), "SCRIPT", "LOAD", script.Body)
				}
				r := hkRunSale(t, proxies, clients, func(c *hkClient) error {
					return c.sellScript([]byte("EVALSHA"), []byte(sha), []byte(key), 1)
				})
				t.Logf("%s: %d units in %v: %s", mode, r.sold, r.dur.Round(time.Millisecond), r.rate(r.sold))
				r.check(t, s, key, stock, clients, true, proxies...)
				// What the proxies count (PROXY HOTKEYS, and the metrics
				// made from the same counters) adds up to what the
				// clients were told they bought.
				var units, ok uint64
				for _, p := range proxies {
					c := hkmProxyHotkeys(t, p.addr)[key].counters
					units, ok = units+c["units_sold"], ok+c["deducts_ok"]
					t.Logf("%s: proxy %s counted %v", mode, p.addr, c)
				}
				if units != uint64(r.sold) || ok != uint64(r.sold) {
					t.Errorf("the proxies counted %d units sold in %d deducts; the clients bought %d", units, ok, r.sold)
				}
			})

			t.Run("decr", func(t *testing.T) {
				// (b) DECR; if negative, INCR back and stop.
				const stock = 20000
				key := "stock:sellout:decr"
				hkMust(t, s.a.addr, "+OK\r\n", "SET", key, strconv.Itoa(stock))
				r := hkRunSale(t, proxies, clients, func(c *hkClient) error {
					return c.sellDecr([]byte(key), 1, false)
				})
				t.Logf("%s: %d units in %v: %s", mode, r.sold, r.dur.Round(time.Millisecond), r.rate(r.sold))
				r.check(t, s, key, stock, clients, false, proxies...)
			})

			t.Run("decr-crossed", func(t *testing.T) {
				// (b'), beyond the three: (b) with the INCR back
				// through the other proxy, as when the two commands of
				// one pooled client reach two instances behind a load
				// balancer.
				const stock = 20000
				key := "stock:sellout:decr-crossed"
				hkMust(t, s.a.addr, "+OK\r\n", "SET", key, strconv.Itoa(stock))
				r := hkRunSale(t, proxies, clients, func(c *hkClient) error {
					return c.sellDecr([]byte(key), 1, true)
				})
				t.Logf("%s: %d units in %v: %s", mode, r.sold, r.dur.Round(time.Millisecond), r.rate(r.sold))
				r.check(t, s, key, stock, clients, false, proxies...)
			})

			t.Run("decrby2", func(t *testing.T) {
				// (c) DECRBY 2; if negative, INCRBY 2 back and stop. The
				// stock is even, so a plain key sells all of it by twos;
				// 20004 over 8 buckets leaves 4 buckets odd, so the last
				// units of those must be gathered from two buckets.
				const stock = 20004
				key := "stock:sellout:decrby2"
				hkMust(t, s.a.addr, "+OK\r\n", "SET", key, strconv.Itoa(stock))
				r := hkRunSale(t, proxies, clients, func(c *hkClient) error {
					return c.sellDecr([]byte(key), 2, false)
				})
				t.Logf("%s: %d units in %v: %s", mode, r.sold, r.dur.Round(time.Millisecond), r.rate(r.sold))
				r.check(t, s, key, stock, clients, false, proxies...)
			})

			t.Run("script-n", func(t *testing.T) {
				// (d), beyond the three: EVALSHA of deduct-n taking
				// 2 (ARGV[1]) until -1, on the same odd buckets as (c).
				// No client gives back, so the strict contract-7 check
				// applies, and the last units need a gather.
				const stock = 20004
				key := "stock:sellout:script-n"
				hkMust(t, s.a.addr, "+OK\r\n", "SET", key, strconv.Itoa(stock))
				sha := scriptN.SHA1()
				for _, p := range proxies {
					hkMust(t, p.addr, fmt.Sprintf("$%d\r\n%s\r\n", len(sha), sha), "SCRIPT", "LOAD", scriptN.Body)
				}
				r := hkRunSale(t, proxies, clients, func(c *hkClient) error {
					return c.sellScript([]byte("EVALSHA"), []byte(sha), []byte(key), 2, []byte("2"))
				})
				t.Logf("%s: %d units in %v: %s", mode, r.sold, r.dur.Round(time.Millisecond), r.rate(r.sold))
				r.check(t, s, key, stock, clients, true, proxies...)
			})
		})
	}
}

// TestHotKeyConvertLive: a key that holds a plain integer becomes hot on
// its first touch while 100 clients, started together, deduct from it
// through a proxy that has the rule (issue 4, "Marking keys hot"): no unit
// lost or counted twice.
func TestHotKeyConvertLive(t *testing.T) {
	const (
		clients = 100
		stock   = 10000
		rounds  = 2
	)
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			// A: no rule, so the key is plain; B: the stock:* rule.
			s := hkStart(t, mode, false, true)
			script := hkDeductOne(t, hkScripts(t))
			for round := range rounds {
				key := fmt.Sprintf("stock:convert:%d", round)
				hkMust(t, s.a.addr, "+OK\r\n", "SET", key, strconv.Itoa(stock))
				if v, err := s.direct.Get(context.Background(), key).Result(); err != nil || v != strconv.Itoa(stock) {
					t.Fatalf("before the sale %s holds %q (%v) in Redis, want the plain %d", key, v, err, stock)
				}
				r := hkRunSale(t, []hkProxy{s.b}, clients, func(c *hkClient) error {
					return c.sellScript([]byte("EVAL"), []byte(script.Body), []byte(key), 1)
				})
				t.Logf("%s round %d: %d units in %v: %s", mode, round, r.sold, r.dur.Round(time.Millisecond), r.rate(r.sold))
				r.check(t, s, key, stock, clients, true, s.b)
			}
		})
	}
}

// hkBuild builds the hotkeyproxy binary (the module root is ..).
func hkBuild(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "hotkeyproxy")
	if out, err := exec.Command("go", "build", "-o", bin, "..").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// hkFreeAddr is a loopback address nothing listens on now.
func hkFreeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// hkProc is one run of the proxy binary.
type hkProc struct {
	cmd  *exec.Cmd
	out  *redistest.SyncBuffer
	done chan struct{}
	err  error // valid once done is closed
}

// hkSpawn runs the binary with the config file and waits until listen
// answers PING (with PONG, or NOAUTH when the config sets a password). The
// process is killed when the test ends, if still alive.
func hkSpawn(t *testing.T, bin, cfgPath, listen string) *hkProc {
	t.Helper()
	p := &hkProc{cmd: exec.Command(bin, "--config", cfgPath), out: &redistest.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.kill() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("proxy exited before serving: %v\n%s", p.err, p.out)
		default:
		}
		if c, err := hkDial(listen); err == nil {
			r, err := c.doStr("PING")
			c.close()
			if err == nil && (r == "+PONG\r\n" || strings.HasPrefix(r, "-NOAUTH")) {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy does not answer PING on %s after 10s\n%s", listen, p.out)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// kill sends SIGKILL (to this process, by its id) and waits for it to go.
func (p *hkProc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// TestHotKeyProxyKilled: a proxy process SIGKILLed mid-sale and restarted
// on the same port loses nothing (contract 10): Redis holds the truth.
// 50 clients deduct by EVALSHA of deduct-one, reconnecting after an error;
// the proxy is killed twice. Units the clients were told they got plus
// what the buckets hold equals the stock, short at most one unit per
// request that met a transport error after it was sent (in flight at a
// kill); the clients run until sold out, so the buckets end at 0.
func TestHotKeyProxyKilled(t *testing.T) {
	const (
		clients = 50
		stock   = 20000
		key     = "stock:killed"
	)
	killAt := []int64{stock / 4, stock * 3 / 5} // units sold when each SIGKILL goes
	bin := hkBuild(t)
	rs := redistest.Start(t, localredis.Options{})
	listen := hkFreeAddr(t)
	scripts := hkScripts(t)
	script := hkDeductOne(t, scripts)
	var yScripts []map[string]any
	for _, s := range scripts {
		amount := any(s.Amount.Const)
		if s.Amount.ArgvIndex > 0 {
			amount = fmt.Sprintf("argv:%d", s.Amount.ArgvIndex)
		}
		yScripts = append(yScripts, map[string]any{"name": s.Name, "body": s.Body, "amount": amount, "soldout": s.Soldout})
	}
	cfgYAML, err := yaml.Marshal(map[string]any{
		"listen":   listen,
		"upstream": map[string]any{"mode": "standalone", "addrs": []string{rs.Addr()}},
		"log":      map[string]any{"level": "warn"},
		"hotkeys": map[string]any{"keys": []map[string]any{
			{"match": "stock:*", "buckets": hkBucketCount, "route": "random"},
		}},
		"scripts": yScripts,
		"metrics": map[string]any{"listen": ""},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(cfgPath, cfgYAML, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(cfgPath); err != nil {
		t.Fatalf("the test's config does not load: %v\n%s", err, cfgYAML)
	}
	proc := hkSpawn(t, bin, cfgPath, listen)

	hkMust(t, listen, "+OK\r\n", "SET", key, strconv.Itoa(stock))
	sha := script.SHA1()
	hkMust(t, listen, fmt.Sprintf("$%d\r\n%s\r\n", len(sha), sha), "SCRIPT", "LOAD", script.Body)

	var (
		sold, inflight, refused atomic.Int64
		errMu                   sync.Mutex
		errs                    []string
		wg                      sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(func() { cancel(); wg.Wait() })
	fail := func(format string, args ...any) {
		errMu.Lock()
		errs = append(errs, fmt.Sprintf(format, args...))
		errMu.Unlock()
	}
	start := make(chan struct{})
	args := [][]byte{[]byte("EVALSHA"), []byte(sha), []byte("1"), []byte(key)}
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var c *hkConn
			defer func() {
				if c != nil {
					c.close()
				}
			}()
			for ctx.Err() == nil {
				if c == nil {
					var err error
					if c, err = hkDial(listen); err != nil {
						refused.Add(1) // never sent: cannot have been applied
						time.Sleep(2 * time.Millisecond)
						continue
					}
				}
				r, err := c.do(args...)
				if err != nil {
					inflight.Add(1) // sent, or maybe: it may have been applied
					c.close()
					c = nil
					continue
				}
				v, ok := resp.IntValue(r)
				switch {
				case !ok:
					fail("client %d: EVALSHA reply %q", i, r)
					return
				case v == -1:
					return
				case v < 0:
					fail("client %d: EVALSHA reply %d", i, v)
					return
				}
				sold.Add(1)
			}
			fail("client %d: not told sold out within 2 minutes", i)
		}()
	}
	t0 := time.Now()
	close(start)
	clientsDone := make(chan struct{})
	go func() { wg.Wait(); close(clientsDone) }()
	var kills []string
	var soldAtRestart int64
	for _, at := range killAt {
		for sold.Load() < at {
			select {
			case <-clientsDone:
				t.Fatalf("the sale ended (sold %d) before the kill at %d units", sold.Load(), at)
			case <-time.After(200 * time.Microsecond):
			}
		}
		atSold := sold.Load()
		down := time.Now()
		proc.kill()
		proc = hkSpawn(t, bin, cfgPath, listen)
		soldAtRestart = sold.Load()
		kills = append(kills, fmt.Sprintf("SIGKILL at %d units sold, serving again after %v", atSold, time.Since(down).Round(time.Millisecond)))
	}
	<-clientsDone
	dur := time.Since(t0)

	if len(errs) > 0 {
		t.Errorf("%d clients failed; first: %s", len(errs), strings.Join(errs[:min(5, len(errs))], "; "))
	}
	s := &hkSetup{mode: "standalone", a: hkProxy{name: "restarted", addr: listen}, direct: redis.NewClient(&redis.Options{Addr: rs.Addr(), Protocol: 2, MaxRetries: -1})}
	defer s.direct.Close()
	b := s.readBuckets(t, key)
	final := hkGet(t, listen, key)
	got, lost := sold.Load(), inflight.Load()
	afterRestart := got - soldAtRestart
	summary := fmt.Sprintf("stock %d, sold %d (%d after the last restart), left in Redis %s, final GET %q, %d requests met a transport error (in flight at a kill), %d connects refused; %s",
		stock, got, afterRestart, b, final, lost, refused.Load(), strings.Join(kills, "; "))
	switch total := got + b.sum; {
	case total > stock:
		t.Errorf("OVERSELL: sold + left = %d > stock: %s", total, summary)
	case total < stock-lost:
		t.Errorf("units LOST: sold + left = %d < stock - in-flight = %d: %s", total, stock-lost, summary)
	}
	if b.sum != 0 || len(b.strays) > 0 {
		t.Errorf("every client was told sold out, but Redis holds %s: %s", b, summary)
	}
	if final != "$1\r\n0\r\n" {
		t.Errorf("final GET %s = %q, want \"0\": %s", key, final, summary)
	}
	if afterRestart == 0 {
		t.Errorf("nothing was sold through the restarted proxy: %s", summary)
	}
	t.Logf("%s in %v (%.0f units/s, restarts included)", summary, dur.Round(time.Millisecond), float64(got)/dur.Seconds())
}
