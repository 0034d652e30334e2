package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// clientMemory accounts the memory the sessions hold, for
// limits.max_client_memory, as Redis 7.0's maxmemory-clients does: each
// session's query buffer, the replies not yet written to it, and the
// requests it is relaying. Sessions report changes in bulk (when a buffer
// is made, grown, handed over or dropped), never per byte.
type clientMemory struct {
	total atomic.Int64 // bytes, all sessions
	scan  sync.Mutex   // one search for a client to evict at a time
}

// memAccount is one session's share of clientMemory. The session and its
// background writer both add to it.
type memAccount struct {
	srv     *Server
	held    atomic.Int64 // bytes
	evicted atomic.Bool  // closed for limits.max_client_memory; not yet gone
}

// add changes the session's share by d bytes; growth past
// limits.max_client_memory closes the client holding the most.
func (a *memAccount) add(d int64) {
	if d == 0 {
		return
	}
	a.held.Add(d)
	total := a.srv.clientMem.total.Add(d)
	if limit := a.srv.config().Limits.MaxClientMemory; d > 0 && limit > 0 && total > int64(limit) {
		a.srv.evictLargest(limit)
	}
}

// evictLargest closes the client holding the most memory while the clients
// together hold more than limit (not one that sent CLIENT NO-EVICT ON, as
// Redis spares it), counting out those already closed for it
// that have not freed theirs yet, so one surge closes one client, not many.
// A search under way elsewhere does the job.
func (s *Server) evictLargest(limit config.ByteSize) {
	if !s.clientMem.scan.TryLock() {
		return
	}
	defer s.clientMem.scan.Unlock()
	s.mu.Lock()
	var victim *session
	var most, leaving int64
	for sess := range s.sessions {
		n := sess.mem.held.Load()
		switch {
		case sess.mem.evicted.Load():
			leaving += n
		case n > most && !sess.info.noEvicting():
			victim, most = sess, n
		}
	}
	s.mu.Unlock()
	total := s.clientMem.total.Load()
	if victim == nil || total-leaving <= int64(limit) || !victim.mem.evicted.CompareAndSwap(false, true) {
		return
	}
	s.log.Warn("closing the client holding the most memory: the clients together hold more than limits.max_client_memory",
		"client", victim.nc.RemoteAddr().String(), "bytes", most, "total", total, "limit", limit.String())
	s.m.evicted[evictMemory].Inc()
	victim.abort()
}

// account brings the session's share up to date with the buffers it holds
// itself (the background writer accounts its own queue): the query buffer,
// the replies being gathered and the requests being batched.
func (s *session) account() {
	n := int64(s.rd.Size() + cap(s.out) + cap(s.b.Req))
	s.mem.add(n - s.memOwn)
	s.memOwn = n
}
