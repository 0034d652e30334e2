package proxy

import (
	"bytes"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
	"github.com/tidwall/redcon"
)

// layoutMark is a command relayed upstream whose reply may show that a key
// is held as buckets: the value of a GET or MGET, or the error of a
// command that fails on a layout (INCR…: not an integer; a deduct script:
// a Lua error) and did nothing.
type layoutMark struct {
	reply int // its reply's place among those of the batch
	// args are its arguments, as the client's commands hold them: valid
	// until the session reads the client again, which it does only after
	// readLayouts.
	args   [][]byte
	keyAt  int  // its key's argument, for a command that failed
	failed bool // the command fails on a layout (else: GET or MGET)
}

// markLayout notes a command that may be relayed and whose reply
// readLayouts is to look at, as rewrite.MayShowLayout tells.
func (s *session) markLayout(name string, args [][]byte) {
	if s.tx.open {
		return
	}
	keyAt, failed, ok := rewrite.MayShowLayout(name, args)
	if !ok {
		return
	}
	// Set in place: a literal appended is built on the stack field by field
	// and copied in wider moves, which cannot be forwarded from the
	// narrower stores and stall on every GET.
	s.marks = append(s.marks, layoutMark{})
	m := &s.marks[len(s.marks)-1]
	m.reply, m.args, m.keyAt, m.failed = s.b.N+len(s.cs.cmds), args, keyAt, failed
}

// unmarkLayout drops the mark of the command just noted: it is answered
// here, not relayed.
func (s *session) unmarkLayout() {
	if n := len(s.marks); n > 0 && s.marks[n-1].reply == s.b.N+len(s.cs.cmds) {
		s.marks = s.marks[:n-1]
	}
}

// readLayouts looks at the replies of the marked commands, appended to out
// from on. A GET or MGET value that is a layout, or a marked command's
// error on a key that holds one, means the key is held as buckets by
// another proxy (or this one's config is older): the key is hot from now
// on, and the command is answered again as on a hot key (contract 9). The
// usual batch costs one scan for the layout prefix and for an error.
func (s *session) readLayouts(from int) {
	defer s.clearMarks()
	out := s.out[from:]
	layout := bytes.Contains(out, []byte(rewrite.MarkerPrefix))
	if !layout && (len(out) == 0 || out[0] != '-' && !bytes.Contains(out, []byte("\r\n-"))) {
		return
	}
	rest := append([]byte(nil), out...)
	s.out = s.out[:from]
	n := 0
	for _, m := range s.marks {
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
		s.out = append(s.out, s.reread(m, r)...)
	}
	s.out = append(s.out, rest...)
}

// clearMarks forgets the marks once their replies are settled.
func (s *session) clearMarks() {
	clear(s.marks) // their arguments are the client's
	s.marks = s.marks[:0]
}

// reread is the reply of the marked command m, which Redis answered r.
func (s *session) reread(m layoutMark, r []byte) []byte {
	e := s.srv.hot
	args := m.args
	if m.failed {
		return s.retryFailed(args, m.keyAt, r)
	}
	elems, isArray := resp.ArrayElems(r, nil)
	if !isArray {
		elems = [][]byte{r}
	}
	var out []byte
	if isArray {
		out = redcon.AppendArray(nil, len(elems))
	}
	for i, v := range elems {
		if b, ok := resp.BulkValue(v); ok && rewrite.IsMarker(b) && i+1 < len(args) {
			key := args[i+1] // GET k, MGET k1 k2…
			e.Learn(key)
			if again := e.Do([][]byte{[]byte("GET"), key}, 1, s.id); again != nil {
				v = s.proto.Adapt(again)
			}
		}
		out = append(out, v...)
	}
	return out
}

// retryFailed answers again a marked command that Redis failed with r,
// when the failure is the one a layout causes and did nothing
// (rewrite.Engine.LayoutFailure); any other failure is the client's to
// see, as a retry could apply the command twice. The key holding a
// layout: it is learned and the command answered as on a hot key. The key
// plain (merged back since): the command is sent again. Three rounds at
// most, for a key sharded and merged back meanwhile.
func (s *session) retryFailed(args [][]byte, keyAt int, r []byte) []byte {
	e, up := s.srv.hot, s.srv.up
	key := args[keyAt]
	for range 3 {
		if !e.LayoutFailure(args, r) {
			return r
		}
		v, ok := resp.BulkValue(up.Do([]rewrite.Request{{Key: key, Args: [][]byte{[]byte("GET"), key}}})[0])
		if ok && rewrite.IsMarker(v) {
			e.Learn(key)
			if again := e.Do(args, keyAt, s.id); again != nil {
				return again
			}
		}
		r = up.Do([]rewrite.Request{{Key: key, Args: args}})[0]
	}
	return r
}
