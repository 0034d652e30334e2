package proxy

import (
	"bytes"
	"slices"
	"strconv"

	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
	"github.com/tidwall/redcon"
)

// Client-side caching: Redis tracks the keys a connection reads, so a
// client that turns tracking on gets a connection of its own (standalone
// mode; in cluster mode its keys live on every master and tracking is
// refused), and every command it sends goes there. REDIRECT names a proxy
// client, whose own connection's Redis id is what Redis is given; in RESP2
// that client must be subscribed to __redis__:invalidate, as with Redis,
// and so has one. The keys of a hot key are its buckets, read on other
// connections: no invalidation comes for them.

// clientTracking answers CLIENT TRACKING ON|OFF [REDIRECT id] [BCAST]
// [PREFIX p …] [OPTIN] [OPTOUT] [NOLOOP] with Redis's reply on the
// client's own connection.
func (s *session) clientTracking(args [][]byte) {
	if len(args) < 3 {
		s.replyError(rediserr.WrongArity("client|tracking"))
		return
	}
	if s.srv.up.Cluster != nil {
		s.replyError(notInCluster(args))
		return
	}
	if s.own == nil && !s.pin(s.srv.up.Pool) {
		return
	}
	req := slices.Clone(args)
	var redir int64
	bcast := false
	for j := 3; j < len(req); j++ {
		more := j+1 < len(req)
		switch {
		case bytes.EqualFold(req[j], []byte("redirect")) && more:
			j++
			if redir != 0 {
				j = len(req) // Redis refuses a second one; it needs no id
				break
			}
			id, ok := resp.ParseInt(req[j])
			if !ok {
				j = len(req) // Redis refuses it
				break
			}
			rid, msg := s.redirectID(uint64(id))
			if msg != "" {
				s.replyError(msg)
				return
			}
			req[j], redir = strconv.AppendInt(nil, rid, 10), id
		case bytes.EqualFold(req[j], []byte("prefix")) && more:
			j++
		case bytes.EqualFold(req[j], []byte("bcast")):
			bcast = true
		}
	}
	mark := s.exchange(&resp.Command{Args: req})
	if string(s.out[mark:]) != "+OK\r\n" {
		return
	}
	on := bytes.EqualFold(args[2], []byte("on"))
	s.track = tracking{on: on, bcast: on && bcast, redir: redir}
	if !on {
		s.track.redir = 0
	}
	s.info.mu.Lock()
	s.info.tracking, s.info.bcast, s.info.redir = s.track.on, s.track.bcast, s.track.redir
	s.info.mu.Unlock()
}

// redirectID is the Redis id of the own connection of the client with
// proxy id id, or 0 when there is no such client (Redis then says so), or
// the error to answer.
func (s *session) redirectID(id uint64) (rid int64, msg string) {
	target := s.srv.session(id)
	if target == nil {
		return 0, ""
	}
	var addr string
	var p *upstream.Pool
	ok := true
	if target == s {
		addr, p = addrString(s.own.nc.LocalAddr()), s.own.pool
	} else if addr, p, ok = target.ownAddr(); !ok {
		if addr, p, ok = target.ownForPushes(); !ok {
			return 0, msgRedirUnsubscribed
		}
	}
	rid, err := redisID(p, addr)
	if err != nil {
		return 0, upstream.ErrorText(err)
	}
	return rid, ""
}

// trackingInfo answers CLIENT TRACKINGINFO: Redis's, from the client's own
// connection, with the redirect given as the proxy id; Redis's reply for a
// connection that never tracked when the client has none.
func (s *session) trackingInfo() {
	if !s.pinned() {
		b := redcon.AppendArray(nil, 6)
		if s.proto >= 3 {
			b = append(b[:0], "%3\r\n"...)
		}
		b = redcon.AppendBulkString(b, "flags")
		if s.proto >= 3 {
			b = append(b, "~1\r\n"...)
		} else {
			b = redcon.AppendArray(b, 1)
		}
		b = redcon.AppendBulkString(b, "off")
		b = redcon.AppendBulkString(b, "redirect")
		b = redcon.AppendInt(b, -1)
		b = redcon.AppendBulkString(b, "prefixes")
		s.reply(redcon.AppendArray(b, 0))
		return
	}
	mark := s.exchange(&resp.Command{Args: [][]byte{[]byte("CLIENT"), []byte("TRACKINGINFO")}})
	if s.track.on {
		s.out = append(s.out[:mark], patchIntField(s.out[mark:], "redirect", s.track.redir)...)
	}
}
