package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/internal/keyspec"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// How the slot map is kept fresh: on a timer, and at once (but not more
// often than minRefreshGap) when a reply or a failure says it is stale.
const (
	refreshInterval = 2 * time.Second
	minRefreshGap   = 100 * time.Millisecond
)

// node is one Redis server of the cluster with its shared connections.
type node struct {
	addr string
	pool *pool
}

// topology is one loaded view of the cluster. It is never changed once
// published; a refresh publishes a new one.
type topology struct {
	slots   [hashslot.Count]*node // the master serving each slot; nil if none
	masters []*node               // each master once, by the lowest slot it serves
	lowest  []uint16              // lowest[i] is the lowest slot of masters[i]
}

// masterIndex is i where masters[i] == n, or -1.
func (t *topology) masterIndex(n *node) int { return slices.Index(t.masters, n) }

// clusterUpstream is a Redis Cluster behind the proxy: the slot map, the
// nodes with their connection pools, and the command table that tells
// which arguments are keys. Safe for concurrent use.
type clusterUpstream struct {
	cfg   *config.Upstream
	log   *slog.Logger
	m     *metrics
	topo  atomic.Pointer[topology]
	keys  atomic.Pointer[keyspec.Table]
	wake  chan struct{} // cap 1: refresh now
	quit  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	nodes map[string]*node // every node ever named, by address
	err   error            // why the last load failed; nil after a success

	scripts scriptCache
}

func newClusterUpstream(cfg *config.Upstream, log *slog.Logger, m *metrics) *clusterUpstream {
	c := &clusterUpstream{
		cfg:   cfg,
		log:   log,
		m:     m,
		wake:  make(chan struct{}, 1),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
		nodes: make(map[string]*node),

		scripts: newScriptCache(),
	}
	if err := c.load(); err != nil {
		// Start anyway, as in standalone mode: clients get an error
		// until a seed answers.
		log.Warn("cluster slot map not loaded; retrying", "err", err)
	}
	go c.refreshLoop()
	return c
}

// node returns the node at addr, adding it when first named.
func (c *clusterUpstream) node(addr string) *node {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[addr]
	if n == nil {
		d := dialer{
			addr:     addr,
			username: c.cfg.Username,
			password: string(c.cfg.Password),
			timeout:  c.cfg.DialTimeout.Duration(),
		}
		n = &node{addr: addr, pool: newPool(d, c.cfg.ConnsPerNode)}
		n.pool.m, n.pool.log = c.m.node(addr), c.log
		c.nodes[addr] = n
	}
	return n
}

// current is the slot map and command table, or an error saying why the
// proxy has none yet.
func (c *clusterUpstream) current() (*topology, *keyspec.Table, error) {
	t, k := c.topo.Load(), c.keys.Load()
	if t == nil || k == nil {
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		if err == nil {
			err = errors.New("cluster slot map not loaded yet")
		}
		c.refresh() // a client is waiting: try again now, not at the tick
		return nil, nil, err
	}
	return t, k, nil
}

// refresh asks for a new slot map soon; it does not wait for it.
func (c *clusterUpstream) refresh() { signal(c.wake) }

func (c *clusterUpstream) refreshLoop() {
	defer close(c.done)
	tick := time.NewTicker(refreshInterval)
	defer tick.Stop()
	for {
		select {
		case <-c.quit:
			return
		case <-tick.C:
		case <-c.wake:
		}
		c.load()
		select { // coalesce a burst of requests (every client saw MOVED)
		case <-c.quit:
			return
		case <-time.After(minRefreshGap):
		}
	}
}

// load asks the known masters, then the seeds, for the slot map, and keeps
// the first complete answer.
func (c *clusterUpstream) load() error {
	var addrs []string
	if t := c.topo.Load(); t != nil {
		for _, n := range t.masters {
			addrs = append(addrs, n.addr)
		}
	}
	for _, a := range c.cfg.Addrs {
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	var errs []error
	for _, a := range addrs {
		err := c.loadFrom(c.node(a))
		if err == nil {
			c.mu.Lock()
			c.err = nil
			c.mu.Unlock()
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", a, err))
	}
	err := errors.Join(errs...)
	c.mu.Lock()
	changed := c.err == nil || c.err.Error() != err.Error()
	c.err = fmt.Errorf("cluster slot map: %w", err)
	c.mu.Unlock()
	if changed {
		c.log.Warn("cannot load the cluster slot map", "err", err)
	}
	return err
}

func (c *clusterUpstream) loadFrom(n *node) error {
	req := resp.AppendCommand(nil, []byte("CLUSTER"), []byte("SLOTS"))
	want := 1
	if c.keys.Load() == nil {
		req = resp.AppendCommand(req, []byte("COMMAND"))
		want++
	}
	replies, err := n.pool.ask(req, want)
	if err != nil {
		return err
	}
	host, _, _ := net.SplitHostPort(n.addr)
	t, err := c.parseSlots(replies[0], host)
	if err != nil {
		return err
	}
	if want == 2 {
		if resp.IsError(replies[1]) {
			return fmt.Errorf("COMMAND: %s", replies[1][1:len(replies[1])-2])
		}
		k, err := keyspec.Parse(replies[1])
		if err != nil {
			return err
		}
		c.keys.Store(k)
	}
	switch old := c.topo.Swap(t); {
	case old == nil:
		c.log.Info("cluster slot map loaded", "from", n.addr, "master_count", len(t.masters), "masters", t.describe())
	case old.slots != t.slots:
		c.log.Info("cluster topology changed", "from", n.addr, "master_count", len(t.masters), "masters", t.describe())
	}
	return nil
}

// parseSlots builds a topology from a CLUSTER SLOTS reply, per the Redis
// Cluster spec: an array of [start, end, [ip, port, id, …], replicas…]. An
// empty ip means the node that answered.
func (c *clusterUpstream) parseSlots(reply []byte, host string) (*topology, error) {
	if resp.IsError(reply) {
		return nil, fmt.Errorf("CLUSTER SLOTS: %s", reply[1:len(reply)-2])
	}
	ranges, ok := resp.ArrayElems(reply, nil)
	if !ok || len(ranges) == 0 {
		return nil, errors.New("CLUSTER SLOTS: no slots served")
	}
	t := &topology{}
	var fields, master [][]byte
	for _, r := range ranges {
		fields, ok = resp.ArrayElems(r, fields[:0])
		if !ok || len(fields) < 3 {
			return nil, fmt.Errorf("CLUSTER SLOTS: bad entry %q", r)
		}
		start, ok1 := resp.IntValue(fields[0])
		end, ok2 := resp.IntValue(fields[1])
		master, ok = resp.ArrayElems(fields[2], master[:0])
		if !ok1 || !ok2 || !ok || len(master) < 2 || start < 0 || end >= hashslot.Count || start > end {
			return nil, fmt.Errorf("CLUSTER SLOTS: bad entry %q", r)
		}
		ip, _ := resp.BulkValue(master[0])
		port, ok := resp.IntValue(master[1])
		if !ok {
			return nil, fmt.Errorf("CLUSTER SLOTS: bad entry %q", r)
		}
		if len(ip) == 0 {
			ip = []byte(host)
		}
		n := c.node(net.JoinHostPort(string(ip), strconv.FormatInt(port, 10)))
		for s := start; s <= end; s++ {
			t.slots[s] = n
		}
	}
	for s, n := range t.slots {
		if n != nil && !slices.Contains(t.masters, n) {
			t.masters = append(t.masters, n)
			t.lowest = append(t.lowest, uint16(s))
		}
	}
	return t, nil
}

// describe lists the masters with their slot ranges, for the log.
func (t *topology) describe() string {
	var b strings.Builder
	for s := 0; s < hashslot.Count; {
		n, e := t.slots[s], s
		for e+1 < hashslot.Count && t.slots[e+1] == n {
			e++
		}
		if n != nil {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%d-%d:%s", s, e, n.addr)
		}
		s = e + 1
	}
	return b.String()
}

// close stops refreshing and retires every node's shared connections.
func (c *clusterUpstream) close() {
	select {
	case <-c.quit:
	default:
		close(c.quit)
	}
	<-c.done
	c.mu.Lock()
	nodes := make([]*node, 0, len(c.nodes))
	for _, n := range c.nodes {
		nodes = append(nodes, n)
	}
	c.mu.Unlock()
	for _, n := range nodes {
		n.pool.close()
	}
}
