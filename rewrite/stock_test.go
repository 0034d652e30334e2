package rewrite

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
)

// step is one command a client sends on hot key k, the requests the
// engine is to send for it and what Redis answers them, and the reply the
// client is to get.
type step struct {
	wait   time.Duration // the clock moves on by this first
	cmd    string        // split at spaces
	client uint64
	want   []exchange
	reply  string
}

// run sends each step's command through Do, the public boundary, and
// checks its requests and reply exactly.
func run(t *testing.T, e *Engine, f *fakeUpstream, c *fakeClock, steps []step) {
	t.Helper()
	for i, st := range steps {
		c.now = c.now.Add(st.wait)
		f.want = append(f.want, st.want...)
		args := cmd(st.cmd)
		keyAt := 1
		if strings.HasPrefix(strings.ToLower(st.cmd), "eval") {
			keyAt = 3
		}
		got := string(e.Do(args, keyAt, st.client))
		if f.next != len(f.want) {
			t.Fatalf("step %d (%s): %d of %d requests sent", i+1, st.cmd, f.next, len(f.want))
		}
		if got != st.reply {
			t.Fatalf("step %d (%s): reply %q, want %q", i+1, st.cmd, got, st.reply)
		}
	}
}

// big is what the debt's gather asks of bucket b: everything (2^62) less
// what bucket 0 holds.
func big(less int64) string { return itoa(1<<62 - less) }

func itoa(n int64) string { return num(n)[1 : len(num(n))-2] }

var (
	one  = "EVALSHA " + sha(deductOne) + " 1 k"
	five = "EVALSHA " + sha(deductN) + " 1 k 5"
)

func TestDeduct(t *testing.T) {
	for _, tc := range []struct {
		name  string
		route string
		start int // the random start bucket; -1: not to be drawn
		steps []step
	}{
		{"the start bucket covers", config.RouteRandom, 2, []step{{
			cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{{"EVALSHA deduct 1 k#2 1", num(4)}}), reply: num(19),
		}}},
		{"ring order from the start, past buckets seen short", config.RouteRandom, 2, []step{{
			cmd: one, want: join(loaded(0, 3, 0, 0), []exchange{{"EVALSHA deduct 1 k#1 1", num(2)}}), reply: num(2),
		}}},
		{"a bucket found short in Redis: the ring goes on", config.RouteRandom, 3, []step{{
			cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{
				{"EVALSHA deduct 1 k#3 1", pair2(0, 0)},
				{"EVALSHA deduct 1 k#0 1", num(4)},
			}), reply: num(14),
		}}},
		{"route client: the client's bucket", config.RouteClient, -1, []step{
			{cmd: one, client: 6, want: join(loaded(5, 5, 5, 5), []exchange{{"EVALSHA deduct 1 k#2 1", num(4)}}), reply: num(19)},
			{cmd: one, client: 7, want: []exchange{{"EVALSHA deduct 1 k#3 1", num(4)}}, reply: num(18)},
		}},
		{"a node without the script gets its body", config.RouteRandom, 0, []step{{
			cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{
				{"EVALSHA deduct 1 k#0 1", errR("NOSCRIPT No matching script. Please use EVAL.")},
				{"EVAL deduct 1 k#0 1", num(4)},
			}), reply: num(19),
		}}},
		{"no bucket covers, together they do: gathered into bucket 0", config.RouteRandom, 1, []step{{
			cmd: five, want: join(loaded(2, 2, 2, 2), reads(2, 2, 2, 2),
				moveSteps(1, 3, "m1", 2, 0, 4), moveSteps(2, 1, "m2", 1, 1, 5),
				[]exchange{{"EVALSHA deduct 1 k#0 5", num(0)}}), reply: num(3),
		}}},
		{"together they cannot: sold out after two reads, no move in flight", config.RouteRandom, 0, []step{{
			cmd: five, want: join(loaded(2, 1, 1, 0), reads(2, 1, 1, 0), sweep(), reads(2, 1, 1, 0), sweep()), reply: num(-1),
		}}},
		{"a move by another proxy seen on the second read", config.RouteRandom, 0, []step{{
			cmd: five, want: join(loaded(2, 1, 1, 0), reads(2, 1, 1, 0), sweep(), reads(5, 0, 0, 0),
				[]exchange{{"EVALSHA deduct 1 k#0 5", num(0)}}), reply: num(0),
		}}},
		{"a move in flight (another proxy's, or a dead one's) finished, not sold out", config.RouteRandom, 0, []step{{
			cmd: five, want: join(loaded(2, 2, 1, 0), reads(2, 2, 0, 0), []exchange{
				{listMoves("k", 0), movesOf(true, nil)},
				{listMoves("k", 1), movesOf(true, nil)},
				{listMoves("k", 2), movesOf(true, []string{"x9", "0 1 " + itoa(nowMs)})},
				{listMoves("k", 3), movesOf(true, nil)},
				{"EVALSHA apply 2 k#0 k#0:applied x9 1 <keep>", pair2(1, 3)},
				{"HDEL k#2:intents x9", num(1)},
			}, reads(3, 2, 0, 0), moveSteps(1, 2, "m1", 2, 0, 5),
				[]exchange{{"EVALSHA deduct 1 k#0 5", num(0)}}), reply: num(0),
		}}},
		{"gathered stock taken meanwhile: read again, sold out", config.RouteRandom, 1, []step{{
			cmd: five, want: join(loaded(2, 2, 2, 2), reads(2, 2, 2, 2),
				moveSteps(1, 3, "m1", 2, 0, 4), moveSteps(2, 1, "m2", 1, 1, 5),
				[]exchange{{"EVALSHA deduct 1 k#0 5", pair2(0, 3)}},
				reads(3, 0, 1, 0), sweep(), reads(3, 0, 1, 0), sweep()), reply: num(-1),
		}}},
		{"bucket 0's node fails the gather: the move is left to whoever looks next", config.RouteRandom, 0, []step{{
			cmd: five, want: join(loaded(2, 2, 2, 2), reads(2, 2, 2, 2), []exchange{
				{"EVALSHA take 2 k#1 k#1:intents 3 m1 0 <keep>", pair2(2, 0)},
				{"EVALSHA apply 2 k#0 k#0:applied m1 2 <keep>", downR},
			}), reply: downR,
		}}},
		{"bucket 0 gone in the gather: undone, the key read again", config.RouteRandom, 0, []step{{
			cmd: five, want: join(loaded(2, 2, 2, 2), reads(2, 2, 2, 2), []exchange{
				{"EVALSHA take 2 k#1 k#1:intents 3 m1 0 <keep>", pair2(2, 0)},
				{"EVALSHA apply 2 k#0 k#0:applied m1 2 <keep>", pair2(-2, 0)},
				{"EVALSHA undo 2 k#1 k#1:intents m1", pair2(1, 2)},
				{"EVALSHA lose 2 k k#0:lost layout:0 1 2 3 0 2 1000", pair2(0, 0)},
				{"GET k", nilR},
			}), reply: num(-1),
		}}},
		{"a take fails: the node's error", config.RouteRandom, 0, []step{{
			cmd: five, want: join(loaded(2, 2, 2, 2), reads(2, 2, 2, 2), []exchange{
				{"EVALSHA take 2 k#1 k#1:intents 3 m1 0 <keep>", errR("ERR something")},
			}), reply: errR("ERR something"),
		}}},
		{"a bucket's node down: passed over", config.RouteRandom, 0, []step{{
			cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{
				{"EVALSHA deduct 1 k#0 1", downR},
				{"EVALSHA deduct 1 k#1 1", num(4)},
			}), reply: num(19),
		}}},
		{"the stock's only node down: its error, never sold out", config.RouteRandom, 0, []step{{
			cmd: one, want: join(loaded(0, 5, 0, 0), []exchange{
				{"EVALSHA deduct 1 k#1 1", downR},
				{"GET k#0", bulk("0")}, {"GET k#1", downR}, {"GET k#2", bulk("0")}, {"GET k#3", bulk("0")},
			}), reply: downR,
		}}},
		{"the key's node down", config.RouteRandom, 0, []step{{
			cmd: one, want: []exchange{{"GET k", downR}}, reply: downR,
		}}},
		{"a node down as the layout is read: its bucket counts as empty", config.RouteRandom, 2, []step{{
			cmd: one, want: []exchange{
				{"GET k", bulk(marker)},
				{"GET k#0", bulk("5")}, {"GET k#1", bulk("5")}, {"GET k#2", downR}, {"GET k#3", bulk("5")},
				{"EVALSHA deduct 1 k#3 1", num(4)},
			}, reply: num(14),
		}}},
		{"a bucket missing in the ring, the layout replaced: the new layout is read", config.RouteRandom, 0, []step{{
			cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{
				{"EVALSHA deduct 1 k#0 1", pair2(-2, 0)},
				{"EVALSHA lose 2 k k#0:lost layout:0 1 2 3 0 5 1000", pair2(0, 0)},
				{"GET k", bulk("hotkeyproxy-layout:1:b:0 1 2 3")},
			}, reads(10, 0, 0, 0), []exchange{{"EVALSHA deduct 1 k#0 1", num(9)}}), reply: num(9),
		}}},
		{"a bucket missing on the slow path's read, the key gone", config.RouteRandom, 0, []step{{
			cmd: one, want: join(loaded(0, 0, 0, 0), []exchange{
				{"GET k#0", bulk("0")}, {"GET k#1", nilR}, {"GET k#2", bulk("0")}, {"GET k#3", bulk("0")},
				{"EVALSHA lose 2 k k#0:lost layout:0 1 2 3 1 0 1000", pair2(0, 0)},
				{"GET k", nilR},
			}), reply: num(-1),
		}}},
		{"a bucket missing as the key expires: the key read again", config.RouteRandom, 0, []step{{
			cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{
				{"EVALSHA deduct 1 k#0 1", pair2(-2, 0)},
				{"EVALSHA lose 2 k k#0:lost layout:0 1 2 3 0 5 1000", pair2(-1, 0)},
				{"GET k", nilR},
			}), reply: num(-1),
		}}},
		{"the layout replaced three times over: the key-gone error", config.RouteRandom, 0, []step{{
			cmd: one, want: join(
				loaded(5, 5, 5, 5), []exchange{{"EVALSHA deduct 1 k#0 1", pair2(-2, 0)}, {"EVALSHA lose 2 k k#0:lost layout:0 1 2 3 0 5 1000", pair2(0, 0)}},
				loaded(5, 5, 5, 5), []exchange{{"EVALSHA deduct 1 k#0 1", pair2(-2, 0)}, {"EVALSHA lose 2 k k#0:lost layout:0 1 2 3 0 5 1000", pair2(0, 0)}},
				loaded(5, 5, 5, 5), []exchange{{"EVALSHA deduct 1 k#0 1", pair2(-2, 0)}, {"EVALSHA lose 2 k k#0:lost layout:0 1 2 3 0 5 1000", pair2(0, 0)}},
			), reply: "-ERR hotkeyproxy: the key is gone\r\n",
		}}},
		{"a take answered with no pair: that reply, as it is", config.RouteRandom, 0, []step{{
			cmd: five, want: join(loaded(2, 2, 2, 2), reads(2, 2, 2, 2), []exchange{
				{"EVALSHA take 2 k#1 k#1:intents 3 m1 0 <keep>", num(7)},
			}), reply: num(7),
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, f, c := testEngine(t, tc.route, tc.start, nil)
			if tc.start < 0 {
				e.intN = func(int) int { t.Fatal("start bucket drawn for route: client"); return 0 }
			}
			run(t, e, f, c, tc.steps)
		})
	}
}

// TestSoldOutMemory drives the sold-out memory with the clock: answered
// locally within soldout_ttl, for the amount sold out or more, and
// forgotten on a give-back or when the buckets are read again.
func TestSoldOutMemory(t *testing.T) {
	soldOut := step{cmd: one, want: join(loaded(0, 0, 0, 0), reads(0, 0, 0, 0), sweep(), reads(0, 0, 0, 0), sweep()), reply: num(-1)}
	for _, tc := range []struct {
		name  string
		steps []step
		local uint64 // sold-out answers given without Redis
	}{
		{"remembered within soldout_ttl", []step{soldOut,
			{wait: 99 * time.Millisecond, cmd: one, reply: num(-1)},
			{cmd: five, reply: num(-1)},
		}, 2},
		{"a smaller amount than the one sold out asks Redis", []step{
			{cmd: five, want: join(loaded(2, 1, 1, 0), reads(2, 1, 1, 0), sweep(), reads(2, 1, 1, 0), sweep()), reply: num(-1)},
			{cmd: one, want: []exchange{{"EVALSHA deduct 1 k#0 1", num(1)}}, reply: num(3)},
		}, 0},
		// Past soldout_ttl the memory no longer answers (sold_out_local
		// stays), but the conclusion its expiry refreshed stands until
		// the layout's recheck: no request either.
		{"past soldout_ttl, before the recheck", []step{soldOut,
			{wait: 100 * time.Millisecond, cmd: one, reply: num(-1)},
		}, 0},
		{"past the recheck: read again, stock given back elsewhere sold", []step{soldOut,
			{wait: recheck, cmd: one, want: join(loaded(0, 0, 3, 0), []exchange{{"EVALSHA deduct 1 k#2 1", num(2)}}), reply: num(2)},
		}, 0},
		{"a give-back here forgets it", []step{soldOut,
			{cmd: "INCRBY k 3", want: []exchange{{"EVALSHA add 1 k#0 3", num(3)}}, reply: num(3)},
			{cmd: one, want: []exchange{{"EVALSHA deduct 1 k#0 1", num(2)}}, reply: num(2)},
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, f, c := testEngine(t, config.RouteRandom, 0, nil)
			start := c.now
			run(t, e, f, c, tc.steps)
			if s := e.Stats()[0]; s.SoldOutLocal != tc.local {
				t.Errorf("sold_out_local %d, want %d", s.SoldOutLocal, tc.local)
			}
			var waited time.Duration
			for _, st := range tc.steps {
				waited += st.wait
			}
			// The slow path sleeps a moveGap after each read short of
			// the amount, the second one included.
			if slept := c.now.Sub(start) - waited; slept != 2*moveGap {
				t.Errorf("slept %v, want two moveGaps (%v) for the sold-out reads", slept, 2*moveGap)
			}
		})
	}
}

// TestDebt drives DECR/DECRBY past the stock (bucket 0 goes negative, the
// others are emptied into it) and INCR/INCRBY, which repay bucket 0 first.
func TestDebt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"covered by one bucket", []step{
			{cmd: "DECRBY k 3", want: join(loaded(5, 5, 5, 5), []exchange{{"EVALSHA deduct 1 k#0 3", num(2)}}), reply: num(17)},
		}},
		{"past the stock: the rest gathered, bucket 0 negative", []step{
			{cmd: "DECRBY k 5", want: join(loaded(1, 1, 1, 0), reads(1, 1, 1, 0), sweep(), reads(1, 1, 1, 0), sweep(),
				moveSteps(1, 1<<62-1, "m1", 1, 0, 2), moveSteps(2, 1<<62-2, "m2", 1, 0, 3), moveSteps(3, 1<<62-3, "m3", 0, 0, 0),
				[]exchange{{"EVALSHA add 1 k#0 -5", num(-2)}}), reply: num(-2)},
			// Sold out for 5 is remembered: straight to the debt.
			{cmd: "DECRBY k 5", want: []exchange{{"EVALSHA add 1 k#0 -5", num(-7)}}, reply: num(-7)},
			{cmd: "INCRBY k 8", want: []exchange{{"EVALSHA add 1 k#0 8", num(1)}}, reply: num(1)},
		}},
		{"DECR; if < 0, INCR back", []step{
			{cmd: "DECR k", want: join(loaded(0, 0, 0, 0), reads(0, 0, 0, 0), sweep(), reads(0, 0, 0, 0), sweep(), []exchange{
				{"EVALSHA add 1 k#0 -1", num(-1)},
			}), reply: num(-1)},
			{cmd: "INCR k", want: []exchange{{"EVALSHA add 1 k#0 1", num(0)}}, reply: num(0)},
		}},
		{"a node fails the debt's gather", []step{
			{cmd: "DECRBY k 5", want: join(loaded(1, 1, 1, 0), reads(1, 1, 1, 0), sweep(), reads(1, 1, 1, 0), sweep(), []exchange{
				{"EVALSHA take 2 k#1 k#1:intents " + big(1) + " m1 0 <keep>", downR},
			}), reply: downR},
		}},
		{"bucket 0's node fails the debt", []step{
			{cmd: "DECR k", want: join(loaded(0, 0, 0, 0), reads(0, 0, 0, 0), sweep(), reads(0, 0, 0, 0), sweep(), []exchange{
				{"EVALSHA add 1 k#0 -1", downR},
			}), reply: downR},
		}},
		{"bucket 0's node fails a give-back", []step{
			{cmd: "INCR k", want: join(loaded(0, 0, 0, 0), []exchange{{"EVALSHA add 1 k#0 1", downR}}), reply: downR},
		}},
		{"bucket 0 gone on a give-back: the new layout takes it", []step{
			{cmd: "INCRBY k 2", want: join(loaded(0, 0, 0, 0), []exchange{
				{"EVALSHA add 1 k#0 2", pair2(-2, 0)},
				{"EVALSHA lose 2 k k#0:lost layout:0 1 2 3 0 0 1000", pair2(0, 0)},
				{"GET k", bulk("hotkeyproxy-layout:1:b:0 1 2 3")},
			}, reads(1, 1, 1, 1), []exchange{{"EVALSHA add 1 k#0 2", num(3)}}), reply: num(6)},
		}},
		{"refused before Redis", []step{
			{cmd: "INCRBY k x", reply: errR(rediserr.NotInteger)},
			{cmd: "DECRBY k -9223372036854775808", reply: errR("ERR decrement would overflow")},
			{cmd: "INCR k 1", reply: errR("ERR wrong number of arguments for 'incr' command")},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, f, c := testEngine(t, config.RouteRandom, 0, nil)
			run(t, e, f, c, tc.steps)
		})
	}
}

// TestStartBucketShare: over many deducts, each master that holds buckets
// gets an equal share of the start buckets (within ±5%), whatever N mod M,
// drawn at random and with route: client alike.
func TestStartBucketShare(t *testing.T) {
	const draws = 30000
	for _, route := range []string{config.RouteRandom, config.RouteClient} {
		for m := 1; m <= 5; m++ {
			owner := func(s uint16) int { return int(s) * m / hashslot.Count }
			for n := 2; n <= 16; n++ {
				cfg := config.Default()
				cfg.Hotkeys.Keys = []config.KeyRule{{Match: "k", Buckets: n, Route: route}}
				e := New(&fakeUpstream{t: t}, cfg, slog.New(slog.DiscardHandler))
				h := e.key([]byte("k"))
				l := Place("k", n, m, owner)
				l.groupByMaster(owner)
				share := make(map[int]int)
				for i := range draws {
					b := e.startBucket(h, l, uint64(i))
					share[owner(hashslot.Of([]byte(l.Tags[b])))]++
				}
				want := float64(draws) / float64(min(m, n))
				for master, got := range share {
					if d := float64(got)/want - 1; d > 0.05 || d < -0.05 {
						t.Errorf("%s, %d buckets over %d masters: master %d starts %d of %d deducts, want %.0f ±5%%",
							route, n, m, master, got, draws, want)
					}
				}
				if len(share) != min(m, n) {
					t.Errorf("%s, %d buckets over %d masters: %d masters start deducts, want %d", route, n, m, len(share), min(m, n))
				}
			}
		}
	}
}

// TestStartBucketRuns: drawn at random, the masters take the deducts in
// turn, startRun in a row each, a random bucket of the master each time,
// and from many goroutines at once every master gets exactly its share.
func TestStartBucketRuns(t *testing.T) {
	e, h, l := startBucketKey(t, config.KeyRule{})
	masterOf := func(l *Layout, b int) int { return threeMasters(hashslot.Of([]byte(l.Tags[b]))) }
	const masters = 3

	// Align on a turn's start, then follow the turns.
	for l.starts.Load()%startRun != 0 {
		e.startBucket(h, l, 0)
	}
	const turns = 600
	share := make(map[int]int)
	last := -1
	for turn := range turns {
		m := masterOf(l, e.startBucket(h, l, 0))
		if turn > 0 && m == last {
			t.Fatalf("turn %d on master %d again", turn, m)
		}
		for i := 1; i < startRun; i++ {
			b := e.startBucket(h, l, 0)
			if got := masterOf(l, b); got != m {
				t.Fatalf("turn %d: deduct %d on master %d, the turn's first on %d", turn, i, got, m)
			}
			share[b]++
		}
		last = m
	}
	for _, g := range l.byMaster {
		want := turns / masters * (startRun - 1) / len(g)
		for _, b := range g {
			if share[b] < want*9/10 || share[b] > want*11/10 {
				t.Errorf("bucket %d starts %d deducts, want %d ±10%%", b, share[b], want)
			}
		}
	}

	const workers, each = 8, masters * startRun * 50
	per := make([][masters]int, workers)
	var wg sync.WaitGroup
	for w := range per {
		wg.Go(func() {
			for range each {
				per[w][masterOf(l, e.startBucket(h, l, 0))]++
			}
		})
	}
	wg.Wait()
	for m := range masters {
		got := 0
		for w := range per {
			got += per[w][m]
		}
		if want := workers * each / masters; got != want {
			t.Errorf("from %d goroutines at once: master %d starts %d deducts, want exactly %d", workers, m, got, want)
		}
	}
}

// TestStartBucketWaitingKeyNotGrouped: a key whose changes wait for
// replicas takes no turns: each deduct draws its master.
func TestStartBucketWaitingKeyNotGrouped(t *testing.T) {
	const masters, draws = 3, 3000
	e, h, l := startBucketKey(t, config.KeyRule{WaitReplicas: 1, WaitTimeout: config.Duration(100 * time.Millisecond)})
	owner := threeMasters
	start := l.starts.Load()
	share := make(map[int]int)
	runs, last := 0, -1
	for range draws {
		m := owner(hashslot.Of([]byte(l.Tags[e.startBucket(h, l, 0)])))
		share[m]++
		if m != last {
			runs++
		}
		last = m
	}
	for m := range masters {
		if share[m] < draws/masters*9/10 || share[m] > draws/masters*11/10 {
			t.Errorf("master %d starts %d of %d deducts, want %d ±10%%: %v", m, share[m], draws, draws/masters, share)
		}
	}
	// Drawn each time, the master changes at 2 of 3 deducts; in turns of
	// startRun, once a turn.
	if runs < draws/2 || l.starts.Load() != start {
		t.Errorf("%d runs of one master in %d deducts (want about %d), turns counter %d → %d (want unchanged)",
			runs, draws, draws*2/3, start, l.starts.Load())
	}
}

// startBucketKey is an engine and hot key "k" of 8 buckets on
// threeMasters, with rule's settings and route: random.
func startBucketKey(t *testing.T, rule config.KeyRule) (*Engine, *hotKey, *Layout) {
	rule.Match, rule.Buckets, rule.Route = "k", 8, config.RouteRandom
	cfg := config.Default()
	cfg.Hotkeys.Keys = []config.KeyRule{rule}
	e := New(&fakeUpstream{t: t}, cfg, slog.New(slog.DiscardHandler))
	l := Place("k", 8, 3, threeMasters)
	l.groupByMaster(threeMasters)
	return e, e.key([]byte("k")), l
}
