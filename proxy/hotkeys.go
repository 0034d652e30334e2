package proxy

import (
	"slices"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
	"github.com/tidwall/redcon"
)

// hotCommand answers cmd when it names a hot key, and reports whether it
// did. Hot keys live in db 0.
func (s *session) hotCommand(cmd *resp.Command, c *command, name string) bool {
	e := s.srv.hot
	if s.db != 0 || s.streaming {
		return false
	}
	s.markLayout(name, cmd.Args)
	sampled := s.srv.detect.d.Sample()
	if !sampled && !e.Any() {
		return false // no key can be hot: no need to know which are keys
	}
	table := s.srv.up.KeyTable()
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
	idx := s.keyPositions(table, cmd)
	if sampled {
		s.observe(table, cmd.Args, idx)
	}
	hot := -1
	for _, i := range idx {
		if e.Hot(cmd.Args[i]) {
			hot = i
			break
		}
	}
	if hot < 0 {
		return false
	}
	s.unmarkLayout()
	if name == "watch" && s.srv.up.Cluster == nil {
		s.hotWatch(cmd, idx)
		return true
	}
	if s.tx.open && s.srv.up.Cluster == nil {
		s.hotInTx(cmd, hot, len(idx))
		return true
	}
	if s.tx.open {
		s.replyError("ERR hotkeyproxy: '" + string(cmd.Args[hot]) + "' is a hot key held as buckets; it cannot be used inside MULTI in cluster mode, where its buckets are on several masters")
		s.tx.dirty = true
		return true
	}
	s.flush()
	if c.script == bodyAt1 && s.srv.up.Cluster != nil {
		s.srv.up.Cluster.Scripts().Learn(cmd.Args[1]) // as the relay remembers it
	}
	if len(idx) == 1 || !c.hotPerKey {
		r := e.Do(cmd.Args, hot, s.id)
		if r == nil {
			s.markLayout(name, cmd.Args) // not hot any more: relayed
			return false
		}
		s.reply(s.proto.Adapt(r))
		return true
	}
	// One command per key, then put together as one Redis would reply.
	up := s.srv.up
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
		}
		if r == nil {
			r = up.Do([]rewrite.Request{{Key: cmd.Args[i], Args: args}})[0]
		}
		if resp.IsError(r) {
			s.reply(r)
			return true
		}
		if name == "mget" {
			out = append(out, s.proto.Adapt(r)...)
		} else {
			n, _ := resp.IntValue(r)
			sum += n
		}
	}
	if name == "mget" {
		s.reply(append(redcon.AppendArray(nil, len(idx)), out...))
	} else {
		s.reply(redcon.AppendInt(nil, sum))
	}
	return true
}

// hotInTx queues a command on the hot key cmd.Args[hot] in the client's
// transaction (standalone mode): the engine's step in its place, which
// Redis answers QUEUED and runs at EXEC; or the refusal Redis would give
// a command it will not queue, which makes EXEC fail.
func (s *session) hotInTx(cmd *resp.Command, hot, keys int) {
	if keys > 1 {
		s.replyError("ERR hotkeyproxy: '" + string(cmd.Args[hot]) + "' is a hot key held as buckets; inside MULTI it must be the command's only key")
		s.tx.dirty = true
		return
	}
	key := string(cmd.Args[hot])
	step, reply, queued := s.srv.hot.TxStep(cmd.Args, hot, slices.Contains(s.tx.deleted, key))
	if !queued {
		s.reply(reply)
		s.tx.dirty = true
		return
	}
	s.tx.hotKeys = append(s.tx.hotKeys, key)
	if rewrite.Deletes(cmd.Args[0]) {
		s.tx.deleted = append(s.tx.deleted, key)
	}
	s.forward(&resp.Command{Args: step})
}

// hotWatch is WATCH naming a hot key (standalone mode): the hot keys are
// watched with their buckets, so that EXEC fails when another client
// changes their value, as it does for a plain key (and, more often than
// for one, when stock moves between buckets: a client retries). Inside
// MULTI, Redis refuses it as it is.
func (s *session) hotWatch(cmd *resp.Command, idx []int) {
	args := cmd.Args
	if !s.tx.open {
		args = [][]byte{cmd.Args[0]}
		for _, i := range idx {
			if !s.srv.hot.Hot(cmd.Args[i]) {
				args = append(args, cmd.Args[i])
				continue
			}
			keys, err := s.srv.hot.WatchKeys(cmd.Args[i])
			if err != nil {
				s.reply(err)
				return
			}
			args = append(args, keys...)
		}
	}
	if s.own == nil && !s.pin(s.srv.up.Pool) {
		return
	}
	s.forward(&resp.Command{Args: args})
}
