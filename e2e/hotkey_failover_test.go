package e2e

import (
	"bytes"
	"context"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
	"github.com/redis/go-redis/v9"
)

// foStock is the stock of the failover sale: enough that the kill, at a
// third of it, comes mid-sale and the sale outlasts the promotion (about
// 2.5 s), small enough that a run stays near 20 s under -race on a
// shared machine. (The 300000 units would only make it longer.)
const foStock = 30000

// foClients sell at once, as the new user measures.
const foClients = 50

// unackedText is in the error of a change its replicas did not
// acknowledge in time (rewrite's unackedError).
const unackedText = "the change was applied and may be lost on failover"

// foSale is what the clients of a failover sale were told.
type foSale struct {
	sold    atomic.Int64 // deducts answered with the stock left
	unacked atomic.Int64 // deducts applied, replicas short: "may be lost on failover"
	mu      sync.Mutex
	others  map[string]int  // any other error, by text: retried
	orders  map[string]bool // the order ids of the deducts told sold
}

// TestHotKeyFailover: 3 masters with a replica each, in sync; 50 clients
// sell a hot key through the proxy; mid-sale a master's replica loses its
// link for 100 ms, then the master is SIGKILLed, the replica takes over
// (node timeout 1 s), and the killed node comes back as its replica. With
// wait_replicas: 1, every deduct a client was told succeeded survived the
// failover: units sold ≤ stock ≤ units sold + deducts told "applied, may
// be lost". Without it the sale still ends sold out with no bucket below
// zero, but the deducts the master acknowledged while its replica was cut
// off are missing on the promoted replica and sold again: measured and
// logged, not asserted. The key is journaled, each deduct with an order
// id of its own: the journals hold every unit that left the buckets, and
// every order told sold, but without wait_replicas those the promoted
// replica never had (the units sold twice): their entries were lost with
// their change, in the same script, so PROXY RECONCILE finds journal and
// buckets in agreement all the same.
func TestHotKeyFailover(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait int
	}{{"WaitReplicas1", 1}, {"NoWait", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			cl := redistest.StartCluster(t, localredis.ClusterOptions{Masters: 3, Replicas: 1})
			cfg := testConfig(t, config.ModeCluster, cl.Seeds(), func(c *config.Config) {
				c.Upstream.DialTimeout = config.Duration(time.Second)
				c.Hotkeys.Keys = []config.KeyRule{{Match: "stock:fo", Buckets: 6, Route: config.RouteRandom,
					WaitReplicas: tc.wait, WaitTimeout: config.Duration(50 * time.Millisecond), Journal: true}}
				c.Scripts = []config.Script{jrScript}
			})
			e := &clusterEnv{Cluster: cl, Proxy: startProxy(t, cfg), Cfg: cfg}
			foWaitSynced(t, e.Cluster)
			if r := hkDo(t, e.ProxyAddr(), "SET", "stock:fo", strconv.Itoa(foStock)); r != "+OK\r\n" {
				t.Fatalf("SET = %q", r)
			}
			foLoad(t, e.ProxyAddr(), jrScript)
			masters, err := e.Cluster.Masters()
			if err != nil {
				t.Fatal(err)
			}
			victim := masters[1]
			replica, err := e.Cluster.ReplicaOf(victim)
			if err != nil {
				t.Fatal(err)
			}

			var s foSale
			s.others = map[string]int{}
			s.orders = map[string]bool{}
			var wg sync.WaitGroup
			for i := range foClients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.sell(t, e.ProxyAddr(), jrScript.SHA1(), i)
				}()
			}
			for start := time.Now(); s.sold.Load() < foStock/3; time.Sleep(time.Millisecond) {
				if time.Since(start) > time.Minute {
					t.Fatalf("a third of the stock not sold within a minute: %d", s.sold.Load())
				}
			}
			atKill := s.sold.Load()
			foCutReplica(t, victim, replica, 100*time.Millisecond)
			t0 := time.Now()
			if err := victim.Kill(); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Kill(replica.Pid(), syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if err := e.Cluster.WaitOK(20 * time.Second); err != nil {
				t.Fatal(err)
			}
			promoted := time.Since(t0)
			if err := victim.Restart(); err != nil {
				t.Fatal(err)
			}
			if err := e.Cluster.WaitOK(20 * time.Second); err != nil {
				t.Fatal(err)
			}
			rejoined := time.Since(t0)
			wg.Wait()

			sold, unacked := s.sold.Load(), s.unacked.Load()
			buckets := foBuckets(t, e.Cluster)
			t.Logf("killed %s at %d sold; replica promoted after %v, old master back as a replica after %v; "+
				"sold %d, applied but unacknowledged %d, of %d; other errors (retried) %v; buckets now %v",
				victim.Addr(), atKill, promoted.Round(time.Millisecond), rejoined.Round(time.Millisecond),
				sold, unacked, foStock, s.others, buckets)
			if got := hkGet(t, e.ProxyAddr(), "stock:fo"); got != "$1\r\n0\r\n" {
				t.Errorf("GET after the sale = %s, want 0", got)
			}
			for i, v := range buckets {
				if v < 0 {
					t.Errorf("bucket %d holds %d, below zero", i, v)
				}
			}
			lost := foJournaled(t, e, &s)
			if tc.wait == 0 {
				t.Logf("without wait_replicas: %d units sold twice (acknowledged by the killed master, missing on its replica); "+
					"%d orders told sold are in no journal", max(sold-foStock, 0), lost)
				return
			}
			if lost != 0 {
				t.Errorf("%d orders told sold are in no journal: lost in the failover", lost)
			}
			// Every unit told sold is on the promoted replica, so none
			// is sold twice; a unit told "applied, may be lost" either
			// stayed sold or came back with the replica and was sold
			// again: sold ≤ stock ≤ sold + unacknowledged.
			if sold > foStock {
				t.Errorf("sold %d units of %d: %d sold twice", sold, foStock, sold-foStock)
			}
			if sold+unacked < foStock {
				t.Errorf("sold %d + applied but unacknowledged %d = %d, below the stock %d: units lost", sold, unacked, sold+unacked, foStock)
			}
			for k := range s.others {
				if !definite(k) {
					t.Errorf("an error during the failover whose deduct may have applied: %q", k)
				}
			}
		})
	}
}

// sell deducts one unit at a time until the proxy says sold out; an error
// other than "applied, may be lost" is counted and the deduct tried again
// a moment later, as a shop would (the test then checks that each was one
// that applied nothing: definite).
func (s *foSale) sell(t *testing.T, addr, sha string, client int) {
	var c *hkConn
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	for n, deadline := 0, time.Now().Add(60*time.Second); time.Now().Before(deadline); n++ {
		// A new order id each time: a deduct that failed may have applied.
		order := "c" + strconv.Itoa(client) + "-" + strconv.Itoa(n)
		args := [][]byte{[]byte("EVALSHA"), []byte(sha), []byte("1"), []byte("stock:fo"), []byte(order)}
		if c == nil {
			var err error
			if c, err = hkDial(addr); err != nil {
				s.other("dial: " + err.Error())
				time.Sleep(10 * time.Millisecond)
				continue
			}
		}
		r, err := c.do(args...)
		switch {
		case err != nil:
			t.Errorf("deduct: %v", err) // the proxy answers every request
			return
		case bytes.Equal(r, []byte(":-1\r\n")):
			return
		case resp.IsError(r) && bytes.Contains(r, []byte(unackedText)):
			s.unacked.Add(1)
		case resp.IsError(r):
			s.other(strings.TrimSpace(string(r[1:])))
			time.Sleep(10 * time.Millisecond)
		default:
			s.sold.Add(1)
			s.mu.Lock()
			s.orders[order] = true
			s.mu.Unlock()
		}
	}
	t.Error("the sale did not end within 60s")
}

// foJournaled checks the journals of the sale's key once it sold out:
// they explain each bucket, their deducts are the stock (one entry per
// order id, each once), PROXY RECONCILE finds them clean. lost is the
// number of orders told sold that no journal holds: entries gone with
// their change in the failover, each a unit that came back and was sold
// again, so sold - stock of them, plus one for each deduct journaled
// though its client was told an error.
func foJournaled(t *testing.T, e *clusterEnv, s *foSale) (lost int) {
	t.Helper()
	direct := redis.NewClusterClient(&redis.ClusterOptions{Addrs: e.Cluster.Seeds(), Protocol: 2, MaxRetries: -1})
	defer direct.Close()
	layouts := jrJournals(t, direct, "stock:fo")
	if len(layouts) != 1 {
		t.Fatalf("%d journaled layouts of stock:fo, want 1", len(layouts))
	}
	var deducted int64
	var unsold int // entries of orders not told sold
	journaled := map[string]bool{}
	for _, st := range layouts[0].streams {
		if err := st.explains(); err != nil {
			t.Error(err)
		}
		for _, en := range st.entries {
			if en.op != "deduct" {
				continue
			}
			deducted += en.amount
			if journaled[en.order] {
				t.Errorf("order %s journaled twice", en.order)
			}
			journaled[en.order] = true
			if !s.orders[en.order] {
				unsold++
			}
		}
	}
	for o := range s.orders {
		if !journaled[o] {
			lost++
		}
	}
	if deducted != foStock {
		t.Errorf("the journals deducted %d units, want the stock %d", deducted, foStock)
	}
	if want := int(s.sold.Load()) - foStock + unsold; lost != want {
		t.Errorf("%d orders told sold are in no journal, want sold - stock + journaled but not told sold = %d", lost, want)
	}
	if r := jrReconcile(t, e.ProxyAddr(), "stock:fo"); r["status"] != "clean" {
		t.Errorf("PROXY RECONCILE after the failover: %v, want clean", r)
	}
	return lost
}

// other counts an error by its text, cut before any address.
func (s *foSale) other(text string) {
	if i := strings.Index(text, "127.0.0.1"); i > 0 {
		text = text[:i]
	}
	s.mu.Lock()
	s.others[text]++
	s.mu.Unlock()
}

// foLoad loads s through addr (SCRIPT LOAD), as a shop does before its
// EVALSHAs: the proxy answers an EVALSHA of a script Redis does not hold
// with NOSCRIPT, and in cluster mode, having seen its body, loads it on a
// master promoted later.
func foLoad(t *testing.T, addr string, s config.Script) {
	t.Helper()
	if r := hkDo(t, addr, "SCRIPT", "LOAD", s.Body); r != "$40\r\n"+s.SHA1()+"\r\n" {
		t.Fatalf("SCRIPT LOAD %s = %q, want its SHA1 %s", s.Name, r, s.SHA1())
	}
}

// foCutReplica makes replica miss what master writes for gap, as a link
// that drops just before its master dies: replica is stopped (SIGSTOP, so
// it cannot connect again) and master drops its link (what it sent is in
// replica's socket and will be applied; what it writes next is not sent).
// The caller kills master and lets replica go on (SIGCONT).
func foCutReplica(t *testing.T, master, replica *localredis.Server, gap time.Duration) {
	t.Helper()
	if err := syscall.Kill(replica.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(&redis.Options{Addr: master.Addr(), Protocol: 2})
	defer rc.Close()
	if n, err := rc.ClientKillByFilter(context.Background(), "TYPE", "replica").Result(); err != nil || n != 1 {
		t.Fatalf("CLIENT KILL TYPE replica on %s = %d, %v; want 1", master.Addr(), n, err)
	}
	time.Sleep(gap)
}

// foWaitSynced waits until every replica of the cluster has its master's
// link up and the master's replication offset: past the first sync, so
// that a master killed now has a replica that can take over.
func foWaitSynced(t *testing.T, c *localredis.Cluster) {
	t.Helper()
	if err := c.WaitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	masters, err := c.Masters()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for deadline := time.Now().Add(20 * time.Second); ; {
		behind := ""
		for _, m := range masters {
			rc := redis.NewClient(&redis.Options{Addr: m.Addr(), Protocol: 2})
			info, err := rc.Info(ctx, "replication").Result()
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			off := infoValue(info, "master_repl_offset")
			slave := infoValue(info, "slave0")
			if !strings.Contains(slave, "state=online") || !strings.Contains(slave, ",offset="+off+",") {
				behind = m.Addr() + ": master_repl_offset " + off + ", slave0 " + slave
			}
		}
		if behind == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas not in sync within 20s: %s", behind)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// infoValue is the value of field in an INFO reply, "" when absent.
func infoValue(info, field string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// foBuckets reads the sale's bucket values from the masters directly, as
// the layout in the key names them.
func foBuckets(t *testing.T, c *localredis.Cluster) []int64 {
	t.Helper()
	ctx := context.Background()
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{c.Nodes()[0].Addr()}, Protocol: 2, MaxRetries: -1})
	defer rc.Close()
	m, err := rc.Get(ctx, "stock:fo").Result()
	if err != nil {
		t.Fatalf("GET stock:fo directly: %v", err)
	}
	l, err := rewrite.ParseMarker("stock:fo", []byte(m))
	if err != nil {
		t.Fatalf("stock:fo holds %q: %v", m, err)
	}
	vals := make([]int64, l.N())
	for i := range vals {
		if vals[i], err = rc.Get(ctx, string(l.Bucket(i))).Int64(); err != nil {
			t.Fatalf("GET bucket %s directly: %v", l.Bucket(i), err)
		}
	}
	return vals
}

// TestHotKeyWaitReplicasUnacked: a standalone server has no replica, so
// with wait_replicas: 1 every change of a hot key is applied, and the
// client told so with an error that it may be lost on failover; each short
// WAIT is counted. A reload to wait_replicas: 0 answers as before, at once.
func TestHotKeyWaitReplicasUnacked(t *testing.T) {
	sc := hkDeductOne(t, hkScripts(t))
	rule := config.KeyRule{Match: "stock:w", Buckets: 4, Route: config.RouteRandom, WaitReplicas: 1, WaitTimeout: config.Duration(20 * time.Millisecond)}
	e := startEnv(t, func(c *config.Config) {
		c.Hotkeys.Keys = []config.KeyRule{rule}
		c.Scripts = []config.Script{sc}
	})
	addr := e.ProxyAddr()
	foLoad(t, addr, sc)
	const short = "but only 0 of 1 replicas acknowledged it within 20ms; " + unackedText + "\r\n"
	for _, st := range []struct {
		cmd  []string
		left string
	}{
		{[]string{"SET", "stock:w", "10"}, "10"},
		{[]string{"EVALSHA", sc.SHA1(), "1", "stock:w"}, "9"},
		{[]string{"DECR", "stock:w"}, "8"},
		{[]string{"INCRBY", "stock:w", "2"}, "10"},
	} {
		r := hkDo(t, addr, st.cmd...)
		if !strings.HasPrefix(r, "-ERR hotkeyproxy: 'stock:w' was changed in ") || !strings.HasSuffix(r, short) {
			t.Errorf("%v = %q, want the change applied and unacknowledged", st.cmd, r)
		}
		if got := hkGet(t, addr, "stock:w"); got != "$"+strconv.Itoa(len(st.left))+"\r\n"+st.left+"\r\n" {
			t.Errorf("GET after %v = %q, want %s: the change applied", st.cmd, got, st.left)
		}
	}
	// One short WAIT at least for each command, one per request that
	// changed something (a SET writes the key and every bucket).
	rec := httptest.NewRecorder()
	e.Proxy.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	m := regexp.MustCompile(`hotkeyproxy_hotkey_replica_waits_short_total\{key="stock:w"\} (\d+)\n`).FindStringSubmatch(rec.Body.String())
	n := 0
	if m != nil {
		n, _ = strconv.Atoi(m[1])
	}
	if n < 8 {
		t.Errorf("short WAITs counted %d, want 8 or more", n)
	}

	rule.WaitReplicas = 0
	cfg := *e.Cfg
	cfg.Hotkeys.Keys = []config.KeyRule{rule}
	if _, err := e.Proxy.Apply(&cfg); err != nil {
		t.Fatal(err)
	}
	if r := hkDo(t, addr, "DECR", "stock:w"); r != ":9\r\n" {
		t.Errorf("DECR after the reload to wait_replicas: 0 = %q, want :9", r)
	}
}
