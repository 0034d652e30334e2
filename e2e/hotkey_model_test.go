package e2e

// Tests of the hot-key contract (rewrite/doc.go, "Hot-key contract"; issue 4)
// through the proxy, against real redis-server processes:
//
//   - TestHotKeyModel: random single-client histories on a hot key through
//     the proxy and on a plain key of a reference redis-server give
//     byte-identical replies, and the buckets read straight from Redis
//     always add up to the reference's value.
//   - TestHotKeyPlacement: buckets spread evenly over the masters, names
//     contain the key, a hash tag in the key does not capture them, and
//     PROXY HOTKEYS shows them.
//   - TestHotKeySeedScenario: buckets [0, 5, 0, …]: a client whose start
//     bucket is empty still buys.
//   - TestHotKeyStaleProxy: a proxy that does not know the key is hot never
//     sells from it.
//   - TestHotKeyRefusals: what a hot key cannot do fails clearly.
//
// Every identifier here starts with hkm, so as not to clash with the rest
// of the package.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
)

// hkmBucketCount is the bucket count of every hot-key rule here.
const hkmBucketCount = 8

// hkmModes are the upstream modes every mode-independent test runs in.
var hkmModes = []string{config.ModeStandalone, config.ModeCluster}

// hkmScripts are the two deduct scripts of the default ../proxy.yaml.
type hkmScripts struct {
	all        []config.Script
	one, n     config.Script // deduct-one (amount 1), deduct-n (amount argv:1)
	soldout    string        // their sold-out reply, raw
	oneSHA     string
	nSHA       string
	loadOne    string // the raw reply SCRIPT LOAD of each gives
	loadN      string
	undeclared string // a script no config declares
}

func hkmLoadScripts(t testing.TB) *hkmScripts {
	t.Helper()
	def, err := config.Load("../proxy.yaml")
	if err != nil {
		t.Fatalf("loading ../proxy.yaml: %v", err)
	}
	s := &hkmScripts{all: def.Scripts, undeclared: "return redis.call('get', KEYS[1])"}
	var haveOne, haveN bool
	for _, sc := range def.Scripts {
		switch sc.Name {
		case "deduct-one":
			s.one, haveOne = sc, true
		case "deduct-n":
			s.n, haveN = sc, true
		}
	}
	if !haveOne || !haveN {
		t.Fatalf("../proxy.yaml must declare the scripts deduct-one and deduct-n; it has %+v", def.Scripts)
	}
	if s.one.Soldout != s.n.Soldout {
		t.Fatalf("deduct-one and deduct-n have different sold-out values %d, %d", s.one.Soldout, s.n.Soldout)
	}
	s.soldout = ":" + strconv.FormatInt(s.one.Soldout, 10) + "\r\n"
	s.oneSHA, s.nSHA = s.one.SHA1(), s.n.SHA1()
	s.loadOne = "$40\r\n" + s.oneSHA + "\r\n"
	s.loadN = "$40\r\n" + s.nSHA + "\r\n"
	return s
}

// hkmEnv is an upstream (standalone or cluster), a proxy in front of it,
// and a client that reads Redis directly, bypassing the proxy.
type hkmEnv struct {
	mode    string
	addr    string // the proxy
	addrs   []string
	scripts *hkmScripts
	// direct reads and writes Redis without the proxy: a Client on the
	// standalone server, or a ClusterClient that sends each key to the
	// master of its slot.
	direct redis.UniversalClient
}

// hkmStart starts an upstream of mode and a proxy over it whose hot keys
// are rules, with the default deduct scripts.
func hkmStart(t testing.TB, mode string, rules ...config.KeyRule) *hkmEnv {
	t.Helper()
	sc := hkmLoadScripts(t)
	edit := func(c *config.Config) {
		c.Hotkeys.Keys = rules
		c.Scripts = sc.all
	}
	e := &hkmEnv{mode: mode, scripts: sc}
	switch mode {
	case config.ModeStandalone:
		se := startEnv(t, edit)
		e.addr, e.addrs = se.ProxyAddr(), []string{se.Redis.Addr()}
		e.direct = redis.NewClient(&redis.Options{Addr: se.Redis.Addr(), Protocol: 2, MaxRetries: -1})
	case config.ModeCluster:
		ce := startClusterEnv(t, edit)
		e.addr, e.addrs = ce.ProxyAddr(), ce.Cluster.Seeds()
		e.direct = redis.NewClusterClient(&redis.ClusterOptions{Addrs: ce.Cluster.Seeds(), Protocol: 2, MaxRetries: -1})
	default:
		t.Fatalf("unknown mode %q", mode)
	}
	t.Cleanup(func() { e.direct.Close() })
	return e
}

// startSecondProxy starts another proxy on the same upstream with rules as
// its hot keys (none: a proxy that has not heard of any hot key).
func (e *hkmEnv) startSecondProxy(t testing.TB, rules ...config.KeyRule) string {
	t.Helper()
	cfg := testConfig(t, e.mode, e.addrs, func(cfg *config.Config) {
		cfg.Hotkeys.Keys = rules
		cfg.Scripts = e.scripts.all
	})
	return startProxy(t, cfg).Addr().String()
}

// hkmState is a hot key as Redis holds it: its layout and bucket values.
type hkmState struct {
	exists bool
	layout *rewrite.Layout
	values []int64
	absent []bool // the bucket key does not exist (counted as 0)
	sum    int64
}

func (s *hkmState) String() string {
	if !s.exists {
		return "key does not exist"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sum %d over %d buckets [", s.sum, len(s.values))
	for i, v := range s.values {
		if i > 0 {
			b.WriteString(", ")
		}
		b.Write(s.layout.Bucket(i))
		if s.absent[i] {
			b.WriteString("=(none)")
		} else {
			fmt.Fprintf(&b, "=%d", v)
		}
	}
	b.WriteString("]")
	return b.String()
}

// read reads key's marker and every bucket straight from Redis: in
// cluster mode each from the master of its slot.
func (e *hkmEnv) read(ctx context.Context, key string) (*hkmState, error) {
	v, err := e.direct.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return &hkmState{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("direct GET %s: %w", key, err)
	}
	l, err := rewrite.ParseMarker(key, []byte(v))
	if err != nil {
		return nil, fmt.Errorf("direct GET %s = %q: not a layout marker (%v)", key, v, err)
	}
	s := &hkmState{exists: true, layout: l, values: make([]int64, l.N()), absent: make([]bool, l.N())}
	for i := 0; i < l.N(); i++ {
		b := string(l.Bucket(i))
		bv, err := e.direct.Get(ctx, b).Result()
		switch {
		case errors.Is(err, redis.Nil):
			s.absent[i] = true
			continue
		case err != nil:
			return nil, fmt.Errorf("direct GET %s (bucket %d of %s): %w", b, i, key, err)
		}
		n, err := strconv.ParseInt(bv, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bucket %s of %s holds %q, not an integer", b, key, bv)
		}
		s.values[i] = n
		s.sum += n
	}
	return s, nil
}

// mustRead is read, failing the test on error.
func (e *hkmEnv) mustRead(t testing.TB, key string) *hkmState {
	t.Helper()
	s, err := e.read(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// hkmBulk is the raw bulk reply holding s.
func hkmBulk(s string) string { return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n" }

// hkmInt is the raw integer reply n.
func hkmInt(n int64) string { return ":" + strconv.FormatInt(n, 10) + "\r\n" }

// hkmHotErrPrefix is how every refusal on the hot key key starts.
func hkmHotErrPrefix(key string) string {
	return "-ERR hotkeyproxy: '" + key + "' is a hot key held as buckets; "
}

// ---------------------------------------------------------------------------
// Model test

// hkmStep is one command of a history, sent to the proxy and the reference.
type hkmStep struct {
	args []string
	tol  int64         // TTL/PTTL: replies may differ by this much; 0: byte-identical
	wait time.Duration // sleep after the command (a short expiry runs out)
}

func (s hkmStep) String() string {
	var b strings.Builder
	for i, a := range s.args {
		if i > 0 {
			b.WriteByte(' ')
		}
		if a == "" || strings.ContainsAny(a, " '\"\\") {
			b.WriteString(strconv.Quote(a))
		} else {
			b.WriteString(a)
		}
	}
	if s.wait > 0 {
		fmt.Fprintf(&b, "   (then sleep %v)", s.wait)
	}
	return b.String()
}

// hkmGenOpts leave out kinds of commands, to tell apart the causes of a
// failure: HOTKEY_MODEL_WITHOUT=expiry,negative (a comma-separated list).
type hkmGenOpts struct {
	noExpiry   bool // no expiry that runs out during the history: no SET PX 100 / PEXPIRE 100 then sleep, no EXPIRE 0/-1
	noNegative bool // SET never sets a negative value
}

func hkmGenOptsFromEnv(t testing.TB) hkmGenOpts {
	var o hkmGenOpts
	for _, w := range strings.Split(os.Getenv("HOTKEY_MODEL_WITHOUT"), ",") {
		switch strings.TrimSpace(w) {
		case "":
		case "expiry":
			o.noExpiry = true
		case "negative":
			o.noNegative = true
		default:
			t.Fatalf("HOTKEY_MODEL_WITHOUT: unknown kind %q (expiry, negative)", w)
		}
	}
	return o
}

// hkmGen makes a random history of about n commands on the hot key hot,
// with plain a plain key (MGET, EXISTS, DEL).
func hkmGen(r *rand.Rand, o hkmGenOpts, sc *hkmScripts, hot, plain string, n int) []hkmStep {
	value := func() string {
		switch r.IntN(10) {
		case 0:
			return "0"
		case 1, 2:
			if !o.noNegative {
				return strconv.Itoa(-1 - r.IntN(20))
			}
		}
		return strconv.Itoa(1 + r.IntN(60))
	}
	delta := func() string { return strconv.Itoa(r.IntN(31) - 15) } // negative, 0 and positive
	amount := func() string { return strconv.Itoa(1 + r.IntN(12)) }
	step := func(args ...string) hkmStep { return hkmStep{args: args} }
	var h []hkmStep
	for len(h) < n {
		switch k := r.IntN(100); {
		case k < 15: // SET with options
			args := []string{"SET", hot, value()}
			var groups [][]string
			switch r.IntN(9) {
			case 0:
				groups = append(groups, []string{"EX", strconv.Itoa(100 + r.IntN(900))})
			case 1:
				groups = append(groups, []string{"PX", strconv.Itoa(100000 + r.IntN(900000))})
			case 2:
				groups = append(groups, []string{"EXAT", strconv.FormatInt(time.Now().Unix()+100+int64(r.IntN(900)), 10)})
			case 3:
				groups = append(groups, []string{"PXAT", strconv.FormatInt(time.Now().UnixMilli()+100000+int64(r.IntN(900000)), 10)})
			case 4, 5:
				groups = append(groups, []string{"KEEPTTL"})
			}
			switch r.IntN(6) {
			case 0:
				groups = append(groups, []string{"NX"})
			case 1:
				groups = append(groups, []string{"XX"})
			}
			if r.IntN(3) == 0 {
				groups = append(groups, []string{"GET"})
			}
			switch r.IntN(40) { // now and then, options Redis refuses
			case 0:
				groups = append(groups, []string{"NX"}, []string{"XX"})
			case 1:
				groups = append(groups, []string{"EX", "0"})
			}
			r.Shuffle(len(groups), func(i, j int) { groups[i], groups[j] = groups[j], groups[i] })
			for _, g := range groups {
				args = append(args, g...)
			}
			h = append(h, step(args...))
		case k < 16: // a short expiry that runs out
			if o.noExpiry {
				continue
			}
			// Mostly a short sleep; now and then one past the 1 s for
			// which the proxy trusts what it knows of the layout
			// (rewrite.recheck), so that it looks at Redis again.
			wait := 350 * time.Millisecond
			if r.IntN(3) == 0 {
				wait = 1200 * time.Millisecond
			}
			if r.IntN(2) == 0 {
				h = append(h, hkmStep{args: []string{"SET", hot, value(), "PX", "100"}, wait: wait})
			} else {
				h = append(h, hkmStep{args: []string{"PEXPIRE", hot, "100"}, wait: wait})
			}
		case k < 25:
			h = append(h, step("GET", hot))
		case k < 28:
			if r.IntN(2) == 0 {
				h = append(h, step("MGET", hot, plain))
			} else {
				h = append(h, step("MGET", plain, hot))
			}
		case k < 33:
			h = append(h, step("DECR", hot))
		case k < 38:
			h = append(h, step("DECRBY", hot, delta()))
		case k < 43:
			h = append(h, step("INCR", hot))
		case k < 48:
			h = append(h, step("INCRBY", hot, delta()))
		case k < 54:
			h = append(h, step("EVAL", sc.one.Body, "1", hot))
		case k < 60:
			h = append(h, step("EVALSHA", sc.oneSHA, "1", hot))
		case k < 66:
			h = append(h, step("EVAL", sc.n.Body, "1", hot, amount()))
		case k < 72:
			h = append(h, step("EVALSHA", sc.nSHA, "1", hot, amount()))
		case k < 76:
			switch r.IntN(3) {
			case 0:
				h = append(h, step("EXISTS", hot))
			case 1:
				h = append(h, step("EXISTS", hot, plain))
			default:
				h = append(h, step("EXISTS", plain, hot, hot))
			}
		case k < 79:
			switch r.IntN(4) {
			case 0:
				h = append(h, step("DEL", hot, plain))
			case 1:
				h = append(h, step("UNLINK", hot))
			default:
				h = append(h, step("DEL", hot))
			}
		case k < 84:
			secs := strconv.Itoa(100 + r.IntN(900))
			if r.IntN(8) == 0 && !o.noExpiry {
				secs = strconv.Itoa(-r.IntN(2)) // 0 or -1: deletes the key
			}
			h = append(h, step("EXPIRE", hot, secs))
		case k < 88:
			h = append(h, hkmStep{args: []string{"TTL", hot}, tol: 1})
		case k < 91:
			h = append(h, hkmStep{args: []string{"PTTL", hot}, tol: 1000})
		case k < 94:
			h = append(h, step("PERSIST", hot))
		case k < 97:
			h = append(h, step("TYPE", hot))
		default:
			h = append(h, step("SET", plain, value())) // the plain key comes back after a DEL
		}
	}
	return h
}

// hkmSameTTL compares TTL or PTTL replies: equal, or both non-negative
// and within tol.
func hkmSameTTL(a, b string, tol int64) bool {
	if a == b {
		return true
	}
	parse := func(s string) (int64, bool) {
		if !strings.HasPrefix(s, ":") || !strings.HasSuffix(s, "\r\n") {
			return 0, false
		}
		n, err := strconv.ParseInt(s[1:len(s)-2], 10, 64)
		return n, err == nil
	}
	x, ok1 := parse(a)
	y, ok2 := parse(b)
	if !ok1 || !ok2 || x < 0 || y < 0 {
		return false
	}
	return max(x-y, y-x) <= tol
}

// hkmHistoryLog is what a history has done so far, for failure messages.
type hkmHistoryLog struct{ lines []string }

func (l *hkmHistoryLog) add(i int, s hkmStep, proxy, ref string) {
	mark := "  "
	if !(proxy == ref || s.tol > 0 && hkmSameTTL(proxy, ref, s.tol)) {
		mark = ">>"
	}
	l.lines = append(l.lines, fmt.Sprintf("%s %3d  %-60s proxy %-22q reference %q", mark, i+1, hkmShort(s.String(), 60), proxy, ref))
}

func (l *hkmHistoryLog) String() string { return strings.Join(l.lines, "\n") }

// hkmShort cuts s to n characters, for script bodies in a history.
func hkmShort(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// TestHotKeyModel: random single-client histories on a hot key through the
// proxy and on a plain key of a reference redis-server get byte-identical
// replies (TTL within 1 s, PTTL within 1000 ms), and after every command
// the buckets read straight from Redis add up to the reference's value
// (contract points 1-5). HOTKEY_MODEL_SEED=n replays a run;
// HOTKEY_MODEL_WITHOUT=expiry,negative leaves kinds of commands out.
func TestHotKeyModel(t *testing.T) {
	const histories, commands = 20, 60
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("HOTKEY_MODEL_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("HOTKEY_MODEL_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (replay with HOTKEY_MODEL_SEED=%d)", seed, seed)
	opts := hkmGenOptsFromEnv(t)
	for _, mode := range hkmModes {
		t.Run(mode, func(t *testing.T) {
			e := hkmStart(t, mode, config.KeyRule{Match: "stock:*", Buckets: hkmBucketCount, Route: config.RouteRandom})
			ref := redistest.Start(t, localredis.Options{})
			refDirect := redis.NewClient(&redis.Options{Addr: ref.Addr(), Protocol: 2, MaxRetries: -1})
			t.Cleanup(func() { refDirect.Close() })
			pc, rc := dialRaw(t, e.addr), dialRaw(t, ref.Addr())
			sc := e.scripts

			// SCRIPT LOAD through the proxy gives the SHA1 Redis gives, so
			// EVALSHA works on both sides.
			for _, body := range []string{sc.one.Body, sc.n.Body} {
				p, r := pc.do("SCRIPT", "LOAD", body), rc.do("SCRIPT", "LOAD", body)
				if p != r {
					t.Fatalf("SCRIPT LOAD %q: proxy %q, reference %q", body, p, r)
				}
			}
			if p := pc.do("SCRIPT", "LOAD", sc.one.Body); p != sc.loadOne {
				t.Fatalf("SCRIPT LOAD of deduct-one through the proxy = %q, want %q", p, sc.loadOne)
			}
			if p := pc.do("SCRIPT", "LOAD", sc.n.Body); p != sc.loadN {
				t.Fatalf("SCRIPT LOAD of deduct-n through the proxy = %q, want %q", p, sc.loadN)
			}

			ctx := context.Background()
			failed := 0
			for hi := 0; hi < histories; hi++ {
				hseed := seed + uint64(hi)
				r := rand.New(rand.NewPCG(hseed, uint64(len(mode))))
				hot := fmt.Sprintf("stock:model:%d", hi)
				plain := fmt.Sprintf("plain:model:%d", hi)
				steps := append([]hkmStep{{args: []string{"SET", plain, strconv.Itoa(r.IntN(100))}}},
					hkmGen(r, opts, sc, hot, plain, commands)...)
				var log hkmHistoryLog
				fail := func(format string, args ...any) {
					failed++
					t.Errorf("%s history %d (seed %d, HOTKEY_MODEL_SEED=%d), hot key %s: %s\nhistory so far (>> marks a differing reply):\n%s",
						mode, hi, hseed, seed, hot, fmt.Sprintf(format, args...), log.String())
				}
			steps:
				for si, s := range steps {
					p, q := pc.do(s.args...), rc.do(s.args...)
					log.add(si, s, p, q)
					if s.wait > 0 {
						time.Sleep(s.wait)
					}
					if p != q && !(s.tol > 0 && hkmSameTTL(p, q, s.tol)) {
						what := "replies differ"
						if s.tol > 0 {
							what = fmt.Sprintf("replies differ by more than %d", s.tol)
						}
						fail("step %d %s: %s\n  proxy:     %q\n  reference: %q", si+1, s, what, p, q)
						break steps
					}
					// The buckets, read straight from Redis, add up to
					// the reference's value.
					st, err := e.read(ctx, hot)
					if err != nil {
						fail("after step %d %s: %v", si+1, s, err)
						break steps
					}
					rv, err := refDirect.Get(ctx, hot).Result()
					switch {
					case errors.Is(err, redis.Nil):
						if st.exists {
							fail("after step %d %s: the reference key does not exist, but Redis holds a layout: %s", si+1, s, st)
							break steps
						}
					case err != nil:
						t.Fatalf("reference GET %s: %v", hot, err)
					default:
						want, err := strconv.ParseInt(rv, 10, 64)
						if err != nil {
							t.Fatalf("reference %s holds %q, not an integer", hot, rv)
						}
						if !st.exists || st.sum != want {
							fail("after step %d %s: the reference holds %d, but Redis holds %s", si+1, s, want, st)
							break steps
						}
					}
				}
				if failed >= 5 {
					t.Fatalf("%s: stopping after %d diverging histories of %d", mode, failed, hi+1)
				}
			}
			if failed > 0 {
				t.Logf("%s: %d of %d histories diverged", mode, failed, histories)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Placement and PROXY HOTKEYS

// hkmMasterOfSlot maps each slot to the address of its master, from
// CLUSTER SLOTS.
func hkmMasterOfSlot(t testing.TB, c redis.UniversalClient) (owner func(slot int64) string, masters []string) {
	t.Helper()
	slots, err := c.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	var table [16384]string
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			continue
		}
		if !slices.Contains(masters, s.Nodes[0].Addr) {
			masters = append(masters, s.Nodes[0].Addr)
		}
		for i := s.Start; i <= s.End; i++ {
			table[i] = s.Nodes[0].Addr
		}
	}
	return func(slot int64) string { return table[slot] }, masters
}

// hkmReportEntry is one hot key's entry in PROXY HOTKEYS.
type hkmReportEntry struct {
	key, buckets, sum, soldOut string
	bucketKeys, nodes, values  []string
	counters                   map[string]uint64 // deducts_ok, units_sold, …
}

// hkmProxyHotkeys runs PROXY HOTKEYS and checks the shape of its reply
// (rewrite/report.go): an array of 30-element arrays of fields.
func hkmProxyHotkeys(t testing.TB, addr string) map[string]hkmReportEntry {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, MaxRetries: -1})
	defer c.Close()
	v, err := c.Do(context.Background(), "PROXY", "HOTKEYS").Result()
	if err != nil {
		t.Fatalf("PROXY HOTKEYS: %v", err)
	}
	entries, ok := v.([]any)
	if !ok {
		t.Fatalf("PROXY HOTKEYS replied %T %v, want an array", v, v)
	}
	strs := func(x any, what string) []string {
		arr, ok := x.([]any)
		if !ok {
			t.Fatalf("PROXY HOTKEYS: %s is %T %v, want an array", what, x, x)
		}
		out := make([]string, len(arr))
		for i, a := range arr {
			if out[i], ok = a.(string); !ok {
				t.Fatalf("PROXY HOTKEYS: %s[%d] is %T %v, want a bulk string", what, i, a, a)
			}
		}
		return out
	}
	out := make(map[string]hkmReportEntry)
	for i, en := range entries {
		f, ok := en.([]any)
		if !ok || len(f) != 30 {
			t.Fatalf("PROXY HOTKEYS entry %d: %#v, want an array of 30 elements", i, en)
		}
		names := []string{"key", "buckets", "sum", "sold_out", "bucket_keys", "nodes", "values"}
		for j, n := range names {
			if f[2*j] != n {
				t.Fatalf("PROXY HOTKEYS entry %d: element %d is %#v, want the field name %q", i, 2*j, f[2*j], n)
			}
		}
		scalar := func(j int) string {
			s, ok := f[2*j+1].(string)
			if !ok {
				t.Fatalf("PROXY HOTKEYS entry %d: field %s is %T %v, want a bulk string", i, names[j], f[2*j+1], f[2*j+1])
			}
			return s
		}
		e := hkmReportEntry{key: scalar(0), buckets: scalar(1), sum: scalar(2), soldOut: scalar(3),
			bucketKeys: strs(f[9], "bucket_keys"), nodes: strs(f[11], "nodes"), values: strs(f[13], "values"),
			counters: make(map[string]uint64)}
		for j := 14; j < len(f); j += 2 {
			name, _ := f[j].(string)
			v, _ := f[j+1].(string)
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("PROXY HOTKEYS entry %d: counter %q is %#v, want a number", i, name, f[j+1])
			}
			e.counters[name] = n
		}
		out[e.key] = e
	}
	return out
}

// TestHotKeyPlacement (cluster): the 8 buckets of a hot key spread over the
// 3 masters, ⌊8/3⌋ or ⌈8/3⌉ each, their names contain the key, a hash tag
// inside the key does not pull them into one slot, SET splits the value
// evenly with the remainder on the first buckets (contract 1, 8), and
// PROXY HOTKEYS lists each bucket with its node and value, and the sum.
func TestHotKeyPlacement(t *testing.T) {
	e := hkmStart(t, config.ModeCluster, config.KeyRule{Match: "stock:*", Buckets: hkmBucketCount, Route: config.RouteRandom})
	owner, masters := hkmMasterOfSlot(t, e.direct)
	if len(masters) != 3 {
		t.Fatalf("CLUSTER SLOTS shows masters %v, want 3", masters)
	}
	c := dialRaw(t, e.addr)
	ctx := context.Background()
	const total = 83 // 10 each, the 3 left over one each on buckets 0-2
	// stock:converted holds a plain value with a TTL before the proxy
	// meets it: converted, it is spread the same way, TTL kept.
	keys := []string{"stock:place", "stock:{sku1001}", "stock:converted"}
	for _, key := range keys {
		if key == "stock:converted" {
			if err := e.direct.Set(ctx, key, total, 100*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			if r := c.do("GET", key); r != hkmBulk(strconv.Itoa(total)) {
				t.Fatalf("GET %s through the proxy (converts it) = %q, want %q", key, r, hkmBulk(strconv.Itoa(total)))
			}
		} else if r := c.do("SET", key, strconv.Itoa(total)); r != "+OK\r\n" {
			t.Fatalf("SET %s %d through the proxy: %q", key, total, r)
		}
		st := e.mustRead(t, key)
		if !st.exists {
			t.Fatalf("%s: no layout in Redis after SET", key)
		}
		t.Logf("%s: %s", key, st)
		if st.layout.N() != hkmBucketCount {
			t.Errorf("%s: %d buckets, want %d", key, st.layout.N(), hkmBucketCount)
		}
		perMaster := make(map[string][]string)
		slotsSeen := make(map[int64]bool)
		for i := 0; i < st.layout.N(); i++ {
			b := string(st.layout.Bucket(i))
			if !strings.Contains(b, key) {
				t.Errorf("%s: bucket %d is named %q, which does not contain the key", key, i, b)
			}
			slot, err := e.direct.ClusterKeySlot(ctx, b).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %s: %v", b, err)
			}
			slotsSeen[slot] = true
			m := owner(slot)
			perMaster[m] = append(perMaster[m], fmt.Sprintf("%s (slot %d)", b, slot))
			want := int64(total / hkmBucketCount)
			if i < total%hkmBucketCount {
				want++
			}
			if st.values[i] != want || st.absent[i] {
				t.Errorf("%s: bucket %d %s holds %d (absent %v), want %d: n/N each, the remainder one each on the first buckets",
					key, i, b, st.values[i], st.absent[i], want)
			}
			if key == "stock:converted" {
				if ttl := e.direct.TTL(ctx, b).Val(); ttl < 90*time.Second || ttl > 100*time.Second {
					t.Errorf("%s: bucket %s has TTL %v, want the key's (~100s)", key, b, ttl)
				}
			}
		}
		lo, hi := hkmBucketCount/len(masters), (hkmBucketCount+len(masters)-1)/len(masters)
		for _, m := range masters {
			if n := len(perMaster[m]); n < lo || n > hi {
				t.Errorf("%s: master %s holds %d buckets %v, want %d or %d (all: %v)", key, m, n, perMaster[m], lo, hi, perMaster)
			}
		}
		if len(slotsSeen) < 2 {
			t.Errorf("%s: all %d buckets are in one slot %v: the key's hash tag captured them", key, st.layout.N(), slotsSeen)
		}
		t.Logf("%s: buckets per master %v; %d distinct slots", key, perMaster, len(slotsSeen))
		if r := c.do("GET", key); r != hkmBulk(strconv.Itoa(total)) {
			t.Errorf("GET %s through the proxy = %q, want %q", key, r, hkmBulk(strconv.Itoa(total)))
		}
	}

	// Take 2 from one of them, so that the sum shown is not the one SET.
	if r := c.do("DECRBY", keys[0], "2"); r != hkmInt(total-2) {
		t.Fatalf("DECRBY %s 2 = %q, want %q", keys[0], r, hkmInt(total-2))
	}
	report := hkmProxyHotkeys(t, e.addr)
	for _, key := range keys {
		en, ok := report[key]
		if !ok {
			t.Errorf("PROXY HOTKEYS does not list %s; it lists %v", key, slices.Sorted(func(yield func(string) bool) {
				for k := range report {
					if !yield(k) {
						return
					}
				}
			}))
			continue
		}
		st := e.mustRead(t, key)
		if en.buckets != strconv.Itoa(st.layout.N()) {
			t.Errorf("PROXY HOTKEYS %s: buckets %q, want %d", key, en.buckets, st.layout.N())
		}
		if en.sum != strconv.FormatInt(st.sum, 10) {
			t.Errorf("PROXY HOTKEYS %s: sum %q, but the buckets in Redis add up to %d", key, en.sum, st.sum)
		}
		if en.soldOut != "no" {
			t.Errorf("PROXY HOTKEYS %s: sold_out %q, want no", key, en.soldOut)
		}
		if len(en.bucketKeys) != st.layout.N() || len(en.nodes) != st.layout.N() || len(en.values) != st.layout.N() {
			t.Errorf("PROXY HOTKEYS %s: %d bucket_keys, %d nodes, %d values; want %d of each", key,
				len(en.bucketKeys), len(en.nodes), len(en.values), st.layout.N())
			continue
		}
		for i := 0; i < st.layout.N(); i++ {
			b := string(st.layout.Bucket(i))
			slot, err := e.direct.ClusterKeySlot(ctx, b).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %s: %v", b, err)
			}
			if en.bucketKeys[i] != b {
				t.Errorf("PROXY HOTKEYS %s: bucket_keys[%d] = %q, want %q (from the layout in Redis)", key, i, en.bucketKeys[i], b)
			}
			if en.nodes[i] != owner(slot) {
				t.Errorf("PROXY HOTKEYS %s: nodes[%d] = %q, but %s (slot %d) is on %s", key, i, en.nodes[i], b, slot, owner(slot))
			}
			if en.values[i] != strconv.FormatInt(st.values[i], 10) {
				t.Errorf("PROXY HOTKEYS %s: values[%d] = %q, but %s holds %d", key, i, en.values[i], b, st.values[i])
			}
		}
	}
}

// ---------------------------------------------------------------------------
// Seed scenario

// TestHotKeySeedScenario: the buckets hold [0, 5, 0, 0, …] (the stock of
// 5 all in bucket 1): clients whose start bucket is empty still buy — 5
// deducts succeed, each reply the stock left, and the 6th is sold out.
// Both routes (random, client), and with the proxy's memory of the buckets
// stale (it last saw [1, 1, 1, 1, 1, 0, 0, 0]) or fresh (a GET read them).
func TestHotKeySeedScenario(t *testing.T) {
	for _, mode := range hkmModes {
		t.Run(mode, func(t *testing.T) {
			e := hkmStart(t, mode,
				config.KeyRule{Match: "stock:seed:random:*", Buckets: hkmBucketCount, Route: config.RouteRandom},
				config.KeyRule{Match: "stock:seed:client:*", Buckets: hkmBucketCount, Route: config.RouteClient})
			ctx := context.Background()
			for _, route := range []string{config.RouteRandom, config.RouteClient} {
				for _, memory := range []string{"stale", "fresh"} {
					key := "stock:seed:" + route + ":" + memory
					setup := dialRaw(t, e.addr)
					if r := setup.do("SET", key, "5"); r != "+OK\r\n" {
						t.Fatalf("SET %s 5: %q", key, r)
					}
					st := e.mustRead(t, key)
					if !st.exists || st.sum != 5 {
						t.Fatalf("%s after SET 5: %s", key, st)
					}
					// Move all the stock to bucket 1, straight in Redis.
					for i := 0; i < st.layout.N(); i++ {
						v := "0"
						if i == 1 {
							v = "5"
						}
						if err := e.direct.Set(ctx, string(st.layout.Bucket(i)), v, redis.KeepTTL).Err(); err != nil {
							t.Fatal(err)
						}
					}
					st = e.mustRead(t, key)
					t.Logf("%s: %s", key, st)
					if memory == "fresh" {
						if r := setup.do("GET", key); r != hkmBulk("5") {
							t.Fatalf("GET %s after moving the stock to bucket 1 = %q, want %q", key, r, hkmBulk("5"))
						}
					}
					// 6 clients, one deduct each, in turn: with route
					// client their start buckets are their own, and at
					// most one of them starts at bucket 1.
					var got []string
					for c := 0; c < 6; c++ {
						got = append(got, dialRaw(t, e.addr).do("EVAL", e.scripts.one.Body, "1", key))
					}
					// A 7th deduct, by a client that already bought.
					got = append(got, setup.do("EVALSHA", e.scripts.oneSHA, "1", key))
					want := []string{hkmInt(4), hkmInt(3), hkmInt(2), hkmInt(1), hkmInt(0), e.scripts.soldout, e.scripts.soldout}
					for i := range want {
						succeeded := got[i] != e.scripts.soldout && strings.HasPrefix(got[i], ":")
						switch {
						case i < 5 && !succeeded:
							t.Errorf("%s %s, route %s, proxy memory %s: deduct %d = %q: a false sold-out, %d units are still in bucket 1 (all replies %q)",
								mode, key, route, memory, i+1, got[i], 5-i, got)
						case i >= 5 && got[i] != e.scripts.soldout:
							t.Errorf("%s %s, route %s, proxy memory %s: deduct %d = %q after 5 units were sold: oversell, want %q (all replies %q)",
								mode, key, route, memory, i+1, got[i], e.scripts.soldout, got)
						case got[i] != want[i] && (memory == "fresh" || strings.HasPrefix(got[i], ":-")):
							// Sold the unit, but the stock it says is left
							// is not what a plain key would say. The reply
							// is the sum as this proxy last saw the buckets
							// (README, Hot keys): exact when it saw every
							// change, and never negative after a sale; with
							// the buckets moved behind its back (memory
							// stale) only the sale and the sign are checked.
							t.Errorf("%s %s, route %s, proxy memory %s: deduct %d sold a unit but replied %q remaining, want %q: the key held %d, so a plain key would reply %d (all replies %q; Redis held %s before the deducts)",
								mode, key, route, memory, i+1, got[i], want[i], 5-i, 4-i, got, st)
						}
					}
					if r := setup.do("GET", key); r != hkmBulk("0") {
						t.Errorf("GET %s after the sell-out = %q, want %q", key, r, hkmBulk("0"))
					}
					if st := e.mustRead(t, key); st.sum != 0 {
						t.Errorf("%s after the sell-out: Redis holds %s, want sum 0", key, st)
					}
				}
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Stale proxy

// TestHotKeyStaleProxy: proxies that do not know a key is hot (stale: their
// config lacks the rule, and they started after the key was made, so they
// missed the news) and one that does (fresh), on the same Redis. After the
// fresh one SETs the key to 100, the key holds the layout marker, which is
// not an integer, so a stale DECR, INCR or deduct script fails at Redis
// instead of selling from a stale plain value; the stale proxy then sees
// the layout, learns the key is hot, and answers the command as on a hot
// key. Its GET and MGET learn it from the value (contract 9).
func TestHotKeyStaleProxy(t *testing.T) {
	for _, mode := range hkmModes {
		t.Run(mode, func(t *testing.T) {
			rule := config.KeyRule{Match: "stock:*", Buckets: hkmBucketCount, Route: config.RouteRandom}
			e := hkmStart(t, mode, rule)
			sc := e.scripts
			fresh := dialRaw(t, e.addr)
			const key = "stock:stale"
			if r := fresh.do("SET", key, "100"); r != "+OK\r\n" {
				t.Fatalf("fresh SET %s 100: %q", key, r)
			}
			fresh.do("SCRIPT", "LOAD", sc.one.Body)
			fresh.do("SCRIPT", "LOAD", sc.n.Body)
			ctx := context.Background()
			// At Redis, the layout fails them all.
			if err := e.direct.Decr(ctx, key).Err(); err == nil || !strings.Contains(err.Error(), "not an integer") {
				t.Errorf("DECR %s straight at Redis: %v, want not an integer", key, err)
			}
			if err := e.direct.EvalSha(ctx, sc.oneSHA, []string{key}).Err(); err == nil {
				t.Errorf("deduct-one on %s straight at Redis succeeded: the layout must make it fail", key)
			}
			// Each through a stale proxy of its own, which learns from
			// that command's failure: the answer of a hot key.
			want := int64(100)
			for _, cmd := range [][]string{
				{"DECR", key}, {"DECRBY", key, "3"}, {"INCR", key}, {"INCRBY", key, "3"},
				{"EVAL", sc.one.Body, "1", key}, {"EVALSHA", sc.oneSHA, "1", key},
				{"EVAL", sc.n.Body, "1", key, "1"}, {"EVALSHA", sc.nSHA, "1", key, "2"},
				{"GET", key}, {"MGET", "nokey", key},
			} {
				stale := dialRaw(t, e.startSecondProxy(t))
				var w string
				switch cmd[0] {
				case "DECR", "INCR":
					want += map[string]int64{"DECR": -1, "INCR": 1}[cmd[0]]
					w = hkmInt(want)
				case "DECRBY", "INCRBY":
					want += map[string]int64{"DECRBY": -3, "INCRBY": 3}[cmd[0]]
					w = hkmInt(want)
				case "EVAL", "EVALSHA":
					n := int64(1)
					if len(cmd) == 5 {
						n, _ = strconv.ParseInt(cmd[4], 10, 64)
					}
					want -= n
					w = hkmInt(want)
				case "GET":
					w = hkmBulk(strconv.FormatInt(want, 10))
				case "MGET":
					w = "*2\r\n$-1\r\n" + hkmBulk(strconv.FormatInt(want, 10))
				}
				if r := stale.do(cmd...); r != w {
					t.Errorf("stale proxy %s %s…: %q, want %q: it must learn from the layout and answer as on a hot key", cmd[0], hkmShort(cmd[1], 20), r, w)
				}
			}
			if r := fresh.do("GET", key); r != hkmBulk(strconv.FormatInt(want, 10)) {
				t.Errorf("fresh proxy GET %s = %q, want %d", key, r, want)
			}
			if st := e.mustRead(t, key); st.sum != want {
				t.Errorf("%s: Redis holds %s, want sum %d", key, st, want)
			}

			// A stale proxy's SET or DEL does act on the key (they apply
			// to any string), leaving the old buckets behind. The fresh
			// proxy must then answer from the key, never from those
			// leftovers ("none acts on leftover or internal state"). It
			// may trust its memory of the layout for up to the recheck
			// interval (1 s), so wait past it.
			const recheck = 1100 * time.Millisecond
			stale := dialRaw(t, e.startSecondProxy(t)) // one that has not learned
			if r := stale.do("SET", key, "50"); r != "+OK\r\n" {
				t.Fatalf("stale SET %s 50: %q", key, r)
			}
			time.Sleep(recheck)
			if r := fresh.do("GET", key); r != hkmBulk("50") {
				st := e.mustRead(t, key)
				t.Errorf("after a stale SET %s 50, fresh GET = %q, want %q; Redis now holds %s (leftover buckets counted?)", key, r, hkmBulk("50"), st)
			}
			if r := stale.do("DEL", key); r != ":1\r\n" {
				t.Fatalf("stale DEL %s: %q", key, r)
			}
			time.Sleep(recheck)
			if r := fresh.do("GET", key); r != "$-1\r\n" {
				t.Errorf("after a stale DEL %s, fresh GET = %q, want nil", key, r)
			}
			if r := fresh.do("INCR", key); r != ":1\r\n" {
				st := e.mustRead(t, key)
				t.Errorf("after a stale DEL %s, fresh INCR = %q, want %q, as on a key that does not exist; Redis now holds %s (leftover buckets counted?)", key, r, ":1\r\n", st)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Refusals

// TestHotKeyRefusals: type commands, INCRBYFLOAT, RENAME, a non-integer
// SET, a hot key inside MULTI, an undeclared script and a 2-key script on a
// hot key all get an error that names the key and says why (contract 1, 3,
// 6; issue 4 point 4), and leave the key as it was.
func TestHotKeyRefusals(t *testing.T) {
	for _, mode := range hkmModes {
		t.Run(mode, func(t *testing.T) {
			e := hkmStart(t, mode, config.KeyRule{Match: "stock:*", Buckets: hkmBucketCount, Route: config.RouteRandom})
			sc := e.scripts
			c := dialRaw(t, e.addr)
			const key = "stock:refuse"
			prefix := hkmHotErrPrefix(key)
			if r := c.do("SET", key, "10"); r != "+OK\r\n" {
				t.Fatalf("SET %s 10: %q", key, r)
			}
			if r := c.do("SET", "plain:src", "x"); r != "+OK\r\n" {
				t.Fatalf("SET plain:src x: %q", r)
			}
			undeclSHA := strings.TrimSuffix(strings.SplitN(c.do("SCRIPT", "LOAD", sc.undeclared), "\r\n", 2)[1], "\r\n")
			refused := func(why string, cmd ...string) {
				t.Helper()
				r := c.do(cmd...)
				if !strings.HasPrefix(r, prefix) || !strings.HasSuffix(r, "\r\n") || strings.Count(r, "\r\n") != 1 {
					t.Errorf("%v = %q, want an error starting %q", hkmShortArgs(cmd), r, prefix)
					return
				}
				if why != "" && !strings.Contains(r, why) {
					t.Errorf("%v = %q: the reason should mention %q", hkmShortArgs(cmd), r, why)
				}
			}
			refused("HSET", "HSET", key, "f", "v")
			refused("LPUSH", "LPUSH", key, "a")
			refused("APPEND", "APPEND", key, "x")
			refused("INCRBYFLOAT", "INCRBYFLOAT", key, "1.5")
			refused("RENAME", "RENAME", key, "plain:dst")
			refused("RENAME", "RENAME", "plain:src", key)
			refused("integer", "SET", key, "ten")
			refused("declared", "EVAL", sc.undeclared, "1", key)
			refused("declared", "EVALSHA", undeclSHA, "1", key)
			refused("key", "EVAL", sc.one.Body, "2", key, key)
			refused("key", "EVAL", sc.n.Body, "2", key, key, "1")
			refused("", "EVAL", sc.one.Body, "2", "{stock:refuse}x", key)

			// In MULTI: a command on the hot key it cannot queue (SET;
			// in cluster mode any) is refused, and EXEC discards the
			// whole transaction, as Redis does after a queueing error.
			if r := c.do("MULTI"); r != "+OK\r\n" {
				t.Fatalf("MULTI: %q", r)
			}
			if r := c.do("SET", "plain:tx", "1"); r != "+QUEUED\r\n" {
				t.Fatalf("SET plain:tx 1 in MULTI: %q", r)
			}
			refused("MULTI", "SET", key, "5")
			if r := c.do("EXEC"); r != "-EXECABORT Transaction discarded because of previous errors.\r\n" {
				t.Errorf("EXEC after a hot key in MULTI = %q, want EXECABORT", r)
			}
			if r := c.do("GET", "plain:tx"); r != "$-1\r\n" {
				t.Errorf("GET plain:tx after the aborted transaction = %q, want nil", r)
			}

			// Nothing was changed.
			if r := c.do("GET", key); r != hkmBulk("10") {
				t.Errorf("GET %s after the refusals = %q, want %q", key, r, hkmBulk("10"))
			}
			if st := e.mustRead(t, key); st.sum != 10 {
				t.Errorf("%s after the refusals: Redis holds %s, want sum 10", key, st)
			}
			if r := c.do("GET", "plain:src"); r != hkmBulk("x") {
				t.Errorf("GET plain:src after the refused RENAME = %q, want %q", r, hkmBulk("x"))
			}
		})
	}
}

// hkmShortArgs shortens long arguments (script bodies) for messages.
func hkmShortArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = hkmShort(a, 30)
	}
	return out
}
