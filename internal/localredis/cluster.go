package localredis

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	// clusterSlots is the number of hash slots in a Redis Cluster.
	clusterSlots = 16384
	// clusterTimeout bounds StartCluster and the wait in Failover.
	clusterTimeout = 30 * time.Second
	// clusterPollInterval is the pause between two polls of the nodes while
	// waiting for the cluster to settle.
	clusterPollInterval = 50 * time.Millisecond
	// defaultMasters is ClusterOptions.Masters when zero.
	defaultMasters = 3
	// defaultNodeTimeout is ClusterOptions.NodeTimeout when zero.
	defaultNodeTimeout = time.Second
	// maxReplyItems bounds the length of a RESP array a node may send.
	maxReplyItems = 1 << 16
)

// ClusterOptions configures StartCluster. The zero value starts 3 masters
// without replicas or password, with a node timeout of 1 second.
type ClusterOptions struct {
	// Masters is the number of masters, 1..16384; they share the 16384 slots
	// in contiguous ranges of near-equal size. If 0, 3. A replica is promoted
	// automatically only with the votes of a majority of masters, so a test
	// that kills a master needs at least 3.
	Masters int

	// Replicas is the number of replicas of each master. 0 (the default)
	// means none.
	Replicas int

	// Password, if not empty, is required from clients on every node
	// (--requirepass) and is what replicas send their master (--masterauth).
	Password string

	// Args are extra redis-server arguments for every node, appended after
	// the cluster's own so that they can override them.
	Args []string

	// TLS, if not nil, gives every node a TLS port too (Server.TLSAddr,
	// TLSSeeds) and makes the nodes talk TLS to each other, on the cluster
	// bus and for replication (--tls-cluster yes --tls-replication yes).
	// As Redis 7.0 does then, CLUSTER SLOTS and redirections name the TLS
	// ports to TLS clients and the plain ports to the others; the plain
	// ports stay, for the setup and the checks of this package.
	TLS *TLSOptions

	// NodeTimeout is cluster-node-timeout: how long a node may be unreachable
	// before it counts as failing, and so roughly how long an automatic
	// failover takes. It is passed in whole milliseconds and must be at least
	// 1ms. If 0, 1 second (Redis's own default is 15 seconds).
	NodeTimeout time.Duration
}

// Cluster is a running Redis Cluster of local redis-server processes, each a
// Server with its own port, cluster bus port and temp dir. Its methods are
// safe for concurrent use.
//
// A node counts as live while its Server runs. Take a node down with
// Server.Kill: it is then left out of Masters, ReplicaOf, WaitOK and Failover
// until Server.Restart brings it back with its node ID (nodes.conf is kept)
// but no data, and the cluster decides its role. Server.Stop removes the dir,
// so a node restarted after Stop is a stranger to the cluster.
type Cluster struct {
	opts  ClusterOptions // with defaults applied; never changed
	nodes []*Server      // the masters as started, then their replicas; fixed
	bus   []int          // cluster bus port of nodes[i]; fixed
}

// slotRange is one entry of CLUSTER SLOTS: a range of slots, the address of
// the master that serves it and those of its replicas, sorted, since nodes
// list replicas in the order they learnt of them.
type slotRange struct {
	start, end int64
	master     string
	replicas   []string
}

// role is a node's answer to ROLE.
type role struct {
	master     bool
	masterAddr string // replica only: the master it replicates
	link       string // replica only: "connected" once the link is up
}

// respError is an error reply from a node, such as "ERR Unknown node".
type respError string

func (e respError) Error() string { return string(e) }

// StartCluster starts opts.Masters*(1+opts.Replicas) real redis-server nodes
// on free loopback ports, each run by Start as
//
//	redis-server ... --cluster-enabled yes --cluster-config-file nodes.conf \
//	    --cluster-node-timeout MS --cluster-port BUS \
//	    --repl-diskless-sync-delay 0 --repl-ping-replica-period 1 \
//	    [--masterauth PW] [--tls-cluster yes --tls-replication yes] ARGS...
//
// It gives master i the i-th contiguous share of the slots, joins all nodes
// with CLUSTER MEET, makes each replica replicate its master, and waits until
// every node reports cluster_state:ok, every replica's link to its master is
// up and all nodes report the same CLUSTER SLOTS with every master and its
// replicas. It gives up 30 seconds after the call (plus however long the
// last redis-server took to start), with an error naming a node that was not
// ready and why. On error every node started is stopped. The caller must call
// Stop.
func StartCluster(opts ClusterOptions) (*Cluster, error) {
	if opts.Masters == 0 {
		opts.Masters = defaultMasters
	}
	if opts.NodeTimeout == 0 {
		opts.NodeTimeout = defaultNodeTimeout
	}
	switch {
	case opts.Masters < 1 || opts.Masters > clusterSlots:
		return nil, fmt.Errorf("localredis: invalid cluster Masters %d, want 1..%d", opts.Masters, clusterSlots)
	case opts.Replicas < 0:
		return nil, fmt.Errorf("localredis: invalid cluster Replicas %d", opts.Replicas)
	case opts.NodeTimeout < time.Millisecond:
		return nil, fmt.Errorf("localredis: invalid cluster NodeTimeout %v, want at least 1ms", opts.NodeTimeout)
	}

	deadline := time.Now().Add(clusterTimeout)
	c := &Cluster{opts: opts}
	for range opts.Masters * (1 + opts.Replicas) {
		s, bus, err := startNode(opts)
		if err != nil {
			return nil, errors.Join(err, c.Stop())
		}
		c.nodes = append(c.nodes, s)
		c.bus = append(c.bus, bus)
	}
	if err := c.form(deadline); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

// startNode starts one cluster-enabled redis-server and returns it with its
// cluster bus port. It picks the bus port itself because Redis's default,
// port+10000, is above 65535 for a quarter of the ports Start may pick, and
// may be taken; like Start, it retries with new ports when either is taken.
func startNode(opts ClusterOptions) (*Server, int, error) {
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(2)
		if err != nil {
			return nil, 0, err
		}
		args := []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(opts.NodeTimeout.Milliseconds(), 10),
			"--cluster-port", strconv.Itoa(ports[1]),
			// The default 5s delay before a full sync would hold every
			// replica, and so StartCluster, for 5 seconds.
			"--repl-diskless-sync-delay", "0",
			// CLUSTER SLOTS leaves out a replica until its replication
			// offset is above 0 (Redis 7.0 isReplicaAvailable); on an idle
			// master only the PING to replicas moves the offset, every 10
			// seconds by default.
			"--repl-ping-replica-period", "1",
		}
		if opts.Password != "" {
			args = append(args, "--masterauth", opts.Password)
		}
		if opts.TLS != nil {
			args = append(args, "--tls-cluster", "yes", "--tls-replication", "yes")
		}
		args = append(args, opts.Args...)
		s, err := Start(Options{Port: ports[0], Password: opts.Password, Args: args, TLS: opts.TLS})
		if err == nil {
			return s, ports[1], nil
		}
		if attempt == maxStartAttempts || !errors.Is(err, errAddrInUse) {
			return nil, 0, err
		}
	}
}

// freePorts returns n distinct loopback TCP ports that were free a moment
// ago. It holds all n listeners at once so that no port is returned twice.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("localredis: find free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// form turns the started nodes into a cluster and waits until it is ready,
// giving up at deadline.
func (c *Cluster) form(deadline time.Time) error {
	m := c.opts.Masters
	ids := make([]string, m)
	for i, s := range c.nodes[:m] {
		id, err := c.NodeID(s)
		if err != nil {
			return err
		}
		ids[i] = id
		lo, hi := i*clusterSlots/m, (i+1)*clusterSlots/m-1
		// Distinct config epochs, as redis-cli --cluster create sets them,
		// spare the masters resolving epoch collisions among themselves
		// before a failover can get a majority.
		_, err = c.call(s,
			[]string{"CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)},
			[]string{"CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i + 1)})
		if err != nil {
			return fmt.Errorf("localredis: node %s: %w", s.Addr(), err)
		}
	}

	// Gossip spreads what the first node learns to the others.
	first := c.nodes[0]
	for i, s := range c.nodes[1:] {
		host, port, _ := net.SplitHostPort(s.Addr())
		if _, err := c.call(first, []string{"CLUSTER", "MEET", host, port, strconv.Itoa(c.bus[i+1])}); err != nil {
			return fmt.Errorf("localredis: node %s: %w", first.Addr(), err)
		}
	}

	for i, s := range c.nodes[m:] {
		masterID := ids[i/c.opts.Replicas]
		// CLUSTER REPLICATE fails with "Unknown node" until gossip has
		// told the replica about its master.
		err := waitCluster(deadline, func() error {
			v, err := c.call(s, []string{"CLUSTER", "NODES"})
			if err != nil {
				return fmt.Errorf("node %s: %w", s.Addr(), err)
			}
			if nodes, _ := v[0].(string); !strings.Contains(nodes, masterID) {
				return fmt.Errorf("node %s does not know its master %s yet", s.Addr(), masterID)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("localredis: cluster not ready within %v: %w", clusterTimeout, err)
		}
		if _, err := c.call(s, []string{"CLUSTER", "REPLICATE", masterID}); err != nil {
			return fmt.Errorf("localredis: node %s: %w", s.Addr(), err)
		}
	}

	err := waitCluster(deadline, func() error {
		ranges, err := c.view()
		if err != nil {
			return err
		}
		if len(ranges) != m {
			return fmt.Errorf("CLUSTER SLOTS has %d ranges, want %d", len(ranges), m)
		}
		for _, r := range ranges {
			if len(r.replicas) != c.opts.Replicas {
				return fmt.Errorf("CLUSTER SLOTS lists %d replicas of %s, want %d", len(r.replicas), r.master, c.opts.Replicas)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("localredis: cluster not ready within %v: %w", clusterTimeout, err)
	}
	return nil
}

// Seeds returns the addresses ("127.0.0.1:port") of the masters as started,
// one per slot range in slot order. They stay the same after a failover, when
// some of them may be replicas or down; any live node serves as a seed.
func (c *Cluster) Seeds() []string {
	seeds := make([]string, c.opts.Masters)
	for i, s := range c.nodes[:c.opts.Masters] {
		seeds[i] = s.Addr()
	}
	return seeds
}

// TLSSeeds is Seeds with the masters' TLS addresses, for a cluster started
// with TLS; nil without.
func (c *Cluster) TLSSeeds() []string {
	if c.opts.TLS == nil {
		return nil
	}
	seeds := make([]string, c.opts.Masters)
	for i, s := range c.nodes[:c.opts.Masters] {
		seeds[i] = s.TLSAddr()
	}
	return seeds
}

// Nodes returns every node, live or not: the masters as started in slot
// order, then the replicas of the first master, of the second, and so on.
func (c *Cluster) Nodes() []*Server {
	return slices.Clone(c.nodes)
}

// NodeID returns the 40-character cluster node ID of s (CLUSTER MYID). It
// survives Server.Kill and Restart. It fails if s is not a node of c or does
// not answer.
func (c *Cluster) NodeID(s *Server) (string, error) {
	if err := c.member(s); err != nil {
		return "", err
	}
	v, err := c.call(s, []string{"CLUSTER", "MYID"})
	if err != nil {
		return "", fmt.Errorf("localredis: node %s: %w", s.Addr(), err)
	}
	id, ok := v[0].(string)
	if !ok {
		return "", fmt.Errorf("localredis: node %s: CLUSTER MYID replied %v", s.Addr(), v[0])
	}
	return id, nil
}

// Masters returns the live nodes whose ROLE is master now, in Nodes order.
// Right after a failover this is not yet settled; call WaitOK first. It fails
// if a live node does not answer.
func (c *Cluster) Masters() ([]*Server, error) {
	var masters []*Server
	for _, s := range c.live() {
		r, err := c.role(s)
		if err != nil {
			return nil, fmt.Errorf("localredis: node %s: %w", s.Addr(), err)
		}
		if r.master {
			masters = append(masters, s)
		}
	}
	return masters, nil
}

// ReplicaOf returns the first live node, in Nodes order, whose ROLE says it
// replicates master. It fails if there is none or a live node does not
// answer.
func (c *Cluster) ReplicaOf(master *Server) (*Server, error) {
	if err := c.member(master); err != nil {
		return nil, err
	}
	for _, s := range c.live() {
		r, err := c.role(s)
		if err != nil {
			return nil, fmt.Errorf("localredis: node %s: %w", s.Addr(), err)
		}
		// A TLS replica names its master by the TLS port it replicates from.
		if !r.master && (r.masterAddr == master.Addr() || r.masterAddr == master.TLSAddr()) {
			return s, nil
		}
	}
	return nil, fmt.Errorf("localredis: no live replica of %s", master.Addr())
}

// Failover sends CLUSTER FAILOVER (a manual failover, without FORCE) to
// replica and waits up to 30 seconds until replica is a master and the live
// nodes agree as WaitOK requires; its old master, if live, is then its
// replica. It fails if replica is not a live replica of c, the failover is
// refused, or the cluster does not settle in time, naming a node that has
// not.
func (c *Cluster) Failover(replica *Server) error {
	if err := c.member(replica); err != nil {
		return err
	}
	if _, err := c.call(replica, []string{"CLUSTER", "FAILOVER"}); err != nil {
		return fmt.Errorf("localredis: node %s: %w", replica.Addr(), err)
	}
	err := waitCluster(time.Now().Add(clusterTimeout), func() error {
		r, err := c.role(replica)
		if err != nil {
			return fmt.Errorf("node %s: %w", replica.Addr(), err)
		}
		if !r.master {
			return fmt.Errorf("node %s is still a replica", replica.Addr())
		}
		_, err = c.view()
		return err
	})
	if err != nil {
		return fmt.Errorf("localredis: failover to %s not done within %v: %w", replica.Addr(), clusterTimeout, err)
	}
	return nil
}

// WaitOK waits up to timeout until the live nodes agree that the cluster is
// healthy: each reports cluster_state:ok; all report the same CLUSTER SLOTS,
// which names only live nodes; and each live replica's link to its master is
// up. After Server.Kill of a master this holds only once a replica has been
// promoted and the others have stopped listing the dead node: a few node
// timeouts, about 2.5 seconds with the default NodeTimeout. A timeout of 0
// checks once. The error names a node that did not agree and why.
func (c *Cluster) WaitOK(timeout time.Duration) error {
	err := waitCluster(time.Now().Add(timeout), func() error {
		_, err := c.view()
		return err
	})
	if err != nil {
		return fmt.Errorf("localredis: cluster not ok within %v: %w", timeout, err)
	}
	return nil
}

// Stop stops every node as Server.Stop does and removes their dirs. It is
// idempotent and returns the nodes' errors joined.
func (c *Cluster) Stop() error {
	var errs []error
	for _, s := range c.nodes {
		errs = append(errs, s.Stop())
	}
	return errors.Join(errs...)
}

// member fails unless s is a node of c.
func (c *Cluster) member(s *Server) error {
	if !slices.Contains(c.nodes, s) {
		return errors.New("localredis: server is not a node of this cluster")
	}
	return nil
}

// live returns the nodes whose process runs, in Nodes order.
func (c *Cluster) live() []*Server {
	var live []*Server
	for _, s := range c.nodes {
		if s.Pid() != 0 {
			live = append(live, s)
		}
	}
	return live
}

// view asks every live node for its state and returns the slot map they all
// report. It fails, naming the node, if a live node does not answer, does not
// report cluster_state:ok, is a replica whose link to its master is not up,
// or reports a map that differs from the first node's or names a node that
// is not live.
func (c *Cluster) view() ([]slotRange, error) {
	live := c.live()
	if len(live) == 0 {
		return nil, errors.New("no live node")
	}
	isLive := make(map[string]bool, len(live))
	for _, s := range live {
		isLive[s.Addr()] = true
	}

	var want []slotRange
	for _, s := range live {
		// CLUSTER SLOTS rather than SHARDS: it is what the proxy reads, and
		// it leaves out replicas flagged as failed.
		v, err := c.call(s, []string{"CLUSTER", "INFO"}, []string{"CLUSTER", "SLOTS"}, []string{"ROLE"})
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", s.Addr(), err)
		}
		info, _ := v[0].(string)
		if state := infoField(info, "cluster_state"); state != "ok" {
			return nil, fmt.Errorf("node %s: cluster_state is %q", s.Addr(), state)
		}
		ranges, err := parseSlots(v[1])
		if err != nil {
			return nil, fmt.Errorf("node %s: CLUSTER SLOTS: %w", s.Addr(), err)
		}
		r, err := parseRole(v[2])
		if err != nil {
			return nil, fmt.Errorf("node %s: ROLE: %w", s.Addr(), err)
		}
		if !r.master && r.link != "connected" {
			return nil, fmt.Errorf("node %s: link to master %s is %q", s.Addr(), r.masterAddr, r.link)
		}
		for _, rg := range ranges {
			for _, addr := range append([]string{rg.master}, rg.replicas...) {
				if !isLive[addr] {
					return nil, fmt.Errorf("node %s: CLUSTER SLOTS %d-%d lists %s, which is down", s.Addr(), rg.start, rg.end, addr)
				}
			}
		}
		if want == nil {
			want = ranges
		} else if !slices.EqualFunc(ranges, want, slotRange.equal) {
			return nil, fmt.Errorf("node %s: CLUSTER SLOTS %v differs from node %s's %v", s.Addr(), ranges, live[0].Addr(), want)
		}
	}
	return want, nil
}

// role asks s for its ROLE.
func (c *Cluster) role(s *Server) (role, error) {
	v, err := c.call(s, []string{"ROLE"})
	if err != nil {
		return role{}, err
	}
	return parseRole(v[0])
}

// call sends cmds to s over a new connection, after AUTH if the cluster has a
// password, and returns their replies in order. An error reply to any of them
// is returned as the error. The whole exchange is bounded by probeTimeout. A
// new connection each time means none outlives a Server.Kill or Restart.
func (c *Cluster) call(s *Server, cmds ...[]string) ([]any, error) {
	deadline := time.Now().Add(probeTimeout)
	conn, err := net.DialTimeout("tcp", s.Addr(), probeTimeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}

	if c.opts.Password != "" {
		cmds = append([][]string{{"AUTH", c.opts.Password}}, cmds...)
	}
	var req []byte
	for _, cmd := range cmds {
		req = appendCommand(req, cmd...)
	}
	if _, err := conn.Write(req); err != nil {
		return nil, err
	}

	r := bufio.NewReader(conn)
	replies := make([]any, len(cmds))
	for i, cmd := range cmds {
		name := cmd[0]
		if name == "CLUSTER" {
			name += " " + cmd[1]
		}
		v, err := readReply(r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if e, ok := v.(respError); ok {
			return nil, fmt.Errorf("%s: %w", name, e)
		}
		replies[i] = v
	}
	if c.opts.Password != "" {
		replies = replies[1:]
	}
	return replies, nil
}

// readReply reads one RESP2 reply: a string for a simple or bulk string, an
// int64 for an integer, []any for an array, nil for a null, and a respError
// value (not an error) for an error reply.
func readReply(r *bufio.Reader) (any, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	if line == "" {
		return nil, errors.New("empty reply line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return respError(line[1:]), nil
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < -1 || n > maxBulk {
			return nil, fmt.Errorf("bad bulk length %q", line)
		}
		if n == -1 {
			return nil, nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		return string(b[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < -1 || n > maxReplyItems {
			return nil, fmt.Errorf("bad array length %q", line)
		}
		if n == -1 {
			return nil, nil
		}
		items := make([]any, n)
		for i := range items {
			if items[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return items, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}

// parseSlots parses a CLUSTER SLOTS reply: per range, start, end, then the
// master's and each replica's [ip, port, id, ...].
func parseSlots(v any) ([]slotRange, error) {
	items, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("got %v, want an array", v)
	}
	ranges := make([]slotRange, 0, len(items))
	for _, item := range items {
		f, ok := item.([]any)
		if !ok || len(f) < 3 {
			return nil, fmt.Errorf("bad range %v", item)
		}
		start, ok1 := f[0].(int64)
		end, ok2 := f[1].(int64)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("bad range %v", item)
		}
		addrs := make([]string, len(f)-2)
		for i, n := range f[2:] {
			nf, ok := n.([]any)
			if !ok || len(nf) < 2 {
				return nil, fmt.Errorf("bad node %v", n)
			}
			ip, ok1 := nf[0].(string)
			port, ok2 := nf[1].(int64)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("bad node %v", n)
			}
			addrs[i] = net.JoinHostPort(ip, strconv.FormatInt(port, 10))
		}
		replicas := addrs[1:]
		slices.Sort(replicas)
		ranges = append(ranges, slotRange{start: start, end: end, master: addrs[0], replicas: replicas})
	}
	return ranges, nil
}

// equal reports whether r and o are the same range served by the same nodes.
func (r slotRange) equal(o slotRange) bool {
	return r.start == o.start && r.end == o.end && r.master == o.master && slices.Equal(r.replicas, o.replicas)
}

// parseRole parses a ROLE reply: ["master", offset, replicas] or
// ["slave", ip, port, link state, offset].
func parseRole(v any) (role, error) {
	f, ok := v.([]any)
	if !ok || len(f) == 0 {
		return role{}, fmt.Errorf("got %v, want an array", v)
	}
	switch f[0] {
	case "master":
		return role{master: true}, nil
	case "slave":
		if len(f) < 4 {
			return role{}, fmt.Errorf("short replica role %v", f)
		}
		ip, ok1 := f[1].(string)
		port, ok2 := f[2].(int64)
		link, ok3 := f[3].(string)
		if !ok1 || !ok2 || !ok3 {
			return role{}, fmt.Errorf("bad replica role %v", f)
		}
		return role{masterAddr: net.JoinHostPort(ip, strconv.FormatInt(port, 10)), link: link}, nil
	}
	return role{}, fmt.Errorf("unexpected role %v", f[0])
}

// waitCluster calls check every clusterPollInterval until it returns nil or
// deadline passes, and then returns check's last error.
func waitCluster(deadline time.Time, check func() error) error {
	for {
		err := check()
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return err
		}
		time.Sleep(clusterPollInterval)
	}
}
