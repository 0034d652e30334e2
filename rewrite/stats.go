package rewrite

import (
	"slices"
	"strings"
	"sync/atomic"
)

// keyCounters count what the engine did for one hot key since the proxy
// started. Monotonic; read without a lock.
type keyCounters struct {
	deductsOK      atomic.Uint64 // deducts (declared scripts, DECR/DECRBY) that took stock
	deductsSoldOut atomic.Uint64 // deducts answered "sold out" (DECR: covered only in part)
	deductsFailed  atomic.Uint64 // deducts answered with an error
	unitsSold      atomic.Uint64 // units the successful deducts took
	soldOutLocal   atomic.Uint64 // sold-out answers given from memory, no upstream call
	readsLocal     atomic.Uint64 // GETs answered from memory within read_staleness
	ringHops       atomic.Uint64 // buckets a deduct script was run on
	upstreamCalls  atomic.Uint64 // commands sent to Redis for the key
	bucketsLost    atomic.Uint64 // buckets this proxy found lost, each once per layout
	movesRecovered atomic.Uint64 // moves left unfinished by another (or an earlier) proxy that this one finished
	waitsShort     atomic.Uint64 // WAITs after a bucket change short of the rule's wait_replicas
}

// KeyStats is what PROXY HOTKEYS and the metrics show of one hot key: its
// buckets as last seen (no Redis call), and the counters since the proxy
// started.
type KeyStats struct {
	Key string
	// Buckets are the bucket values last seen, in bucket order; empty when
	// the layout is not known (the key does not exist, or was not met).
	Buckets []int64
	// Deducts by result; UnitsSold the units the OK ones took.
	DeductsOK, DeductsSoldOut, DeductsFailed, UnitsSold uint64
	// SoldOutLocal counts the sold-out answers given without Redis.
	SoldOutLocal uint64
	// ReadsLocal counts the GETs answered within read_staleness, without
	// Redis.
	ReadsLocal uint64
	// RingHops counts the buckets deducts were tried on: RingHops ÷
	// deducts is the ring's cost (1 when the first bucket tried covers).
	RingHops uint64
	// UpstreamCalls counts every command sent to Redis for the key.
	UpstreamCalls uint64
	// BucketsLost counts the buckets this proxy found lost (their key
	// missing while the layout names them), each once per layout;
	// LostUnits is what the lost buckets of the layout known now held
	// when last seen.
	BucketsLost uint64
	LostUnits   int64
	// MovesRecovered counts the moves between buckets left unfinished
	// (their proxy died or lost Redis half way) that this proxy finished
	// or undid.
	MovesRecovered uint64
	// WaitsShort counts the WAITs after requests that change buckets
	// (deducts, give backs, SETs, steps of moves) that fewer replicas than
	// the rule's wait_replicas acknowledged in time. A change they
	// followed is answered with an error: applied, it may be lost on
	// failover. (A deduct script run on a bucket too short to cover it
	// changed nothing, and its short WAIT is counted all the same.)
	WaitsShort uint64
}

// Met is the number of hot keys this proxy has met.
func (e *Engine) Met() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.keys)
}

// Stats returns the stats of every hot key this proxy has met, by key.
func (e *Engine) Stats() []KeyStats {
	e.mu.Lock()
	keys := make([]*hotKey, 0, len(e.keys))
	for _, h := range e.keys {
		keys = append(keys, h)
	}
	e.mu.Unlock()
	slices.SortFunc(keys, func(a, b *hotKey) int { return strings.Compare(a.name, b.name) })
	out := make([]KeyStats, len(keys))
	for i, h := range keys {
		c := &h.count
		out[i] = KeyStats{
			Key:            h.name,
			DeductsOK:      c.deductsOK.Load(),
			DeductsSoldOut: c.deductsSoldOut.Load(),
			DeductsFailed:  c.deductsFailed.Load(),
			UnitsSold:      c.unitsSold.Load(),
			SoldOutLocal:   c.soldOutLocal.Load(),
			ReadsLocal:     c.readsLocal.Load(),
			RingHops:       c.ringHops.Load(),
			UpstreamCalls:  c.upstreamCalls.Load(),
			BucketsLost:    c.bucketsLost.Load(),
			MovesRecovered: c.movesRecovered.Load(),
			WaitsShort:     c.waitsShort.Load(),
		}
		if l := h.layout.Load(); l != nil {
			for b := range l.N() {
				out[i].Buckets = append(out[i].Buckets, h.last[b].Load())
			}
			for _, u := range h.lostOf(l) {
				out[i].LostUnits += u
			}
		}
	}
	return out
}

// send is Upstream.Do, counted for h.
func (e *Engine) send(h *hotKey, reqs []Request) [][]byte {
	h.count.upstreamCalls.Add(uint64(len(reqs)))
	return e.up.Do(reqs)
}

// counted records a deduct's outcome and returns it: reply and err are
// what the client gets, soldout the script's sold-out reply.
func (h *hotKey) counted(reply []byte, err error, soldout []byte, amount int64) ([]byte, error) {
	switch {
	case err != nil:
		h.count.deductsFailed.Add(1)
	case string(reply) == string(soldout):
		h.count.deductsSoldOut.Add(1)
	default:
		h.count.deductsOK.Add(1)
		h.count.unitsSold.Add(uint64(amount))
	}
	return reply, err
}
