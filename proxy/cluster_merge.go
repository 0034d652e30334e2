package proxy

import (
	"math/rand/v2"
	"strconv"

	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
	"github.com/tidwall/redcon"
)

// mergeKind says how the replies of a command's parts, sent to several
// nodes, become the one reply a standalone Redis would give.
type mergeKind uint8

const (
	mergeOne    mergeKind = iota // one part: its reply as it is
	mergeArray                   // MGET split by slot: elements back in key order
	mergeAll                     // MSET split, FLUSHALL, SCRIPT LOAD…: the first error, else the first reply
	mergeSum                     // DEL, EXISTS… split, DBSIZE: the sum
	mergeAnd                     // SCRIPT EXISTS: 1 where every master has the script
	mergeConcat                  // KEYS: every master's keys
	mergeRandom                  // RANDOMKEY: a key from a master that has one
	mergeScan                    // SCAN on one master: the cursor names the master
	mergeInfo                    // INFO: one node's, plus the proxy's section
)

// mergeReplies appends to dst the reply of c, whose parts answered
// replies.
func (c *clusterCmd) mergeReplies(dst []byte, replies [][]byte) []byte {
	kind := c.merge
	if kind == mergeOne {
		return append(dst, replies[0]...)
	}
	for _, r := range replies {
		if resp.IsError(r) {
			return append(dst, r...)
		}
	}
	switch kind {
	case mergeArray:
		elems := make([][][]byte, len(replies))
		for i, r := range replies {
			var ok bool
			if elems[i], ok = resp.ArrayElems(r, nil); !ok {
				return append(dst, r...)
			}
		}
		per, start := max(c.per, 1), len(dst)
		dst = redcon.AppendArray(dst, len(c.order)*per)
		for _, p := range c.order {
			if len(elems[p]) < per {
				return redcon.AppendError(dst[:start], "ERR hotkeyproxy: short reply from a node")
			}
			for _, e := range elems[p][:per] {
				dst = append(dst, e...)
			}
			elems[p] = elems[p][per:]
		}
		return dst
	case mergeSum:
		var sum int64
		for _, r := range replies {
			n, ok := resp.IntValue(r)
			if !ok {
				return append(dst, r...)
			}
			sum += n
		}
		return redcon.AppendInt(dst, sum)
	case mergeAnd:
		all, ok := resp.ArrayElems(replies[0], nil)
		if !ok {
			return append(dst, replies[0]...)
		}
		have := make([]bool, len(all))
		for i, e := range all {
			have[i] = string(e) == ":1\r\n"
		}
		for _, r := range replies[1:] {
			elems, _ := resp.ArrayElems(r, nil)
			for i := range have {
				have[i] = have[i] && i < len(elems) && string(elems[i]) == ":1\r\n"
			}
		}
		for i := range have {
			have[i] = have[i] || i < len(c.known) && c.known[i]
		}
		dst = redcon.AppendArray(dst, len(have))
		for _, h := range have {
			if h {
				dst = append(dst, ":1\r\n"...)
			} else {
				dst = append(dst, ":0\r\n"...)
			}
		}
		return dst
	case mergeConcat:
		var elems [][]byte
		for _, r := range replies {
			var ok bool
			if elems, ok = resp.ArrayElems(r, elems); !ok {
				return append(dst, r...)
			}
		}
		dst = redcon.AppendArray(dst, len(elems))
		for _, e := range elems {
			dst = append(dst, e...)
		}
		return dst
	case mergeRandom:
		var found [][]byte
		for _, r := range replies {
			if _, ok := resp.BulkValue(r); ok {
				found = append(found, r)
			}
		}
		if len(found) == 0 {
			return append(dst, replies[0]...)
		}
		return append(dst, found[rand.IntN(len(found))]...)
	case mergeScan:
		return c.scan.merge(dst, replies[0])
	case mergeInfo:
		return addInfoSection(dst, replies[0], c.info, c.proto)
	}
	return append(dst, replies[0]...) // mergeAll
}

// A SCAN cursor through the proxy names the master as well as the
// position in it: cursor<<14 | the lowest slot of the master. A slot, not
// an address, so a scan goes on after a failover; the first master, which
// serves slot 0 in any complete cluster, starts at cursor 0.
const scanSlotBits = 14

// scanPos is where one step of a SCAN runs: on masters[i] of topo, from
// its own cursor.
type scanPos struct {
	topo   *upstream.Topology
	i      int
	cursor uint64
}

// parseScanCursor finds the master and its cursor from the client's
// cursor; ok is false when the cursor names no master (it was not made
// by this cluster's proxy) or does not parse.
func parseScanCursor(t *upstream.Topology, arg []byte) (scanPos, bool) {
	c, err := strconv.ParseUint(string(arg), 10, 64)
	if err != nil || len(t.Masters) == 0 {
		return scanPos{}, false
	}
	if c == 0 {
		return scanPos{topo: t}, true
	}
	slot := uint16(c & (hashslot.Count - 1))
	i := t.MasterOf(int(slot))
	if i < 0 || t.Lowest[i] != slot {
		return scanPos{}, false
	}
	return scanPos{topo: t, i: i, cursor: c >> scanSlotBits}, true
}

// merge rewrites the master's cursor in its SCAN reply into the proxy's:
// when the master is done, the scan moves on to the next one.
func (p scanPos) merge(dst, reply []byte) []byte {
	elems, ok := resp.ArrayElems(reply, nil)
	if !ok || len(elems) != 2 {
		return append(dst, reply...)
	}
	raw, _ := resp.BulkValue(elems[0])
	c, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil || c >= 1<<(64-scanSlotBits) {
		return redcon.AppendError(dst, "ERR hotkeyproxy: SCAN cursor out of range")
	}
	var next uint64
	switch {
	case c != 0:
		next = c<<scanSlotBits | uint64(p.topo.Lowest[p.i])
	case p.i+1 < len(p.topo.Masters):
		next = uint64(p.topo.Lowest[p.i+1])
	}
	dst = redcon.AppendArray(dst, 2)
	dst = redcon.AppendBulk(dst, strconv.AppendUint(nil, next, 10))
	return append(dst, elems[1]...)
}
