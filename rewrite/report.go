package rewrite

import (
	"errors"
	"slices"
	"strconv"

	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// Report is the reply to PROXY HOTKEYS: for each hot key this proxy has
// met, read fresh from Redis, an array of
//
//	key, <key>, buckets, <n>, sum, <sum>, sold_out, yes|no,
//	bucket_keys, [<key>…], nodes, [<host:port>…], values, [<value>…],
//	deducts_ok, <n>, deducts_sold_out, <n>, deducts_failed, <n>,
//	units_sold, <n>, sold_out_local, <n>, reads_local, <n>, ring_hops, <n>,
//	upstream_calls, <n>
//
// (the counters since this proxy started; see KeyStats)
// so that redis-cli shows it as a list of fields (a map each in RESP3,
// as p asks); a key that does not
// exist now has buckets 0. A layout with buckets found lost has two more
// fields: lost_buckets, [<bucket>…], lost_units, [<units>…], the units
// each held when last seen (by the proxy that found it lost first, as
// recorded in Redis); its values then show 0 for them.
func (e *Engine) Report(p resp.Proto) []byte {
	e.mu.Lock()
	names := make([]string, 0, len(e.keys))
	for k := range e.keys {
		names = append(names, k)
	}
	e.mu.Unlock()
	slices.Sort(names)
	var out []byte
	n := 0
	for _, k := range names {
		h := e.key([]byte(k))
		h.seen.Store(0) // read it afresh
		l, st, err := e.load(h, false)
		if errors.Is(err, errPlain) {
			e.Forget([]byte(k)) // learned, and plain again
			continue
		}
		n++
		if err != nil {
			out = append(out, errorReply(err)...)
			continue
		}
		var sum int64
		var values []int64
		if st == stateHot {
			if sum, err = e.readBuckets(h, l); err != nil && !isLost(err) {
				out = append(out, errorReply(err)...)
				continue
			}
			for i := range l.N() {
				values = append(values, h.last[i].Load())
			}
		}
		n := 0
		var lost []int
		if l != nil && st == stateHot {
			n = l.N()
			for b := range h.lostOf(l) {
				lost = append(lost, b)
			}
			slices.Sort(lost)
		}
		if len(lost) > 0 {
			out = p.AppendMap(out, 17)
		} else {
			out = p.AppendMap(out, 15)
		}
		out = field(out, "key", []byte(k))
		out = field(out, "buckets", strconv.AppendInt(nil, int64(n), 10))
		out = field(out, "sum", strconv.AppendInt(nil, sum, 10))
		sold := "no"
		if at := h.soldAt.Load(); at != 0 && e.since(at) < e.settings.Load().soldoutTTL {
			sold = "yes"
		}
		out = field(out, "sold_out", []byte(sold))
		out = redcon.AppendBulk(out, []byte("bucket_keys"))
		out = redcon.AppendArray(out, n)
		for i := 0; i < n; i++ {
			out = redcon.AppendBulk(out, l.Bucket(i))
		}
		out = redcon.AppendBulk(out, []byte("nodes"))
		out = redcon.AppendArray(out, n)
		for i := 0; i < n; i++ {
			out = redcon.AppendBulk(out, []byte(e.up.Node(hashslot.Of(l.Bucket(i)))))
		}
		out = redcon.AppendBulk(out, []byte("values"))
		out = redcon.AppendArray(out, len(values))
		for _, v := range values {
			out = redcon.AppendBulk(out, strconv.AppendInt(nil, v, 10))
		}
		c := &h.count
		for _, f := range []struct {
			name string
			n    uint64
		}{
			{"deducts_ok", c.deductsOK.Load()},
			{"deducts_sold_out", c.deductsSoldOut.Load()},
			{"deducts_failed", c.deductsFailed.Load()},
			{"units_sold", c.unitsSold.Load()},
			{"sold_out_local", c.soldOutLocal.Load()},
			{"reads_local", c.readsLocal.Load()},
			{"ring_hops", c.ringHops.Load()},
			{"upstream_calls", c.upstreamCalls.Load()},
		} {
			out = field(out, f.name, strconv.AppendUint(nil, f.n, 10))
		}
		if len(lost) > 0 {
			units := h.lostOf(l)
			out = redcon.AppendBulk(out, []byte("lost_buckets"))
			out = redcon.AppendArray(out, len(lost))
			for _, b := range lost {
				out = redcon.AppendBulk(out, strconv.AppendInt(nil, int64(b), 10))
			}
			out = redcon.AppendBulk(out, []byte("lost_units"))
			out = redcon.AppendArray(out, len(lost))
			for _, b := range lost {
				out = redcon.AppendBulk(out, strconv.AppendInt(nil, units[b], 10))
			}
		}
	}
	return append(redcon.AppendArray(nil, n), out...)
}

func field(out []byte, name string, v []byte) []byte {
	return redcon.AppendBulk(redcon.AppendBulk(out, []byte(name)), v)
}
