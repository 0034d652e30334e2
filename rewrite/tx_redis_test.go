package rewrite

import (
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// TestTxStepOnRedis: the steps TxStep queues, run by MULTI/EXEC on a real
// redis-server, with stock on its way between two buckets (a take whose
// mover died): GET counts it, a deduct of all the stock succeeds (no
// false sold-out), one more is sold out (no oversell), and the move is
// finished once, its intent gone.
func TestTxStepOnRedis(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{})
	e, u := redisEngine(t, rs.Addr())
	if r := string(e.Do(cmd("SET k 20"), 1, 0)); r != okR {
		t.Fatalf("SET: %q", r)
	}
	h := e.key([]byte("k"))
	l := h.layout.Load()
	if m, err := e.startMove(h, l, 1, 0, 5); err != nil || m.amount != 5 {
		t.Fatalf("take 5 of bucket 1: %+v, %v", m, err)
	}
	step := func(args string) [][]byte {
		t.Helper()
		a := cmd(args)
		keyAt := 1
		if a[0][0] == 'E' {
			keyAt = 3
		}
		s, reply, queued := e.TxStep(a, keyAt, false)
		if !queued {
			t.Fatalf("%s not queued: %q", args, reply)
		}
		return s
	}
	exec := func(steps ...[][]byte) string {
		t.Helper()
		reqs := []Request{{Key: []byte("k"), Args: cmd("MULTI")}}
		for _, s := range steps {
			reqs = append(reqs, Request{Key: []byte("k"), Args: s})
		}
		reqs = append(reqs, Request{Key: []byte("k"), Args: cmd("EXEC")})
		replies := u.Do(reqs)
		return string(replies[len(replies)-1])
	}
	if got := exec(step("GET k")); got != "*1\r\n"+bulk("20") {
		t.Errorf("GET with 5 units on their way: %q, want 20", got)
	}
	if n, _ := resp.IntValue([]byte(u.do("HLEN", string(l.IntentsKey(1))))); n != 0 {
		t.Errorf("%d intents left after the step", n)
	}
	deduct := "EVALSHA " + sha(deductN) + " 1 k "
	u.do("SCRIPT", "LOAD", deductN)
	if got := exec(step(deduct+"20"), step(deduct+"1"), step("GET k")); got != "*3\r\n"+num(0)+num(-1)+bulk("0") {
		t.Errorf("deducts of 20 then 1: %q, want 0, -1 (sold out), sum 0", got)
	}
}
