package e2e

// The journal of a hot key (rewrite/journal.go) and its reconciliation
// (PROXY RECONCILE, hotkeyproxy reconcile): a sell-out by 200 clients over
// two proxies while the key is merged back and made hot again, whose
// journal holds every unit sold while it was hot, order for order; a unit
// changed behind the proxy's back, found with its bucket; clients that
// hang up right after sending a deduct.

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
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
	"github.com/hotkeyproxy/hotkeyproxy/internal/cli"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/internal/seckill"
)

// jrScript is the deduct script of these tests: deduct-one's body, with
// the caller's order id in ARGV[1], which the journal carries.
var jrScript = config.Script{
	Name:    "deduct-order",
	Body:    "if tonumber(redis.call('get', KEYS[1]) or '0') > 0 then return redis.call('decr', KEYS[1]) else return -1 end -- ARGV[1]: order id",
	Amount:  config.Amount{Const: 1},
	Soldout: -1,
	OrderID: 1,
}

// jrEnv is an upstream and two proxies in front of it that journal the
// keys made hot by PROXY SHARD, and a client of Redis itself.
type jrEnv struct {
	a, b   string
	direct redis.UniversalClient
}

func jrStart(t *testing.T, mode string) *jrEnv {
	t.Helper()
	edit := func(c *config.Config) {
		c.Scripts = append(hkScripts(t), jrScript)
		c.Hotkeys.Keys = []config.KeyRule{{Match: "jr:bench", Buckets: 4, Route: config.RouteRandom, Journal: true}}
		c.Hotkeys.Detect.Journal = true
		c.Hotkeys.MoveTimeout = config.Duration(400 * time.Millisecond)
		// A proxy remembers "sold out" for soldout_ttl, and sees another
		// proxy's give-back only after it: none here, so that a client
		// told "sold out" after the last refill knows it is.
		c.Hotkeys.SoldoutTTL = 0
	}
	e := &jrEnv{}
	var cfg *config.Config
	switch mode {
	case "standalone":
		s := startEnv(t, edit)
		cfg, e.a = s.Cfg, s.ProxyAddr()
		e.direct = redis.NewClient(&redis.Options{Addr: s.Redis.Addr(), Protocol: 2, MaxRetries: -1})
	case "cluster":
		s := startClusterEnv(t, edit)
		cfg, e.a = s.Cfg, s.ProxyAddr()
		e.direct = redis.NewClusterClient(&redis.ClusterOptions{Addrs: s.Cluster.Seeds(), Protocol: 2, MaxRetries: -1})
	}
	t.Cleanup(func() { e.direct.Close() })
	cfgB := *cfg
	e.b = startProxy(t, &cfgB).Addr().String()
	// A plain key runs the script in Redis itself.
	hkMust(t, e.a, "$40\r\n"+jrScript.SHA1()+"\r\n", "SCRIPT", "LOAD", jrScript.Body)
	return e
}

// TestHotKeyJournal runs the journal's tests per upstream mode.
func TestHotKeyJournal(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			e := jrStart(t, mode)
			t.Run("sell-out while sharded and unsharded", func(t *testing.T) { jrSellOut(t, e) })
			t.Run("clients gone after sending", func(t *testing.T) { jrHangUps(t, e) })
			t.Run("bench seckill checks the journal", func(t *testing.T) { jrBench(t, e) })
		})
	}
}

// jrSale is what the clients of a sale were told.
type jrSale struct {
	mu     sync.Mutex
	orders map[string]bool // the order ids told they bought a unit
	errs   []string
}

// jrSellOut: 200 clients, half through each proxy, buy one unit at a time
// with an order id each, while the key is merged back into a plain key
// (PROXY UNSHARD through A), made hot again with another bucket count
// (PROXY SHARD through B) and given 1000 units (INCRBY), three times; then
// until sold out. The journals of all its layouts then hold: a deduct
// entry for every unit the clients were told they bought while the key
// was hot, each with its order id, and none other; the units sold while
// it was plain are exactly what its value lost between a merge and the
// next conversion; the give-backs; and every entry explains its bucket.
// PROXY RECONCILE of the last layout is clean, as is hotkeyproxy
// reconcile (exit 0); then an INCRBY on one bucket key directly is found
// with that bucket and amount, and the command exits 1.
func jrSellOut(t *testing.T, e *jrEnv) {
	const key, stock, clients, cycles, refill = "jr:sale", 3000, 200, 3, 1000
	hkMust(t, e.a, "+OK\r\n", "SET", key, strconv.Itoa(stock))
	hkMust(t, e.a, "+OK\r\n", "PROXY", "SHARD", key, "4")
	sale := &jrSale{orders: map[string]bool{}}
	var cycled atomic.Bool
	var wg sync.WaitGroup
	for i := range clients {
		addr := e.a
		if i%2 == 1 {
			addr = e.b
		}
		conn, err := hkDial(addr)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.close()
			sha := []byte(jrScript.SHA1())
			for n := 0; ; n++ {
				order := fmt.Sprintf("c%d-%d", i, n)
				last := cycled.Load() // sent after the last refill
				r, err := conn.do([]byte("EVALSHA"), sha, []byte("1"), []byte(key), []byte(order))
				v, ok := resp.IntValue(r)
				switch {
				case err != nil || !ok:
					sale.mu.Lock()
					sale.errs = append(sale.errs, fmt.Sprintf("%q %v", r, err))
					sale.mu.Unlock()
					if err != nil {
						return
					}
				case v >= 0:
					sale.mu.Lock()
					sale.orders[order] = true
					sale.mu.Unlock()
				case last:
					return // sold out after the last refill
				}
				time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
			}
		}()
	}
	for c := range cycles {
		hkMust(t, e.a, "+OK\r\n", "PROXY", "UNSHARD", key)
		hkMust(t, e.b, "+OK\r\n", "PROXY", "SHARD", key, strconv.Itoa(2+2*c))
		if r := jrDo(t, e.b, "INCRBY", key, strconv.Itoa(refill)); !strings.HasPrefix(r, ":") {
			t.Fatalf("INCRBY %s %d: %q", key, refill, r)
		}
	}
	cycled.Store(true)
	wg.Wait()
	if len(sale.errs) > 0 {
		t.Fatalf("%d requests failed, first: %s", len(sale.errs), sale.errs[0])
	}
	supply := stock + cycles*refill
	if len(sale.orders) != supply {
		t.Fatalf("clients were told they bought %d units, want %d (the stock and its refills)", len(sale.orders), supply)
	}

	layouts := jrJournals(t, e.direct, key)
	if len(layouts) != cycles+1 {
		t.Fatalf("journals of %d layouts, want %d: %v", len(layouts), cycles+1, layouts)
	}
	var deducts, gaveBack, soldPlain int64
	journaled := map[string]bool{}
	for i, l := range layouts {
		for _, s := range l.streams {
			if err := s.explains(); err != nil {
				t.Errorf("layout %d: %v", i, err)
			}
			for _, en := range s.entries {
				switch en.op {
				case "deduct":
					deducts += en.amount
					switch {
					case en.order == "":
						t.Errorf("deduct entry %s has no order id", en.id)
					case journaled[en.order]:
						t.Errorf("order %s journaled twice", en.order)
					case !sale.orders[en.order]:
						t.Errorf("order %s is journaled, but no client was told it bought", en.order)
					}
					journaled[en.order] = true
				case "give_back":
					gaveBack += en.amount
				}
			}
		}
		if i+1 < len(layouts) {
			if l.merged < 0 {
				t.Fatalf("layout %d ended without a merged entry", i)
			}
			soldPlain += l.merged - layouts[i+1].set
		}
	}
	if deducts+soldPlain != int64(supply) {
		t.Errorf("journal deducts %d + sold while plain %d = %d, want the %d units bought", deducts, soldPlain, deducts+soldPlain, supply)
	}
	if notJournaled := int64(len(sale.orders) - len(journaled)); notJournaled != soldPlain {
		t.Errorf("%d orders bought are not in the journal, want the %d sold while the key was plain", notJournaled, soldPlain)
	}
	if gaveBack != cycles*refill {
		t.Errorf("journal give-backs %d, want %d", gaveBack, cycles*refill)
	}
	t.Logf("%d units: %d journaled over %d layouts, %d sold while plain", supply, deducts, len(layouts), soldPlain)

	rec := jrReconcile(t, e.a, key)
	if rec["status"] != "clean" || rec["difference"] != "0" || rec["buckets_hold"] != "0" {
		t.Fatalf("PROXY RECONCILE after the sell-out: %v", rec)
	}
	if code, out := jrReconcileCmd(e.b, key); code != 0 {
		t.Fatalf("hotkeyproxy reconcile after the sell-out: exit %d, want 0:\n%s", code, out)
	}

	last := layouts[len(layouts)-1]
	bucket := len(last.streams) - 1
	if err := e.direct.IncrBy(context.Background(), last.streams[bucket].bucket, 5).Err(); err != nil {
		t.Fatal(err)
	}
	rec = jrReconcile(t, e.a, key)
	if rec["status"] != "differs" || rec["difference"] != "5" {
		t.Fatalf("PROXY RECONCILE after INCRBY 5 on bucket %d directly: %v", bucket, rec)
	}
	for _, b := range rec["buckets"].([]map[string]any) {
		want := "0"
		if b["bucket"] == strconv.Itoa(bucket) {
			want = "5"
		}
		if b["difference"] != want {
			t.Errorf("bucket %v: difference %v, want %s (%v)", b["bucket"], b["difference"], want, b["note"])
		}
	}
	code, out := jrReconcileCmd(e.b, key)
	if code != 1 || !strings.Contains(out, "bucket "+strconv.Itoa(bucket)+" ") || !strings.Contains(out, "a difference of 5") {
		t.Fatalf("hotkeyproxy reconcile after the INCRBY: exit %d, want 1 and bucket %d named:\n%s", code, bucket, out)
	}
}

// jrHangUps: 100 clients each send a deduct and close their connection at
// once, not waiting for the reply; what the buckets lost is what the
// journal deducted, and PROXY RECONCILE is clean.
func jrHangUps(t *testing.T, e *jrEnv) {
	const key, stock, clients = "jr:gone", 500, 100
	hkMust(t, e.b, "+OK\r\n", "PROXY", "SHARD", key)
	hkMust(t, e.b, "+OK\r\n", "SET", key, strconv.Itoa(stock))
	for i := range clients {
		c, err := hkDial([]string{e.a, e.b}[i%2])
		if err != nil {
			t.Fatal(err)
		}
		c.nc.Write(resp.AppendCommand(nil, []byte("EVALSHA"), []byte(jrScript.SHA1()), []byte("1"), []byte(key), []byte("gone-"+strconv.Itoa(i))))
		c.close()
	}
	// The deducts the proxies took up finish on their own: wait until the
	// journal has said all it will (the buckets' sum stops changing at
	// what it deducted), then compare.
	var rec map[string]any
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec = jrReconcile(t, e.a, key)
		if rec["status"] != "clean" {
			t.Fatalf("PROXY RECONCILE with clients gone: %v", rec)
		}
		held, _ := strconv.ParseInt(rec["buckets_hold"].(string), 10, 64)
		deducted, _ := strconv.ParseInt(rec["deducted"].(string), 10, 64)
		if held+deducted != stock {
			t.Fatalf("the buckets hold %d and the journal deducted %d: %d, want the stock %d", held, deducted, held+deducted, stock)
		}
		again := jrReconcile(t, e.b, key)
		if again["buckets_hold"] == rec["buckets_hold"] || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("%d clients hung up; the journal deducted %v", clients, rec["deducted"])
}

// jrBench: bench seckill with --journal and --order-ids on a journaled
// key finds the journal deducting the units sold, entry for entry; and
// finds it wrong once a unit is deducted behind the proxy's back, in a
// journal entry no client was told of.
func jrBench(t *testing.T, e *jrEnv) {
	opts := seckill.Options{Addr: e.a, Key: "jr:bench", Stock: 3000, Clients: 50, Journal: true, OrderIDs: true, Duration: time.Minute}
	res, err := seckill.Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	j := res.Journal
	if v := res.Violations(); len(v) > 0 || j == nil || j.Deducted != 3000 || j.NoEntry != 0 || j.NoSuccess != 0 || res.Sold != 3000 {
		t.Fatalf("bench seckill on a journaled key: %v\n%s", v, res)
	}
	if !strings.Contains(res.String(), "ok: the journal deducts exactly the units sold, entry for entry by order id") {
		t.Errorf("the report does not say the journal check passed:\n%s", res)
	}

	// Another sale, while a client the bench does not know of buys one
	// unit with an order id of its own, once the sale has begun: the
	// check finds its entry, and one unit more deducted than sold.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for { // the first sale left 0; this one SETs 2000 and sells
			r := jrDo(t, e.b, "GET", "jr:bench")
			if v, _ := resp.BulkValue([]byte(r)); string(v) != "0" && string(v) != "2000" {
				break
			}
		}
		if r := jrDo(t, e.b, "EVALSHA", hkDeductOne(t, hkScripts(t)).SHA1(), "1", "jr:bench", "not-the-bench"); !strings.HasPrefix(r, ":") || r == ":-1\r\n" {
			t.Errorf("the other buyer, once the sale began: %q", r)
		}
	}()
	opts.Stock, opts.Clients = 2000, 2
	res, err = seckill.Run(context.Background(), opts)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if j := res.Journal; j == nil || j.NoSuccess != 1 || j.NoEntry != 0 || j.Deducted != res.Sold+1 || len(res.Violations()) != 2 {
		t.Fatalf("bench seckill with a buyer it does not know of: %+v, violations %q", j, res.Violations())
	}
}

// jrLayout is the journals of one layout of a key, read from Redis.
type jrLayout struct {
	gen     string
	streams []*jrStream // in bucket order
	set     int64       // the units its set entries set
	merged  int64       // the units its merged entry moved to the plain key; -1 for none
	first   string      // its oldest entry's id
}

// jrStream is one bucket's journal.
type jrStream struct {
	name, bucket string
	entries      []jrEntry
}

type jrEntry struct {
	id, op, order string
	amount, after int64
}

// explains checks that each entry's value after is the one before it
// changed by its amount: no change of the bucket is missing between two.
func (s *jrStream) explains() error {
	var v int64
	for i, en := range s.entries {
		switch en.op {
		case "set":
			v = en.amount
		case "deduct", "move_out", "merged":
			v -= en.amount
		case "give_back", "move_in", "move_back":
			v += en.amount
		default:
			return fmt.Errorf("%s: entry %s has op %q", s.name, en.id, en.op)
		}
		if i == 0 && en.op != "set" {
			return fmt.Errorf("%s: the first entry is %q, not set", s.name, en.op)
		}
		if v != en.after {
			return fmt.Errorf("%s: entry %s (%s %d) says %d after, the entries before it %d", s.name, en.id, en.op, en.amount, en.after, v)
		}
	}
	return nil
}

var jrStreamName = regexp.MustCompile(`^(\{\d+\}.+#(\d+)\.([0-9a-f]+)):journal$`)

// jrJournals reads every journal stream of key from Redis directly, by
// layout, oldest layout first.
func jrJournals(t *testing.T, direct redis.UniversalClient, key string) []*jrLayout {
	t.Helper()
	ctx := context.Background()
	byGen := map[string]*jrLayout{}
	for _, name := range hkKeys(t, direct, "*"+key+"#*:journal") {
		m := jrStreamName.FindStringSubmatch(name)
		if m == nil {
			t.Fatalf("journal %q: not named after a bucket", name)
		}
		l := byGen[m[3]]
		if l == nil {
			l = &jrLayout{gen: m[3], merged: -1}
			byGen[m[3]] = l
		}
		b, _ := strconv.Atoi(m[2])
		for len(l.streams) <= b {
			l.streams = append(l.streams, nil)
		}
		s := &jrStream{name: name, bucket: m[1]}
		l.streams[b] = s
		msgs, err := direct.XRange(ctx, name, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, msg := range msgs {
			en := jrEntry{id: msg.ID, op: fmt.Sprint(msg.Values["op"])}
			en.amount, _ = strconv.ParseInt(fmt.Sprint(msg.Values["amount"]), 10, 64)
			en.after, _ = strconv.ParseInt(fmt.Sprint(msg.Values["after"]), 10, 64)
			if o, ok := msg.Values["order"]; ok {
				en.order = fmt.Sprint(o)
			}
			if msg.Values["key"] != key || msg.Values["bucket"] != m[2] {
				t.Errorf("%s entry %s: key %v bucket %v, want %s and %s", name, msg.ID, msg.Values["key"], msg.Values["bucket"], key, m[2])
			}
			switch en.op {
			case "set":
				l.set += en.amount
			case "merged":
				l.merged = en.amount
			}
			if l.first == "" || jrBefore(msg.ID, l.first) {
				l.first = msg.ID
			}
			s.entries = append(s.entries, en)
		}
	}
	var out []*jrLayout
	for _, l := range byGen {
		if slices.Contains(l.streams, nil) {
			t.Fatalf("layout %s: a bucket without a journal", l.gen)
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(x, y *jrLayout) int {
		if jrBefore(x.first, y.first) {
			return -1
		}
		return 1
	})
	return out
}

// jrBefore reports whether stream id a is older than b.
func jrBefore(a, b string) bool {
	pa, pb := strings.SplitN(a, "-", 2), strings.SplitN(b, "-", 2)
	ma, _ := strconv.ParseInt(pa[0], 10, 64)
	mb, _ := strconv.ParseInt(pb[0], 10, 64)
	sa, _ := strconv.ParseInt(pa[1], 10, 64)
	sb, _ := strconv.ParseInt(pb[1], 10, 64)
	return ma < mb || ma == mb && sa < sb
}

// jrReconcile is PROXY RECONCILE key through addr, its fields by name
// ("buckets": one map per bucket).
func jrReconcile(t *testing.T, addr, key string) map[string]any {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, MaxRetries: -1, DisableIdentity: true})
	defer c.Close()
	v, err := c.Do(context.Background(), "PROXY", "RECONCILE", key).Slice()
	if err != nil {
		t.Fatalf("PROXY RECONCILE %s: %v", key, err)
	}
	m := jrFields(v)
	var buckets []map[string]any
	for _, b := range m["buckets"].([]any) {
		buckets = append(buckets, jrFields(b.([]any)))
	}
	m["buckets"] = buckets
	return m
}

func jrFields(v []any) map[string]any {
	m := map[string]any{}
	for i := 0; i+1 < len(v); i += 2 {
		m[fmt.Sprint(v[i])] = v[i+1]
	}
	return m
}

// jrDo runs one command through addr: its raw reply.
func jrDo(t *testing.T, addr string, args ...string) string {
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

// jrReconcileCmd runs hotkeyproxy reconcile against addr: its exit status
// and output.
func jrReconcileCmd(addr, key string) (int, string) {
	var out bytes.Buffer
	code := cli.Main([]string{"reconcile", "--addr", addr, "--key", key}, nil, &out, &out)
	return code, out.String()
}
