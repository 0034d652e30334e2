package resp

import "bytes"

// The functions here look inside complete raw replies, as ReadReply frames
// them, so the proxy can merge the replies of several servers into one.
// They trust the framing ReadReply checked and report ok=false for a reply
// of another type than asked.

// FrameLen is the length of the first reply in b, or len(b) when b does
// not hold a complete one: a truncated or malformed reply is never read
// past. RESP3's aggregate and blob types are walked too.
func FrameLen(b []byte) int {
	off := 0
	for pending := 1; pending > 0; pending-- {
		n, next, ok := headerInt(b, off)
		if !ok {
			eol := bytes.IndexByte(b[off:], '\n')
			if eol < 0 {
				return len(b)
			}
			off += eol + 1
			continue
		}
		switch b[off] {
		case '$', '=', '!': // bulk string, verbatim string, blob error
			if n > int64(len(b)-next-2) {
				return len(b)
			}
			next += int(n) + 2
		case '*', '~', '>': // array, set, push
			pending += int(min(n, int64(len(b))))
		case '%': // map: n pairs
			pending += 2 * int(min(n, int64(len(b))))
		case '|': // attribute: n pairs, then the reply they are about
			pending += 2*int(min(n, int64(len(b)))) + 1
		}
		off = next
	}
	return off
}

// headerInt reads the non-negative length after the type byte at off, for
// the headers of bulk strings and aggregates. ok is false for a negative or
// missing one (nil, a line without a length), or a header cut short; next
// is where the header's line ends.
func headerInt(b []byte, off int) (n int64, next int, ok bool) {
	i := off + 1
	for ; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
		n = min(n*10+int64(b[i]-'0'), 1<<40) // more than any reply is long
	}
	if i == off+1 || i+1 >= len(b) || b[i] != '\r' || b[i+1] != '\n' {
		return 0, 0, false
	}
	return n, i + 2, true
}

// ArrayElems appends the raw elements of an array reply to dst; ok is false
// for any other reply, the nil array included.
func ArrayElems(reply []byte, dst [][]byte) (elems [][]byte, ok bool) {
	return aggregateElems(reply, '*', 1, dst)
}

// MapElems appends the raw keys and values of a RESP3 map reply to dst,
// key, value, key, value…; ok is false for any other reply.
func MapElems(reply []byte, dst [][]byte) (elems [][]byte, ok bool) {
	return aggregateElems(reply, '%', 2, dst)
}

// PushKind is the first element of a push reply, which names its kind
// (subscribe, message, invalidate…); ok is false for other replies.
func PushKind(reply []byte) (kind []byte, ok bool) {
	var first [1][]byte
	elems, ok := aggregateElems(reply, '>', 1, first[:0])
	if !ok || len(elems) == 0 {
		return nil, false
	}
	return BulkValue(elems[0])
}

// aggregateElems appends the per*n elements of an aggregate of type typ.
func aggregateElems(reply []byte, typ byte, per int64, dst [][]byte) ([][]byte, bool) {
	if len(reply) == 0 || reply[0] != typ {
		return dst, false
	}
	eol := bytes.IndexByte(reply, '\n')
	n, _ := ParseInt(reply[1 : eol-1])
	if n < 0 {
		return dst, false
	}
	rest := reply[eol+1:]
	for n *= per; n > 0; n-- {
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

// TextValue is the text of a bulk string or, without its format, of a
// verbatim string (INFO's reply in RESP3); ok is false for other replies.
func TextValue(reply []byte) ([]byte, bool) {
	if len(reply) > 0 && reply[0] == '=' {
		eol := bytes.IndexByte(reply, '\n')
		if text := reply[eol+1 : len(reply)-2]; len(text) >= 4 {
			return text[4:], true // after "txt:"
		}
		return nil, false
	}
	return BulkValue(reply)
}

// IsError reports whether reply is an error reply.
func IsError(reply []byte) bool { return len(reply) > 0 && reply[0] == '-' }
