package localredis_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startCluster starts a cluster for the test and logs how long it took.
func startCluster(t *testing.T, opts localredis.ClusterOptions) *localredis.Cluster {
	t.Helper()
	requireRedisServer(t)
	start := time.Now()
	c := redistest.StartCluster(t, opts)
	t.Logf("%d nodes ready in %v", len(c.Nodes()), time.Since(start).Round(time.Millisecond))
	return c
}

// newClusterClient returns a go-redis cluster client seeded with c's seeds.
func newClusterClient(t *testing.T, c *localredis.Cluster, password string) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:           c.Seeds(),
		Password:        password,
		Protocol:        2,
		DisableIdentity: true,
		DialTimeout:     time.Second,
		ReadTimeout:     time.Second,
	})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// keyOn returns a key whose slot is served by the i-th seed, found by asking
// node for CLUSTER KEYSLOT of candidate keys.
func keyOn(t *testing.T, c *localredis.Cluster, node *redis.Client, i int) string {
	t.Helper()
	m := c.Opts().Masters
	lo, hi := int64(i*localredis.ClusterSlots/m), int64((i+1)*localredis.ClusterSlots/m-1)
	for n := range 1000 {
		key := fmt.Sprintf("key-%d", n)
		slot, err := node.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
		}
		if slot >= lo && slot <= hi {
			return key
		}
	}
	t.Fatalf("no key found in slots %d-%d", lo, hi)
	return ""
}

// addrs returns the addresses of servers.
func addrs(servers []*localredis.Server) []string {
	var a []string
	for _, s := range servers {
		a = append(a, s.Addr())
	}
	return a
}

// mustMasters returns c.Masters() or fails the test.
func mustMasters(t *testing.T, c *localredis.Cluster) []*localredis.Server {
	t.Helper()
	masters, err := c.Masters()
	if err != nil {
		t.Fatalf("Masters: %v", err)
	}
	return masters
}

// mustReplicaOf returns c.ReplicaOf(m) or fails the test.
func mustReplicaOf(t *testing.T, c *localredis.Cluster, m *localredis.Server) *localredis.Server {
	t.Helper()
	r, err := c.ReplicaOf(m)
	if err != nil {
		t.Fatalf("ReplicaOf(%s): %v", m.Addr(), err)
	}
	return r
}

func TestClusterStart(t *testing.T) {
	ctx := context.Background()
	c := startCluster(t, localredis.ClusterOptions{Replicas: 1})
	nodes := c.Nodes()
	if len(nodes) != 6 {
		t.Fatalf("%d nodes, want 6", len(nodes))
	}

	for _, s := range nodes {
		info, err := newClient(t, s.Addr(), "", 0).ClusterInfo(ctx).Result()
		if err != nil {
			t.Fatalf("node %s: CLUSTER INFO: %v", s.Addr(), err)
		}
		for field, want := range map[string]string{
			"cluster_state":          "ok",
			"cluster_slots_assigned": "16384",
			"cluster_known_nodes":    "6",
			"cluster_size":           "3",
		} {
			if got := localredis.InfoField(info, field); got != want {
				t.Errorf("node %s: %s = %q, want %q", s.Addr(), field, got, want)
			}
		}
	}

	seeds := c.Seeds()
	masters := mustMasters(t, c)
	if !slices.Equal(masters, nodes[:3]) {
		t.Errorf("Masters() = %v, want the first 3 nodes %v", addrs(masters), addrs(nodes[:3]))
	}
	ids := make(map[string]bool)
	for i, m := range masters {
		if seeds[i] != m.Addr() {
			t.Errorf("Seeds()[%d] = %s, want %s", i, seeds[i], m.Addr())
		}
		r := mustReplicaOf(t, c, m)
		if slices.Contains(masters, r) {
			t.Errorf("ReplicaOf(%s) = %s, a master", m.Addr(), r.Addr())
		}
		for _, s := range []*localredis.Server{m, r} {
			id, err := c.NodeID(s)
			if err != nil || len(id) != 40 || ids[id] {
				t.Errorf("NodeID(%s) = %q, %v; want a new 40-character id", s.Addr(), id, err)
			}
			ids[id] = true
		}
	}

	// Each key is served by its slot's master and moved elsewhere.
	cc := newClusterClient(t, c, "")
	probe := newClient(t, seeds[0], "", 0)
	for i, m := range masters {
		key := keyOn(t, c, probe, i)
		if err := cc.Set(ctx, key, m.Addr(), 0).Err(); err != nil {
			t.Fatalf("cluster SET %s: %v", key, err)
		}
		if got, err := cc.Get(ctx, key).Result(); err != nil || got != m.Addr() {
			t.Errorf("cluster GET %s = %q, %v; want %q", key, got, err, m.Addr())
		}
		for _, other := range masters {
			got, err := newClient(t, other.Addr(), "", 0).Get(ctx, key).Result()
			if other == m {
				if err != nil || got != m.Addr() {
					t.Errorf("GET %s on its master %s = %q, %v", key, m.Addr(), got, err)
				}
			} else if err == nil || !strings.HasPrefix(err.Error(), "MOVED") || !strings.HasSuffix(err.Error(), m.Addr()) {
				t.Errorf("GET %s on %s: error %v, want MOVED to %s", key, other.Addr(), err, m.Addr())
			}
		}
	}
}

func TestClusterFailover(t *testing.T) {
	ctx := context.Background()
	const pw = "cluster secret"
	c := startCluster(t, localredis.ClusterOptions{Replicas: 1, Password: pw})
	m := c.Nodes()[0]
	r := mustReplicaOf(t, c, m)
	cc := newClusterClient(t, c, pw)
	key := keyOn(t, c, newClient(t, m.Addr(), pw, 0), 0)
	if err := cc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatalf("cluster SET: %v", err)
	}

	start := time.Now()
	if err := c.Failover(r); err != nil {
		t.Fatal(err)
	}
	t.Logf("manual failover took %v", time.Since(start).Round(time.Millisecond))

	masters := mustMasters(t, c)
	if !slices.Contains(masters, r) || slices.Contains(masters, m) || len(masters) != 3 {
		t.Errorf("Masters() = %v, want 3 with %s and without %s", addrs(masters), r.Addr(), m.Addr())
	}
	if got := mustReplicaOf(t, c, r); got != m {
		t.Errorf("ReplicaOf(new master) = %s, want old master %s", got.Addr(), m.Addr())
	}
	// A manual failover loses no write.
	if got, err := newClient(t, r.Addr(), pw, 0).Get(ctx, key).Result(); err != nil || got != "v" {
		t.Errorf("GET on new master = %q, %v; want \"v\"", got, err)
	}
	if got, err := cc.Get(ctx, key).Result(); err != nil || got != "v" {
		t.Errorf("cluster GET after failover = %q, %v; want \"v\"", got, err)
	}

	if err := c.Failover(m); err != nil {
		t.Fatalf("failover back: %v", err)
	}
	if err := c.Failover(m); err == nil {
		t.Errorf("Failover of a master: no error")
	}
}

func TestClusterKillMaster(t *testing.T) {
	ctx := context.Background()
	c := startCluster(t, localredis.ClusterOptions{Replicas: 1})
	m := c.Nodes()[1]
	r := mustReplicaOf(t, c, m)
	id, err := c.NodeID(m)
	if err != nil {
		t.Fatal(err)
	}
	mc := newClient(t, m.Addr(), "", 0)
	key := keyOn(t, c, mc, 1)
	if err := mc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if n, err := mc.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT = %d, %v; want 1 replica", n, err)
	}

	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	// The others still list the dead master as serving its slots.
	if err := c.WaitOK(0); err == nil || !strings.Contains(err.Error(), m.Addr()) {
		t.Errorf("WaitOK(0) right after Kill: %v, want an error naming %s", err, m.Addr())
	}
	start := time.Now()
	if err := c.WaitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("automatic failover settled in %v", time.Since(start).Round(time.Millisecond))

	masters := mustMasters(t, c)
	if !slices.Contains(masters, r) || len(masters) != 3 {
		t.Errorf("Masters() = %v, want 3 with the promoted %s", addrs(masters), r.Addr())
	}
	if got, err := newClient(t, r.Addr(), "", 0).Get(ctx, key).Result(); err != nil || got != "v" {
		t.Errorf("GET on promoted replica = %q, %v; want \"v\"", got, err)
	}
	if _, err := c.ReplicaOf(r); err == nil {
		t.Errorf("ReplicaOf(promoted) found a replica while the old master is down")
	}

	// The old master comes back with its node ID and rejoins as a replica.
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := c.WaitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted master rejoined in %v", time.Since(start).Round(time.Millisecond))
	if got, err := c.NodeID(m); err != nil || got != id {
		t.Errorf("NodeID after Restart = %q, %v; want %q", got, err, id)
	}
	if got := mustReplicaOf(t, c, r); got != m {
		t.Errorf("ReplicaOf(promoted) = %s, want old master %s", got.Addr(), m.Addr())
	}
}

func TestClusterStop(t *testing.T) {
	requireRedisServer(t)
	c, err := localredis.StartCluster(localredis.ClusterOptions{Masters: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	var dirs []string
	for _, s := range c.Nodes() {
		pids = append(pids, s.Pid())
		dirs = append(dirs, s.Dir())
	}
	for i := range 2 {
		if err := c.Stop(); err != nil {
			t.Fatalf("Stop #%d: %v", i+1, err)
		}
	}
	for i, s := range c.Nodes() {
		if err := syscall.Kill(pids[i], 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("signal 0 to pid %d after Stop: %v, want ESRCH", pids[i], err)
		}
		if _, err := os.Stat(dirs[i]); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("dir of %s after Stop: %v, want not exist", s.Addr(), err)
		}
	}
	if err := c.WaitOK(0); err == nil {
		t.Errorf("WaitOK after Stop: no error")
	}
}

func TestStartClusterErrors(t *testing.T) {
	tests := []struct {
		name    string
		opts    localredis.ClusterOptions
		wantErr string
	}{
		{"negative masters", localredis.ClusterOptions{Masters: -1}, "Masters"},
		{"too many masters", localredis.ClusterOptions{Masters: localredis.ClusterSlots + 1}, "Masters"},
		{"negative replicas", localredis.ClusterOptions{Replicas: -1}, "Replicas"},
		{"negative node timeout", localredis.ClusterOptions{NodeTimeout: -time.Second}, "NodeTimeout"},
		{"sub-millisecond node timeout", localredis.ClusterOptions{NodeTimeout: time.Microsecond}, "NodeTimeout"},
		{"bad arg", localredis.ClusterOptions{Masters: 1, Args: []string{"--no-such-option", "1"}}, "no-such-option"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := localredis.StartCluster(tt.opts)
			if err == nil {
				c.Stop()
				t.Fatalf("localredis.StartCluster succeeded, want error containing %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tt.wantErr)
			}
		})
	}
}
