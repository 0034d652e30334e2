package upstream

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
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

// Node is one Redis server of the cluster with its pool. A Cluster has one
// Node per address, for its whole life, so nodes compare with ==.
type Node struct {
	Addr string // host:port, as the cluster names it
	Pool *Pool
}

// Topology is one loaded view of the cluster. It is never changed once
// published; a refresh publishes a new one.
type Topology struct {
	Masters []*Node  // each master once, by the lowest slot it serves
	Lowest  []uint16 // Lowest[i] is the lowest slot of Masters[i]
	// owner is 1 + the index in Masters of each slot's master, 0 if none:
	// 32 KiB that stay in the CPU's caches where 16384 pointers (128 KiB)
	// miss them on every request for a random slot.
	owner [hashslot.Count]uint16
}

// NewTopology is the topology whose slot s is served by slots[s], none
// where it is nil.
func NewTopology(slots *[hashslot.Count]*Node) *Topology {
	t := &Topology{}
	for s, n := range slots {
		if n == nil {
			continue
		}
		i := slices.Index(t.Masters, n)
		if i < 0 {
			i = len(t.Masters)
			t.Masters = append(t.Masters, n)
			t.Lowest = append(t.Lowest, uint16(s))
		}
		t.owner[s] = uint16(i + 1)
	}
	return t
}

// Node is the master serving slot, nil if none.
func (t *Topology) Node(slot int) *Node {
	if i := t.owner[slot]; i != 0 {
		return t.Masters[i-1]
	}
	return nil
}

// MasterOf is i where Masters[i] serves slot, or -1.
func (t *Topology) MasterOf(slot int) int { return int(t.owner[slot]) - 1 }

// MasterIndex is i where Masters[i] == n, or -1.
func (t *Topology) MasterIndex(n *Node) int { return slices.Index(t.Masters, n) }

// slots is the master of every slot, as NewTopology takes them.
func (t *Topology) slots() *[hashslot.Count]*Node {
	var slots [hashslot.Count]*Node
	for s := range slots {
		slots[s] = t.Node(s)
	}
	return &slots
}

// same reports whether t and u map every slot to the same master.
func (t *Topology) same(u *Topology) bool {
	return t.owner == u.owner && slices.Equal(t.Masters, u.Masters)
}

// Cluster is a Redis Cluster behind the proxy: the slot map, the nodes
// with their pools, the command table that tells which arguments are keys,
// and the script bodies seen. Safe for concurrent use.
type Cluster struct {
	cfg   *config.Upstream
	tls   *tls.Config // upstream.tls as loaded; nil when off
	log   *slog.Logger
	m     Metrics
	topo  atomic.Pointer[Topology]
	keys  atomic.Pointer[keyspec.Table]
	wake  chan struct{} // cap 1: refresh now
	quit  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	nodes map[string]*Node // every node ever named, by address
	err   error            // why the last load failed; nil after a success
	// logged is that failure's text as logged, without the local ends of
	// its connections, whose ports change with every attempt: a failure
	// is logged once, until another one or a success.
	logged string

	scripts *ScriptCache
}

// newCluster loads the slot map from cfg's seeds and keeps it fresh
// until close. When no seed answers it starts anyway, as in standalone
// mode: clients get an error until one does.
func newCluster(cfg *config.Upstream, tlsBase *tls.Config, log *slog.Logger, m Metrics) *Cluster {
	c := &Cluster{
		cfg:   cfg,
		tls:   tlsBase,
		log:   log,
		m:     m,
		wake:  make(chan struct{}, 1),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
		nodes: make(map[string]*Node),

		scripts: newScriptCache(),
	}
	c.load() // a failure is logged, and the refresh loop retries
	go c.refreshLoop()
	return c
}

// Node returns the node at addr (host:port), adding it when first named,
// by the slot map or a redirection.
func (c *Cluster) Node(addr string) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[addr]
	if n == nil {
		d := newDialer(c.cfg, c.tls, addr)
		n = &Node{Addr: addr, Pool: newPool(d, c.cfg.ConnsPerNode, c.cfg.ReadTimeout.Duration(), c.m.Node(addr), c.log)}
		c.nodes[addr] = n
	}
	return n
}

// Current is the slot map and command table, or an error saying why the
// proxy has none yet; then a refresh is asked for at once.
func (c *Cluster) Current() (*Topology, *keyspec.Table, error) {
	t, k := c.topo.Load(), c.keys.Load()
	if t == nil || k == nil {
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		if err == nil {
			err = errors.New("cluster slot map not loaded yet")
		}
		c.Refresh() // a client is waiting: try again now, not at the tick
		return nil, nil, err
	}
	return t, k, nil
}

// Refresh asks for a new slot map soon; it does not wait for it. Requests
// that come faster than one per 100 ms are coalesced.
func (c *Cluster) Refresh() { signal(c.wake) }

// Ready reports why the cluster cannot serve now: the slot map is not
// loaded, or its last refresh failed (the error names each node asked).
func (c *Cluster) Ready() error {
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	switch {
	case err != nil:
		return err
	case c.topo.Load() == nil || c.keys.Load() == nil:
		return errors.New("cluster slot map not loaded yet")
	}
	return nil
}

// Scripts is the cache of the script bodies seen, which the round trip
// loads on a node that answers NOSCRIPT.
func (c *Cluster) Scripts() *ScriptCache { return c.scripts }

func (c *Cluster) refreshLoop() {
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
func (c *Cluster) load() error {
	var addrs []string
	if t := c.topo.Load(); t != nil {
		for _, n := range t.Masters {
			addrs = append(addrs, n.Addr)
		}
	}
	for _, a := range c.cfg.Addrs {
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	var errs []error
	for _, a := range addrs {
		err := c.loadFrom(c.Node(a))
		if err == nil {
			c.mu.Lock()
			failed := c.err != nil
			c.err, c.logged = nil, ""
			c.mu.Unlock()
			if failed {
				c.log.Info("cluster slot map loaded again", "from", a)
			}
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", a, err))
	}
	err := errors.Join(errs...)
	text := localEnd.ReplaceAllString(err.Error(), "")
	c.mu.Lock()
	changed := text != c.logged
	c.err, c.logged = fmt.Errorf("cluster slot map: %w", err), text
	c.mu.Unlock()
	if changed {
		c.log.Warn("cannot load the cluster slot map", "err", err)
	}
	return err
}

// localEnd matches the local end of a connection in a net.OpError's text
// ("read tcp 127.0.0.1:41088->127.0.0.1:7000: i/o timeout").
var localEnd = regexp.MustCompile(`\S+->`)

func (c *Cluster) loadFrom(n *Node) error {
	req := resp.AppendCommand(nil, []byte("CLUSTER"), []byte("SLOTS"))
	want := 1
	if c.keys.Load() == nil {
		req = resp.AppendCommand(req, []byte("COMMAND"))
		want++
	}
	replies, err := n.Pool.Ask(req, want)
	if err != nil {
		return err
	}
	host, _, _ := net.SplitHostPort(n.Addr)
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
		c.log.Info("cluster slot map loaded", "from", n.Addr, "master_count", len(t.Masters), "masters", t.describe())
	case !old.same(t):
		c.log.Info("cluster topology changed", "from", n.Addr, "master_count", len(t.Masters), "masters", t.describe())
	}
	return nil
}

// parseSlots builds a topology from a CLUSTER SLOTS reply, per the Redis
// Cluster spec: an array of [start, end, [ip, port, id, …], replicas…]. An
// empty ip means the node that answered. Redis 7.0 adds a fourth element,
// a map of the node's other endpoints: its "hostname" (when the node has
// cluster-announce-hostname and the endpoint type is ip) becomes the name
// its TLS certificate is checked against.
func (c *Cluster) parseSlots(reply []byte, host string) (*Topology, error) {
	if resp.IsError(reply) {
		return nil, fmt.Errorf("CLUSTER SLOTS: %s", reply[1:len(reply)-2])
	}
	ranges, ok := resp.ArrayElems(reply, nil)
	if !ok || len(ranges) == 0 {
		return nil, errors.New("CLUSTER SLOTS: no slots served")
	}
	var slots [hashslot.Count]*Node
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
		n := c.Node(net.JoinHostPort(string(ip), strconv.FormatInt(port, 10)))
		if n.Pool.tls != nil {
			n.Pool.tls.setHostname(hostname(master))
		}
		for s := start; s <= end; s++ {
			slots[s] = n
		}
	}
	return NewTopology(&slots), nil
}

// hostname is the "hostname" of a CLUSTER SLOTS node entry [ip, port, id,
// {name: value…}], or "" when it has none.
func hostname(node [][]byte) string {
	if len(node) < 4 {
		return ""
	}
	meta, ok := resp.ArrayElems(node[3], nil)
	if !ok {
		return ""
	}
	for i := 0; i+1 < len(meta); i += 2 {
		if k, _ := resp.BulkValue(meta[i]); string(k) == "hostname" {
			v, _ := resp.BulkValue(meta[i+1])
			return string(v)
		}
	}
	return ""
}

// Moved follows "-MOVED slot addr" as cluster clients do: the slot's owner
// changes in the slot map at once, so the next request for the slot goes
// straight to the node at addr, and a full reload is asked for behind it
// (other slots may have moved too). It counts the redirection and returns
// the node.
func (c *Cluster) Moved(slot int, addr string) *Node {
	n := c.Node(addr)
	c.m.Moved.Inc()
	c.Refresh()
	for {
		t := c.topo.Load()
		if t == nil || slot < 0 || slot >= hashslot.Count || t.Node(slot) == n {
			return n
		}
		slots := t.slots()
		slots[slot] = n
		if c.topo.CompareAndSwap(t, NewTopology(slots)) {
			return n
		}
	}
}

// Asked follows "-ASK slot addr": the slot map stays, since only keys
// already migrated are asked for elsewhere. It counts the redirection and
// returns the node.
func (c *Cluster) Asked(addr string) *Node {
	c.m.Ask.Inc()
	return c.Node(addr)
}

// describe lists the masters with their slot ranges, for the log.
func (t *Topology) describe() string {
	var b strings.Builder
	for s := 0; s < hashslot.Count; {
		n, e := t.owner[s], s
		for e+1 < hashslot.Count && t.owner[e+1] == n {
			e++
		}
		if n != 0 {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%d-%d:%s", s, e, t.Masters[n-1].Addr)
		}
		s = e + 1
	}
	return b.String()
}

// close stops refreshing and retires every node's shared connections.
func (c *Cluster) close() {
	select {
	case <-c.quit:
	default:
		close(c.quit)
	}
	<-c.done
	c.mu.Lock()
	nodes := make([]*Node, 0, len(c.nodes))
	for _, n := range c.nodes {
		nodes = append(nodes, n)
	}
	c.mu.Unlock()
	for _, n := range nodes {
		n.Pool.close()
	}
}
