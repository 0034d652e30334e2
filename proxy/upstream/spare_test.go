package upstream

import (
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
)

// TestSparesFollowBursts: a key keeps one spare; a client that finds none
// ready makes it keep one more, so that the next burst of as many clients
// (blocking commands sent at once) each takes one without a dial.
func TestSparesFollowBursts(t *testing.T) {
	be := redistest.StartBackend(t, redistest.BackendOptions{})
	p := testPool(t, dialer{addr: be.Addr()}, 1, nil)
	k := Key{DB: 0}
	ready := func() int {
		p.spare.mu.Lock()
		defer p.spare.mu.Unlock()
		return len(p.spare.ready[k])
	}
	p.KeepSpare(k)
	eventually(t, "one spare", func() bool { return ready() == 1 })
	take := func() bool {
		sc, ok := p.spare.take(k)
		if ok {
			sc.nc.Close()
		}
		return ok
	}
	// Two clients at once, before the first one's refill.
	if !take() {
		t.Fatal("the first client found no spare")
	}
	if take() {
		t.Fatal("a second spare was ready before any burst")
	}
	p.refillSpare(k)
	eventually(t, "two spares after a burst of two", func() bool { return ready() == 2 })
	eventually(t, "the backend saw the dials", func() bool { return be.Conns() == 3 })
	if !take() || !take() {
		t.Error("the next burst of two found fewer than two spares")
	}
	p.refillSpare(k)
	eventually(t, "refilled", func() bool { return ready() == 2 })
	eventually(t, "two dials to refill two spares", func() bool { return be.Conns() == 5 })
	p.spare.mu.Lock()
	n := p.spare.n
	p.spare.mu.Unlock()
	if n != 2 {
		t.Errorf("spares counted: %d, want 2", n)
	}
}
