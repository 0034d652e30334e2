package rewrite

// The moves between buckets on a real redis-server (standalone): the
// scripts as Redis 7.0 runs them, and a proxy killed after each step of
// each move, finished by another.

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// redisUpstream is an Upstream over one connection to a redis-server, the
// only master. Once dead, it sends nothing more: the proxy is killed.
type redisUpstream struct {
	t    testing.TB
	dead atomic.Bool

	mu sync.Mutex // guards nc and br
	nc net.Conn
	br *bufio.Reader
}

func dialRedis(t testing.TB, addr string) *redisUpstream {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &redisUpstream{t: t, nc: nc, br: bufio.NewReader(nc)}
}

func (u *redisUpstream) Do(reqs []Request) [][]byte {
	out := make([][]byte, len(reqs))
	if u.dead.Load() {
		for i := range out {
			out[i] = []byte("-ERR upstream unavailable: the proxy is dead\r\n")
		}
		return out
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	var buf []byte
	for _, r := range reqs {
		buf = resp.AppendCommand(buf, r.Args...)
	}
	u.nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := u.nc.Write(buf); err != nil {
		u.t.Fatalf("write to redis: %v", err)
	}
	for i := range out {
		r, err := resp.ReadReply(u.br, nil)
		if err != nil {
			u.t.Fatalf("read from redis: %v", err)
		}
		out[i] = r
	}
	return out
}

func (u *redisUpstream) Placement() (int, func(uint16) int) { return 1, func(uint16) int { return 0 } }
func (u *redisUpstream) Node(uint16) string                 { return u.nc.RemoteAddr().String() }

// do sends one command straight to Redis.
func (u *redisUpstream) do(args ...string) string {
	u.t.Helper()
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	return string(u.Do([]Request{{Key: bs[min(1, len(bs)-1)], Args: bs}})[0])
}

// redisEngine is an engine over its own connection to addr: keys "k…"
// hot by rule with 4 buckets, the deduct script deduct-n, move_timeout
// 40ms.
func redisEngine(t testing.TB, addr string) (*Engine, *redisUpstream) {
	t.Helper()
	cfg := config.Default()
	cfg.Hotkeys.Keys = []config.KeyRule{{Match: "k*", Buckets: 4, Route: config.RouteRandom}}
	cfg.Hotkeys.MoveTimeout = config.Duration(40 * time.Millisecond)
	cfg.Scripts = []config.Script{{Name: "deduct-n", Body: deductN, Amount: config.Amount{ArgvIndex: 1}, Soldout: -1}}
	u := dialRedis(t, addr)
	return New(u, cfg, slog.New(slog.DiscardHandler)), u
}

// TestMoveScriptsOnRedis: the steps of a move as Redis runs them — the
// take records its intent with it, an apply applied twice is applied
// once, an undo gives back once, the records keep their bucket's TTL and
// more, and old applied marks go once their intent is gone.
func TestMoveScriptsOnRedis(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{})
	e, u := redisEngine(t, rs.Addr())
	if r := string(e.Do(cmd("SET k 20 PX 100000"), 1, 0)); r != okR {
		t.Fatalf("SET: %q", r)
	}
	h := e.key([]byte("k"))
	l := h.layout.Load()
	get := func(i int) string { return u.do("GET", string(l.Bucket(i))) }

	m, err := e.startMove(h, l, 1, 0, 3)
	if err != nil || m.amount != 3 || get(1) != bulk("2") {
		t.Fatalf("take 3 of 5: %+v, %v; bucket 1 holds %q", m, err, get(1))
	}
	rec := u.do("HGET", string(l.IntentsKey(1)), m.id)
	if !regexp.MustCompile(`^\$\d+\r\n0 3 \d{13}\r\n$`).MatchString(rec) {
		t.Errorf("the intent recorded: %q, want \"0 3 <ms>\"", rec)
	}
	if ttl, _ := resp.IntValue([]byte(u.do("PTTL", string(l.IntentsKey(1))))); ttl < appliedKeep.Milliseconds() {
		t.Errorf("the intents' PTTL %d ms, want past the bucket's by appliedKeep", ttl)
	}
	if m, _ := e.startMove(h, l, 1, 0, 10); m.amount != 2 || get(1) != bulk("0") {
		t.Errorf("take 10 of 2: took %d, bucket holds %q; want 2, never below zero", m.amount, get(1))
	}
	if m, _ := e.startMove(h, l, 1, 0, 1); m.amount != 0 {
		t.Errorf("take from an empty bucket took %d", m.amount)
	}
	for range 2 {
		if n, err := e.settle(h, l, []move{m}); n != 1 || err != nil {
			t.Fatalf("settle: %d, %v", n, err)
		}
	}
	if get(0) != bulk("8") {
		t.Errorf("bucket 0 after the move applied twice: %q, want 8 (5 + 3, once)", get(0))
	}

	// Bucket 2 deleted behind the proxy: the move to it is undone, once,
	// and the bucket found lost.
	m2, _ := e.startMove(h, l, 3, 2, 4)
	u.do("DEL", string(l.Bucket(2)))
	_, err = e.settle(h, l, []move{m2})
	if !isLost(err) || !strings.Contains(err.Error(), "lost bucket 2") || get(3) != bulk("5") {
		t.Errorf("a move to a deleted bucket: %v, bucket 3 holds %q; want lost bucket 2 and 5 given back", err, get(3))
	}
	if r := u.do("EVALSHA", string(scriptUndo.sha), "2", string(l.Bucket(3)), string(l.IntentsKey(3)), m2.id); r != pair2(0, 0) || get(3) != bulk("5") {
		t.Errorf("the undo again: %q, bucket 3 holds %q; want {0, 0} and nothing given back twice", r, get(3))
	}
	if r := u.do("HGET", string(l.LostKey()), "2"); !strings.HasPrefix(r, "$") || !strings.Contains(r, "5 ") {
		t.Errorf("the lost record of bucket 2: %q, want its 5 units", r)
	}

	// An applied mark older than appliedKeep goes once its intent is gone;
	// one whose intent is still there stays.
	past := strconv.FormatInt(time.Now().Add(-2*appliedKeep).UnixMilli(), 10)
	u.do("ZADD", string(l.AppliedKey(0)), past, "gone-long-ago", past, "still-in-flight")
	u.do("HSET", string(l.IntentsKey(1)), "still-in-flight", "0 0 "+strconv.FormatInt(time.Now().UnixMilli(), 10))
	if _, err := e.finishMoves(h, l, time.Hour); err != nil {
		t.Fatal(err)
	}
	if r := u.do("ZRANGE", string(l.AppliedKey(0)), "0", "-1"); strings.Contains(r, "gone-long-ago") || !strings.Contains(r, "still-in-flight") {
		t.Errorf("applied marks after the sweep: %q, want the old one gone and the one in flight kept", r)
	}
}

// TestMoveKilledOnRedis kills the proxy (its upstream goes dead) after
// each step of each kind of move — a gather, a debt's gather, a merge, a
// conversion — and lets a second proxy, restarted, finish: the stock is
// whole (what the buckets or the key hold plus what was sold), no intent
// is left, and no key but the layout's buckets and their applied marks.
func TestMoveKilledOnRedis(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{})
	const stock = 20
	for _, op := range []struct {
		name  string
		key   string
		setup func(e *Engine, u *redisUpstream, key string)
		run   func(e *Engine, key string) (sold int64)
	}{
		{"gather", "k:gather", func(e *Engine, _ *redisUpstream, key string) {
			e.Do(cmd("SET "+key+" 20"), 1, 0)
		}, func(e *Engine, key string) int64 {
			// EVAL: a fresh Redis holds no script for EVALSHA.
			eval := [][]byte{[]byte("EVAL"), []byte(deductN), []byte("1"), []byte(key), []byte("12")}
			if r, ok := resp.IntValue(e.Do(eval, 3, 0)); ok && r >= 0 {
				return 12
			}
			return 0
		}},
		{"debt", "k:debt", func(e *Engine, _ *redisUpstream, key string) {
			e.Do(cmd("SET "+key+" 20"), 1, 0)
		}, func(e *Engine, key string) int64 {
			if _, ok := resp.IntValue(e.Do(cmd("DECRBY "+key+" 25"), 1, 0)); ok {
				return 25
			}
			return 0
		}},
		{"merge", "j:merge", func(e *Engine, _ *redisUpstream, key string) {
			e.Learn([]byte(key))
			e.Shard([]byte(key), 4)
			e.Do(cmd("SET "+key+" 20"), 1, 0)
		}, func(e *Engine, key string) int64 {
			e.clock = &fakeClock{} // no wait after the flip
			e.Unshard([]byte(key))
			return 0
		}},
		{"conversion", "k:convert", func(_ *Engine, u *redisUpstream, key string) {
			u.do("SET", key, "20")
		}, func(e *Engine, key string) int64 {
			e.Do(cmd("GET "+key), 1, 0)
			return 0
		}},
	} {
		t.Run(op.name, func(t *testing.T) {
			// How many steps the move has, when nothing kills it.
			e, u := redisEngine(t, rs.Addr())
			key := op.key + ":count"
			op.setup(e, u, key)
			var steps []string
			e.SetMoveHook(func(s string) { steps = append(steps, s) })
			op.run(e, key)
			if len(steps) == 0 {
				t.Fatalf("%s: no step told the hook", op.name)
			}
			for k := range len(steps) + 1 { // k = len: killed after the last step
				key := op.key + ":" + strconv.Itoa(k)
				victim, vu := redisEngine(t, rs.Addr())
				op.setup(victim, vu, key)
				n := 0
				victim.SetMoveHook(func(string) {
					if n++; n == k+1 {
						vu.dead.Store(true)
					}
				})
				sold := op.run(victim, key)
				if k < len(steps) && !vu.dead.Load() {
					t.Fatalf("kill after step %d (%s) did not happen", k+1, steps[k])
				}
				survivor, su := redisEngine(t, rs.Addr())
				survivor.Learn([]byte(key))
				survivor.Do(cmd("GET "+key), 1, 0) // finds the layout, completes or merges it
				time.Sleep(25 * time.Millisecond)  // past half of move_timeout
				survivor.FinishMoves()
				where := fmt.Sprintf("killed after step %d of %v", k+1, steps)
				if k == len(steps) {
					where = "not killed"
				}
				checkWhole(t, su, key, stock-sold, where)
			}
		})
	}
}

// checkWhole checks what Redis holds of key: want in all (its buckets'
// sum, or its plain value), no intent, no key but its layout's buckets
// and their applied marks.
func checkWhole(t *testing.T, u *redisUpstream, key string, want int64, where string) {
	t.Helper()
	v, _ := resp.BulkValue([]byte(u.do("GET", key)))
	named := map[string]bool{}
	var sum int64
	l, err := ParseMarker(key, v)
	switch {
	case err == nil:
		for i := range l.N() {
			b := string(l.Bucket(i))
			named[b], named[b+":applied"] = true, true
			n, _ := resp.BulkValue([]byte(u.do("GET", b)))
			x, _ := strconv.ParseInt(string(n), 10, 64)
			sum += x
		}
	default:
		sum, _ = strconv.ParseInt(string(v), 10, 64)
	}
	keys, _ := resp.ArrayElems([]byte(u.do("KEYS", "*"+key+"#*")), nil)
	var strays []string
	for _, k := range keys {
		if b, _ := resp.BulkValue(k); !named[string(b)] {
			strays = append(strays, string(b))
		}
	}
	slices.Sort(strays)
	if sum != want || len(strays) > 0 {
		t.Errorf("%s, %s: Redis holds %d (%q), want %d; keys left behind: %v", key, where, sum, v, want, strays)
	}
}
