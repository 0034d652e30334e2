package rewrite

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestDeductScriptHeld: EVALSHA of a declared deduct script on a hot key
// answers NOSCRIPT, in Redis's words and before anything is taken, when
// the key's node does not hold the script; EVAL of it loads it there; a
// yes is trusted for recheck, and forgotten on ForgetScripts.
func TestDeductScriptHeld(t *testing.T) {
	const noScript = "-NOSCRIPT No matching script. Please use EVAL.\r\n"
	deduct := func(left int64) []exchange {
		return join(loaded(5, 5, 5, 5), []exchange{{"EVALSHA deduct 1 k#0 1", num(left)}})
	}
	evalOne := [][]byte{[]byte("EVAL"), []byte(deductOne), []byte("1"), []byte("k")}

	t.Run("flushed: NOSCRIPT, nothing taken", func(t *testing.T) {
		e, f, c := testEngine(t, "", 0, nil)
		f.flushed = true
		run(t, e, f, c, []step{{cmd: one, reply: noScript}, {cmd: one, reply: noScript}})
		if f.asked != 2 {
			t.Errorf("%d SCRIPT requests, want 2: a no is asked again", f.asked)
		}
	})
	t.Run("EVAL loads it, then EVALSHA runs", func(t *testing.T) {
		e, f, c := testEngine(t, "", 0, nil)
		f.flushed = true
		f.want = deduct(4)
		if got := string(e.Do(evalOne, 3, 0)); got != num(19) {
			t.Fatalf("EVAL: %q", got)
		}
		if !f.loaded[sha(deductOne)] {
			t.Fatal("EVAL did not load the script on the key's node")
		}
		run(t, e, f, c, []step{{cmd: one, want: []exchange{{"EVALSHA deduct 1 k#0 1", num(3)}}, reply: num(18)}})
		if f.asked != 1 {
			t.Errorf("%d SCRIPT requests, want 1: the load's yes is trusted", f.asked)
		}
	})
	t.Run("a yes trusted for recheck, forgotten by ForgetScripts", func(t *testing.T) {
		e, f, c := testEngine(t, "", 0, nil)
		run(t, e, f, c, []step{{cmd: one, want: deduct(4), reply: num(19)}})
		run(t, e, f, c, []step{{cmd: one, want: []exchange{{"EVALSHA deduct 1 k#0 1", num(3)}}, reply: num(18)}})
		if f.asked != 1 {
			t.Fatalf("%d SCRIPT requests, want 1", f.asked)
		}
		e.ForgetScripts()
		f.flushed = true
		run(t, e, f, c, []step{{cmd: one, reply: noScript}})
	})
	t.Run("an old yes is asked again once, trusted by the others meanwhile; a no is not", func(t *testing.T) {
		e, f, c := testEngine(t, "", 0, nil)
		h, s := e.key([]byte("k")), e.deductScript(cmd(one))
		if err := e.scriptHeld(h, s); err != nil {
			t.Fatal(err)
		}
		c.Sleep(recheck)
		var during []error
		f.onScript = func() {
			f.onScript = nil // the recheck under way; the checks below are the others
			for range 3 {
				during = append(during, e.scriptHeld(h, s))
			}
		}
		if err := e.scriptHeld(h, s); err != nil {
			t.Fatal(err)
		}
		if f.asked != 2 || len(during) != 3 || during[0] != nil || during[1] != nil || during[2] != nil {
			t.Fatalf("%d SCRIPT requests, want 2 (one recheck, none from the 3 checks during it, which trust the old yes: %v)", f.asked, during)
		}
		c.Sleep(recheck)
		f.flushed = true
		for range 2 {
			if err := e.scriptHeld(h, s); err == nil || !strings.Contains(err.Error(), "NOSCRIPT") {
				t.Fatalf("after a flush: %v, want NOSCRIPT", err)
			}
		}
		if f.asked != 4 {
			t.Errorf("%d SCRIPT requests, want 4: a no is asked again", f.asked)
		}
	})
	t.Run("flushed, but the proxy remembers it: loaded, then run", func(t *testing.T) {
		e, f, c := testEngine(t, "", 0, nil)
		f.flushed = true
		e.SetScriptMemory(func(s []byte) bool { return string(s) == sha(deductOne) })
		run(t, e, f, c, []step{{cmd: one, want: deduct(4), reply: num(19)}, {cmd: five, reply: noScript}})
		if !f.loaded[sha(deductOne)] || f.loaded[sha(deductN)] {
			t.Errorf("loaded %v, want deduct-one only", f.loaded)
		}
	})
}

// TestHeldRecheckClaimedOnce: when a yes grows old, of the deducts that
// check it at once exactly one is told to ask Redis again; the others
// trust the yes meanwhile.
func TestHeldRecheckClaimedOnce(t *testing.T) {
	e, _, c := testEngine(t, "", 0, nil)
	at := heldAt{sha: sha(deductOne), node: "fake:6379"}
	e.markHeld(at, true)
	for round := range 50 {
		c.Sleep(recheck)
		var claims atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 16 {
			wg.Go(func() {
				<-start
				if !e.seenHeld(at) {
					claims.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if n := claims.Load(); n != 1 {
			t.Fatalf("round %d: %d of 16 checks would ask Redis, want 1", round, n)
		}
	}
}
