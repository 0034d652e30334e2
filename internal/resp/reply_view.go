package resp

import "bytes"

// The functions here look inside complete raw replies, as ReadReply frames
// them, so the proxy can merge the replies of several servers into one.
// They trust the framing ReadReply checked and report ok=false for a reply
// of another type than asked.

// FrameLen is the length of the first reply in b, which must start with a
// complete reply framed by ReadReply. RESP3's aggregate and blob types
// are counted too, so a client that said HELLO 3 is walked right.
func FrameLen(b []byte) int {
	off := 0
	for pending := 1; pending > 0; pending-- {
		eol := bytes.IndexByte(b[off:], '\n') + 1
		line := b[off : off+eol-2]
		off += eol
		n, _ := ParseInt(line[1:])
		switch line[0] {
		case '$', '=', '!': // bulk string, verbatim string, blob error
			if n >= 0 {
				off += int(n) + 2
			}
		case '*', '~', '>': // array, set, push
			pending += max(int(n), 0)
		case '%': // map: n pairs
			pending += 2 * max(int(n), 0)
		case '|': // attribute: n pairs, then the reply it is about
			pending += 2*max(int(n), 0) + 1
		}
	}
	return off
}

// ArrayElems appends the raw elements of an array reply to dst; ok is false
// for any other reply, the nil array included.
func ArrayElems(reply []byte, dst [][]byte) (elems [][]byte, ok bool) {
	if len(reply) == 0 || reply[0] != '*' {
		return dst, false
	}
	eol := bytes.IndexByte(reply, '\n')
	n, _ := ParseInt(reply[1 : eol-1])
	if n < 0 {
		return dst, false
	}
	rest := reply[eol+1:]
	for ; n > 0; n-- {
		l := FrameLen(rest)
		dst = append(dst, rest[:l])
		rest = rest[l:]
	}
	return dst, true
}

// IntValue is the value of an integer reply.
func IntValue(reply []byte) (int64, bool) {
	if len(reply) < 4 || reply[0] != ':' {
		return 0, false
	}
	return ParseInt(reply[1 : len(reply)-2])
}

// BulkValue is the payload of a bulk string reply; ok is false for the nil
// bulk and for other replies.
func BulkValue(reply []byte) ([]byte, bool) {
	if len(reply) == 0 || reply[0] != '$' || reply[1] == '-' {
		return nil, false
	}
	eol := bytes.IndexByte(reply, '\n')
	return reply[eol+1 : len(reply)-2], true
}

// IsError reports whether reply is an error reply.
func IsError(reply []byte) bool { return len(reply) > 0 && reply[0] == '-' }
