package upstream

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/internal/keyspec"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
	"github.com/tidwall/redcon"
)

// keyTableRetry is how long KeyTable waits after a failed COMMAND before
// it asks again: not once per command while Redis is down or answers
// COMMAND with something else.
const keyTableRetry = time.Second

// Redis is the Redis behind the proxy: a standalone server or a cluster.
// It is the hot-key engine's rewrite.Upstream. Safe for concurrent use.
type Redis struct {
	// Exactly one is set, by New, and never changed.
	Pool    *Pool    // a standalone server
	Cluster *Cluster // a cluster

	// Logins are the ACL users clients logged in as, with upstream
	// client_auth "redis"; unused otherwise.
	Logins *Logins

	// Cluster mode's round trips for Do, reused.
	trips sync.Pool
	// doConn is standalone Do's shared connection, as Pool.Send left it:
	// kept, so that a hot-key command does not look it up in the pool.
	doConn atomic.Pointer[Conn]
	// turn spreads Do's calls that block (rewrite.Request.Blocks) over
	// the Blocking connections.
	turn atomic.Uint64

	// Standalone mode's command table, asked once.
	keys    atomic.Pointer[keyspec.Table]
	keysMu  sync.Mutex   // one asks
	keysErr atomic.Int64 // unix nanos of the last failed ask
}

var _ rewrite.Upstream = (*Redis)(nil)

// New returns the upstream cfg describes, which must have passed
// validation. A standalone server is dialed on first use; a cluster's
// slot map is loaded before New returns when a seed answers, else in the
// background, and kept fresh until Close. upstream.tls's files are read
// here, once: a change to them needs a restart. log gets the nodes going down
// and up and the slot map's changes.
func New(cfg *config.Upstream, log *slog.Logger, m Metrics) (*Redis, error) {
	m = m.orNowhere()
	tlsBase, err := cfg.TLS.ClientConfig()
	if err != nil {
		return nil, err
	}
	switch cfg.Mode {
	case config.ModeStandalone:
		d := newDialer(cfg, tlsBase, cfg.Addrs[0])
		return &Redis{Pool: newPool(d, cfg.ConnsPerNode, cfg.ReadTimeout.Duration(), m.Node(d.addr), log), Logins: newLogins()}, nil
	case config.ModeCluster:
		u := &Redis{Cluster: newCluster(cfg, tlsBase, log, m), Logins: newLogins()}
		u.trips.New = func() any { r := NewRoundTrip(u.Cluster, 0); return &r }
		return u, nil
	}
	return nil, fmt.Errorf("proxy: unknown upstream.mode %q", cfg.Mode)
}

// Close retires every shared connection, failing the batches in flight,
// and stops the cluster's refresh.
func (u *Redis) Close() {
	u.Logins.close()
	if u.Cluster != nil {
		u.Cluster.close()
	} else {
		u.Pool.close()
	}
}

// Verify checks a client's AUTH, req (AUTH with the password alone, or
// user and password), with Redis and returns its reply (see Pool.Verify):
// the standalone server's, or in cluster mode the first master's (a seed
// while no slot map is loaded). Cluster nodes keep their ACL users each
// on its own: a user must exist on every node with the same password.
func (u *Redis) Verify(req []byte) ([]byte, error) {
	if c := u.Cluster; c != nil {
		if t, _, err := c.Current(); err == nil {
			return t.Masters[0].Pool.Verify(req)
		}
		return c.Node(c.cfg.Addrs[0]).Pool.Verify(req)
	}
	return u.Pool.Verify(req)
}

// Do implements rewrite.Upstream: in standalone mode all requests go in
// one batch on a shared connection of db 0, where hot keys live; in
// cluster mode each to its slot's master, redirections followed, a
// follower (Request.Follows) with the request before it. A call with a
// request that blocks (Request.Blocks: a WAIT) goes on the Blocking
// connections of db 0 instead, each call on the next of them.
func (u *Redis) Do(reqs []rewrite.Request) [][]byte {
	if c := u.Cluster; c != nil {
		t, _, err := c.Current()
		if err != nil {
			replies := make([][]byte, len(reqs))
			for i := range replies {
				replies[i] = redcon.AppendError(nil, ErrorText(err))
			}
			return replies
		}
		r := u.trips.Get().(*RoundTrip)
		defer u.trips.Put(r)
		r.SetBlocking(u.lane(reqs))
		var n *Node
		for _, q := range reqs {
			if q.Follows && n != nil {
				r.QueueFollower(q.Args)
				continue
			}
			slot := int(hashslot.Of(q.Key))
			if n = t.Node(slot); n == nil {
				n = t.Masters[0] // it answers CLUSTERDOWN, which is retried
			}
			r.Queue(n, slot, nil, q.Args)
		}
		r.Run()
		// The replies outlive the RoundTrip's buffers: one copy holds them.
		size := 0
		for i := range reqs {
			size += len(r.Reply(i))
		}
		replies, out := replyRoom(len(reqs), size)
		for i := range replies {
			start := len(out)
			out = append(out, r.Reply(i)...)
			replies[i] = out[start:len(out):len(out)]
		}
		r.Reset()
		return replies
	}
	b := doBatches.Get().(*Batch)
	defer doBatches.Put(b)
	b.Req, b.N, b.Done, b.OKLen, b.Err, b.Ends = b.Req[:0], len(reqs), 0, 0, nil, b.Ends[:0]
	for _, q := range reqs {
		b.Req = resp.AppendCommand(b.Req, q.Args...)
	}
	// The replies are returned: Out is the one part never reused.
	replies, out := replyRoom(len(reqs), 64*len(reqs))
	b.Out = out
	if blocking, id := u.lane(reqs); blocking {
		var conn *Conn
		u.Pool.Send(&conn, Key{Blocking: true}, id, b)
	} else {
		kept := u.doConn.Load()
		conn := kept
		u.Pool.Send(&conn, Key{}, 0, b)
		if conn != kept {
			u.doConn.Store(conn)
		}
	}
	<-b.DoneCh
	done := b.replies(replies[:0])
	for i := len(done); i < len(replies); i++ {
		replies[i] = redcon.AppendError(nil, ErrorText(b.Err))
	}
	b.Out = nil
	return replies
}

// lane is where Do's call with reqs goes: the shared connections of id 0,
// or, when one of reqs blocks its connection (Request.Blocks), the next
// Blocking connection (id from turn).
func (u *Redis) lane(reqs []rewrite.Request) (blocking bool, id uint64) {
	if slices.ContainsFunc(reqs, func(q rewrite.Request) bool { return q.Blocks }) {
		return true, u.turn.Add(1)
	}
	return false, 0
}

// oneReply is Do's room for the reply to one request, made in one piece:
// a hot-key deduct's round trip then allocates once.
type oneReply struct {
	replies [1][]byte
	out     [64]byte
}

// replyRoom is Do's room for n replies of about size bytes in all.
func replyRoom(n, size int) ([][]byte, []byte) {
	if n == 1 && size <= len(oneReply{}.out) {
		r := new(oneReply)
		return r.replies[:], r.out[:0]
	}
	return make([][]byte, n), make([]byte, 0, size)
}

// doBatches are standalone Do's batches, each with its DoneCh, Ends and
// request buffer, reused once their replies are in: a hot-key deduct then
// allocates for its replies only.
var doBatches = sync.Pool{New: func() any { return &Batch{Ends: make([]int, 0, 8), DoneCh: make(chan struct{}, 1)} }}

// Placement implements rewrite.Upstream.
func (u *Redis) Placement() (int, func(uint16) int) {
	if c := u.Cluster; c != nil {
		if t, _, err := c.Current(); err == nil {
			return len(t.Masters), func(s uint16) int { return t.MasterOf(int(s)) }
		}
	}
	return 1, func(uint16) int { return 0 }
}

// Node implements rewrite.Upstream: the address of the master serving
// slot, or "?" while the cluster has none.
func (u *Redis) Node(slot uint16) string {
	if c := u.Cluster; c != nil {
		if t, _, err := c.Current(); err == nil && t.Node(int(slot)) != nil {
			return t.Node(int(slot)).Addr
		}
		return "?"
	}
	return u.Pool.addr
}

// KeyTable is the command table that says which arguments are keys: the
// cluster's, loaded with the slot map, or in standalone mode the server's,
// asked once. It is nil while it could not be read (Redis down, COMMAND
// refused); a standalone server is asked again a second after a failure
// at the earliest.
func (u *Redis) KeyTable() *keyspec.Table {
	if u.Cluster != nil {
		_, k, _ := u.Cluster.Current()
		return k
	}
	if k := u.keys.Load(); k != nil {
		return k
	}
	if u.failedLately() {
		return nil
	}
	u.keysMu.Lock() // one COMMAND at a time, however many clients ask
	defer u.keysMu.Unlock()
	if k := u.keys.Load(); k != nil {
		return k
	}
	if u.failedLately() {
		return nil
	}
	replies, err := u.Pool.Ask(resp.AppendCommand(nil, []byte("COMMAND")), 1)
	var k *keyspec.Table
	if err == nil {
		k, err = keyspec.Parse(replies[0])
	}
	if err != nil {
		u.keysErr.Store(time.Now().UnixNano())
		return nil
	}
	u.keys.Store(k)
	return k
}

// failedLately reports whether the last COMMAND failed within keyTableRetry.
func (u *Redis) failedLately() bool {
	at := u.keysErr.Load()
	return at != 0 && time.Since(time.Unix(0, at)) < keyTableRetry
}
