package proxy

import (
	"bytes"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/cluster"
	"github.com/hotkeyproxy/hotkeyproxy/keyspec"
	"github.com/hotkeyproxy/hotkeyproxy/resp"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
)

// hotUpstream is the proxy's upstream as the hot-key engine sees it.
type hotUpstream struct{ srv *Server }

// Do implements rewrite.Upstream: in standalone mode all requests go in
// one batch on a shared connection of db 0, where hot keys live; in
// cluster mode each to its slot's master, redirections followed.
func (u hotUpstream) Do(reqs []rewrite.Request) [][]byte {
	replies := make([][]byte, len(reqs))
	if c := u.srv.cluster; c != nil {
		t, _, err := c.current()
		if err != nil {
			for i := range replies {
				replies[i] = resp.AppendError(nil, errorText(err))
			}
			return replies
		}
		r := roundTripper{c: c}
		for _, q := range reqs {
			slot := int(cluster.Slot(q.Key))
			n := t.slots[slot]
			if n == nil {
				n = t.masters[0] // it answers CLUSTERDOWN, which is retried
			}
			r.queuePart(n, slot, nil, q.Args)
		}
		r.run()
		for i := range replies {
			replies[i] = r.parts[i].reply
		}
		return replies
	}
	var req []byte
	for _, q := range reqs {
		req = resp.AppendCommand(req, q.Args...)
	}
	conn, err := u.srv.pool.get(0, 0)
	b := &batch{req: req, n: len(reqs), ends: make([]int, 0, len(reqs)), doneCh: make(chan struct{}, 1)}
	if err == nil {
		conn.send(b)
		<-b.doneCh
		err = b.err
	}
	done := b.replies(nil)
	copy(replies, done)
	for i := len(done); i < len(replies); i++ {
		replies[i] = resp.AppendError(nil, errorText(err))
	}
	return replies
}

// Placement implements rewrite.Upstream.
func (u hotUpstream) Placement() (int, func(uint16) int) {
	if c := u.srv.cluster; c != nil {
		if t, _, err := c.current(); err == nil {
			return len(t.masters), func(s uint16) int { return t.masterIndex(t.slots[s]) }
		}
	}
	return 1, func(uint16) int { return 0 }
}

// Node implements rewrite.Upstream.
func (u hotUpstream) Node(slot uint16) string {
	if c := u.srv.cluster; c != nil {
		if t, _, err := c.current(); err == nil && t.slots[slot] != nil {
			return t.slots[slot].addr
		}
		return "?"
	}
	return u.srv.cfg.Upstream.Addrs[0]
}

// keyTable is the command table that says which arguments are keys: the
// cluster's, or in standalone mode the server's, asked once.
func (srv *Server) keyTable() *keyspec.Table {
	if srv.cluster != nil {
		_, k, _ := srv.cluster.current()
		return k
	}
	if k := srv.keys.Load(); k != nil {
		return k
	}
	srv.keysMu.Lock() // one COMMAND at a time, however many clients ask
	defer srv.keysMu.Unlock()
	if k := srv.keys.Load(); k != nil {
		return k
	}
	replies, err := srv.pool.ask(resp.AppendCommand(nil, []byte("COMMAND")), 1)
	if err != nil {
		return nil
	}
	k, err := keyspec.Parse(replies[0])
	if err != nil {
		return nil
	}
	srv.keys.Store(k)
	return k
}

// perKey are the multi-key commands the proxy answers key by key when a
// hot key is among them, with how the answers add up.
var perKey = map[string]bool{"mget": true, "del": true, "unlink": true, "exists": true, "touch": true}

// hotCommand answers cmd when it names a hot key, and reports whether it
// did. Hot keys live in db 0.
func (s *session) hotCommand(cmd *resp.Command, name string) bool {
	e := s.srv.hot
	if e == nil || s.db != 0 || s.streaming {
		return false
	}
	table := s.srv.keyTable()
	if table == nil {
		// Which arguments are keys is unknown (Redis down, COMMAND
		// refused): a command naming a hot key anywhere must not reach
		// it as a plain key.
		for _, a := range cmd.Args[1:] {
			if e.Hot(a) {
				s.replyError("ERR hotkeyproxy: '" + string(a) + "' is a hot key, and the command table could not be read from Redis")
				return true
			}
		}
		return false
	}
	var buf [8]int
	idx, _ := table.Keys(cmd.Args, buf[:0])
	hot := -1
	for _, i := range idx {
		if e.Hot(cmd.Args[i]) {
			hot = i
			break
		}
	}
	if hot < 0 {
		if (name == "get" || name == "mget") && !s.inMulti && !s.pinned() {
			s.markGet(cmd.Args, idx)
		}
		return false
	}
	if s.inMulti {
		s.replyError("ERR hotkeyproxy: '" + string(cmd.Args[hot]) + "' is a hot key held as buckets; it cannot be used inside MULTI")
		s.cs.txDirty = true
		return true
	}
	s.flush()
	if len(idx) == 1 || !perKey[name] {
		s.reply(e.Do(cmd.Args, hot, s.id))
		return true
	}
	// One command per key, then put together as one Redis would reply.
	up := hotUpstream{s.srv}
	var out []byte
	var sum int64
	for _, i := range idx {
		args := [][]byte{cmd.Args[0], cmd.Args[i]}
		if name == "mget" {
			args[0] = []byte("GET")
		}
		var r []byte
		if e.Hot(cmd.Args[i]) {
			r = e.Do(args, 1, s.id)
		} else {
			r = up.Do([]rewrite.Request{{Key: cmd.Args[i], Args: args}})[0]
		}
		if resp.IsError(r) {
			s.reply(r)
			return true
		}
		if name == "mget" {
			out = append(out, r...)
		} else {
			n, _ := resp.IntValue(r)
			sum += n
		}
	}
	if name == "mget" {
		s.reply(append(resp.AppendArrayHeader(nil, len(idx)), out...))
	} else {
		s.reply(resp.AppendInt(nil, sum))
	}
	return true
}

// getMark is a GET or MGET sent upstream whose reply may hold a layout.
type getMark struct {
	reply int   // its reply's place among those of the batch
	keys  []int // where each key ends in session.getKeys
}

// markGet notes a GET or MGET being queued: it is answered by Redis, and
// if a key turns out to hold a layout, readLayouts answers it again.
func (s *session) markGet(args [][]byte, idx []int) {
	m := getMark{reply: s.b.n + len(s.cs.cmds)}
	for _, i := range idx {
		s.getKeys = append(s.getKeys, args[i]...)
		m.keys = append(m.keys, len(s.getKeys))
	}
	s.gets = append(s.gets, m)
}

// readLayouts looks at the GET and MGET replies appended to out from on:
// a value that is a layout means the key is held as buckets by another
// proxy (or this one's config is older). The key is hot from now on, and
// its value is answered as the sum of its buckets (contract 9).
func (s *session) readLayouts(from int) {
	defer func() { s.gets, s.getKeys = s.gets[:0], s.getKeys[:0] }()
	if !bytes.Contains(s.out[from:], []byte(rewrite.MarkerPrefix)) {
		return
	}
	rest := append([]byte(nil), s.out[from:]...)
	s.out = s.out[:from]
	n, keyEnd := 0, 0
	for _, m := range s.gets {
		for ; n < m.reply && len(rest) > 0; n++ {
			l := resp.FrameLen(rest)
			s.out, rest = append(s.out, rest[:l]...), rest[l:]
		}
		if len(rest) == 0 {
			break
		}
		l := resp.FrameLen(rest)
		r := rest[:l]
		rest = rest[l:]
		n++
		elems, isArray := resp.ArrayElems(r, nil)
		if !isArray {
			elems = [][]byte{r}
		}
		if isArray {
			s.out = resp.AppendArrayHeader(s.out, len(elems))
		}
		for i, v := range elems {
			if b, ok := resp.BulkValue(v); ok && rewrite.IsMarker(b) && i < len(m.keys) {
				key := s.getKeys[keyEnd:m.keys[i]]
				if i > 0 {
					key = s.getKeys[m.keys[i-1]:m.keys[i]]
				}
				s.srv.hot.Learn(key)
				v = s.srv.hot.Do([][]byte{[]byte("GET"), key}, 1, s.id)
			}
			s.out = append(s.out, v...)
		}
		keyEnd = m.keys[len(m.keys)-1]
	}
	s.out = append(s.out, rest...)
}

// proxyCommand answers PROXY, the proxy's admin command.
func (s *session) proxyCommand(args [][]byte) {
	if len(args) < 2 {
		s.replyError(wrongArity("proxy"))
		return
	}
	switch strings.ToLower(string(args[1])) {
	case "hotkeys":
		if len(args) != 2 {
			s.replyError(wrongArity("proxy|hotkeys"))
			return
		}
		if s.srv.hot == nil {
			s.reply(resp.AppendArrayHeader(nil, 0))
			return
		}
		s.flush()
		s.reply(s.srv.hot.Report())
	case "help":
		lines := []string{
			"PROXY <subcommand>. Subcommands are:",
			"HOTKEYS",
			"    Each hot key: its buckets (key, node, value), their sum, and whether it is sold out.",
			"HELP",
			"    Print this help.",
		}
		out := resp.AppendArrayHeader(nil, len(lines))
		for _, l := range lines {
			out = resp.AppendStatus(out, l)
		}
		s.reply(out)
	default:
		s.replyError("ERR unknown subcommand '" + string(args[1]) + "'. Try PROXY HELP.")
	}
}
