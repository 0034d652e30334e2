package rewrite

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// intent is a record of k's intents: a move to bucket to of amount units,
// age old by the node's clock.
func intent(to int, amount int64, age time.Duration) string {
	return itoa(int64(to)) + " " + itoa(amount) + " " + itoa(nowMs-age.Milliseconds())
}

// TestFinishMoves drives the recovery of moves left unfinished, as the
// periodic sweep meets them (move_timeout 2s: those older than 1s): one
// completed, one undone, one applied before, one too young to touch, each
// step's failure, old applied marks dropped, a bucket found lost.
func TestFinishMoves(t *testing.T) {
	stale, young := time.Second, 999*time.Millisecond
	for _, tc := range []struct {
		name      string
		want      []exchange
		recovered uint64
	}{
		{"a stale intent completed, a young one left to its mover", []exchange{
			{listMoves("k", 0), movesOf(true, nil)},
			{listMoves("k", 1), movesOf(true, []string{"a1", intent(0, 3, stale)})},
			{listMoves("k", 2), movesOf(true, []string{"a2", intent(0, 4, young)})},
			{listMoves("k", 3), movesOf(true, nil)},
			{"EVALSHA apply 2 k#0 k#0:applied a1 3 <keep>", pair2(1, 8)},
			{"HDEL k#1:intents a1", num(1)},
		}, 1},
		{"a stale intent whose target is gone with the layout: undone", []exchange{
			{listMoves("k", 0), movesOf(true, nil)},
			{listMoves("k", 1), movesOf(true, nil)},
			{listMoves("k", 2), movesOf(true, []string{"a1", intent(0, 3, stale)})},
			{listMoves("k", 3), movesOf(true, nil)},
			{"EVALSHA apply 2 k#0 k#0:applied a1 3 <keep>", pair2(-2, 0)},
			{"EVALSHA undo 2 k#2 k#2:intents a1", pair2(1, 3)},
			{"EVALSHA lose 2 k k#0:lost layout:0 1 2 3 0 5 1000", pair2(0, 0)},
		}, 1},
		{"applied before its mover died: applying it again adds nothing", []exchange{
			{listMoves("k", 0), movesOf(true, nil)},
			{listMoves("k", 1), movesOf(true, nil)},
			{listMoves("k", 2), movesOf(true, []string{"a1", intent(0, 3, stale)})},
			{listMoves("k", 3), movesOf(true, nil)},
			{"EVALSHA apply 2 k#0 k#0:applied a1 3 <keep>", pair2(2, 5)},
			{"HDEL k#2:intents a1", num(1)},
		}, 1},
		{"the apply fails: the intent stays for the next sweep", []exchange{
			{listMoves("k", 0), movesOf(true, nil)},
			{listMoves("k", 1), movesOf(true, []string{"a1", intent(0, 3, stale)})},
			{listMoves("k", 2), movesOf(true, nil)},
			{listMoves("k", 3), movesOf(true, nil)},
			{"EVALSHA apply 2 k#0 k#0:applied a1 3 <keep>", downR},
		}, 0},
		{"the intent's deletion fails: applied, the intent stays", []exchange{
			{listMoves("k", 0), movesOf(true, nil)},
			{listMoves("k", 1), movesOf(true, []string{"a1", intent(0, 3, stale)})},
			{listMoves("k", 2), movesOf(true, nil)},
			{listMoves("k", 3), movesOf(true, nil)},
			{"EVALSHA apply 2 k#0 k#0:applied a1 3 <keep>", pair2(1, 8)},
			{"HDEL k#1:intents a1", downR},
		}, 0},
		{"the undo fails: the intent stays", []exchange{
			{listMoves("k", 0), movesOf(true, nil)},
			{listMoves("k", 1), movesOf(true, []string{"a1", intent(0, 3, stale)})},
			{listMoves("k", 2), movesOf(true, nil)},
			{listMoves("k", 3), movesOf(true, nil)},
			{"EVALSHA apply 2 k#0 k#0:applied a1 3 <keep>", pair2(-2, 0)},
			{"EVALSHA undo 2 k#1 k#1:intents a1", downR},
		}, 0},
		{"a node fails the listing: the others still finished, no mark dropped", []exchange{
			{listMoves("k", 0), downR},
			{listMoves("k", 1), movesOf(true, []string{"a1", intent(0, 3, stale)})},
			{listMoves("k", 2), movesOf(true, nil)},
			{listMoves("k", 3), movesOf(true, nil, "z2")},
			{"EVALSHA apply 2 k#0 k#0:applied a1 3 <keep>", pair2(1, 8)},
			{"HDEL k#1:intents a1", num(1)},
		}, 1},
		{"a record written by hand is left alone", []exchange{
			{listMoves("k", 0), movesOf(true, nil)},
			{listMoves("k", 1), movesOf(true, []string{"a1", "to 0 somewhere", "a2", intent(1, 3, stale), "a3", intent(9, 3, stale)})},
			{listMoves("k", 2), movesOf(true, nil)},
			{listMoves("k", 3), movesOf(true, nil)},
		}, 0},
		{"old applied marks go once their intent is gone", []exchange{
			{listMoves("k", 0), movesOf(true, nil, "z1", "a1")},
			{listMoves("k", 1), movesOf(true, []string{"a1", intent(0, 3, young)})},
			{listMoves("k", 2), movesOf(true, nil)},
			{listMoves("k", 3), movesOf(true, nil, "z2")},
			{"ZREM k#0:applied z1", num(1)},
			{"ZREM k#3:applied z2", num(1)},
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The layout is known from a GET; then the sweep.
			e, f, _ := testEngine(t, config.RouteRandom, 0, join(loaded(5, 5, 5, 5), loaded(5, 5, 5, 5), tc.want))
			e.Do(cmd("GET k"), 1, 0)
			e.FinishMoves()
			f.done()
			if s := e.Stats()[0]; s.MovesRecovered != tc.recovered {
				t.Errorf("moves_recovered %d, want %d", s.MovesRecovered, tc.recovered)
			}
		})
	}
}

// TestLostBucket: a bucket whose key went while the key still holds the
// layout is lost: the deduct that meets it gets an error naming it, it is
// logged once, counted and recorded; the others keep selling, GET sums
// them, PROXY HOTKEYS shows it.
func TestLostBucket(t *testing.T) {
	e, f, c := testEngine(t, config.RouteRandom, 2, nil)
	var log bytes.Buffer
	e.log = slog.New(slog.NewTextHandler(&log, nil))
	lostReply := errR("ERR hotkeyproxy: 'k' lost bucket 2 ({2}k#2.a): its key is missing while the layout names it; it held 5 units when last seen; the other buckets still sell")
	// What Redis holds from the loss on: bucket 2 missing.
	readsLost := []exchange{{"GET k#0", bulk("5")}, {"GET k#1", bulk("5")}, {"GET k#2", nilR}, {"GET k#3", bulk("4")}}
	sweepLost := []exchange{
		{listMoves("k", 0), movesOf(true, nil)}, {listMoves("k", 1), movesOf(true, nil)},
		{listMoves("k", 2), movesOf(false, nil)}, {listMoves("k", 3), movesOf(true, nil)},
	}
	run(t, e, f, c, []step{
		{cmd: one, want: join(loaded(5, 5, 5, 5), []exchange{
			{"EVALSHA deduct 1 k#2 1", pair2(-2, 0)},
			{"EVALSHA lose 2 k k#0:lost layout:0 1 2 3 2 5 1000", pair2(1, 5)},
		}), reply: lostReply},
		// Known lost: passed over, the others sell.
		{cmd: one, want: []exchange{{"EVALSHA deduct 1 k#3 1", num(4)}}, reply: num(14)},
		{cmd: "GET k", want: join([]exchange{{"GET k", bulk(marker)}}, readsLost), reply: bulk("14")},
		// A gather passes it over too, and sold out is concluded from
		// the others.
		{cmd: "EVALSHA " + sha(deductN) + " 1 k 20", want: join(readsLost, sweepLost, readsLost, sweepLost), reply: num(-1)},
	})
	if n := strings.Count(log.String(), "hot key bucket lost"); n != 1 {
		t.Errorf("%d log lines of the lost bucket, want 1:\n%s", n, log.String())
	}
	if !strings.Contains(log.String(), "bucket=2") || !strings.Contains(log.String(), "units=5") {
		t.Errorf("the log line does not name the bucket and its units: %s", log.String())
	}
	if s := e.Stats()[0]; s.BucketsLost != 1 || s.LostUnits != 5 {
		t.Errorf("buckets_lost %d, lost_units %d; want 1 and 5", s.BucketsLost, s.LostUnits)
	}
	f.want = join(f.want, []exchange{{"GET k", bulk(marker)}}, readsLost, readsLost)
	r := string(e.Report(resp.RESP2))
	for _, want := range []string{"*34\r\n", "$12\r\nlost_buckets\r\n*1\r\n$1\r\n2\r\n", "$10\r\nlost_units\r\n*1\r\n$1\r\n5\r\n"} {
		if !strings.Contains(r, want) {
			t.Errorf("PROXY HOTKEYS %q lacks %q", r, want)
		}
	}
}
