package rewrite

import (
	"errors"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// moveGap is how long a proxy that found too little stock waits before it
// looks again: longer than a move between two buckets takes.
const moveGap = 5 * time.Millisecond

// estimate is the sum of the last values seen of l's buckets.
func (h *hotKey) estimate(l *Layout) int64 {
	var sum int64
	for i := range l.N() {
		sum += h.last[i].Load()
	}
	return sum
}

// startBucket is where a deduct on l's buckets begins: drawn at random,
// or fixed per client (route: client). A master is chosen first, then one
// of its buckets, so that each master takes an equal share of the deducts
// whatever N mod M is (8 buckets over 3 masters: ⅓ each, not 3/8 and 2/8).
//
// Drawn at random, the masters take the deducts in turn, startRun each,
// and each deduct starts on a random bucket of its master. The deducts
// that arrive together then mostly go to one master, where they share
// one write and one read of its replies (the upstream connection sends
// in one write the batches queued while its writer yields), for the
// proxy and for Redis, where spread over M masters they would take M of
// each. The turns give each master its share whatever the other traffic
// on the masters (to within one turn a recheck: each reading of the
// layout starts its turns at a random master), and keep a crowd (a
// thousand clients answered at once) in many small runs, so no master
// waits for work while another has it all. A key whose changes wait for
// replicas takes a random master each time: each of its deducts goes on
// a connection of its own that its WAIT blocks, so a run would share no
// write and would queue on the master's few such connections.
func (e *Engine) startBucket(h *hotKey, l *Layout, client uint64) int {
	rule := &h.conf.Load().rule
	perClient := rule.Route == config.RouteClient
	groups := l.byMaster
	if len(groups) <= 1 {
		if perClient {
			return int(client % uint64(l.N()))
		}
		return e.intN(l.N())
	}
	if perClient {
		g := groups[client%uint64(len(groups))]
		return g[client/uint64(len(groups))%uint64(len(g))]
	}
	var g []int
	if rule.WaitReplicas > 0 {
		g = groups[e.intN(len(groups))]
	} else {
		g = groups[(l.starts.Add(1)-1)/startRun%uint64(len(groups))]
	}
	return g[e.intN(len(g))]
}

// startRun is how many deducts in a row a master takes. A turn's end
// splits the deducts that arrive together (50 clients at depth 1: about
// 5) once in startRun/5 times: at 16 that kept 60% of the saving in
// writes to Redis, at 64 all of it (proxy CPU per deduct alike with every
// burst on one master); a master's turn is still a fraction of a
// millisecond of its work.
const startRun = 64

// soldOut reports whether a deduct of amount can be answered "sold out"
// without Redis: one was, within soldout_ttl. When that has expired, one
// caller goes to Redis to find out again while the others keep the
// answer, so a storm of requests after the sell-out costs one round trip
// per ttl, not one each.
func (e *Engine) soldOut(h *hotKey, amount int64) bool {
	at := h.soldAt.Load()
	ttl := e.settings.Load().soldoutTTL
	if at == 0 || ttl <= 0 || amount < h.soldAmount.Load() {
		return false
	}
	// Once expired, the caller that moves soldAt on checks; the rest wait
	// on its answer, which comes within one round trip.
	return e.since(at) < ttl || !h.soldAt.CompareAndSwap(at, e.now())
}

// soldOutSeen reports whether a deduct of amount was concluded sold out
// within soldout_ttl (or, without memory, within moveGap): a deduct that
// waited for another's conclusion takes it.
func (e *Engine) soldOutSeen(h *hotKey, amount int64) bool {
	at := h.soldAt.Load()
	return at != 0 && amount >= h.soldAmount.Load() && e.since(at) < max(e.settings.Load().soldoutTTL, moveGap)
}

// deduct takes amount from one bucket that holds it: first the buckets
// last seen holding enough, in ring order from the start bucket, without
// waiting on anyone. When none does, the slow path reads every bucket
// afresh; when no bucket alone holds the amount but together they do, it
// moves stock into bucket 0 until that one does. Stock is never held
// aside, so concurrent deducts (on any proxy) cannot each hold a part and
// all fail; and "sold out" is concluded only from Redis: two fresh reads,
// a moment apart, both short of the amount, each after every move found
// in flight (on any proxy, or left by one that died) was finished, so that
// no unit in transit between two buckets goes unseen. ok is false when
// sold out. The error is errGone when a bucket is missing, a lostError
// when the deduct met a bucket found lost, or a bucket's node failure
// when the stock of the others does not cover the amount. order is the
// caller's order id, for the journal (nil: none).
func (e *Engine) deduct(h *hotKey, l *Layout, amount int64, client uint64, order []byte) (ok bool, err error) {
	if e.soldOut(h, amount) {
		return false, nil
	}
	n := l.N()
	start := e.startBucket(h, l, client)
	// A bucket whose node does not answer is passed over: the stock of
	// the others is still for sale.
	var unreachable error
	ring := func() (bool, error) {
		for i := 0; i < n; i++ {
			b := (start + i) % n
			if h.last[b].Load() < amount {
				continue
			}
			ok, err := e.tryDeduct(h, l, b, amount, order)
			switch {
			case ok || errors.Is(err, errGone) || isLost(err):
				return ok, err
			case err != nil:
				unreachable = err
			}
		}
		return false, nil
	}
	if ok, err := ring(); ok || err != nil {
		return ok, err
	}
	h.slow.Lock()
	defer h.slow.Unlock()
	if e.soldOutSeen(h, amount) {
		return false, nil // concluded by the deduct that held the lock before
	}
	short := 0
	for attempt := 0; attempt < 4 && short < 2; attempt++ {
		sum, err := e.readBuckets(h, l)
		switch {
		case errors.Is(err, errGone) || isLost(err):
			return false, err
		case err != nil:
			unreachable = err
		}
		if ok, err := ring(); ok || err != nil {
			return ok, err
		}
		if sum < amount {
			if unreachable != nil {
				return false, unreachable // stock may sit where we cannot see
			}
			// Stock in a move in flight is in no bucket: the move is
			// finished here, whoever started it, and the buckets read
			// again.
			switch moved, err := e.finishMoves(h, l, 0); {
			case err != nil:
				return false, err
			case moved > 0:
				continue
			}
			short++
			e.clock.Sleep(moveGap)
			continue
		}
		if err := e.consolidate(h, l, amount); err != nil {
			return false, err
		}
		if ok, err := e.tryDeduct(h, l, 0, amount, order); ok || err != nil {
			return ok, err
		}
	}
	h.soldAmount.Store(amount)
	h.soldAt.Store(e.now())
	return false, nil
}

// tryDeduct runs the deduct script on bucket b: ok when b covered amount,
// with an unackedError when b's replicas did not acknowledge the take.
// order is the caller's order id, for the journal (nil: none).
func (e *Engine) tryDeduct(h *hotKey, l *Layout, b int, amount int64, order []byte) (ok bool, err error) {
	h.count.ringHops.Add(1)
	got, v, err := e.bucketOp(h, l, b, scriptDeduct, amount, order)
	if err != nil && !isUnacked(err) {
		return false, err
	}
	h.last[b].Store(v)
	if got != 1 {
		return false, nil // nothing taken: no change to be lost
	}
	return true, err
}

// consolidate moves stock from the other buckets into bucket 0 until it
// holds want (or everything is there), one move at a time: taken from
// one with its intent, applied to bucket 0 (see "Moves between buckets"
// in the package doc). A bucket found lost is passed over: it has
// nothing to give. A move a node failed is left to whoever looks next.
func (e *Engine) consolidate(h *hotKey, l *Layout, want int64) error {
	for b := 1; b < l.N() && h.last[0].Load() < want; b++ {
		if h.isLost(l, b) {
			continue
		}
		m, err := e.startMove(h, l, b, 0, want-h.last[0].Load())
		switch {
		case isLost(err):
			continue
		case err != nil:
			return err
		case m.amount == 0:
			continue
		}
		if _, err := e.settle(h, l, []move{m}); err != nil {
			return err
		}
	}
	return nil
}

// decrBy takes amount (> 0) from the buckets that have stock; when they
// cannot cover it all, everything left is moved into bucket 0 and the
// amount taken from there, so bucket 0 goes negative and no other bucket
// holds stock while the sum is below zero: the sum changes exactly as a
// plain key's would (contract 4). covered is false when there was a
// shortfall.
func (e *Engine) decrBy(h *hotKey, l *Layout, amount int64, client uint64) (covered bool, err error) {
	if ok, err := e.deduct(h, l, amount, client, nil); ok || err != nil {
		return ok, err
	}
	h.slow.Lock()
	defer h.slow.Unlock()
	// What the other buckets hold goes to bucket 0 first, so that none
	// holds stock while the sum is below zero; skipped when the reads
	// that just concluded "sold out" found them empty.
	empty := true
	for b := 1; b < l.N(); b++ {
		empty = empty && h.last[b].Load() <= 0
	}
	if !empty {
		if err := e.consolidate(h, l, 1<<62); err != nil {
			return false, err
		}
	}
	_, v, err := e.bucketOp(h, l, 0, scriptAdd, -amount, nil)
	if err != nil && !isUnacked(err) {
		return false, err
	}
	h.last[0].Store(v)
	return v >= 0, err
}

// incrBy gives amount (>= 0) back, to bucket 0: a debt there (another
// proxy's, too) is repaid first, in the same step, and stock added
// elsewhere while the sum is below zero could be sold although a plain
// key would have none. One call; INCRs do not spread over the buckets.
func (e *Engine) incrBy(h *hotKey, l *Layout, amount int64) error {
	_, v, err := e.bucketOp(h, l, 0, scriptAdd, amount, nil)
	if err != nil && !isUnacked(err) {
		return err
	}
	h.last[0].Store(v)
	h.soldAt.Store(0) // stock is back
	return err
}
