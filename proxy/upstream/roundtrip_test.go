package upstream

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/keyspec"
)

// testCluster is a Cluster whose slot map the test sets with serve, and
// that does not refresh it: what Refresh asks for stays in c.wake, for
// refreshAsked to see.
func testCluster(t *testing.T) *Cluster {
	t.Helper()
	cfg := config.Default().Upstream
	cfg.DialTimeout = config.Duration(2 * time.Second)
	c := &Cluster{
		cfg:     &cfg,
		log:     slog.New(slog.DiscardHandler),
		m:       Metrics{}.orNowhere(),
		wake:    make(chan struct{}, 1),
		nodes:   make(map[string]*Node),
		scripts: newScriptCache(),
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.Pool.close()
		}
	})
	return c
}

// serve publishes a slot map with every slot on the node at addr.
func (c *Cluster) serve(addr string) {
	t := &Topology{}
	n := c.Node(addr)
	for s := range t.Slots {
		t.Slots[s] = n
	}
	t.Masters, t.Lowest = []*Node{n}, []uint16{0}
	c.topo.Store(t)
	c.keys.Store(&keyspec.Table{})
}

// TestRedirectCounts: the redirection counters count MOVED and ASK
// replies, and nothing that merely mentions them.
func TestRedirectCounts(t *testing.T) {
	c := testCluster(t)
	r := NewRoundTrip(c, 0)
	for _, reply := range []string{"-MOVED 12 127.0.0.1:7001\r\n", "-ASK 12 127.0.0.1:7002\r\n",
		"-ASK 13 127.0.0.1:7002\r\n", "-ERR MOVED\r\n", "+OK\r\n"} {
		r.redirect(&clusterPart{reply: []byte(reply)})
	}
	if got := testutil.ToFloat64(c.m.Moved); got != 1 {
		t.Errorf("moved = %v, want 1", got)
	}
	if got := testutil.ToFloat64(c.m.Ask); got != 2 {
		t.Errorf("ask = %v, want 2", got)
	}
}

// TestClusterReady: not ready without a slot map, nor after a failed load.
func TestClusterReady(t *testing.T) {
	c := testCluster(t)
	if err := c.Ready(); err == nil || !strings.Contains(err.Error(), "not loaded") {
		t.Errorf("Ready with no slot map: %v", err)
	}
	c.err = fmt.Errorf("cluster slot map: 127.0.0.1:7000: connection refused")
	if err := c.Ready(); err != c.err {
		t.Errorf("Ready after a failed load: %v", err)
	}
	c.err = nil
	c.serve("127.0.0.1:7000")
	if err := c.Ready(); err != nil {
		t.Errorf("Ready with a slot map: %v", err)
	}
}
