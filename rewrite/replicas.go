package rewrite

import (
	"errors"
	"strconv"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// A hot key whose rule sets wait_replicas has every change of its buckets
// followed by WAIT on the master that made it, on the same connection,
// right after the write: WAIT counts the replicas that have what its own
// connection wrote, so only there does it cover the change. Redis
// replicates asynchronously, so a change a master acknowledged can be
// missing on the replica a failover promotes; a change its replicas
// acknowledged cannot, when they are all the master has (Redis Cluster
// lets the replica with the highest offset try first, no guarantee).

// unackedError is a change of a bucket that its master applied but fewer
// replicas than the rule's wait_replicas acknowledged in time: it may be
// lost on failover. Its reply says so; the change stands on the master.
type unackedError struct {
	keyError
}

func newUnackedError(key string, written []byte, node string, acked, want int64, timeout time.Duration) *unackedError {
	return &unackedError{keyError{key: key, reason: "was changed in " + string(written) + " on " + node +
		", but only " + strconv.FormatInt(acked, 10) + " of " + strconv.FormatInt(want, 10) +
		" replicas acknowledged it within " + timeout.String() + "; the change was applied and may be lost on failover"}}
}

// isUnacked reports whether err is an unackedError.
func isUnacked(err error) bool {
	_, ok := errors.AsType[*unackedError](err)
	return ok
}

// sendChanges is send for requests that change buckets: with h's rule's
// wait_replicas, each is followed by WAIT on its connection, and
// unacked[i] is an unackedError when request i's WAIT came short; unacked
// is nil when every change was acknowledged or the rule does not wait. A
// request whose own reply is an error changed nothing to wait for.
func (e *Engine) sendChanges(h *hotKey, reqs []Request) (replies [][]byte, unacked []error) {
	rule := h.conf.Load().rule
	if rule.WaitReplicas <= 0 {
		return e.send(h, reqs), nil
	}
	timeout := rule.WaitTimeout.Duration()
	want := int64(rule.WaitReplicas)
	wait := [][]byte{[]byte("WAIT"), strconv.AppendInt(nil, want, 10), strconv.AppendInt(nil, timeout.Milliseconds(), 10)}
	with := make([]Request, 0, 2*len(reqs))
	for _, q := range reqs {
		with = append(with, q, Request{Key: q.Key, Args: wait, Follows: true, Blocks: true})
	}
	all := e.send(h, with)
	replies = make([][]byte, len(reqs))
	for i := range reqs {
		replies[i] = all[2*i]
		if resp.IsError(replies[i]) {
			continue
		}
		// A WAIT that failed (its node went away) acknowledged none.
		if acked, ok := resp.IntValue(all[2*i+1]); !ok || acked < want {
			if unacked == nil {
				unacked = make([]error, len(reqs))
			}
			h.count.waitsShort.Add(1)
			unacked[i] = newUnackedError(h.name, reqs[i].Key, e.up.Node(hashslot.Of(reqs[i].Key)), max(acked, 0), want, timeout)
		}
	}
	return replies, unacked
}

// sendChange is sendChanges of one request: its reply, and its
// unackedError or nil.
func (e *Engine) sendChange(h *hotKey, req Request) ([]byte, error) {
	return e.sendChangeIn(h, []Request{req})
}

// sendChangeIn is sendChange of req[0], its only request.
func (e *Engine) sendChangeIn(h *hotKey, req []Request) ([]byte, error) {
	rs, unacked := e.sendChanges(h, req)
	if unacked != nil {
		return rs[0], unacked[0]
	}
	return rs[0], nil
}

// sendEach is sendChanges with each unacknowledged change's reply replaced
// by its unackedError's: for the steps of a move, which are then left as
// they are, for whoever looks next, as after a node failure.
func (e *Engine) sendEach(h *hotKey, reqs []Request) [][]byte {
	replies, unacked := e.sendChanges(h, reqs)
	for i, err := range unacked {
		if err != nil {
			replies[i] = errorReply(err)
		}
	}
	return replies
}
